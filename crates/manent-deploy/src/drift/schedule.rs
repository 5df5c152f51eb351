//! `drift: {every}` (docs/plan-and-drift.md, "On a schedule"): every worker looks, every
//! few seconds, for environments whose drift is due, and starts each due check under the
//! id of its slot (`drift:<application>/<environment>:<slot>`), so that whichever worker
//! starts it, a slot is checked once. The check runs on the environment's queue.

use std::{sync::Arc, time::Duration};

use manent_config::Config;
use manent_engine::Client;

/// How often a worker looks for due checks.
pub const LOOK_EVERY: Duration = Duration::from_secs(2);

/// Starts the loop on this worker; it ends with the process.
pub fn spawn(client: Client, config: Arc<Config>) {
    tokio::spawn(manent_engine::background(async move {
        let mut tick = tokio::time::interval(LOOK_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(e) = once(&client, &config).await {
                tracing::warn!(error = %e, "drift schedule: cannot look for due checks");
            }
        }
    }));
}

/// Starts the checks due now.
async fn once(client: &Client, config: &Config) -> Result<(), String> {
    let source = config.environments_source();
    let due = tokio::task::spawn_blocking(move || due_environments(&source))
        .await
        .map_err(|e| e.to_string())?;
    let now = super::check::now_ms();
    for (application, environment, every) in due {
        let every_ms = i64::try_from(every.as_millis()).unwrap_or(i64::MAX).max(1);
        let slot = now / every_ms;
        let id = format!("drift:{application}/{environment}:{slot}");
        if let Err(e) = super::start(client, &application, &environment, Some(id)).await {
            tracing::warn!(application, environment, error = %e, "drift schedule: cannot start a check");
        }
    }
    Ok(())
}

/// The environments with `drift.every`, and their interval. A file that cannot be read is
/// skipped here (its deploys and `manent validate` say why).
fn due_environments(source: &std::path::Path) -> Vec<(String, String, Duration)> {
    let Ok(applications) = manent_model::list_applications(source) else {
        return Vec::new();
    };
    let mut due = Vec::new();
    for (application, environments) in applications {
        for environment in environments {
            if let Ok(file) = manent_model::load_environment(source, &application, &environment)
                && let Some(every) = file.drift.and_then(|d| d.every)
            {
                due.push((application.clone(), environment, every));
            }
        }
    }
    due
}
