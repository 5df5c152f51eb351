//! Faults of the database and of the network under real worker processes, on
//! a private PostgreSQL cluster of each test's own (the shared one on 5432
//! must never be restarted): PostgreSQL restarted (crash, then a planned
//! restart) under 200 workflows and 3 workers, and a worker partitioned from
//! PostgreSQL in its own network namespace (at rest, or in the middle of a
//! transaction) while another takes over its id or recovers its work.
//! Checked from a ledger every step body appends to:
//! every workflow succeeds, no workflow ever has two step bodies running at
//! once, no recorded step runs again, no concurrency limit is exceeded.
//!
//! The test binary is its own worker: `child_process_entry` runs the worker
//! when the parent re-executes the binary with `MANENT_FAULTS_CHILD` set (for
//! the partitioned worker, through `ip netns exec`). Needs root (network
//! namespaces, running PostgreSQL as the `postgres` user).

use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
    process::{Command, Stdio},
    time::Duration,
};

use manent_engine::{
    Client, Database, EnqueueRequest, StepStatus, WorkflowFilter, WorkflowRecord, WorkflowStatus,
    store,
};
use manent_testkit::{
    Children, NetNs, PgCluster, StopMode, append_line as append, eventually, signal, wait_exit,
};

/// Generous bounds for waits on other processes; never reached when things work.
const WAIT: Duration = Duration::from_secs(90);
/// Env var that makes a re-executed test binary a worker.
const ROLE: &str = "MANENT_FAULTS_CHILD";
const QUEUE: &str = "q";
const WORKFLOW: &str = "steps";

/// The worker side: returns at once in a normal test run; in a re-executed
/// child it runs a worker and exits the process.
#[test]
fn child_process_entry() {
    if std::env::var(ROLE).is_ok() {
        child::run();
    }
}

// ---------------------------------------------------------------- the ledger

/// One step body's ledger line: `<kind> <workflow> <step> <partition> <pid> <generation>`,
/// kind `begin`, `end` (the body returned) or `drop` (the body was stopped: its
/// run was dropped, fenced or cancelled, before it returned).
#[derive(Debug, Clone)]
struct StepLine {
    kind: String,
    workflow: String,
    step: i64,
    partition: String,
    pid: u32,
    generation: i64,
}

fn parse(line: &str) -> Option<StepLine> {
    let f: Vec<&str> = line.split(' ').collect();
    let [
        kind @ ("begin" | "end" | "drop"),
        wf,
        step,
        partition,
        pid,
        generation,
    ] = f.as_slice()
    else {
        return None;
    };
    Some(StepLine {
        kind: kind.to_string(),
        workflow: wf.to_string(),
        step: step.parse().ok()?,
        partition: partition.to_string(),
        pid: pid.parse().ok()?,
        generation: generation.parse().ok()?,
    })
}

/// A line-per-write file shared by all processes of a test (O_APPEND keeps whole lines in order).
struct Ledger(PathBuf);

impl Ledger {
    fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.0)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn count(&self, pred: impl Fn(&str) -> bool) -> usize {
        self.lines().iter().filter(|l| pred(l)).count()
    }

    fn steps(&self) -> Vec<StepLine> {
        self.lines().iter().filter_map(|l| parse(l)).collect()
    }

    async fn wait_for(&self, what: &str, pred: impl Fn(&str) -> bool) {
        eventually(what, WAIT, || async {
            self.lines().iter().any(|l| pred(l)).then_some(())
        })
        .await
    }
}

/// Limits the workers are given (the same for each), to check the ledger against.
#[derive(Clone, Copy)]
struct Limits {
    worker: usize,
    partition: usize,
    global: usize,
}

/// What the replay of a ledger found.
#[derive(Debug, Default)]
struct Replay {
    max_total: usize,
    max_partition: usize,
    max_worker: usize,
    /// Step bodies begun, and of those stopped before they returned.
    begins: usize,
    drops: usize,
    /// Each time a workflow had two step bodies running at once.
    overlaps: Vec<String>,
    /// Lines that ended nothing, or could not be read.
    malformed: Vec<String>,
}

/// Replays the ledger in order: the step bodies running at each moment, per
/// workflow (never more than one), per partition, per process and in total.
/// `exited <pid>` lines (written by the parent once a worker is gone) close
/// what that process had open.
fn replay(lines: &[String]) -> Replay {
    let mut r = Replay::default();
    // Open intervals: (pid, workflow, step, generation) -> partition.
    let mut open: HashMap<(u32, String, i64, i64), String> = HashMap::new();
    let mut per_workflow: HashMap<String, usize> = HashMap::new();
    let mut per_partition: HashMap<String, usize> = HashMap::new();
    let mut per_pid: HashMap<u32, usize> = HashMap::new();
    let mut total = 0usize;
    for line in lines {
        if let Some(pid) = line.strip_prefix("exited ") {
            let pid: u32 = pid.parse().expect("an exited line names a pid");
            let gone: Vec<_> = open.keys().filter(|k| k.0 == pid).cloned().collect();
            for key in gone {
                let partition = open.remove(&key).expect("an open interval");
                total -= 1;
                *per_workflow.entry(key.1).or_default() -= 1;
                *per_partition.entry(partition).or_default() -= 1;
                *per_pid.entry(pid).or_default() -= 1;
            }
            continue;
        }
        let Some(l) = parse(line) else {
            if ["begin ", "end ", "drop "]
                .iter()
                .any(|p| line.starts_with(p))
            {
                r.malformed.push(line.clone());
            }
            continue;
        };
        let key = (l.pid, l.workflow.clone(), l.step, l.generation);
        if l.kind == "begin" {
            r.begins += 1;
            open.insert(key, l.partition.clone());
            total += 1;
            let w = per_workflow.entry(l.workflow.clone()).or_default();
            *w += 1;
            if *w > 1 {
                r.overlaps.push(format!(
                    "`{line}` began while another step body of {} was running",
                    l.workflow
                ));
            }
            let p = per_partition.entry(l.partition.clone()).or_default();
            *p += 1;
            let n = per_pid.entry(l.pid).or_default();
            *n += 1;
            r.max_total = r.max_total.max(total);
            r.max_partition = r.max_partition.max(*p);
            r.max_worker = r.max_worker.max(*n);
        } else if open.remove(&key).is_some() {
            if l.kind == "drop" {
                r.drops += 1;
            }
            total -= 1;
            *per_workflow.entry(l.workflow.clone()).or_default() -= 1;
            *per_partition.entry(l.partition.clone()).or_default() -= 1;
            *per_pid.entry(l.pid).or_default() -= 1;
        } else {
            r.malformed
                .push(format!("`{line}` ends a step body that never began"));
        }
    }
    r
}

/// Checks every workflow's step records against the ledger: each of the
/// `steps` steps is recorded as a success, by the run whose generation it
/// returned; that run's body began and ended once; no body of that step began
/// under a later generation (a recorded step never runs again). Returns the
/// violations.
async fn check_records(
    client: &Client,
    workflows: &[WorkflowRecord],
    steps: usize,
    lines: &[StepLine],
) -> Vec<String> {
    let mut by_step: BTreeMap<(String, i64), Vec<&StepLine>> = BTreeMap::new();
    for l in lines {
        by_step
            .entry((l.workflow.clone(), l.step))
            .or_default()
            .push(l);
    }
    let mut violations = Vec::new();
    for wf in workflows {
        let records = client.steps(&wf.id).await.expect("load the step records");
        if records.len() != steps {
            violations.push(format!(
                "{} has {} step records, not {steps}",
                wf.id,
                records.len()
            ));
        }
        for s in &records {
            let recorded: Option<i64> = s.output.as_deref().and_then(|o| o.parse().ok());
            let (StepStatus::Success, Some(recorded)) = (s.status, recorded) else {
                violations.push(format!(
                    "step {} of {} is recorded as {s:?}",
                    s.index, wf.id
                ));
                continue;
            };
            let ours = by_step
                .get(&(wf.id.clone(), s.index))
                .map(Vec::as_slice)
                .unwrap_or_default();
            let later: Vec<String> = ours
                .iter()
                .filter(|l| l.kind == "begin" && l.generation > recorded)
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
            let count = |kind: &str| {
                ours.iter()
                    .filter(|l| l.generation == recorded && l.kind == kind)
                    .count()
            };
            if (count("begin"), count("end")) != (1, 1) {
                violations.push(format!(
                    "step {} of {}: the recording run (generation {recorded}) logged {} begins and {} ends",
                    s.index,
                    wf.id,
                    count("begin"),
                    count("end")
                ));
            }
        }
    }
    violations
}

// ---------------------------------------------------------------- processes

/// What one worker process is told.
#[derive(Clone)]
struct Spec {
    vars: Vec<(&'static str, String)>,
}

impl Spec {
    fn worker(id: &str, url: &str) -> Spec {
        Spec {
            vars: vec![
                (ROLE, "worker".into()),
                ("MANENT_TEST_ID", id.into()),
                ("MANENT_TEST_DB", url.into()),
            ],
        }
    }
    fn set(mut self, key: &'static str, value: impl ToString) -> Spec {
        self.vars.push((key, value.to_string()));
        self
    }
    fn limits(self, l: Limits) -> Spec {
        self.set("MANENT_TEST_WORKER_LIMIT", l.worker)
            .set("MANENT_TEST_PARTITION_LIMIT", l.partition)
            .set("MANENT_TEST_GLOBAL_LIMIT", l.global)
    }
}

/// The worker processes of one test, their logs and the ledger. Kills the
/// children when dropped, and prints their logs (and the database's) if the
/// test failed.
struct Procs {
    children: Children,
    dir: tempfile::TempDir,
    ledger: Ledger,
    gate: PathBuf,
    server_log: Option<Box<dyn Fn() -> String>>,
}

impl Procs {
    fn new() -> Procs {
        let dir = tempfile::tempdir().expect("a temporary directory for the test");
        Procs {
            ledger: Ledger(dir.path().join("ledger")),
            gate: dir.path().join("gate"),
            children: Children::default(),
            dir,
            server_log: None,
        }
    }

    /// Re-executes this test binary as a worker, in `netns` if given; returns its index.
    fn spawn(&mut self, spec: Spec, netns: Option<&NetNs>) -> usize {
        let n = self.children.0.len();
        let exe = std::env::current_exe().expect("the test binary's path");
        let mut cmd = match netns {
            Some(ns) => ns.command(&exe),
            None => Command::new(&exe),
        };
        cmd.args([
            "--exact",
            "child_process_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("MANENT_TEST_LEDGER", &self.ledger.0)
        .env("MANENT_TEST_GATE", &self.gate)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(self.log(n, "out")).expect("a child's stdout file"))
        .stderr(std::fs::File::create(self.log(n, "err")).expect("a child's stderr file"));
        for (k, v) in &spec.vars {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn the test binary as a worker");
        self.children.push(child)
    }

    fn log(&self, i: usize, kind: &str) -> PathBuf {
        self.dir.path().join(format!("child-{i}.{kind}"))
    }

    fn pid(&self, i: usize) -> u32 {
        self.children.0[i].id()
    }

    fn stderr(&self, i: usize) -> String {
        std::fs::read_to_string(self.log(i, "err")).unwrap_or_default()
    }

    /// Its logs (tracing writes to stdout in a test binary) and its stderr.
    fn output(&self, i: usize) -> String {
        std::fs::read_to_string(self.log(i, "out")).unwrap_or_default() + &self.stderr(i)
    }

    fn alive(&mut self, i: usize) -> bool {
        self.children.0[i]
            .try_wait()
            .expect("poll a child")
            .is_none()
    }

    async fn wait_ready(&self, i: usize) {
        let line = format!("ready {}", self.pid(i));
        self.ledger
            .wait_for(&format!("worker {i} ready"), |l| l == line)
            .await;
    }

    /// Notes in the ledger that a worker is gone, closing its open step bodies.
    fn note_exit(&self, i: usize) {
        append(&self.ledger.0, &format!("exited {}", self.pid(i)));
    }

    fn open_gate(&self) {
        std::fs::write(&self.gate, b"open").expect("create the gate file");
    }

    /// The ledger checks every test makes, with the replay's figures.
    fn replay(&self, limits: Limits) -> Replay {
        let r = replay(&self.ledger.lines());
        assert!(
            r.malformed.is_empty(),
            "the ledger reads back: {:?}",
            r.malformed
        );
        assert!(
            r.overlaps.is_empty(),
            "no workflow ever had two step bodies running at once (a fenced run stops \
             before another takes over): {:?}",
            r.overlaps
        );
        assert!(
            r.max_total <= limits.global,
            "at most {} step bodies at once overall, saw {}",
            limits.global,
            r.max_total
        );
        assert!(
            r.max_partition <= limits.partition,
            "at most {} step body per partition at once, saw {}",
            limits.partition,
            r.max_partition
        );
        assert!(
            r.max_worker <= limits.worker,
            "at most {} step bodies at once in one process, saw {}",
            limits.worker,
            r.max_worker
        );
        r
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for i in 0..self.children.0.len() {
                eprintln!(
                    "----- worker {i} (pid {}) -----\n{}",
                    self.pid(i),
                    self.output(i)
                );
            }
            eprintln!("----- ledger -----\n{}", self.ledger.lines().join("\n"));
            if let Some(log) = &self.server_log {
                eprintln!("----- PostgreSQL -----\n{}", log());
            }
        }
    }
}

/// Every workflow of the queue, once the database answers (it may be restarting).
async fn all_workflows(client: &Client) -> Option<Vec<WorkflowRecord>> {
    client
        .list(&WorkflowFilter {
            queue: Some(QUEUE.into()),
            limit: Some(100_000),
            ..WorkflowFilter::default()
        })
        .await
        .ok()
}

/// Waits until all `n` workflows have ended, then asserts they all succeeded.
async fn wait_all_succeed(client: &Client, n: usize, timeout: Duration) -> Vec<WorkflowRecord> {
    let all = eventually(&format!("all {n} workflows to end"), timeout, || async {
        let all = all_workflows(client).await?;
        (all.len() == n && all.iter().all(|w| w.status.is_terminal())).then_some(all)
    })
    .await;
    let failed: Vec<String> = all
        .iter()
        .filter(|w| w.status != WorkflowStatus::Success)
        .map(|w| format!("{} {} {:?}", w.id, w.status, w.error))
        .collect();
    assert!(failed.is_empty(), "every workflow succeeds: {failed:?}");
    all
}

// ---------------------------------------------------------------------- tests

/// PostgreSQL crashes (`pg_ctl stop -m immediate`) a fifth into the run and
/// stays down until every worker has fenced itself, then comes back; later it
/// is restarted cleanly (`-m fast`) at once, a blip. Workers keep their ids
/// (nobody else takes them) and go on once their lease renews.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgresql_restarted_twice_under_200_workflows_and_3_workers_loses_none_and_runs_no_step_twice()
 {
    const WORKFLOWS: usize = 200;
    const STEPS: usize = 4;
    const WORKERS: usize = 3;
    const PARTITIONS: usize = 10;
    let limits = Limits {
        worker: 3,
        partition: 1,
        global: 6,
    };
    manent_testkit::init_tracing();
    let started = std::time::Instant::now();
    let cluster = PgCluster::start();
    let url = cluster.create_database("faults").await;
    let client = Client::new(Database::from(
        store::open(&url).await.expect("open the test database"),
    ));
    let mut procs = Procs::new();
    let log_cluster = cluster.log_path();
    procs.server_log = Some(Box::new(move || {
        std::fs::read_to_string(&log_cluster).unwrap_or_default()
    }));

    let workers: Vec<usize> = (0..WORKERS)
        .map(|n| {
            procs.spawn(
                Spec::worker(&format!("w{n}"), &url)
                    .limits(limits)
                    .set("MANENT_TEST_RECOVERY", 1)
                    .set("MANENT_TEST_STALE_MS", 2000)
                    .set("MANENT_TEST_STEPS", STEPS)
                    .set("MANENT_TEST_STEP_MS", 30)
                    // Every 33rd workflow (each in its own partition) has a step longer than the fence
                    // window: one in flight when the database goes down is
                    // stopped mid-body, and the ledger shows it ended first.
                    .set("MANENT_TEST_SLOW_EVERY", 33)
                    .set("MANENT_TEST_SLOW_MS", 2000),
                None,
            )
        })
        .collect();
    for &w in &workers {
        procs.wait_ready(w).await;
    }
    let requests = (0..WORKFLOWS)
        .map(|n| {
            EnqueueRequest::new(WORKFLOW, QUEUE, ())
                .id(format!("wf-{n:03}"))
                .partition(format!("p{}", n % PARTITIONS))
        })
        .collect();
    for outcome in client.enqueue_many(requests).await.expect("enqueue") {
        outcome.expect("each workflow is enqueued");
    }

    let ended = |procs: &Procs| procs.ledger.count(|l| l.starts_with("end "));

    // 1. A crash a fifth into the run, down until every worker has fenced itself.
    eventually("a fifth of the steps to end", WAIT, || async {
        (ended(&procs) >= WORKFLOWS * STEPS / 5).then_some(())
    })
    .await;
    cluster.stop(StopMode::Immediate);
    append(&procs.ledger.0, "database crashed");
    for &w in &workers {
        eventually(&format!("worker {w} to fence itself"), WAIT, || async {
            procs
                .output(w)
                .contains("could not be renewed in time")
                .then_some(())
        })
        .await;
    }
    cluster.start_again();
    append(&procs.ledger.0, "database back");
    for &w in &workers {
        eventually(
            &format!("worker {w} to renew its lease again"),
            WAIT,
            || async {
                procs
                    .output(w)
                    .contains("executor lease renewed again")
                    .then_some(())
            },
        )
        .await;
    }

    // 2. A clean restart at once, three fifths into the run.
    eventually("three fifths of the steps to end", WAIT, || async {
        (ended(&procs) >= WORKFLOWS * STEPS * 3 / 5).then_some(())
    })
    .await;
    cluster.restart(StopMode::Fast);
    append(&procs.ledger.0, "database restarted");

    let all = wait_all_succeed(&client, WORKFLOWS, WAIT).await;
    let r = procs.replay(limits);
    let violations = check_records(&client, &all, STEPS, &procs.ledger.steps()).await;
    assert!(
        violations.is_empty(),
        "every step recorded once by the run that logged it, none rerun after its record: {violations:#?}"
    );
    for &w in &workers {
        assert!(
            procs.alive(w),
            "worker {w} lives on through both restarts (nobody took its id); output:\n{}",
            procs.output(w)
        );
    }
    let lines = procs.ledger.lines();
    let back = lines
        .iter()
        .position(|l| l == "database back")
        .expect("the restart is in the ledger");
    assert!(
        lines[back..].iter().any(|l| l.starts_with("begin ")),
        "steps ran again after the crash (the workers reconnected)"
    );
    eprintln!(
        "postgresql restarts: {WORKFLOWS} workflows, {} step bodies ({} stopped by fencing), \
         max {} running (limit {}), {} per partition, {} per worker, in {:.1}s",
        r.begins,
        r.drops,
        r.max_total,
        limits.global,
        r.max_partition,
        r.max_worker,
        started.elapsed().as_secs_f64()
    );
}

/// The partitioned worker's id is taken over by a newcomer outside the
/// namespace once its lease runs out; healed, the old worker finds its lease
/// taken and exits non-zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_partitioned_from_postgresql_fences_itself_and_exits_non_zero_once_healed_after_its_id_was_taken_over()
 {
    partitioned(Takeover::SameId).await;
}

/// The partitioned worker's work is recovered by another worker with its own
/// id once its lease runs out; healed, the old worker renews its lease (nobody
/// took its id) but finds nothing of its own left to run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_partitioned_from_postgresql_fences_itself_and_runs_nothing_more_once_healed_after_its_work_was_recovered()
 {
    partitioned(Takeover::Recovery).await;
}

/// A worker's network namespace, a cluster it reaches through the namespace's link
/// (`far_url`) while the parent and other workers use loopback (`url`), and the
/// parent's client and processes (whose failure reports carry the cluster's log).
struct PartitionSite {
    ns: NetNs,
    cluster: PgCluster,
    url: String,
    far_url: String,
    client: Client,
    procs: Procs,
}

impl PartitionSite {
    async fn new() -> Self {
        let ns = NetNs::new();
        let cluster = PgCluster::start_listening(
            std::slice::from_ref(&ns.host_addr),
            std::slice::from_ref(&ns.network),
        );
        let url = cluster.create_database("faults").await;
        let far_url = cluster.url_at(&ns.host_addr, "faults");
        let client = Client::new(Database::from(
            store::open(&url).await.expect("open the test database"),
        ));
        let mut procs = Procs::new();
        let log_cluster = cluster.log_path();
        procs.server_log = Some(Box::new(move || {
            std::fs::read_to_string(&log_cluster).unwrap_or_default()
        }));
        PartitionSite {
            ns,
            cluster,
            url,
            far_url,
            client,
            procs,
        }
    }
}

#[derive(PartialEq)]
enum Takeover {
    SameId,
    Recovery,
}

async fn partitioned(takeover: Takeover) {
    const STEPS: usize = 3;
    const WORKFLOWS: usize = 4;
    let limits = Limits {
        worker: 4,
        partition: 1,
        global: 8,
    };
    manent_testkit::init_tracing();
    let started = std::time::Instant::now();
    let PartitionSite {
        ns,
        // Bound, not `_`: the cluster lives until the test ends.
        cluster: _cluster,
        url,
        far_url,
        client,
        mut procs,
    } = PartitionSite::new().await;

    // Step s1 of each workflow waits for the gate: the partition cuts the
    // worker off in the middle of it, with s0 recorded.
    let common = |spec: Spec| {
        spec.limits(limits)
            .set("MANENT_TEST_STALE_MS", 2000)
            .set("MANENT_TEST_STEPS", STEPS)
            .set("MANENT_TEST_STEP_MS", 10)
            .set("MANENT_TEST_GATED_STEP", 1)
    };
    let a = procs.spawn(common(Spec::worker("x", &far_url)), Some(&ns));
    let pid_a = procs.pid(a);
    procs.wait_ready(a).await;
    let requests = (0..WORKFLOWS)
        .map(|n| {
            EnqueueRequest::new(WORKFLOW, QUEUE, ())
                .id(format!("wf-{n}"))
                .partition(format!("p{n}"))
        })
        .collect();
    for outcome in client.enqueue_many(requests).await.expect("enqueue") {
        outcome.expect("each workflow is enqueued");
    }
    for n in 0..WORKFLOWS {
        let begin = format!("begin wf-{n} 1 p{n} {pid_a} ");
        procs
            .ledger
            .wait_for(&format!("wf-{n} to begin s1 in the worker"), |l| {
                l.starts_with(&begin)
            })
            .await;
    }

    ns.cut();
    append(&procs.ledger.0, "partition");
    let b = match takeover {
        Takeover::SameId => procs.spawn(common(Spec::worker("x", &url)), None),
        Takeover::Recovery => procs.spawn(
            common(Spec::worker("y", &url)).set("MANENT_TEST_RECOVERY", 1),
            None,
        ),
    };
    let pid_b = procs.pid(b);
    // The other worker runs the interrupted step of every workflow (blocked on the gate).
    for n in 0..WORKFLOWS {
        let begin = format!("begin wf-{n} 1 p{n} {pid_b} ");
        procs
            .ledger
            .wait_for(&format!("wf-{n} to begin s1 in the other worker"), |l| {
                l.starts_with(&begin)
            })
            .await;
    }
    assert!(
        procs.output(a).contains("could not be renewed in time"),
        "the partitioned worker fenced itself before the other worker took over; output:\n{}",
        procs.output(a)
    );
    procs.open_gate();
    let all = wait_all_succeed(&client, WORKFLOWS, WAIT).await;

    ns.heal();
    append(&procs.ledger.0, "healed");
    the_healed_worker_ends_as_its_takeover_says(&takeover, &mut procs, a, pid_b).await;

    let r = procs.replay(limits);
    let violations = check_records(&client, &all, STEPS, &procs.ledger.steps()).await;
    assert!(
        violations.is_empty(),
        "every step recorded once by the run that logged it, none rerun after its record: {violations:#?}"
    );
    let lines = procs.ledger.lines();
    let cut = lines
        .iter()
        .position(|l| l == "partition")
        .expect("the cut is in the ledger");
    let after_cut: Vec<&String> = lines[cut..]
        .iter()
        .filter(|l| parse(l).is_some_and(|s| s.pid == pid_a && s.kind != "drop"))
        .collect();
    assert!(
        after_cut.is_empty(),
        "the partitioned worker began or finished no step body after the cut: {after_cut:?}"
    );
    assert_eq!(
        lines
            .iter()
            .filter(|l| parse(l).is_some_and(|s| s.pid == pid_a && s.kind == "drop"))
            .count(),
        WORKFLOWS,
        "the partitioned worker stopped each of its interrupted step bodies (fencing)"
    );
    let expected_executor = if takeover == Takeover::SameId {
        "x"
    } else {
        "y"
    };
    for wf in &all {
        let records = client.steps(&wf.id).await.expect("the step records");
        let by: Vec<&str> = records.iter().map(|s| s.executor_id.as_str()).collect();
        assert_eq!(
            by,
            vec!["x", expected_executor, expected_executor],
            "{}: s0 recorded before the cut, the rest by the worker that took over",
            wf.id
        );
    }
    eprintln!(
        "partition ({}): {} step bodies ({} stopped by fencing) in {:.1}s",
        expected_executor,
        r.begins,
        r.drops,
        started.elapsed().as_secs_f64()
    );
}

/// Healed, the partitioned worker `a` exits non-zero naming the newcomer `pid_b` if its
/// id was taken over, or renews its lease and lives on (then is stopped cleanly) if
/// only its work was recovered.
async fn the_healed_worker_ends_as_its_takeover_says(
    takeover: &Takeover,
    procs: &mut Procs,
    a: usize,
    pid_b: u32,
) {
    match takeover {
        Takeover::SameId => {
            let status = wait_exit(&mut procs.children.0[a], WAIT).await;
            procs.note_exit(a);
            assert!(
                !status.success(),
                "the healed worker, its id taken, exits non-zero: {status}"
            );
            let stderr = procs.stderr(a);
            assert!(
                stderr.contains("taken over") && stderr.contains(&format!("pid {pid_b}")),
                "it says its id was taken over and by whom; stderr:\n{stderr}"
            );
        }
        Takeover::Recovery => {
            eventually("the healed worker renews its lease", WAIT, || async {
                procs
                    .output(a)
                    .contains("executor lease renewed again")
                    .then_some(())
            })
            .await;
            assert!(
                procs.alive(a),
                "the healed worker keeps its id (nobody took it) and lives on"
            );
            // It is back: the work it starts from now on would show. Stop it
            // cleanly, which drains whatever it holds, before reading the ledger.
            signal(&procs.children.0[a], "TERM");
            let status = wait_exit(&mut procs.children.0[a], WAIT).await;
            procs.note_exit(a);
            assert!(
                status.success(),
                "the healed worker stops cleanly: {status}"
            );
        }
    }
}

/// The partition strikes while the worker is inside a transaction (a claim
/// holding its queue's advisory lock, or rows it locked): PostgreSQL keeps
/// that session, and its locks, until it learns the client is gone, which
/// TCP alone tells it only after hours. The engine's sessions end an idle
/// transaction themselves (`idle_in_transaction_session_timeout`), so the
/// others are held up for that long at most: the other worker recovers the
/// partitioned worker's work and runs everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_partitioned_in_the_middle_of_a_transaction_holds_up_the_others_only_briefly() {
    const STEPS: usize = 3;
    const WORKFLOWS: usize = 40;
    let limits = Limits {
        worker: 2,
        partition: 1,
        global: 8,
    };
    manent_testkit::init_tracing();
    let started = std::time::Instant::now();
    let PartitionSite {
        ns,
        cluster,
        url,
        far_url,
        client,
        mut procs,
    } = PartitionSite::new().await;
    let common = |spec: Spec| {
        spec.limits(limits)
            .set("MANENT_TEST_STALE_MS", 2000)
            .set("MANENT_TEST_STEPS", STEPS)
            .set("MANENT_TEST_STEP_MS", 5)
    };
    let a = procs.spawn(common(Spec::worker("x", &far_url)), Some(&ns));
    let pid_a = procs.pid(a);
    procs.wait_ready(a).await;
    let requests = (0..WORKFLOWS)
        .map(|n| {
            EnqueueRequest::new(WORKFLOW, QUEUE, ())
                .id(format!("wf-{n:02}"))
                .partition(format!("p{}", n % 10))
        })
        .collect();
    for outcome in client.enqueue_many(requests).await.expect("enqueue") {
        outcome.expect("each workflow is enqueued");
    }
    let begun = format!(" {pid_a} ");
    procs
        .ledger
        .wait_for("the worker to run steps", |l| {
            l.starts_with("begin ") && l.contains(&begun)
        })
        .await;

    // Freeze the worker until it is caught inside a transaction, cut it off
    // there, and let it go on (alive, partitioned).
    let mut caught = false;
    for _ in 0..2000 {
        signal(&procs.children.0[a], "STOP");
        manent_testkit::wait_stopped(&procs.children.0[a], WAIT).await;
        if sessions_in_transaction(&url, &ns.ns_addr).await > 0 {
            caught = true;
            break;
        }
        signal(&procs.children.0[a], "CONT");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(caught, "the worker was caught inside a transaction");
    ns.cut();
    append(&procs.ledger.0, "partition");
    signal(&procs.children.0[a], "CONT");

    let b = procs.spawn(
        common(Spec::worker("y", &url)).set("MANENT_TEST_RECOVERY", 1),
        None,
    );
    procs.wait_ready(b).await;
    let all = wait_all_succeed(&client, WORKFLOWS, WAIT).await;
    // Holding nothing once its claim was rolled back, it may fence itself
    // only after the other worker has run everything: wait for it.
    eventually("the partitioned worker to fence itself", WAIT, || async {
        procs
            .output(a)
            .contains("could not be renewed in time")
            .then_some(())
    })
    .await;
    eventually(
        "PostgreSQL to end the cut-off session's transaction",
        WAIT,
        || async {
            cluster
                .log()
                .contains("idle-in-transaction timeout")
                .then_some(())
        },
    )
    .await;
    ns.heal();

    let r = procs.replay(limits);
    let violations = check_records(&client, &all, STEPS, &procs.ledger.steps()).await;
    assert!(
        violations.is_empty(),
        "every step recorded once by the run that logged it, none rerun after its record: {violations:#?}"
    );
    // Cut off, the worker may still begin a step of a workflow it holds
    // until its fence window ends (its lease lets it act); the replay proved
    // that every such body ended or was stopped before another process
    // began a step of the same workflow.
    eprintln!(
        "partition mid-transaction: {} step bodies ({} stopped by fencing) in {:.1}s",
        r.begins,
        r.drops,
        started.elapsed().as_secs_f64()
    );
}

/// Sessions from `client_addr` inside a transaction that are waiting for
/// their client (`idle in transaction`): they hold whatever they locked.
async fn sessions_in_transaction(url: &str, client_addr: &str) -> i64 {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(url)
        .await
        .expect("connect to PostgreSQL");
    let n: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM pg_stat_activity WHERE client_addr = $1::inet \
         AND state = 'idle in transaction'",
    )
    .bind(client_addr)
    .fetch_one(&mut conn)
    .await
    .expect("read pg_stat_activity");
    let _ = conn.close().await;
    n
}

// ----------------------------------------------------------------- child side

mod child {
    //! The worker a re-executed test binary runs; it ends the process.

    use std::{path::PathBuf, sync::Arc, time::Duration};

    use manent_engine::{Database, Engine, EngineConfig, QueueSpec, WorkflowContext, store};
    use tokio::signal::unix::{SignalKind, signal};

    use super::{QUEUE, WORKFLOW, append};

    use manent_testkit::child_env::{number, required, var};

    pub(super) fn run() -> ! {
        manent_testkit::init_tracing();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let code = runtime.block_on(worker());
        std::process::exit(code)
    }

    /// Appends the `begin` line now and `end` (returned) or `drop` (stopped
    /// before returning: its run was dropped) when it goes.
    struct Body {
        ledger: Arc<PathBuf>,
        fields: String,
        ended: bool,
    }

    impl Body {
        fn begin(ledger: Arc<PathBuf>, fields: String) -> Body {
            append(&ledger, &format!("begin {fields}"));
            Body {
                ledger,
                fields,
                ended: false,
            }
        }
        fn end(mut self) {
            self.ended = true;
            append(&self.ledger, &format!("end {}", self.fields));
        }
    }

    impl Drop for Body {
        fn drop(&mut self) {
            if !self.ended {
                append(&self.ledger, &format!("drop {}", self.fields));
            }
        }
    }

    /// Runs an executor until SIGTERM (exit 0) or until its lease is lost (exit 4).
    async fn worker() -> i32 {
        let id = required("MANENT_TEST_ID");
        let ledger = Arc::new(PathBuf::from(required("MANENT_TEST_LEDGER")));
        let gate = Arc::new(PathBuf::from(required("MANENT_TEST_GATE")));
        let pid = std::process::id();
        let mut terminate = signal(SignalKind::terminate()).expect("a SIGTERM handler");

        let store = store::open(&required("MANENT_TEST_DB"))
            .await
            .expect("open the database");
        let mut config = EngineConfig::new(&id);
        config.stale_after =
            Duration::from_millis(number("MANENT_TEST_STALE_MS").unwrap_or(3_600_000));
        config.heartbeat_interval = Duration::from_millis(200);
        config.automatic_recovery = var("MANENT_TEST_RECOVERY").is_some();
        let engine = Engine::new(Database::from(store), config);

        let mut queue = QueueSpec::new(QUEUE);
        if let Some(n) = number("MANENT_TEST_WORKER_LIMIT") {
            queue = queue.worker_concurrency(n as u32);
        }
        if let Some(n) = number("MANENT_TEST_PARTITION_LIMIT") {
            queue = queue.partition_concurrency(n as u32);
        }
        if let Some(n) = number("MANENT_TEST_GLOBAL_LIMIT") {
            queue = queue.global_concurrency(n as u32);
        }
        engine.listen(queue);

        let steps = number("MANENT_TEST_STEPS").unwrap_or(3);
        let work = Duration::from_millis(number("MANENT_TEST_STEP_MS").unwrap_or(20));
        let gated = number("MANENT_TEST_GATED_STEP");
        let slow_every = number("MANENT_TEST_SLOW_EVERY");
        let slow = Duration::from_millis(number("MANENT_TEST_SLOW_MS").unwrap_or(0));
        engine.register(WORKFLOW, move |ctx: WorkflowContext, (): ()| {
            let (ledger, gate) = (ledger.clone(), gate.clone());
            async move {
                let (wf, partition, generation) =
                    (ctx.workflow_id(), ctx.partition_key(), ctx.generation());
                for step in 0..steps {
                    ctx.step(&format!("s{step}"), || async {
                        let body = Body::begin(
                            ledger.clone(),
                            format!("{wf} {step} {partition} {pid} {generation}"),
                        );
                        if gated == Some(step) {
                            while !gate.exists() {
                                tokio::time::sleep(Duration::from_millis(10)).await;
                            }
                        }
                        // Step s1 of workflow wf-<n> with n a multiple of
                        // MANENT_TEST_SLOW_EVERY lasts MANENT_TEST_SLOW_MS.
                        let n: Option<u64> = wf.strip_prefix("wf-").and_then(|n| n.parse().ok());
                        let is_slow = step == 1
                            && matches!((n, slow_every), (Some(n), Some(every)) if n % every == 0);
                        tokio::time::sleep(if is_slow { slow } else { work }).await;
                        body.end();
                        Ok::<_, String>(generation)
                    })
                    .await?;
                }
                Ok(())
            }
        });

        if let Err(e) = engine.launch().await {
            eprintln!("worker {id} (pid {pid}) cannot start: {e}");
            return 3;
        }
        append(
            &PathBuf::from(required("MANENT_TEST_LEDGER")),
            &format!("ready {pid}"),
        );
        tokio::select! {
            _ = terminate.recv() => {}
            lost = engine.lease_lost() => {
                eprintln!("worker {id} (pid {pid}) stops: {lost}");
                return 4;
            }
        }
        engine.shutdown(Duration::from_secs(10)).await;
        0
    }
}
