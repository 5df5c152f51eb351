//! What each `manent` command does once its arguments are parsed: the request it sends,
//! what it prints and the exit code it returns (docs/cli.md). `main.rs` parses and
//! dispatches; the helpers the commands share (following a deploy, resolving an id
//! prefix) stay beside the dispatch there.

use std::path::PathBuf;

use manent_contract::{
    AuditEntry, AuditQuery, BatchEntry, DecisionBody, DeployLogs, DeployStatus, Recovered,
    ScheduleDeleted, ScheduleView, Submitted, SubmittedStatus,
};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::{
    Lines, client,
    client::{Answer, ApiClient, CliError},
    decided, deploy_path, environment_path, exit_code_of, follow, follow_from, more,
    read_descriptor, render,
    render::{Names, Style},
    resolve_deploy, resolve_schedule,
};

/// `manent deploy -f F… [--wait] [--dry-run]`.
pub async fn deploy(
    api: &ApiClient,
    files: &[PathBuf],
    wait: bool,
    dry_run: bool,
    style: &Style,
) -> Result<u8, CliError> {
    if files.len() > 1 {
        return deploy_many(api, files, wait, dry_run, style).await;
    }
    let file = &files[0];
    let text = read_descriptor(file)?;
    let created = api.submit(&text, file, dry_run).await?;
    // A recurring schedule has no single deploy to wait for: `manent schedules` shows it.
    if !wait || created.body.status == SubmittedStatus::Scheduled {
        render::print(style, &created, render::submitted);
        return Ok(0);
    }
    let status = follow(api, &created.body.id, style).await?;
    render::print(style, &status, render::status);
    Ok(exit_code_of(&status))
}

/// `manent deploy -f A -f B …`: one bulk submission; with `--wait`, follows each deploy in
/// turn and exits 0 only if every one succeeded.
async fn deploy_many(
    api: &ApiClient,
    files: &[PathBuf],
    wait: bool,
    dry_run: bool,
    style: &Style,
) -> Result<u8, CliError> {
    if files.iter().filter(|f| f.as_os_str() == "-").count() > 1 {
        return Err(CliError::Usage(
            "-f -: standard input can be read once; give the other descriptors as files".into(),
        ));
    }
    let mut entries = Vec::with_capacity(files.len());
    for file in files {
        entries.push(BatchEntry {
            descriptor: read_descriptor(file)?,
            file: Some(file.display().to_string()),
        });
    }
    let created = api.submit_batch(entries, dry_run).await?;
    if !wait {
        render::print(style, &created, |style, all: &Vec<Submitted>| {
            all.iter()
                .map(|s| render::submitted(style, s))
                .collect::<Vec<_>>()
                .join("\n")
        });
        return Ok(0);
    }
    let mut statuses = Vec::with_capacity(created.body.len());
    for submitted in &created.body {
        statuses.push(follow(api, &submitted.id, style).await?);
    }
    let code = statuses.iter().map(exit_code_of).max().unwrap_or(0);
    let all = Answer {
        json: Value::Array(statuses.iter().map(|s| s.json.clone()).collect()),
        body: statuses.into_iter().map(|s| s.body).collect::<Vec<_>>(),
    };
    render::print(style, &all, |style, all: &Vec<DeployStatus>| {
        all.iter()
            .map(|d| render::status(style, d))
            .collect::<Vec<_>>()
            .join("\n")
    });
    Ok(code)
}

/// `manent status ID [--watch]`.
pub async fn status(api: &ApiClient, id: &str, watch: bool, style: &Style) -> Result<u8, CliError> {
    let id = resolve_deploy(api, id).await?;
    let status: Answer<DeployStatus> = if watch {
        follow(api, &id, style).await?
    } else {
        api.get(&deploy_path(&id, "")).await?
    };
    render::print(style, &status, render::status);
    Ok(0)
}

/// `manent wait ID`: the exit code of the deploy's end.
pub async fn wait(api: &ApiClient, id: &str, style: &Style) -> Result<u8, CliError> {
    let id = resolve_deploy(api, id).await?;
    let status = follow(api, &id, style).await?;
    render::print(style, &status, render::status);
    Ok(exit_code_of(&status))
}

/// `manent logs ID [-f]`.
pub async fn logs(api: &ApiClient, id: &str, follow: bool, style: &Style) -> Result<u8, CliError> {
    let id = resolve_deploy(api, id).await?;
    let logs: Answer<DeployLogs> = api.get(&deploy_path(&id, "/logs")).await?;
    if !follow {
        render::print(style, &logs, render::logs);
        return Ok(0);
    }
    // With -o json: one JSON document per line (the logs, then each output
    // line), so a reader can parse as it goes; with -o yaml, one YAML document each.
    if style.is_document() {
        render::print_line(&render::document(style, &logs.json));
    } else {
        render::print(style, &logs, render::logs);
    }
    let after = logs.body.output_seq;
    // For people, what `logs` shows besides the output (steps, recoveries, targets,
    // where the deploy stands) is printed as it changes, each line once.
    let mut seen: std::collections::HashSet<String> = logs.body.lines.iter().cloned().collect();
    let log = (!style.is_document()).then_some(&mut seen);
    follow_from(api, &id, style, after, Lines::Stdout, log).await?;
    Ok(0)
}

/// The filters of `manent list`.
pub struct ListFilter {
    pub application: Option<String>,
    pub environment: Option<String>,
    pub status: Option<String>,
    /// A deploy id (or prefix): the page starts after it.
    pub before: Option<String>,
}

/// `manent list [--application A] [--environment E] [--status S] [--limit N] [--before ID]`.
pub async fn list(
    api: &ApiClient,
    filter: ListFilter,
    limit: u32,
    style: &Style,
) -> Result<u8, CliError> {
    let mut query = vec![("limit", limit.to_string())];
    query.extend(filter.application.map(|a| ("application", a)));
    query.extend(filter.environment.map(|e| ("environment", e)));
    query.extend(filter.status.map(|s| ("status", s)));
    if let Some(before) = filter.before {
        query.push(("before", resolve_deploy(api, &before).await?));
    }
    let list: Answer<Vec<DeployStatus>> = api.get_query("/api/v1/deploys", &query).await?;
    render::print(style, &list, render::deploys);
    more(style, &list.body, limit, "manent list");
    Ok(0)
}

/// `manent cancel ID`.
pub async fn cancel(api: &ApiClient, id: &str, style: &Style) -> Result<u8, CliError> {
    let id = resolve_deploy(api, id).await?;
    let out: Answer<Submitted> = api.post(&deploy_path(&id, "/cancel"), &()).await?;
    render::print(style, &out, render::submitted);
    Ok(0)
}

/// `manent approve ID [--comment C]` (`action` `/approve`) and `manent reject ID [--reason R]`
/// (`/reject`): the deploy as it stands once the decision is taken into account.
pub async fn decide(
    api: &ApiClient,
    id: &str,
    action: &str,
    reason: Option<String>,
    style: &Style,
) -> Result<u8, CliError> {
    let id = resolve_deploy(api, id).await?;
    let body = DecisionBody { reason };
    let before: Answer<DeployStatus> = api.post(&deploy_path(&id, action), &body).await?;
    let after = decided(api, &id, &before.body).await?;
    render::print(style, &after, render::status);
    Ok(0)
}

/// A command that reads one resource and prints it (`queues`, `workers`, `whoami`, …).
pub async fn show<T, B>(
    api: &ApiClient,
    path: &str,
    style: &Style,
    human: impl Fn(&Style, &B) -> String,
) -> Result<u8, CliError>
where
    T: DeserializeOwned + std::borrow::Borrow<B>,
    B: ?Sized + Names,
{
    let answer: Answer<T> = api.get(path).await?;
    render::print(style, &answer, human);
    Ok(0)
}

/// `manent recover --executor ID [--force]`.
pub async fn recover(
    api: &ApiClient,
    executor: &str,
    force: bool,
    style: &Style,
) -> Result<u8, CliError> {
    let query = if force { "?force=true" } else { "" };
    let path = format!(
        "/api/v1/executors/{}/recover{query}",
        client::segment(executor)
    );
    let out: Answer<Recovered> = api.post(&path, &()).await?;
    render::print(style, &out, render::recovered);
    Ok(0)
}

/// `manent schedule pause|resume ID` (`action` `pause` or `resume`).
pub async fn schedule_action(
    api: &ApiClient,
    id: &str,
    action: &str,
    style: &Style,
) -> Result<u8, CliError> {
    let id = resolve_schedule(api, id).await?;
    let path = format!("/api/v1/schedules/{}/{action}", client::segment(&id));
    let out: Answer<ScheduleView> = api.post(&path, &()).await?;
    render::print(style, &out, render::schedule);
    Ok(0)
}

/// `manent schedule delete ID`.
pub async fn schedule_delete(api: &ApiClient, id: &str, style: &Style) -> Result<u8, CliError> {
    let id = resolve_schedule(api, id).await?;
    let out: Answer<ScheduleDeleted> = api
        .delete(&format!("/api/v1/schedules/{}", client::segment(&id)))
        .await?;
    render::print(style, &out, render::schedule_deleted);
    Ok(0)
}

/// `manent history APP ENV [--limit N] [--before ID]`.
pub async fn history(
    api: &ApiClient,
    (application, environment): (&str, &str),
    limit: u32,
    before: Option<String>,
    style: &Style,
) -> Result<u8, CliError> {
    let path = environment_path(application, environment, "history")?;
    let mut query = vec![("limit", limit.to_string())];
    if let Some(before) = before {
        query.push(("before", resolve_deploy(api, &before).await?));
    }
    let list: Answer<Vec<DeployStatus>> = api.get_query(&path, &query).await?;
    render::print(style, &list, render::history);
    more(style, &list.body, limit, "manent history");
    Ok(0)
}

/// `manent vars APP ENV [--target T]`: each variable of each target, its value and source.
pub async fn vars(
    api: &ApiClient,
    (application, environment): (&str, &str),
    target: Option<String>,
    style: &Style,
) -> Result<u8, CliError> {
    let path = environment_path(application, environment, "vars")?;
    let query: Vec<(&str, String)> = target.into_iter().map(|t| ("target", t)).collect();
    let rows: Answer<Vec<manent_contract::VariableView>> = api.get_query(&path, &query).await?;
    render::print(style, &rows, render::variables);
    Ok(0)
}

/// `manent audit [filters]`: one page, and on stderr the command for the next.
pub async fn audit(
    api: &ApiClient,
    query: &AuditQuery,
    limit: u32,
    style: &Style,
) -> Result<u8, CliError> {
    let entries: Answer<Vec<AuditEntry>> = api.get_query("/api/v1/audit", query).await?;
    render::print(style, &entries, render::audit);
    // The cursor of the next page, on stderr so that stdout stays the table.
    if !style.is_document()
        && entries.body.len() == limit as usize
        && let Some(last) = entries.body.last()
    {
        eprintln!("more: manent audit ... --before {}", last.seq);
    }
    Ok(0)
}
