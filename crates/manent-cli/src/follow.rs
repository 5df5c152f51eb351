//! Following a deploy as it runs (`deploy --wait`, `wait`, `status --watch`, `logs -f`,
//! an approval's answer): its status polled until it ends, its progress and output lines
//! printed as they come, a server restarting meanwhile waited for.

use std::time::Duration;

use manent_contract::{DeployLogs, DeployOutput, DeployStatus};

use crate::{
    client::{Answer, ApiClient, CliError},
    deploy_path, render,
    render::Style,
};

/// The deploy's status once the approval or rejection just sent shows in it: the
/// workflow records a decision moments after the API accepts it. Gives up after 10 s
/// and shows what it has.
pub async fn decided(
    api: &ApiClient,
    id: &str,
    before: &DeployStatus,
) -> Result<Answer<DeployStatus>, CliError> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let now: Answer<DeployStatus> = api.get(&deploy_path(id, "")).await?;
        // The decision is counted, and what the deploy waits for says so (`2 of 3`, or
        // nothing once the last approval is in): never the count from before it.
        let moved = (now.body.approvals.len() > before.approvals.len()
            && now.body.waiting_for != before.waiting_for)
            || now.body.phase != before.phase
            || now.body.status != before.status;
        if moved || tokio::time::Instant::now() >= deadline {
            return Ok(now);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// How long `--wait`, `wait` and `status --watch` keep retrying a server that cannot be
/// reached or is unavailable (a restart, a failover) before giving up.
pub const OUTAGE_LIMIT: Duration = Duration::from_secs(300);

/// Where a follower prints the deploy's output lines.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Lines {
    /// Not at all (`--output json` of `deploy --wait`, `wait`, `status --watch`).
    Nowhere,
    /// On stderr, beside the progress lines (`deploy --wait`, `wait`, `status --watch`).
    Stderr,
    /// On stdout: they are what `logs -f` prints.
    Stdout,
}

/// Polls the deploy until it ends, printing a line whenever its phase or a
/// target's status changes and its commands' output as they print it (on stderr,
/// so `--output json` stays parseable). A server that cannot be reached for a
/// while (restarting) is waited for, up to `OUTAGE_LIMIT`, saying so once.
pub async fn follow(
    api: &ApiClient,
    id: &str,
    style: &Style,
) -> Result<Answer<DeployStatus>, CliError> {
    let lines = if style.is_document() {
        Lines::Nowhere
    } else {
        Lines::Stderr
    };
    follow_from(api, id, style, 0, lines, None).await
}

/// As `follow`, printing output lines after `after` to `lines`, and with `log` the deploy's
/// log lines not in it yet (then added), on stdout.
pub async fn follow_from(
    api: &ApiClient,
    id: &str,
    style: &Style,
    mut after: i64,
    lines: Lines,
    mut log: Option<&mut std::collections::HashSet<String>>,
) -> Result<Answer<DeployStatus>, CliError> {
    let mut last = String::new();
    let mut outage_since: Option<tokio::time::Instant> = None;
    let following = tokio::time::Instant::now();
    // Whether the server holds a status until the deploy ends (`wait_ms`): assumed until
    // it answers a running deploy at once (a release before it).
    let mut holds = true;
    loop {
        let pause = poll_pause(following.elapsed(), holds);
        let asked = tokio::time::Instant::now();
        let polled = async {
            // The server holds the answer up to `pause` while the deploy runs, and gives it
            // as soon as the deploy ends: the end is seen as it happens.
            let wait = [("wait_ms", pause.as_millis().to_string())];
            let status: Answer<DeployStatus> = api.get_query(&deploy_path(id, ""), &wait).await?;
            // Read after the status: once it says the deploy ended, every line is stored.
            if lines != Lines::Nowhere {
                after = print_output(api, id, after, lines, style).await?;
            }
            if let Some(seen) = log.as_deref_mut() {
                let now: Answer<DeployLogs> = api
                    .get_query(
                        &deploy_path(id, "/logs"),
                        &[("output", "false".to_string())],
                    )
                    .await?;
                for line in now.body.lines {
                    if seen.insert(line.clone()) {
                        render::print_line(&render::terminal_safe(&line));
                    }
                }
            }
            Ok::<_, CliError>(status)
        }
        .await;
        let status = match polled {
            Ok(status) => {
                if outage_since.take().is_some() {
                    eprintln!("the server answers again");
                }
                status
            }
            Err(CliError::Transient(message)) => {
                let since = *outage_since.get_or_insert_with(|| {
                    eprintln!(
                        "{}; retrying for up to {}s",
                        render::terminal_safe(&message),
                        OUTAGE_LIMIT.as_secs()
                    );
                    tokio::time::Instant::now()
                });
                if since.elapsed() >= OUTAGE_LIMIT {
                    return Err(CliError::Transient(format!(
                        "{message} (for {}s, giving up; `manent wait {id}` re-attaches)",
                        OUTAGE_LIMIT.as_secs()
                    )));
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            Err(other) => return Err(other),
        };
        let line = render::progress_line(&status.body);
        if line != last {
            if lines == Lines::Stderr {
                eprintln!("{line}");
            }
            last = line;
        }
        if status.body.status.is_terminal() {
            return Ok(status);
        }
        // A held answer comes after the whole pause, or when the deploy ended.
        if holds && asked.elapsed() < pause / 2 {
            holds = false;
        }
        // Nothing left of the pause when the server held the answer; all of it when the
        // server is a release that answers at once.
        tokio::time::sleep_until(asked + pause).await;
    }
}

/// The time between a follower's polls. A server that holds each status up to that long
/// (`wait_ms`) answers as soon as the deploy ends, so the pause sets only how often the
/// progress and output lines are brought: every 0.5 s for the first 10 s, then every
/// second; each poll builds the whole status, and a deploy to many targets has many steps.
/// A server that answers at once (a release before `wait_ms`) is polled every 100 ms for
/// 10 s, so that a short deploy's end is seen within 0.1 s, then every 300 ms.
fn poll_pause(following_for: Duration, server_holds: bool) -> Duration {
    let early = following_for < Duration::from_secs(10);
    Duration::from_millis(match (server_holds, early) {
        (true, true) => 500,
        (true, false) => 1_000,
        (false, true) => 100,
        (false, false) => 300,
    })
}

/// Prints the deploy's output lines after `after`; returns the last `seq` printed.
pub async fn print_output(
    api: &ApiClient,
    id: &str,
    mut after: i64,
    lines: Lines,
    style: &Style,
) -> Result<i64, CliError> {
    const PAGE: usize = 1_000;
    loop {
        let page: Answer<DeployOutput> = api
            .get_query(
                &deploy_path(id, "/output"),
                &[("after", after.to_string()), ("limit", PAGE.to_string())],
            )
            .await?;
        let got = &page.body.lines;
        for (i, line) in got.iter().enumerate() {
            after = line.seq;
            let text = if style.is_document() {
                render::document(style, &page.json["lines"][i])
            } else {
                render::output_line(line)
            };
            match lines {
                Lines::Stdout => render::print_line(&text),
                Lines::Stderr => eprintln!("{text}"),
                Lines::Nowhere => {}
            }
        }
        if got.len() < PAGE {
            return Ok(after);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_follower_polls_often_at_first_and_less_once_the_deploy_runs_long() {
        let check = |after_secs: u64, holds: bool, pause_ms: u64| {
            assert_eq!(
                poll_pause(Duration::from_secs(after_secs), holds),
                Duration::from_millis(pause_ms),
                "after {after_secs} s of following a server that holds: {holds}"
            );
        };
        check(0, true, 500);
        check(9, true, 500);
        check(10, true, 1_000);
        check(3600, true, 1_000);
        check(0, false, 100);
        check(9, false, 100);
        check(10, false, 300);
        check(3600, false, 300);
    }
}
