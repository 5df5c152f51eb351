//! `manent promote ID` and `manent abort ID [--reason R]` (docs/analysis.md): checks that
//! the deploy bakes or waits for a decision, then sends the decision on the topic
//! `analysis`. Who may decide is the API's question (the approve permission).

use manent_engine::{Client, EngineError, now_ms};

use super::{AnalysisDecision, Measurement};
use crate::request::{ANALYSIS_TOPIC, DEPLOY_WORKFLOW, EventKey, Phase, event};

/// Who decides: the API token's name and stable id.
#[derive(Debug, Clone)]
pub struct Decider {
    pub name: String,
    pub token_id: String,
}

/// Why a promote or an abort was refused.
#[derive(Debug, thiserror::Error)]
pub enum AnalysisDecideError {
    #[error("no deploy `{0}`")]
    NotFound(String),
    /// The deploy neither bakes nor waits for a decision.
    #[error("{0}")]
    NotDeciding(String),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// Sends `promote` (or, when false, abort with `reason`) to deploy `id`, which must be
/// baking a wave or waiting in `waiting_decision`.
pub async fn decide(
    client: &Client,
    id: &str,
    by: &Decider,
    promote: bool,
    reason: Option<String>,
) -> Result<(), AnalysisDecideError> {
    let Some(record) = client.get(id).await?.filter(|r| r.name == DEPLOY_WORKFLOW) else {
        return Err(AnalysisDecideError::NotFound(id.to_string()));
    };
    let events = client.events(id).await?;
    let phase: Option<Phase> = event(id, &events, &EventKey::Phase)?;
    let verb = if promote { "promote" } else { "abort" };
    let wave = match (&phase, record.status.is_terminal()) {
        (Some(Phase::BakeAfterWave(wave)), false) => *wave,
        (Some(Phase::WaitingDecision), false) => {
            let measured: Vec<Measurement> =
                event(id, &events, &EventKey::Measurements)?.unwrap_or_default();
            measured.last().map_or(0, |m| m.wave)
        }
        _ => {
            return Err(AnalysisDecideError::NotDeciding(
                if record.status.is_terminal() {
                    format!(
                        "deploy {id} has ended ({}); nothing to {verb}",
                        record.status
                    )
                } else {
                    format!(
                        "deploy {id} neither bakes a wave nor waits for a decision (status {}, \
                     phase {}); nothing to {verb}",
                        record.status,
                        phase.as_ref().map_or("none".into(), Phase::text),
                    )
                },
            ));
        }
    };
    let decision = AnalysisDecision {
        promote,
        by: by.name.clone(),
        by_id: by.token_id.clone(),
        reason,
        at_ms: now_ms(),
        wave,
    };
    client.send(id, ANALYSIS_TOPIC, &decision).await?;
    Ok(())
}
