//! `manent`: the command-line client of the manent API. Plain tables by default;
//! `-o wide|json|yaml|name` everywhere. Exit codes: 0 success, 1 deploy failed, 2 usage
//! or bad input, 3 server unreachable or token refused, 4 not allowed (docs/cli.md).

mod client;
mod commands;
mod contexts;
mod drift;
mod follow;
mod ids;
mod render;

use std::{path::PathBuf, process::ExitCode};

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use manent_contract::{
    ApplicationView, AuditQuery, DeployStatus, QueueView, RedeployBody, Resubmitted, RollbackBody,
    ScheduleView, TenantView, WorkerView, WorkflowStatus,
};

use crate::{
    client::{Answer, ApiClient, CliError},
    follow::{Lines, decided, follow, follow_from},
    ids::{resolve_deploy, resolve_schedule},
    render::{Fit, Format, Style},
};

#[derive(Parser)]
#[command(
    name = "manent",
    version,
    about = "Durable deploys: submit, follow and operate them."
)]
struct Args {
    /// The API's base URL; without it (or MANENT_SERVER), the context's, else
    /// http://127.0.0.1:8080.
    #[arg(long, global = true, env = "MANENT_SERVER")]
    server: Option<String>,
    /// API token (`manent-server admin token create`).
    #[arg(long, global = true, env = "MANENT_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// A PEM file of the CA that signed the server's certificate (a private CA), trusted
    /// in addition to the system's roots for an `https://` server.
    #[arg(long, global = true, env = "MANENT_CA")]
    ca: Option<PathBuf>,
    /// The context to use instead of the current one (`manent context list`).
    #[arg(long, global = true, env = "MANENT_CONTEXT")]
    context: Option<String>,
    /// How answers are printed: `table` (short ids, relative times, cut to the terminal),
    /// `wide` (whole ids and times, more columns), `json` or `yaml` (the answer as sent;
    /// with `logs -f`, one document each), `name` (ids only, one per line).
    #[arg(long, short, global = true, value_enum, default_value_t = Format::Table)]
    output: Format,
    /// Tables without their header line.
    #[arg(long, global = true)]
    no_headers: bool,
    /// Only ids, one per line: `-o name`.
    #[arg(long, short, global = true)]
    quiet: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Submits a deploy descriptor (YAML or JSON); several `-f` submit them together.
    Deploy {
        /// The descriptor's file; `-` reads it from standard input. Repeated, the deploys
        /// are submitted at once (all of them are enqueued, or none if one is refused).
        #[arg(short, long, required = true)]
        file: Vec<PathBuf>,
        /// Waits for the deploy (each deploy) to end, showing its progress.
        #[arg(long)]
        wait: bool,
        /// Plans instead of acting: nothing changes on any target.
        #[arg(long)]
        dry_run: bool,
    },
    /// A deploy's status, targets and steps. IDs may be shortened to a unique prefix
    /// of 6 or more characters (of the 1,000 most recent deploys), here and below.
    Status {
        /// The deploy's id, or a unique prefix of it.
        id: String,
        /// Follows the deploy until it ends, printing each change, then its status.
        #[arg(long, short)]
        watch: bool,
    },
    /// Waits for a deploy to end, showing its progress (re-attaches after Ctrl-C of
    /// `deploy --wait`); exits 0 on SUCCESS, 1 otherwise.
    Wait {
        /// The deploy's id, or a unique prefix of it.
        id: String,
    },
    /// A deploy's log lines, in time order, with what its commands printed.
    Logs {
        /// The deploy's id, or a unique prefix of it.
        id: String,
        /// Follows a running deploy: its commands' output as they print it, until it ends.
        #[arg(long, short)]
        follow: bool,
    },
    /// Recent deploys.
    List {
        /// Only this application's deploys (`tenant/app`).
        #[arg(long)]
        application: Option<String>,
        /// Only deploys to this environment.
        #[arg(long)]
        environment: Option<String>,
        /// Only deploys in this status: ENQUEUED, PENDING, SUCCESS, ERROR or CANCELLED.
        #[arg(long)]
        status: Option<String>,
        /// At most this many, newest first.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Only deploys submitted before this one (its id or a unique prefix): the next page
        /// after a full one, whose last id `manent` prints on stderr.
        #[arg(long)]
        before: Option<String>,
    },
    /// Cancels a deploy.
    Cancel {
        /// The deploy's id, or a unique prefix of it.
        id: String,
    },
    /// Approves a deploy waiting for approval (counts once per approver).
    Approve {
        /// The deploy's id, or a unique prefix of it.
        id: String,
        /// A comment recorded with the approval.
        #[arg(long)]
        comment: Option<String>,
    },
    /// Rejects a deploy waiting for approval: it fails with the reason.
    Reject {
        /// The deploy's id, or a unique prefix of it.
        id: String,
        /// Why: recorded with the rejection and shown as the deploy's error.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Passes a deploy's analysis (docs/analysis.md): skips the rest of a bake, or goes on
    /// from `waiting_decision`; the next wave starts.
    Promote {
        /// The deploy's id, or a unique prefix of it.
        id: String,
    },
    /// Fails a deploy's analysis (docs/analysis.md): the deploy fails and
    /// `rollback.on_failure` applies.
    Abort {
        /// The deploy's id, or a unique prefix of it.
        id: String,
        /// Why: shown in the deploy's error.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Queues with their kinds, limits, depths and workers.
    Queues,
    /// Workers with their state, last heartbeat and running deploys.
    Workers,
    /// The token this CLI uses: its name, role and scope; the context in use and where
    /// the server, the token and the CA came from.
    Whoami,
    /// Named servers with their CA and token file, one of them current (like kubectl's).
    #[command(subcommand)]
    Context(contexts::commands::ContextCommand),
    /// Which worker runs each deploy, and recent events.
    Activity,
    /// Hands the pending deploys of an executor back to the queues. An
    /// executor that is alive (live lease) is refused unless --force.
    Recover {
        /// The executor id (`manent workers` lists them).
        #[arg(long)]
        executor: String,
        /// Recover even a live executor: its lease is revoked and its process
        /// stops (killing its commands) at its next renewal.
        #[arg(long)]
        force: bool,
    },
    /// Recurring deploys (`schedule.cron`) with their next tick.
    Schedules,
    /// Tenants, their queues and applications.
    Tenants,
    /// Applications (`tenant/app`) and their environments.
    Apps,
    /// Pauses, resumes or deletes a recurring deploy.
    #[command(subcommand)]
    Schedule(ScheduleCommand),
    /// One environment's deploys, newest first: version, status, who, when, duration.
    History {
        /// `tenant/app`.
        application: String,
        /// The environment, e.g. `prod`.
        environment: String,
        /// At most this many, newest first.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Only deploys submitted before this one (its id or a unique prefix): the next page.
        #[arg(long)]
        before: Option<String>,
    },
    /// What a deploy would change on each target, against the release manent recorded
    /// there: the descriptor submitted as a dry run (nothing changes on any target), its
    /// plan printed. Exits 0 when the dry run succeeded (docs/plan-and-drift.md).
    Plan {
        /// The descriptor's file; `-` reads it from standard input.
        #[arg(short, long)]
        file: PathBuf,
    },
    /// Each target of an environment compared with the release manent recorded there
    /// (in_sync, drifted, unreachable, unknown); exits 0 only when every target is in
    /// sync. Runs a check now (a token that may deploy), or with `--last` shows the last.
    Drift {
        /// `tenant/app`.
        application: String,
        /// The environment, e.g. `prod`.
        environment: String,
        /// The last check's result instead of a check now (a token that may read).
        #[arg(long)]
        last: bool,
    },
    /// Deploys the live version again to the targets the last drift check found drifted,
    /// as a deploy like any other (approvals, limits, routing, audit).
    Reconcile {
        /// `tenant/app`.
        application: String,
        /// The environment, e.g. `prod`.
        environment: String,
        /// Waits for the deploy to end, showing its progress.
        #[arg(long)]
        wait: bool,
    },
    /// Each variable's effective value per target of an environment, and where it came
    /// from (`environment`, `region eu`, `target web-2`, ...); secrets as `***` with their
    /// provider. Needs a token that may deploy the application.
    Vars {
        /// `tenant/app`.
        application: String,
        /// The environment, e.g. `prod`.
        environment: String,
        /// Only this target's variables.
        #[arg(long)]
        target: Option<String>,
    },
    /// Deploys an earlier successful version again, with the artifacts (URLs, sha256) its
    /// deploy recorded; by default the version before the one live now. Approvals,
    /// dependencies, routing and limits apply as to any deploy.
    Rollback {
        /// `tenant/app`.
        application: String,
        /// The environment, e.g. `prod`.
        environment: String,
        /// The version to return to (the newest successful deploy of it).
        #[arg(long)]
        to: Option<String>,
        /// Waits for the rollback to end, showing its progress.
        #[arg(long)]
        wait: bool,
        /// Reactivates the release in place on each target that still holds it
        /// (`deploy.keep_releases` of 2 or more keeps it): every target at once,
        /// `max_parallel` at a time, no waves or pauses, checks after; remote-copy only.
        #[arg(long)]
        fast: bool,
        /// Goes back past the environment's newest irreversible deploy anyway (a version
        /// from before a destructive migration, say); recorded in the audit trail.
        #[arg(long)]
        force: bool,
    },
    /// Submits a past deploy's recorded descriptor again, as it was (now, without its
    /// schedule).
    Redeploy {
        /// The past deploy's id, or a unique prefix of it.
        id: String,
        /// Waits for the new deploy to end, showing its progress.
        #[arg(long)]
        wait: bool,
        /// Deploys it again even if that goes back past the environment's newest
        /// irreversible deploy; recorded in the audit trail.
        #[arg(long)]
        force: bool,
    },
    /// Checks environment files before they are committed, without a server: every problem
    /// with its file, line and key. Exits 0 when all are valid, 2 otherwise.
    Validate {
        /// Environment files; the application and environment are read from the path
        /// (`<tenant>/<app>/<environment>.yml`, as under `environments.source`).
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Prints the completion script for SHELL on stdout, e.g.
    /// `manent completion bash > /etc/bash_completion.d/manent`.
    Completion {
        /// bash, elvish, fish, powershell or zsh.
        shell: clap_complete::Shell,
    },
    /// The audit trail, newest first: changes and refused requests (admin only).
    /// Filters combine; `--before SEQ` pages back from the last entry shown.
    Audit {
        /// At most this many entries, newest first.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Entries at or after this time: RFC 3339 or a duration ago (`1h`, `7d`).
        #[arg(long)]
        since: Option<String>,
        /// Entries before this time: RFC 3339 or a duration ago.
        #[arg(long)]
        until: Option<String>,
        /// One token's entries, by name (`-`: requests without a valid token).
        #[arg(long)]
        actor: Option<String>,
        /// One action, exactly (`deploy.submit`, `auth.failures`).
        #[arg(long)]
        action: Option<String>,
        /// Entries older than the one with this seq (the next page).
        #[arg(long)]
        before: Option<i64>,
    },
}

#[derive(Subcommand)]
enum ScheduleCommand {
    /// No new tick until resumed (the ticks during the pause are not run).
    Pause {
        /// The schedule's id, or a unique prefix of it (`manent schedules` lists them).
        id: String,
    },
    /// Ticks again from the next one.
    Resume {
        /// The schedule's id, or a unique prefix of it (`manent schedules` lists them).
        id: String,
    },
    /// Deletes it; deploys it already started are left as they are.
    Delete {
        /// The schedule's id, or a unique prefix of it (`manent schedules` lists them).
        id: String,
    },
}

fn main() -> ExitCode {
    let matches = Args::command().get_matches();
    let args = Args::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // Where each of --server, --token, --ca and --context came from: the precedence of
    // contexts (docs/cli.md, "Contexts").
    let given = contexts::settings::Given::of(&matches);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("manent: cannot start: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(run(args, given)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            // The server's message may quote a target's output.
            eprintln!("manent: {}", render::terminal_safe(&e.to_string()));
            ExitCode::from(e.exit_code())
        }
    }
}

/// How the answers are shown: `--output`, `-q`, `--no-headers`, the width, the clock.
fn style_of(args: &Args) -> Style {
    Style {
        format: if args.quiet {
            Format::Name
        } else {
            args.output
        },
        headers: !args.no_headers,
        fit: fit(),
        now: chrono::Utc::now(),
    }
}

async fn run(args: Args, given: contexts::settings::Given) -> Result<u8, CliError> {
    if let Command::Completion { shell } = args.command {
        clap_complete::generate(
            shell,
            &mut Args::command(),
            "manent",
            &mut std::io::stdout(),
        );
        return Ok(0);
    }
    if let Command::Validate { files } = &args.command {
        return Ok(validate(files));
    }
    let style = &style_of(&args);
    let contexts_file = contexts::file::path();
    if let Command::Context(command) = args.command {
        return contexts::commands::run(command, &given, contexts_file.as_deref(), style);
    }
    let settings = contexts::settings::resolve(&given, contexts_file.as_deref())?;
    let api = &settings.client()?;
    match args.command {
        Command::Deploy {
            file,
            wait,
            dry_run,
        } => commands::deploy(api, &file, wait, dry_run, style).await,
        Command::Status { id, watch } => commands::status(api, &id, watch, style).await,
        Command::Wait { id } => commands::wait(api, &id, style).await,
        Command::Logs { id, follow } => commands::logs(api, &id, follow, style).await,
        Command::List {
            application,
            environment,
            status,
            limit,
            before,
        } => {
            let filter = commands::ListFilter {
                application,
                environment,
                status,
                before,
            };
            commands::list(api, filter, limit, style).await
        }
        Command::Cancel { id } => commands::cancel(api, &id, style).await,
        Command::Approve { id, comment } => {
            commands::decide(api, &id, "/approve", comment, style).await
        }
        Command::Reject { id, reason } => {
            commands::decide(api, &id, "/reject", reason, style).await
        }
        Command::Promote { id } => commands::decide(api, &id, "/promote", None, style).await,
        Command::Abort { id, reason } => commands::decide(api, &id, "/abort", reason, style).await,
        Command::Queues => {
            commands::show::<Vec<QueueView>, _>(api, "/api/v1/queues", style, render::queues).await
        }
        Command::Workers => {
            commands::show::<Vec<WorkerView>, _>(api, "/api/v1/workers", style, render::workers)
                .await
        }
        Command::Whoami => contexts::commands::whoami(api, &settings, style).await,
        Command::Activity => {
            commands::show::<Vec<DeployStatus>, _>(api, "/api/v1/activity", style, render::activity)
                .await
        }
        Command::Recover { executor, force } => {
            commands::recover(api, &executor, force, style).await
        }
        Command::Tenants => {
            commands::show::<Vec<TenantView>, _>(api, "/api/v1/tenants", style, render::tenants)
                .await
        }
        Command::Apps => {
            let path = "/api/v1/apps";
            commands::show::<Vec<ApplicationView>, _>(api, path, style, render::applications).await
        }
        Command::Schedules => {
            let path = "/api/v1/schedules";
            commands::show::<Vec<ScheduleView>, _>(api, path, style, render::schedules).await
        }
        Command::Schedule(ScheduleCommand::Pause { id }) => {
            commands::schedule_action(api, &id, "pause", style).await
        }
        Command::Schedule(ScheduleCommand::Resume { id }) => {
            commands::schedule_action(api, &id, "resume", style).await
        }
        Command::Schedule(ScheduleCommand::Delete { id }) => {
            commands::schedule_delete(api, &id, style).await
        }
        Command::History {
            application,
            environment,
            limit,
            before,
        } => commands::history(api, (&application, &environment), limit, before, style).await,
        command @ (Command::Plan { .. } | Command::Drift { .. } | Command::Reconcile { .. }) => {
            drift::dispatch(api, command, style).await
        }
        Command::Vars {
            application,
            environment,
            target,
        } => commands::vars(api, (&application, &environment), target, style).await,
        Command::Rollback {
            application,
            environment,
            to,
            wait,
            fast,
            force,
        } => {
            let path = environment_path(&application, &environment, "rollback")?;
            let body = RollbackBody { to, fast, force };
            let created: Answer<Resubmitted> = api.post(&path, &body).await?;
            resubmitted(api, created, wait, style).await
        }
        Command::Redeploy { id, wait, force } => {
            let id = resolve_deploy(api, &id).await?;
            let body = RedeployBody { force };
            let created: Answer<Resubmitted> =
                api.post(&deploy_path(&id, "/redeploy"), &body).await?;
            resubmitted(api, created, wait, style).await
        }
        Command::Completion { .. } | Command::Validate { .. } | Command::Context(_) => {
            unreachable!("handled before the client is built")
        }
        Command::Audit {
            limit,
            since,
            until,
            actor,
            action,
            before,
        } => {
            let query = AuditQuery {
                limit: Some(i64::from(limit)),
                since,
                until,
                actor,
                action,
                before,
            };
            commands::audit(api, &query, limit, style).await
        }
    }
}

/// How wide tables may be: `COLUMNS` when it is set (as shells and `watch` set it), the
/// terminal's width when stdout is one, full lines into a pipe or a file.
fn fit() -> Fit {
    use std::io::IsTerminal;
    match std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse::<u16>().ok())
    {
        Some(columns) if columns > 0 => Fit::Columns(columns),
        _ if std::io::stdout().is_terminal() => Fit::Terminal,
        _ => Fit::Unlimited,
    }
}

/// After a full page of deploys shown to people, the cursor of the next one, on stderr so
/// that stdout stays the table.
fn more(style: &Style, page: &[DeployStatus], limit: u32, command: &str) {
    if !style.is_document()
        && style.format != Format::Name
        && page.len() == limit as usize
        && let Some(last) = page.last()
    {
        // The whole id: a prefix is looked for among the 1,000 newest deploys only.
        eprintln!("more: {command} ... --before {}", last.id);
    }
}

/// `/api/v1/apps/<tenant>/<app>/environments/<environment>/<rest>`, each part encoded as
/// one path segment.
fn environment_path(application: &str, environment: &str, rest: &str) -> Result<String, CliError> {
    let Some((tenant, app)) = application.split_once('/') else {
        return Err(CliError::Usage(format!(
            "application `{application}` must be qualified with its tenant, as `tenant/app`"
        )));
    };
    Ok(format!(
        "/api/v1/apps/{}/{}/environments/{}/{rest}",
        client::segment(tenant),
        client::segment(app),
        client::segment(environment)
    ))
}

/// Prints a rollback's or redeploy's new deploy, or with `wait` follows it and prints its
/// final status (exit 0 on SUCCESS, 1 otherwise).
async fn resubmitted(
    api: &ApiClient,
    created: Answer<Resubmitted>,
    wait: bool,
    style: &Style,
) -> Result<u8, CliError> {
    if !wait {
        render::print(style, &created, render::resubmitted);
        return Ok(0);
    }
    if !style.is_document() {
        eprintln!("{}", render::resubmitted(style, &created.body));
    }
    let status = follow(api, &created.body.submitted.id, style).await?;
    render::print(style, &status, render::status);
    Ok(exit_code_of(&status))
}

/// The exit code of a deploy that ended: 0 on SUCCESS, 1 otherwise.
/// A descriptor's text from `file`, or from standard input for `-`.
fn read_descriptor(file: &std::path::Path) -> Result<String, CliError> {
    if file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())
            .map_err(|e| CliError::Usage(format!("cannot read standard input: {e}")))
    } else {
        std::fs::read_to_string(file)
            .map_err(|e| CliError::Usage(format!("cannot read {}: {e}", file.display())))
    }
}

fn exit_code_of(status: &Answer<DeployStatus>) -> u8 {
    if status.body.status == WorkflowStatus::Success {
        0
    } else {
        1
    }
}

/// `/api/v1/deploys/<id><rest>`, the id encoded as one path segment.
fn deploy_path(id: &str, rest: &str) -> String {
    format!("/api/v1/deploys/{}{rest}", client::segment(id))
}

/// `manent validate`: each file parsed and checked as the server would; 0 when all are
/// valid, 2 otherwise (each problem printed on stderr).
fn validate(files: &[PathBuf]) -> u8 {
    let mut valid = true;
    for file in files {
        let (application, environment) = names_of(file);
        let shown = file.display().to_string();
        let checked = std::fs::read_to_string(file)
            .map_err(|e| format!("{shown}: cannot read it: {e}"))
            .and_then(|text| {
                // Its templates are read beside it, as the server reads them.
                let dir = file.parent().unwrap_or(std::path::Path::new("."));
                manent_model::parse_environment_in(&text, &shown, &application, &environment, dir)
                    .map_err(|e| e.to_string())
            });
        match checked {
            Ok(_) => println!("{shown}: valid ({application}, environment {environment})"),
            Err(problems) => {
                valid = false;
                eprintln!("{}", render::terminal_safe(&problems));
            }
        }
    }
    if valid { 0 } else { 2 }
}

/// The application and environment a file's path names: `…/<tenant>/<app>/<env>.yml`.
fn names_of(file: &std::path::Path) -> (String, String) {
    let environment = file
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let dirs: Vec<String> = file
        .parent()
        .into_iter()
        .flat_map(|p| p.iter())
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    let application = match dirs.as_slice() {
        [.., tenant, app] => format!("{tenant}/{app}"),
        [app] => app.clone(),
        [] => String::new(),
    };
    (application, environment)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_files_path_names_its_application_and_environment() {
        let check = |path: &str, app: &str, env: &str| {
            assert_eq!(
                names_of(std::path::Path::new(path)),
                (app.to_string(), env.to_string()),
                "{path}"
            );
        };
        check("environments/acme/web/prod.yml", "acme/web", "prod");
        check("/srv/envs/ml/trainer/staging.yaml", "ml/trainer", "staging");
        check("prod.yml", "", "prod");
    }

    /// Every subcommand and every argument of `cmd` and below without help text, by path.
    fn undocumented(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            if matches!(id, "help" | "version") || arg.is_hide_set() {
                continue;
            }
            if arg.get_help().is_none() && arg.get_long_help().is_none() {
                missing.push(format!("{path} <{id}>"));
            }
        }
        for sub in cmd.get_subcommands() {
            let sub_path = format!("{path} {}", sub.get_name());
            if sub.get_about().is_none() && sub.get_long_about().is_none() {
                missing.push(sub_path.clone());
            }
            undocumented(sub, &sub_path, missing);
        }
    }

    #[test]
    fn every_subcommand_and_argument_has_help() {
        let mut missing = Vec::new();
        undocumented(&Args::command(), "manent", &mut missing);
        assert!(
            missing.is_empty(),
            "give these a doc comment (their --help line): {missing:?}"
        );
    }

    #[test]
    fn no_usage_line_makes_server_or_token_look_required() {
        let mut cmd = Args::command();
        cmd.build();
        let mut usages = vec![cmd.render_usage().to_string()];
        for sub in cmd.get_subcommands_mut() {
            usages.push(sub.render_usage().to_string());
        }
        for usage in usages {
            assert!(
                !usage.contains("--server") && !usage.contains("--token"),
                "--server and --token have defaults (and MANENT_SERVER, MANENT_TOKEN): {usage}"
            );
        }
    }
}
