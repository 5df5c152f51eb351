//! The chaos run's checks, from the ledger and the store: limits, outcomes, no step run
//! again after its checkpoint, and no overlap (a step body of a frozen worker whose step
//! was taken over never acts once it is continued).

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::Path,
};

use anyhow::{Context, Result};
use manent_engine::{Client, StepStatus, WorkflowFilter, WorkflowStatus};

use crate::{GLOBAL_LIMIT, Options, PARTITION_LIMIT, QUEUE, WORKER_LIMIT};

#[derive(Default)]
pub(crate) struct Report {
    pub(crate) succeeded: usize,
    pub(crate) bodies: usize,
    pub(crate) reruns: usize,
    /// Interrupted runs whose process was not killed: recovered away from a
    /// live worker that looked stale (an overloaded machine), then fenced.
    pub(crate) fenced_live: usize,
    /// Step bodies stopped before they returned (their run fenced or stopped).
    pub(crate) dropped: usize,
    pub(crate) max_total: usize,
    pub(crate) max_partition: usize,
    pub(crate) max_worker: usize,
    /// Step bodies of a frozen worker whose step another worker began meanwhile.
    pub(crate) superseded: usize,
}

/// Takes a body that ended (or can no longer act) off the running counts.
fn close(o: &Open, total: &mut usize, per_partition: &mut HashMap<String, usize>) {
    *total -= 1;
    *per_partition.entry(o.partition.clone()).or_default() -= 1;
}

/// A step body running in the ledger: workflow, step, partition, generation, and whether
/// its worker was frozen since it began.
struct Open {
    wf: String,
    step: usize,
    partition: String,
    generation: i64,
    frozen: bool,
}

/// What a ledger line of a step body says.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Begin,
    Done,
    Dropped,
}

/// A ledger line of a step body.
struct StepLine {
    kind: Kind,
    partition: String,
    pid: u32,
    generation: i64,
}

fn parse_line(line: &str) -> Option<((String, usize), StepLine)> {
    let f: Vec<&str> = line.split(' ').collect();
    let [wf, step, kind, partition, pid, generation] = f.as_slice() else {
        return None;
    };
    Some((
        (wf.to_string(), step.parse().ok()?),
        StepLine {
            kind: match *kind {
                "begin" => Kind::Begin,
                "done" => Kind::Done,
                "dropped" => Kind::Dropped,
                _ => return None,
            },
            partition: partition.to_string(),
            pid: pid.parse().ok()?,
            generation: generation.parse().ok()?,
        },
    ))
}

/// The ledger's lines of each step body, by workflow and step, in ledger order.
type ByStep = BTreeMap<(String, usize), Vec<StepLine>>;

pub(crate) async fn verify(
    o: &Options,
    client: &Client,
    ledger: &Path,
    violations: &mut Vec<String>,
) -> Result<Report> {
    let mut report = Report::default();
    let text = std::fs::read_to_string(ledger).unwrap_or_default();
    let (by_step, killed) = check_ledger(&text, &mut report, violations)?;
    check_outcomes(o, client, &by_step, &killed, &mut report, violations).await?;
    Ok(report)
}

/// Checks the ledger alone (limits and overlaps), and returns its lines by step and the
/// pids of the workers that were killed.
fn check_ledger(
    text: &str,
    report: &mut Report,
    violations: &mut Vec<String>,
) -> Result<(ByStep, HashSet<u32>)> {
    // 1. Limits and overlaps, from the begin/done intervals in ledger order. A body of a
    // frozen worker whose step another worker begins is no longer counted as running
    // (it cannot act until continued); it must then end `dropped`, never `done`.
    let mut open: HashMap<u32, Vec<Open>> = HashMap::new();
    let mut per_partition: HashMap<String, usize> = HashMap::new();
    let mut total = 0usize;
    let mut by_step: ByStep = BTreeMap::new();
    let mut killed: HashSet<u32> = HashSet::new();
    let mut superseded: HashSet<(u32, String, usize, i64)> = HashSet::new();
    for line in text.lines() {
        if let Some(pid) = line.strip_prefix("killed ") {
            let pid: u32 = pid.parse().context("a killed line")?;
            killed.insert(pid);
            for o in open.remove(&pid).unwrap_or_default() {
                close(&o, &mut total, &mut per_partition);
            }
            continue;
        }
        if let Some(pid) = line.strip_prefix("frozen ") {
            let pid: u32 = pid.parse().context("a frozen line")?;
            for o in open.entry(pid).or_default() {
                o.frozen = true;
            }
            continue;
        }
        if line.starts_with("thawed ") {
            continue;
        }
        let Some((key, l)) = parse_line(line) else {
            violations.push(format!("unreadable ledger line `{line}`"));
            continue;
        };
        if l.kind == Kind::Dropped {
            report.dropped += 1;
        }
        if l.kind == Kind::Begin {
            // The same step begun again while a frozen worker's body of it is open.
            for (pid, bodies) in open.iter_mut() {
                while let Some(at) = bodies
                    .iter()
                    .position(|o| o.frozen && o.wf == key.0 && o.step == key.1)
                {
                    let o = bodies.remove(at);
                    close(&o, &mut total, &mut per_partition);
                    superseded.insert((*pid, o.wf, o.step, o.generation));
                    report.superseded += 1;
                }
            }
            let running = open.entry(l.pid).or_default();
            running.push(Open {
                wf: key.0.clone(),
                step: key.1,
                partition: l.partition.clone(),
                generation: l.generation,
                frozen: false,
            });
            total += 1;
            let p = per_partition.entry(l.partition.clone()).or_default();
            *p += 1;
            report.max_total = report.max_total.max(total);
            report.max_partition = report.max_partition.max(*p);
            report.max_worker = report.max_worker.max(running.len());
            if total > GLOBAL_LIMIT as usize
                || *p > PARTITION_LIMIT as usize
                || running.len() > WORKER_LIMIT as usize
            {
                violations.push(format!(
                    "limit exceeded at `{line}`: {total} running, {} in partition {}, {} in pid {}",
                    p,
                    l.partition,
                    running.len(),
                    l.pid
                ));
            }
        } else if superseded.remove(&(l.pid, key.0.clone(), key.1, l.generation)) {
            if l.kind == Kind::Done {
                violations.push(format!(
                    "overlap: `{line}`: a frozen worker's body finished after another worker \
                     began its step"
                ));
            }
        } else if let Some(at) = open
            .entry(l.pid)
            .or_default()
            .iter()
            .position(|o| o.wf == key.0 && o.step == key.1)
        {
            let o = open.entry(l.pid).or_default().remove(at);
            close(&o, &mut total, &mut per_partition);
        } else {
            violations.push(format!("`{line}` ends a step that never began"));
        }
        by_step.entry(key).or_default().push(l);
    }
    // No body acts once a later generation of its step has begun, frozen or not.
    for ((wf, step), lines) in &by_step {
        let mut newest_begun = i64::MIN;
        for l in lines {
            match l.kind {
                Kind::Begin => newest_begun = newest_begun.max(l.generation),
                Kind::Done if l.generation < newest_begun => violations.push(format!(
                    "overlap: step {step} of {wf}: generation {} (pid {}) finished after \
                     generation {newest_begun} began",
                    l.generation, l.pid
                )),
                _ => {}
            }
        }
    }
    Ok((by_step, killed))
}

/// Checks the store's outcomes and step records against the ledger's lines `by_step`.
async fn check_outcomes(
    o: &Options,
    client: &Client,
    by_step: &ByStep,
    killed: &HashSet<u32>,
    report: &mut Report,
    violations: &mut Vec<String>,
) -> Result<()> {
    // 2. Outcomes and step records, against the ledger.
    let all = client
        .list(&WorkflowFilter {
            queue: Some(QUEUE.into()),
            limit: Some(i64::try_from(o.workflows).unwrap_or(i64::MAX) + 100),
            ..WorkflowFilter::default()
        })
        .await?;
    if all.len() != o.workflows {
        violations.push(format!(
            "{} workflows stored, {} enqueued",
            all.len(),
            o.workflows
        ));
    }
    for wf in &all {
        if wf.status != WorkflowStatus::Success {
            violations.push(format!(
                "workflow {} is {}, not SUCCESS (error: {:?})",
                wf.id, wf.status, wf.error
            ));
            continue;
        }
        report.succeeded += 1;
        let steps = client.steps(&wf.id).await?;
        if steps.len() != o.steps {
            violations.push(format!(
                "workflow {} has {} step records, not {}",
                wf.id,
                steps.len(),
                o.steps
            ));
        }
        for s in &steps {
            let recorded: Option<i64> = s.output.as_deref().and_then(|v| v.parse().ok());
            let (Some(recorded), StepStatus::Success) = (recorded, s.status) else {
                violations.push(format!(
                    "step {} of {} is recorded as {s:?}",
                    s.index, wf.id
                ));
                continue;
            };
            let lines = by_step
                .get(&(
                    wf.id.clone(),
                    usize::try_from(s.index).unwrap_or(usize::MAX),
                ))
                .map(Vec::as_slice)
                .unwrap_or_default();
            let begins: Vec<&StepLine> = lines.iter().filter(|l| l.kind == Kind::Begin).collect();
            report.bodies += begins.len();
            let interrupted: Vec<&&StepLine> =
                begins.iter().filter(|l| l.generation < recorded).collect();
            report.reruns += interrupted.len();
            report.fenced_live += interrupted
                .iter()
                .filter(|l| !killed.contains(&l.pid))
                .count();
            let later: Vec<String> = lines
                .iter()
                .filter(|l| l.generation > recorded)
                .map(|l| format!("pid {} generation {}", l.pid, l.generation))
                .collect();
            if !later.is_empty() {
                violations.push(format!(
                    "step {} of {} ran again after generation {recorded} recorded it: {}",
                    s.index,
                    wf.id,
                    later.join(", ")
                ));
            }
            let recording = lines.iter().filter(|l| l.generation == recorded);
            let (b, d) = recording.fold((0, 0), |(b, d), l| match l.kind {
                Kind::Begin => (b + 1, d),
                Kind::Done => (b, d + 1),
                Kind::Dropped => (b, d),
            });
            if (b, d) != (1, 1) {
                violations.push(format!(
                    "step {} of {}: the recording run (generation {recorded}) logged {b} begins and {d} ends",
                    s.index, wf.id
                ));
            }
        }
    }
    Ok(())
}
