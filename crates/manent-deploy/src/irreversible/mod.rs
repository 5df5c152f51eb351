//! The rollback guard (docs/environments.md, "The rollback guard"): a descriptor's
//! `irreversible: "reason"` marks its deploy (a destructive schema migration, say), and a
//! rollback or redeploy that would put back a version from before the newest such deploy
//! of its environment is refused, naming that deploy, unless forced.
//!
//! Decided at submission, from the environment's successes (`history`), newest first:
//!
//! - the newest successful irreversible deploy, followed back through its origin to the
//!   deploy that first applied its change (a rollback to, or a redeploy of, a marked
//!   deploy carries its descriptor, mark included, but changes nothing new);
//! - the versions that ran successfully after that one, other than by a forced rollback or
//!   redeploy: going to one of these, or to the irreversible deploy's own version, is not
//!   going back;
//! - any other version that ran successfully in the environment is from before it: going
//!   there is refused. A version that never succeeded there is not going back.

use std::collections::BTreeSet;

use manent_engine::{Client, EngineError, WorkflowRecord, WorkflowStatus};

use crate::history::{OriginKind, find_success, find_success_record, origin_of, read_request};
use crate::request::{DEPLOY_WORKFLOW, DeployRequest};

/// The deploy a rollback or redeploy would go back past: what its refusal names, and what
/// a forced one records and audits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IrreversibleDeploy {
    pub deploy_id: String,
    /// Its version (its first artifact's).
    pub version: String,
    /// Its descriptor's `irreversible`.
    pub reason: String,
}

/// The reason `request`'s descriptor marks its deploy irreversible with, if it does.
pub fn reason_of(request: &DeployRequest) -> Option<&str> {
    request.descriptor.irreversible.as_deref()
}

/// Most origins followed back from the newest irreversible deploy to the one that first
/// applied its change: a chain longer than this ends there (each link is one read).
const MAX_ORIGINS: usize = 64;

/// The irreversible deploy that submitting again a deploy whose recorded request is
/// `source` would go back past in its environment, or `None` when it goes back past none.
/// A dry run changes nothing and passes none.
pub async fn passed_by(
    client: &Client,
    source: &DeployRequest,
) -> Result<Option<IrreversibleDeploy>, EngineError> {
    let (application, environment) = (
        &source.descriptor.application,
        &source.descriptor.environment,
    );
    let dry_run = source
        .effective
        .as_ref()
        .map_or(source.descriptor.dry_run, |e| e.dry_run);
    if dry_run {
        return Ok(None);
    }
    let Some((newest, newest_request)) =
        find_success_record(client, application, environment, |_, r| {
            reason_of(r).is_some()
        })
        .await?
    else {
        return Ok(None);
    };
    let (first, first_request) = first_applied(client, newest, newest_request).await?;
    let irreversible = IrreversibleDeploy {
        deploy_id: first.id.clone(),
        version: first_request.descriptor.version().to_string(),
        reason: reason_of(&first_request).unwrap_or_default().to_string(),
    };
    let version = source.descriptor.version();
    if version == irreversible.version {
        return Ok(None);
    }
    // The versions that ran after it: the successes read before reaching it.
    let mut after = BTreeSet::new();
    find_success_record(client, application, environment, |record, request| {
        if record.id == first.id {
            return true;
        }
        if origin_of(record).is_none_or(|o| o.forced_past.is_none()) {
            after.insert(request.descriptor.version().to_string());
        }
        false
    })
    .await?;
    if after.contains(version) {
        return Ok(None);
    }
    // Not after it: from before it if it ever succeeded here (the source itself, for a
    // rollback), else a version that never ran here.
    let ran = find_success(client, application, environment, |_, r| {
        r.descriptor.version() == version
    })
    .await?;
    Ok(ran.map(|_| irreversible))
}

/// The deploy that first applied the change `newest` is marked for: `newest`, unless it
/// resubmitted (rolled back to, or redeployed) a successful deploy of the same version
/// marked irreversible, and so on back.
async fn first_applied(
    client: &Client,
    mut deploy: WorkflowRecord,
    mut request: DeployRequest,
) -> Result<(WorkflowRecord, DeployRequest), EngineError> {
    for _ in 0..MAX_ORIGINS {
        let Some(origin) = origin_of(&deploy) else {
            break;
        };
        let Some(earlier) = client
            .get(&origin.deploy_id)
            .await?
            .filter(|r| r.name == DEPLOY_WORKFLOW && r.status == WorkflowStatus::Success)
        else {
            // A failed deploy redeployed (the change first applied here), or one pruned.
            break;
        };
        let earlier_request = read_request(&earlier)?;
        if reason_of(&earlier_request).is_none()
            || earlier_request.descriptor.version() != request.descriptor.version()
        {
            break;
        }
        (deploy, request) = (earlier, earlier_request);
    }
    Ok((deploy, request))
}

/// The refusal of a rollback or redeploy of deploy `source_id` (at `version`) that would go
/// back past `irreversible`: names it, its version and its reason, and says how to go on.
pub fn refusal(
    kind: OriginKind,
    source_id: &str,
    version: &str,
    irreversible: &IrreversibleDeploy,
) -> String {
    let IrreversibleDeploy {
        deploy_id,
        version: its_version,
        reason,
    } = irreversible;
    format!(
        "{} to version {version} (deploy {source_id}) refused: it goes back past deploy \
         {deploy_id} (version {its_version}), marked irreversible: \"{reason}\". Version \
         {version} is from before that change; deploy a version made for it, or pass --force \
         (API: \"force\": true) to go back anyway (audited)",
        kind.as_str()
    )
}
