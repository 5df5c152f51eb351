//! What ran in one application/environment: its deploys' recorded requests read back,
//! the last success (for dependencies, rollback and approvals), the live version, and
//! where a rollback or redeploy came from. Read by partition, whatever else ran.

use manent_engine::{Client, EngineError, WorkflowFilter, WorkflowRecord, WorkflowStatus};
use manent_model::EffectiveDescriptor;
use serde::{Deserialize, Serialize};

use crate::request::{DEPLOY_WORKFLOW, DeployRequest, rfc3339};

/// The version live in one environment: its last successful deploy that was not a dry run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveVersion {
    /// The deploy's version (its first artifact's).
    pub version: String,
    /// The successful deploy that put it there.
    pub deploy_id: String,
    /// When that deploy ended (RFC 3339).
    pub finished_at: Option<String>,
    /// Who submitted that deploy (a token's name).
    pub submitted_by: String,
    /// Under the `container` plugin, the container that runs it on each target
    /// (`{target}` left in when its name has one; docs/containers.md).
    pub container: Option<String>,
}

/// The container a deploy under the `container` plugin runs on its targets.
fn container_of(request: &DeployRequest) -> Option<String> {
    let eff = request.effective.as_ref()?;
    let settings = eff.container.as_ref()?;
    if eff.plugin != manent_model::CONTAINER_PLUGIN {
        return None;
    }
    // A target's name stands in for `{target}`, put back after the name is made valid.
    const TARGET: &str = "MANENTTARGET";
    let base = manent_model::container_base(settings, TARGET, &eff.application, &eff.environment);
    Some(manent_model::container_name(&base, &eff.version).replace(TARGET, "{target}"))
}

/// The deploy's recorded request, or an error naming the deploy: what a read that decides
/// something (a rollback's source, the live version, a dependency, an approval) uses.
pub(crate) fn read_request(record: &WorkflowRecord) -> Result<DeployRequest, EngineError> {
    serde_json::from_str(&record.input).map_err(|e| EngineError::Unreadable {
        kind: "deploy",
        id: record.id.clone(),
        error: e.to_string(),
    })
}

/// The deploy's recorded request; one that cannot be read is logged (and shown by
/// `status` as an error) and left out of lists, which cannot tell whose it is.
pub(crate) fn request_of(record: &WorkflowRecord) -> Option<DeployRequest> {
    serde_json::from_str(&record.input)
        .inspect_err(|e| {
            tracing::error!(deploy_id = %record.id, error = %e, "a deploy's recorded input cannot be read; it is kept as it is");
        })
        .ok()
}

/// The last successful deploy (not a dry run) of `application/environment`, other than
/// `except`, read from that partition's history a page at a time: however many deploys of
/// other applications, or dry runs of this one, came after it.
pub(crate) async fn last_success(
    client: &Client,
    application: &str,
    environment: &str,
    except: Option<&str>,
) -> Result<Option<(String, DeployRequest)>, EngineError> {
    find_success(client, application, environment, |id, _| Some(id) != except).await
}

/// The newest successful deploy (not a dry run) of `application/environment` that `wanted`
/// accepts, with its id, reading that partition's successes newest first, a page at a time.
/// A success whose recorded request cannot be read, met before the one wanted, is an error
/// naming it: it may be the one wanted (a rollback's target, the live version, the version
/// a dependency needs), so passing over it would answer wrong.
pub(crate) async fn find_success(
    client: &Client,
    application: &str,
    environment: &str,
    mut wanted: impl FnMut(&str, &DeployRequest) -> bool,
) -> Result<Option<(String, DeployRequest)>, EngineError> {
    Ok(
        find_success_record(client, application, environment, |record, request| {
            wanted(&record.id, request)
        })
        .await?
        .map(|(record, request)| (record.id, request)),
    )
}

/// [`find_success`], with the deploy's record (which `wanted` sees too: its origin).
pub(crate) async fn find_success_record(
    client: &Client,
    application: &str,
    environment: &str,
    mut wanted: impl FnMut(&WorkflowRecord, &DeployRequest) -> bool,
) -> Result<Option<(WorkflowRecord, DeployRequest)>, EngineError> {
    // The newest success is usually the one wanted (the live version): a first page of a
    // few, then larger ones. A page of 100 read 100 recorded requests to use one
    // (`manent apps` over 60 environments, bench/history).
    let mut page: i64 = 4;
    let mut offset = 0;
    loop {
        let records = client
            .list(&WorkflowFilter {
                status: Some(WorkflowStatus::Success),
                name: Some(DEPLOY_WORKFLOW.into()),
                partition_key: Some(manent_model::partition_key(application, environment)),
                limit: Some(page),
                offset: Some(offset),
                ..Default::default()
            })
            .await?;
        let full = records.len() as i64 == page;
        for record in records {
            let request = read_request(&record)?;
            let dry_run = request
                .effective
                .as_ref()
                .map_or(request.descriptor.dry_run, |e| e.dry_run);
            if !dry_run && wanted(&record, &request) {
                return Ok(Some((record, request)));
            }
        }
        if !full {
            return Ok(None);
        }
        offset += page;
        page = 100;
    }
}

/// The effective descriptor of the last successful (not dry-run) deploy of
/// the same application and environment, other than `deploy_id`.
pub async fn previous_success(
    client: &Client,
    eff: &EffectiveDescriptor,
    deploy_id: &str,
) -> Result<Option<EffectiveDescriptor>, EngineError> {
    Ok(
        last_success(client, &eff.application, &eff.environment, Some(deploy_id))
            .await?
            .and_then(|(_, r)| r.effective),
    )
}

/// The key of a deploy's recorded input that holds its [`Origin`], beside the request's own.
pub(crate) const ORIGIN_KEY: &str = "redeploy_of";

/// How a deploy came from an earlier one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OriginKind {
    /// `manent rollback`: an earlier successful version of the application/environment.
    Rollback,
    /// `manent redeploy`: a past deploy's descriptor as it was.
    Redeploy,
}

impl OriginKind {
    pub fn as_str(self) -> &'static str {
        match self {
            OriginKind::Rollback => "rollback",
            OriginKind::Redeploy => "redeploy",
        }
    }
}

/// Which deploy a rollback or redeploy resubmitted, recorded with the new deploy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Origin {
    pub kind: OriginKind,
    pub deploy_id: String,
    /// A fast rollback ([`crate::DeployRequest::fast`]). Left out when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fast: bool,
    /// The irreversible deploy this one went back past with `--force` (docs/environments.md,
    /// "The rollback guard"). Left out when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forced_past: Option<String>,
    /// The only targets deployed (`manent reconcile`: the drifted ones). Left out when all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<String>,
    /// A reconcile's: per target, the files its drift check found added, removed by the
    /// deploy ([`manent_model::EffectiveDescriptor::remove_added`]). Left out when none.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub remove_added: std::collections::BTreeMap<String, Vec<String>>,
}

/// The [`Origin`] recorded in a deploy's input, if any.
pub(crate) fn origin_of(record: &WorkflowRecord) -> Option<Origin> {
    #[derive(Deserialize)]
    struct Recorded {
        #[serde(default, rename = "redeploy_of")]
        origin: Option<Origin>,
    }
    serde_json::from_str::<Recorded>(&record.input)
        .ok()
        .and_then(|r| r.origin)
}

/// A deploy's version: its first artifact's (docs/environments.md).
pub(crate) fn version_of(request: &DeployRequest) -> &str {
    request.descriptor.version()
}

/// The version live in `application/environment`, or `None` before its first success.
pub async fn live_version(
    client: &Client,
    application: &str,
    environment: &str,
) -> Result<Option<LiveVersion>, EngineError> {
    let Some((record, request)) =
        find_success_record(client, application, environment, |_, _| true).await?
    else {
        return Ok(None);
    };
    Ok(Some(LiveVersion {
        version: version_of(&request).to_string(),
        deploy_id: record.id,
        finished_at: record.finished_at_ms.map(rfc3339),
        submitted_by: request.submitted_by.clone(),
        container: container_of(&request),
    }))
}
