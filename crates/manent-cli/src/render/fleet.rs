//! How the CLI prints the fleet and its operation (docs/cli.md): queues, workers, activity,
//! schedules, the caller (`whoami`), tenants and what runs where (`apps`, with each
//! environment's drift). The formats and the table machinery are render.rs's.

use super::*;

pub fn queues(style: &Style, queues: &[QueueView]) -> String {
    table(
        style,
        queues,
        &[
            "name",
            "kind",
            "concurrency",
            "environment_concurrency",
            "global_concurrency",
            "enqueued",
            "running",
            "in_use",
            "workers",
        ],
        |q| {
            // One column with each limit's use, e.g. `worker 3/4, env 1/1, total 5/8,
            // queue 2/2`.
            let used: Vec<String> = q
                .limits
                .iter()
                .map(|l| {
                    let short = match l.key.as_str() {
                        "dbos.concurrency" => "worker",
                        "dbos.environment_concurrency" => "env",
                        "dbos.global_concurrency" => "total",
                        _ => "queue",
                    };
                    format!("{short} {}/{}", l.in_use, l.limit.cell())
                })
                .collect();
            vec![
                q.name.cell(),
                q.kind.cell(),
                q.concurrency.cell(),
                q.environment_concurrency.cell(),
                q.global_concurrency.cell(),
                q.enqueued.cell(),
                q.running.cell(),
                used.join(", ").cell(),
                q.workers.cell(),
            ]
        },
    )
}

pub fn workers(style: &Style, workers: &[WorkerView]) -> String {
    table(
        style,
        workers,
        &[
            "executor_id",
            "host",
            "region",
            "state",
            "heartbeat_at",
            "running",
            "stale",
            "version",
        ],
        |w| {
            vec![
                w.executor_id.cell(),
                w.host.cell(),
                w.region.cell(),
                w.state.cell(),
                style.time(Some(&w.heartbeat_at)),
                w.running.cell(),
                w.stale.cell(),
                w.version.cell(),
            ]
        },
    )
}

/// `manent activity`: which worker runs what, most recently changed first.
pub fn activity(style: &Style, deploys: &[DeployStatus]) -> String {
    deploy_table(
        style,
        deploys,
        &["executor_id", "updated_at"],
        &["dry_run", "duration"],
        |d| {
            vec![
                d.executor_id.cell(),
                style.time(Some(&d.updated_at)),
                d.dry_run.cell(),
                duration_cell(d),
            ]
        },
    )
}

pub fn schedules(style: &Style, schedules: &[ScheduleView]) -> String {
    let (unreadable, readable): (Vec<&ScheduleView>, Vec<&ScheduleView>) =
        schedules.iter().partition(|s| s.error.is_some());
    let table = table(
        style,
        &readable,
        &[
            "id",
            "application",
            "environment",
            "cron",
            "timezone",
            "next_tick",
            "last_tick",
            "paused",
            "queue",
        ],
        |s| {
            vec![
                style.id(&s.id),
                s.application.cell(),
                s.environment.cell(),
                s.cron.cell(),
                s.timezone.cell(),
                style.time(s.next_tick.as_deref()),
                style.time(s.last_tick.as_deref()),
                s.paused.cell(),
                s.queue.cell(),
            ]
        },
    );
    // A stored schedule that cannot be read is listed with its reason, below the table.
    let unreadable: String = unreadable
        .iter()
        .map(|s| {
            format!(
                "\nschedule {} cannot be read: {}",
                s.id.cell(),
                s.error.cell()
            )
        })
        .collect();
    // The latest refused tick of each schedule, with its reason, below the table too.
    let refused: String = readable
        .iter()
        .filter_map(|s| s.refused_ticks.last().map(|r| (s, r)))
        .map(|(s, r)| {
            format!(
                "\nschedule {}: tick {} refused: {}",
                style.id(&s.id),
                r.tick.cell(),
                r.reason.cell()
            )
        })
        .collect();
    table + &unreadable + &refused
}

pub fn schedule(style: &Style, s: &ScheduleView) -> String {
    let refused: String = s
        .refused_ticks
        .iter()
        .map(|r| format!("\n  tick {} refused: {}", r.tick.cell(), r.reason.cell()))
        .collect();
    format!(
        "schedule {}  {} / {}  cron {} ({})  {}  next tick {}{refused}",
        s.id.cell(),
        s.application.cell(),
        s.environment.cell(),
        s.cron.cell(),
        s.timezone.cell(),
        if s.paused { "paused" } else { "active" },
        style.time(s.next_tick.as_deref()),
    )
}

pub fn schedule_deleted(_: &Style, s: &ScheduleDeleted) -> String {
    format!(
        "schedule {} {}",
        s.id.cell(),
        if s.deleted {
            "deleted"
        } else {
            "was already gone"
        }
    )
}

pub fn whoami(style: &Style, me: &WhoAmI) -> String {
    table(
        style,
        std::slice::from_ref(me),
        &["name", "role", "scope"],
        |m| {
            vec![
                m.name.cell(),
                m.role.cell(),
                m.scope.as_deref().unwrap_or("*").cell(),
            ]
        },
    )
}

pub fn tenants(style: &Style, tenants: &[TenantView]) -> String {
    table(
        style,
        tenants,
        &["name", "queue", "declared", "applications"],
        |t| {
            vec![
                t.name.cell(),
                t.queue.cell(),
                t.declared.cell(),
                t.applications.cell(),
            ]
        },
    )
}

/// An environment's last drift check in `manent apps`: `in_sync 2m ago`, `drifted 2 of 3
/// targets 5s ago`, `-` when none ran.
fn drift_cell(style: &Style, check: Option<&manent_contract::DriftCheckView>) -> String {
    let Some(check) = check else {
        return "-".to_string();
    };
    let state = match check.drifted_targets {
        0 => check.state.to_string(),
        n => format!("drifted {n} of {} targets", check.targets),
    };
    format!("{} {}", state.cell(), style.time(Some(&check.checked_at)))
}

/// What runs where (`manent apps`): one row per application and environment, with the
/// version live there, since when and the deploy that put it there.
pub fn applications(style: &Style, applications: &[ApplicationView]) -> String {
    let rows: Vec<(&ApplicationView, &String)> = applications
        .iter()
        .flat_map(|a| a.environments.iter().map(move |e| (a, e)))
        .collect();
    let mut columns = vec!["application", "environment", "live", "since", "deploy"];
    // Under the container plugin, the container that runs the live version (docs/containers.md).
    let containers = rows
        .iter()
        .any(|(a, e)| a.live.get(*e).is_some_and(|l| l.container.is_some()));
    if containers {
        columns.push("container");
    }
    // Each environment's last drift check (docs/plan-and-drift.md), once any ran.
    let drift = rows.iter().any(|(a, _)| !a.drift_checks.is_empty());
    if drift {
        columns.push("drift");
    }
    if style.wide() {
        columns.push("tenant");
    }
    let mut out = table(style, &rows, &columns, |(a, environment)| {
        let live = a.live.get(*environment);
        let mut cells = vec![
            a.application.cell(),
            environment.cell(),
            live.map(|l| l.version.cell()).cell(),
            match live {
                Some(l) => style.time(l.finished_at.as_deref()),
                None => "-".to_string(),
            },
            style.id_or_dash(live.map(|l| l.deploy_id.as_str())),
        ];
        if containers {
            cells.push(live.and_then(|l| l.container.clone()).cell());
        }
        if drift {
            cells.push(drift_cell(style, a.drift_checks.get(*environment)));
        }
        if style.wide() {
            cells.push(a.tenant.cell());
        }
        cells
    });
    // An application without environment files has no row above: named below it.
    let bare: Vec<String> = applications
        .iter()
        .filter(|a| a.environments.is_empty())
        .map(|a| a.application.cell())
        .collect();
    if !bare.is_empty() {
        out.push_str(&format!("\nwithout environments: {}", bare.join(", ")));
    }
    out
}
