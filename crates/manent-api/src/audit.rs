//! The audit trail: every change made through `/api/v1` (submit, cancel, approve, reject,
//! recover, schedule and token changes) and every refused request (401, 403), kept in the
//! database: who (token name and id), when, what (action, target), outcome (the status).
//!
//! `record` is the one way in. The token middleware calls it for every request that is
//! refused or that changes something (any method but GET), so a route added later is
//! audited without further code.

use axum::{
    body::{Body, to_bytes},
    http::{Method, StatusCode},
    response::Response,
};
use manent_engine::{AuditRecord, Records, now_ms};

use crate::auth::Caller;

/// One entry about to be recorded.
#[derive(Debug, Clone)]
pub struct Entry {
    /// `None` when the request carried no valid token.
    pub who: Option<Caller>,
    /// `deploy.submit`, `deploy.cancel`, `token.revoke`, … or `GET /api/v1/…` for a read.
    pub action: String,
    /// The deploy, schedule, executor or token the action was about (empty when none).
    pub target: String,
    pub outcome: StatusCode,
    /// The error message of a failure, or a note.
    pub detail: String,
}

/// Appends `entry` to the trail. A failure to write is logged as an error and never
/// changes the answer of the request it describes (that request already happened).
pub async fn record(records: &Records, entry: Entry) {
    let (actor, actor_id) = match &entry.who {
        Some(caller) => (caller.token.name.clone(), caller.token.id.clone()),
        None => ("-".to_string(), String::new()),
    };
    let record = AuditRecord {
        seq: 0,
        at_ms: now_ms(),
        actor,
        actor_id,
        action: entry.action,
        target: entry.target,
        outcome: i64::from(entry.outcome.as_u16()),
        detail: entry.detail,
    };
    if let Err(e) = records.append_audit(&record).await {
        tracing::error!(error = %e, action = %record.action, target = %record.target,
            actor = %record.actor, "cannot write the audit trail");
    }
}

/// Records that `caller` forced `what` (`rollback of deploy D (version V)`), which made
/// deploy `made` of `application`, past the irreversible deploy `passed` (docs/environments.md,
/// "The rollback guard"): an entry of its own, `deploy.force_irreversible`, beside the
/// request's, naming who forced it and which deploy it went back past.
pub async fn record_forced(
    state: &crate::AppState,
    caller: &Caller,
    (made, application): (&str, &str),
    what: &str,
    passed: &manent_deploy::irreversible::IrreversibleDeploy,
) {
    tracing::warn!(deploy = %made, by = %caller.token.name, past = %passed.deploy_id,
        "{what} forced past an irreversible deploy");
    let detail = format!(
        "{what} forced by {} past irreversible deploy {} (version {}): \"{}\"",
        caller.token.name, passed.deploy_id, passed.version, passed.reason
    );
    let entry = Entry {
        who: Some(caller.clone()),
        action: "deploy.force_irreversible".to_string(),
        target: format!("{made} ({application})"),
        outcome: StatusCode::CREATED,
        detail,
    };
    record(&state.client.records(), entry).await;
}

/// Records a change made outside the API (`manent-server admin …`): the actor is the
/// command, not a token; the outcome is 200.
pub async fn record_admin(records: &Records, actor: &str, action: &str, target: &str) {
    let record = AuditRecord {
        seq: 0,
        at_ms: now_ms(),
        actor: actor.to_string(),
        actor_id: String::new(),
        action: action.to_string(),
        target: target.to_string(),
        outcome: 200,
        detail: String::new(),
    };
    if let Err(e) = records.append_audit(&record).await {
        tracing::error!(error = %e, action, target, "cannot write the audit trail");
    }
}

/// The newest entries `filter` admits, newest first.
pub async fn list(
    records: &Records,
    filter: &manent_engine::AuditFilter,
) -> Result<Vec<AuditRecord>, manent_engine::StoreError> {
    records.audit(filter).await
}

/// The action of a request on the route `template` (`/api/v1/deploys/{id}/cancel`):
/// `deploy.cancel`; a read is `GET <template>`.
pub fn action_of(method: &Method, template: &str) -> String {
    let route = template.strip_prefix("/api/v1").unwrap_or(template);
    let segments: Vec<&str> = route.trim_matches('/').split('/').collect();
    let resource = segments
        .first()
        .map(|s| s.strip_suffix('s').unwrap_or(s))
        .unwrap_or_default();
    let verb = match (method, segments.as_slice()) {
        (&Method::GET, _) => return format!("GET {template}"),
        // `/deploys/{id}/cancel`, `/apps/{tenant}/{app}/environments/{environment}/rollback`.
        (_, [_, .., param, verb]) if param.starts_with('{') => *verb,
        (&Method::POST, ["deploys"]) => "submit",
        (&Method::POST, ["deploys", "batch"]) => "submit_batch",
        (&Method::POST, [_]) => "create",
        (&Method::DELETE, ["tokens", _]) => "revoke",
        (&Method::DELETE, [_, _]) => "delete",
        _ => return format!("{method} {template}"),
    };
    format!("{resource}.{verb}")
}

/// The path parameters of `path` on the route `template`, joined by `/`
/// (`/api/v1/deploys/abc/cancel` on `/api/v1/deploys/{id}/cancel` → `abc`).
pub fn target_of(template: &str, path: &str) -> String {
    // Aligned from the end: inside the `/api/v1` router the path has lost its prefix while
    // the matched template keeps it, so aligned from the start every parameter fell on the
    // wrong segment and a refused action on `/deploys/{id}/…` recorded no target.
    let mut targets: Vec<&str> = template
        .rsplit('/')
        .zip(path.rsplit('/'))
        .filter(|(t, _)| t.starts_with('{'))
        .map(|(_, p)| p)
        .collect();
    targets.reverse();
    targets.join("/")
}

/// Records what a request did, once it has been answered: every refusal (401, 403) and
/// every change attempted (any method but GET), whatever its outcome. The target of a
/// creation is read from the answer (`id`, `name`); the detail of a failure is its error
/// message. Returns the response unchanged.
pub async fn after_response(
    records: &Records,
    who: Option<Caller>,
    method: &Method,
    template: &str,
    path: &str,
    response: Response,
) -> Response {
    let status = response.status();
    let refused = matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN);
    if !refused && method == Method::GET {
        return response;
    }
    let (parts, body) = response.into_parts();
    // Read whole, whatever its size: the answers of these routes are built in memory
    // (a bulk submission's runs to about 85 KB), and the client gets these same bytes.
    // A body cut here would answer the client nothing and audit nothing.
    let (bytes, unread) = match to_bytes(body, usize::MAX).await {
        Ok(bytes) => (bytes, None),
        Err(e) => {
            tracing::error!(error = %e, "cannot read a response for the audit trail");
            (
                Default::default(),
                Some(format!("the answer could not be read: {e}")),
            )
        }
    };
    let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    let mut target = target_of(template, path);
    if target.is_empty() {
        target = ["id", "name"]
            .iter()
            .find_map(|k| json[k].as_str())
            .unwrap_or_default()
            .to_string();
    }
    if target.is_empty()
        && let Some(answers) = json.as_array()
    {
        // A bulk submission: every deploy it created.
        let ids: Vec<&str> = answers.iter().filter_map(|a| a["id"].as_str()).collect();
        target = ids.join(" ");
    }
    if let Some(application) = json["application"].as_str() {
        target = format!("{target} ({application})");
    }
    let detail = unread.unwrap_or_else(|| {
        json["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    });
    if refused {
        let token = who.as_ref().map_or("-", |c| c.token.name.as_str());
        crate::refusals::note(status.as_u16(), token, method.as_str(), path, &detail);
    }
    record(
        records,
        Entry {
            who,
            action: action_of(method, template),
            target,
            outcome: status,
            detail,
        },
    )
    .await;
    Response::from_parts(parts, Body::from(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_name_their_actions() {
        for (method, template, expected) in [
            (Method::POST, "/api/v1/deploys", "deploy.submit"),
            (Method::POST, "/api/v1/deploys/batch", "deploy.submit_batch"),
            (Method::POST, "/api/v1/deploys/{id}/cancel", "deploy.cancel"),
            (
                Method::POST,
                "/api/v1/deploys/{id}/approve",
                "deploy.approve",
            ),
            (
                Method::POST,
                "/api/v1/executors/{id}/recover",
                "executor.recover",
            ),
            (Method::DELETE, "/api/v1/schedules/{id}", "schedule.delete"),
            (
                Method::POST,
                "/api/v1/schedules/{id}/pause",
                "schedule.pause",
            ),
            (
                Method::POST,
                "/api/v1/deploys/{id}/redeploy",
                "deploy.redeploy",
            ),
            (
                Method::POST,
                "/api/v1/apps/{tenant}/{app}/environments/{environment}/rollback",
                "app.rollback",
            ),
            (Method::POST, "/api/v1/tokens", "token.create"),
            (Method::DELETE, "/api/v1/tokens/{name}", "token.revoke"),
            (
                Method::GET,
                "/api/v1/deploys/{id}",
                "GET /api/v1/deploys/{id}",
            ),
        ] {
            assert_eq!(
                action_of(&method, template),
                expected,
                "{method} {template}"
            );
        }
    }

    #[test]
    fn the_target_is_the_path_parameter() {
        assert_eq!(
            target_of("/api/v1/deploys/{id}/cancel", "/api/v1/deploys/d-1/cancel"),
            "d-1",
            "the {{id}} segment is the target"
        );
        assert_eq!(
            target_of("/api/v1/deploys/{id}/cancel", "/deploys/d-1/cancel"),
            "d-1",
            "inside the nested router the path has lost /api/v1, the template has not"
        );
        assert_eq!(
            target_of(
                "/api/v1/apps/{tenant}/{app}/environments/{environment}/rollback",
                "/apps/acme/web/environments/prod/rollback"
            ),
            "acme/web/prod",
            "several parameters, in order"
        );
        assert_eq!(
            target_of("/api/v1/deploys", "/api/v1/deploys"),
            "",
            "a route without parameters has no target in its path"
        );
    }
}
