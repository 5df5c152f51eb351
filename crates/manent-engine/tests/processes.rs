//! Engine behaviour across real worker processes, on both backends: a worker
//! killed with SIGKILL resumes (same id) or is recovered (other id), a worker
//! paused past `stale_after` is fenced, limits hold across processes,
//! concurrent first starts migrate once, and the duplicate-id rule holds.
//!
//! The test binary is its own worker: `child_process_entry` runs the role
//! named by `MANENT_TEST_CHILD` when the parent re-executes the binary with it.

use std::{
    collections::HashMap,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use manent_engine::{
    Client, Database, EnqueueRequest, StepStatus, WorkflowStatus,
    store::{self, SqlStore, Store},
};
use manent_testkit::{
    Children, Db, TestDb, append_line as append, eventually, pause_outside_transactions, signal,
    wait_exit,
};

/// Generous bounds for waits on other processes; never reached when things work.
const WAIT: Duration = Duration::from_secs(60);
const HOUR_MS: &str = "3600000";

/// Env var naming the role a re-executed test binary runs.
const ROLE: &str = "MANENT_TEST_CHILD";

/// Generates one `#[tokio::test]` per backend for each listed test body.
use manent_testkit::on_both_backends;

on_both_backends!(
    a_worker_killed_mid_step_and_restarted_with_its_id_resumes_from_the_interrupted_step,
    a_killed_workers_workflow_is_resumed_by_another_worker_through_automatic_recovery,
    a_worker_killed_on_this_host_is_recovered_by_hand_at_once_though_its_lease_is_live,
    a_paused_worker_whose_workflow_was_recovered_records_nothing_more_when_it_continues,
    limits_hold_across_worker_processes,
    workers_started_together_on_an_empty_database_all_migrate_it,
    a_duplicate_executor_id_is_refused_across_processes_until_the_holder_stops,
    a_paused_worker_taken_over_under_its_own_id_exits_non_zero_without_another_step_when_continued,
    a_worker_rolled_to_a_release_with_a_breaking_change_replays_what_it_held_under_the_old_version,
    a_worker_rolled_back_to_an_older_release_hands_back_what_it_cannot_replay_and_it_waits_for_one_that_can,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_database_connections_are_all_cut_mid_step_keeps_its_id_and_runs_no_step_twice()
 {
    a_worker_whose_database_connections_are_all_cut_keeps_its_id(Db::Postgres).await;
}

/// The worker side: returns at once in a normal test run; in a re-executed
/// child it runs the role and exits the process.
#[test]
fn child_process_entry() {
    if let Ok(role) = std::env::var(ROLE) {
        child::run(&role);
    }
}

// ---------------------------------------------------------------- parent side

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

    fn count(&self, line: &str) -> usize {
        self.lines().iter().filter(|l| *l == line).count()
    }

    async fn wait_for(&self, line: &str) {
        eventually(&format!("ledger line `{line}`"), WAIT, || async {
            self.lines().iter().any(|l| l == line).then_some(())
        })
        .await
    }
}

/// What a child process is told to do.
#[derive(Clone)]
struct Spec {
    vars: Vec<(&'static str, String)>,
}

impl Spec {
    fn worker(id: &str) -> Spec {
        Spec {
            vars: vec![(ROLE, "worker".into()), ("MANENT_TEST_ID", id.into())],
        }
    }
    fn migrator() -> Spec {
        Spec {
            vars: vec![(ROLE, "migrate".into())],
        }
    }
    fn set(mut self, key: &'static str, value: impl ToString) -> Spec {
        self.vars.push((key, value.to_string()));
        self
    }
    /// `stale_after` of the worker, in milliseconds.
    fn stale_ms(self, ms: &str) -> Spec {
        self.set("MANENT_TEST_STALE_MS", ms)
    }
    /// The workflow versions the worker runs (`min-max`) and a short drain at SIGTERM, as a
    /// release in a rolling upgrade.
    fn release(self, versions: &str) -> Spec {
        self.set("MANENT_TEST_VERSIONS", versions)
            .set("MANENT_TEST_DRAIN_MS", 300)
    }
    /// Automatic recovery of stale executors, with a 2 s `stale_after`.
    fn recovering(self) -> Spec {
        self.set("MANENT_TEST_RECOVERY", "1")
            .set("MANENT_TEST_STALE_MS", 2000)
    }
}

/// The child processes of one test, their logs and shared files. Kills the
/// children when dropped, and prints their logs if the test failed.
struct Procs {
    children: Children,
    logs: Vec<PathBuf>,
    url: String,
    dir: PathBuf,
    ledger: Ledger,
    gate: PathBuf,
}

impl Procs {
    fn new(db: &TestDb) -> Procs {
        Procs {
            children: Children::default(),
            logs: Vec::new(),
            url: db.url.clone(),
            dir: db.dir.path().to_path_buf(),
            ledger: Ledger(db.path("ledger")),
            gate: db.path("gate"),
        }
    }

    /// Re-executes this test binary as a child running `spec`; returns its index.
    fn spawn(&mut self, spec: Spec) -> usize {
        let n = self.children.0.len();
        let out = self.dir.join(format!("child-{n}.out"));
        let err = self.dir.join(format!("child-{n}.err"));
        let mut cmd = Command::new(std::env::current_exe().expect("the test binary's path"));
        cmd.args([
            "--exact",
            "child_process_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("MANENT_TEST_DB", &self.url)
        .env("MANENT_TEST_LEDGER", &self.ledger.0)
        .env("MANENT_TEST_GATE", &self.gate)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).expect("a child's stdout file"))
        .stderr(std::fs::File::create(&err).expect("a child's stderr file"));
        for (k, v) in &spec.vars {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn the test binary as a worker");
        self.logs.extend([out, err]);
        self.children.push(child)
    }

    fn pid(&self, i: usize) -> u32 {
        self.children.0[i].id()
    }

    fn child(&mut self, i: usize) -> &mut Child {
        &mut self.children.0[i]
    }

    /// SIGKILL, and wait until the process is gone (its locks released by the kernel).
    async fn kill(&mut self, i: usize) {
        signal(&self.children.0[i], "KILL");
        wait_exit(self.child(i), WAIT).await;
    }

    fn stderr(&self, i: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("child-{i}.err"))).unwrap_or_default()
    }

    /// Its logs (tracing writes to stdout in a test binary) and its stderr.
    fn output(&self, i: usize) -> String {
        let out =
            std::fs::read_to_string(self.dir.join(format!("child-{i}.out"))).unwrap_or_default();
        out + &self.stderr(i)
    }

    fn open_gate(&self) {
        std::fs::write(&self.gate, b"open").expect("create the gate file");
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for log in &self.logs {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                eprintln!("----- {} -----\n{text}", log.display());
            }
            eprintln!("----- ledger -----\n{}", self.ledger.lines().join("\n"));
        }
    }
}

async fn client(db: &TestDb) -> Client {
    Client::new(Database::from(
        store::open(&db.url).await.expect("open the test database"),
    ))
}

async fn wait_success(client: &Client, id: &str) {
    let record = client.wait(id, WAIT).await.expect("the workflow ends");
    assert_eq!(
        record.status,
        WorkflowStatus::Success,
        "workflow {id} must succeed; error: {:?}",
        record.error
    );
}

/// Executor id of each recorded step, by step name.
async fn step_executors(client: &Client, id: &str) -> Vec<(String, String)> {
    let steps = client.steps(id).await.expect("load the steps");
    assert!(
        steps.iter().all(|s| s.status == StepStatus::Success),
        "every recorded step of {id} is a success: {steps:?}"
    );
    steps.into_iter().map(|s| (s.name, s.executor_id)).collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

// ---------------------------------------------------------------------- tests

async fn a_worker_killed_mid_step_and_restarted_with_its_id_resumes_from_the_interrupted_step(
    db: Db,
) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let client = client(&db).await;
    let mut procs = Procs::new(&db);
    client
        .enqueue(EnqueueRequest::new("three", "q", ()).id("wf"))
        .await
        .unwrap();

    // A one-hour stale_after: only the liveness proof (advisory lock / file
    // lock released by the dead process) lets the restart take the id at once.
    let first = procs.spawn(Spec::worker("w1").stale_ms(HOUR_MS));
    let pid1 = procs.pid(first);
    procs
        .ledger
        .wait_for(&format!("wf step2 start {pid1}"))
        .await;
    procs.kill(first).await;
    procs.open_gate();

    let second = procs.spawn(Spec::worker("w1").stale_ms(HOUR_MS));
    let pid2 = procs.pid(second);
    wait_success(&client, "wf").await;

    let ledger = &procs.ledger;
    assert_eq!(
        ledger.count(&format!("wf step1 done {pid1}")),
        1,
        "step1 ran before the kill"
    );
    assert_eq!(
        ledger.count(&format!("wf step1 start {pid2}")),
        0,
        "a completed step is never rerun by the restarted worker"
    );
    assert_eq!(
        ledger.count(&format!("wf step2 done {pid1}")),
        0,
        "the killed worker never finished step2"
    );
    assert_eq!(
        (
            ledger.count(&format!("wf step2 start {pid2}")),
            ledger.count(&format!("wf step2 done {pid2}"))
        ),
        (1, 1),
        "the interrupted step runs again, once, in the restarted worker"
    );
    assert_eq!(
        ledger.count(&format!("wf step3 done {pid2}")),
        1,
        "the last step runs once, after the resume"
    );
    assert_eq!(
        ledger
            .lines()
            .iter()
            .filter(|l| l.starts_with("wf "))
            .count(),
        7,
        "step lines: step1 start/done, step2 start (killed), step2 start/done, step3 start/done, \
         nothing else"
    );
    assert_eq!(
        step_executors(&client, "wf").await,
        pairs(&[("step1", "w1"), ("step2", "w1"), ("step3", "w1")]),
        "every step recorded under the one executor id"
    );
}

async fn a_killed_workers_workflow_is_resumed_by_another_worker_through_automatic_recovery(db: Db) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let client = client(&db).await;
    let mut procs = Procs::new(&db);
    client
        .enqueue(EnqueueRequest::new("three", "q", ()).id("wf"))
        .await
        .unwrap();

    let a = procs.spawn(Spec::worker("a").recovering());
    let pid_a = procs.pid(a);
    procs
        .ledger
        .wait_for(&format!("wf step2 start {pid_a}"))
        .await;
    procs.kill(a).await;
    procs.open_gate();

    // "a" never comes back: "b" recovers its workflow once a's heartbeat is stale.
    let b = procs.spawn(Spec::worker("b").recovering());
    let pid_b = procs.pid(b);
    wait_success(&client, "wf").await;

    let ledger = &procs.ledger;
    assert_eq!(
        ledger.count(&format!("wf step1 done {pid_a}")),
        1,
        "step1 completed on the first worker"
    );
    assert_eq!(
        ledger.count(&format!("wf step1 start {pid_b}")),
        0,
        "the recovering worker never reruns the completed step"
    );
    assert_eq!(
        (
            ledger.count(&format!("wf step2 start {pid_b}")),
            ledger.count(&format!("wf step2 done {pid_b}")),
            ledger.count(&format!("wf step3 done {pid_b}")),
        ),
        (1, 1, 1),
        "the other worker resumes from the interrupted step and finishes"
    );
    assert_eq!(
        step_executors(&client, "wf").await,
        pairs(&[("step1", "a"), ("step2", "b"), ("step3", "b")]),
        "the records name who ran each step"
    );
    let record = client.get("wf").await.unwrap().unwrap();
    assert_eq!(
        record.executor_id.as_deref(),
        Some("b"),
        "the workflow ended under the recovering executor"
    );
}

/// `manent recover` right after a `kill -9` on this host: the lease (an hour's) is live,
/// but the pid it names is gone and its lock free, the fast proof of death.
async fn a_worker_killed_on_this_host_is_recovered_by_hand_at_once_though_its_lease_is_live(
    db: Db,
) {
    let db = TestDb::new(db).await;
    let client = client(&db).await;
    let mut procs = Procs::new(&db);
    let wf = EnqueueRequest::new("three", "q", ()).id("wf");
    client.enqueue(wf).await.unwrap();
    let a = procs.spawn(Spec::worker("a").stale_ms(HOUR_MS));
    let pid_a = procs.pid(a);
    procs
        .ledger
        .wait_for(&format!("wf step2 start {pid_a}"))
        .await;
    let refused = client.recover_executor("a", false, "test").await;
    assert!(
        matches!(
            refused,
            Err(manent_engine::EngineError::ExecutorAlive { .. })
        ),
        "a worker whose process runs is not recovered without force: {refused:?}"
    );
    procs.kill(a).await;
    let recovered = client.recover_executor("a", false, "test").await;
    assert_eq!(
        recovered.ok(),
        Some(vec!["wf".to_string()]),
        "its process gone, a's workflow goes back to its queue at once"
    );
    procs.open_gate();
    procs.spawn(Spec::worker("b").stale_ms(HOUR_MS));
    wait_success(&client, "wf").await;
}

async fn a_paused_worker_whose_workflow_was_recovered_records_nothing_more_when_it_continues(
    db: Db,
) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let client = client(&db).await;
    let mut procs = Procs::new(&db);
    client
        .enqueue(EnqueueRequest::new("three", "q", ()).id("wf"))
        .await
        .unwrap();

    let a = procs.spawn(Spec::worker("a").stale_ms("2000"));
    let pid_a = procs.pid(a);
    procs
        .ledger
        .wait_for(&format!("wf step2 start {pid_a}"))
        .await;
    // Frozen in a long step: alive (its locks held) but silent past stale_after.
    pause_outside_transactions(&procs.children.0[a], &procs.url).await;
    procs.open_gate();

    let b = procs.spawn(Spec::worker("b").recovering());
    let pid_b = procs.pid(b);
    wait_success(&client, "wf").await;
    let finished = client.get("wf").await.unwrap().unwrap();

    signal(&procs.children.0[a], "CONT");
    // On waking, a stops its run in one of three ways, whichever comes first:
    // at once, its lease having run out while it was paused (self-fencing); when
    // its run watcher reads that the workflow was recovered away; or, if the step
    // body wins the race, when its checkpoint is refused (the generation moved on).
    eventually("the continued worker stops its run", WAIT, || async {
        let output = procs.output(a);
        (procs.ledger.count(&format!("wf fenced {pid_a}")) == 1
            || output.contains("could not be renewed in time")
            || output.contains("the workflow is no longer ours"))
        .then_some(())
    })
    .await;

    let ledger = &procs.ledger;
    assert!(
        ledger.count(&format!("wf step2 done {pid_a}")) <= 1,
        "the paused worker's step body ran at most to its end"
    );
    assert_eq!(
        ledger.count(&format!("wf step3 start {pid_a}")),
        0,
        "the fenced worker never starts its next step"
    );
    assert_eq!(
        (
            ledger.count(&format!("wf step2 done {pid_b}")),
            ledger.count(&format!("wf step3 done {pid_b}")),
        ),
        (1, 1),
        "the recovering worker ran the rest"
    );
    assert_eq!(
        step_executors(&client, "wf").await,
        pairs(&[("step1", "a"), ("step2", "b"), ("step3", "b")]),
        "no record of the fenced worker overwrote the recovering worker's"
    );
    assert_eq!(
        client.get("wf").await.unwrap().unwrap(),
        finished,
        "the workflow's final record is untouched by the fenced worker"
    );
    assert_eq!(
        finished.executor_id.as_deref(),
        Some("b"),
        "the outcome was recorded by the recovering worker"
    );
}

async fn limits_hold_across_worker_processes(db: Db) {
    const WORKER: usize = 2;
    const PARTITION: usize = 1;
    const GLOBAL: usize = 3;
    const WORKFLOWS: usize = 30;
    const STEPS: usize = 2;
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let client = client(&db).await;
    let mut procs = Procs::new(&db);
    let mut pids = Vec::new();
    for n in 0..3 {
        let spec = Spec::worker(&format!("w{n}"))
            .set("MANENT_TEST_WORKER_LIMIT", WORKER)
            .set("MANENT_TEST_PARTITION_LIMIT", PARTITION)
            .set("MANENT_TEST_GLOBAL_LIMIT", GLOBAL)
            .set("MANENT_TEST_STEP_MS", 20);
        let i = procs.spawn(spec);
        pids.push(procs.pid(i));
    }
    for pid in &pids {
        procs.ledger.wait_for(&format!("ready {pid}")).await;
    }
    let mut ids = Vec::new();
    for n in 0..WORKFLOWS {
        let wf = client
            .enqueue(EnqueueRequest::new("limited", "q", ()).partition(format!("p{}", n % 4)))
            .await
            .unwrap();
        ids.push(wf.id);
    }
    for id in &ids {
        wait_success(&client, id).await;
    }

    // Replay the ledger: what ran at once, overall, per partition, per process.
    let mut now = (
        0usize,
        HashMap::<String, usize>::new(),
        HashMap::<String, usize>::new(),
    );
    let mut max = (0usize, 0usize, 0usize);
    let mut begins = 0;
    for line in procs.ledger.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let (kind, partition, pid) = match f.as_slice() {
            ["begin" | "end", p, pid, _wf] => (f[0], p.to_string(), pid.to_string()),
            _ => continue,
        };
        let (total, per_partition, per_pid) = &mut now;
        let (p, w) = (
            per_partition.entry(partition).or_default(),
            per_pid.entry(pid).or_default(),
        );
        if kind == "begin" {
            begins += 1;
            *total += 1;
            *p += 1;
            *w += 1;
            max = (max.0.max(*total), max.1.max(*p), max.2.max(*w));
        } else {
            *total -= 1;
            *p -= 1;
            *w -= 1;
        }
    }
    assert_eq!(
        begins,
        WORKFLOWS * STEPS,
        "every step ran exactly once (nothing was killed)"
    );
    assert!(
        max.0 <= GLOBAL,
        "at most {GLOBAL} workflows at once over all processes, saw {}",
        max.0
    );
    assert!(
        max.1 <= PARTITION,
        "at most {PARTITION} workflow per partition at once, saw {}",
        max.1
    );
    assert!(
        max.2 <= WORKER,
        "at most {WORKER} workflows at once in one process, saw {}",
        max.2
    );
}

async fn workers_started_together_on_an_empty_database_all_migrate_it(db: Db) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let mut procs = Procs::new(&db);
    let all: Vec<usize> = (0..8).map(|_| procs.spawn(Spec::migrator())).collect();
    // Every child waits for the gate, so they all open the database at once.
    procs.open_gate();
    let expected = store::expected_schema_version();
    for &i in &all {
        let pid = procs.pid(i);
        let status = wait_exit(procs.child(i), WAIT).await;
        assert!(
            status.success(),
            "process {pid} must open and migrate the shared database: {status}; stderr:\n{}",
            procs.stderr(i)
        );
        assert_eq!(
            procs.ledger.count(&format!("migrated {pid} {expected}")),
            1,
            "process {pid} saw the schema at the version this build expects"
        );
    }
    let store = SqlStore::connect(&db.url).await.unwrap();
    assert_eq!(
        store.schema_version().await.unwrap(),
        expected,
        "the database ends at the expected schema version"
    );
}

async fn a_duplicate_executor_id_is_refused_across_processes_until_the_holder_stops(db: Db) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let client = client(&db).await;
    let mut procs = Procs::new(&db);

    let a = procs.spawn(Spec::worker("x").stale_ms("2000"));
    let pid_a = procs.pid(a);
    procs.ledger.wait_for(&format!("ready {pid_a}")).await;

    // A long stale_after for the newcomer: it must say that it waits long before it refuses.
    let b = procs.spawn(Spec::worker("x").stale_ms("10000"));
    let pid_b = procs.pid(b);
    eventually("the newcomer says it waits", WAIT, || async {
        procs
            .output(b)
            .contains("waiting up to stale_after")
            .then_some(())
    })
    .await;
    assert!(
        procs.child(b).try_wait().unwrap().is_none(),
        "the newcomer announced its wait at once, while still waiting"
    );
    let status = wait_exit(procs.child(b), WAIT).await;
    assert!(
        !status.success(),
        "a second process with a live worker's id must not start: {status}"
    );
    let stderr = procs.stderr(b);
    let host = hostname::get().unwrap().to_string_lossy().into_owned();
    assert!(
        stderr.contains("already in use") && stderr.contains(&format!("host `{host}`")),
        "the refusal names the host holding the id; stderr:\n{stderr}"
    );
    assert_eq!(
        procs.ledger.count(&format!("ready {pid_b}")),
        0,
        "the refused process never ran as a worker"
    );

    signal(&procs.children.0[a], "TERM");
    let status = wait_exit(procs.child(a), WAIT).await;
    assert!(
        status.success(),
        "SIGTERM shuts the worker down cleanly: {status}"
    );
    assert_eq!(
        procs.ledger.count(&format!("stopped {pid_a}")),
        1,
        "the worker drained and recorded its stop before exiting"
    );

    // A one-hour stale_after: only the recorded stop lets the id be taken at once.
    let c = procs.spawn(Spec::worker("x").stale_ms(HOUR_MS));
    let pid_c = procs.pid(c);
    procs.ledger.wait_for(&format!("ready {pid_c}")).await;
    let executor = client
        .executors()
        .await
        .unwrap()
        .into_iter()
        .find(|e| e.id == "x")
        .expect("the executor row");
    assert_eq!(
        executor.pid,
        i64::from(pid_c),
        "the id now belongs to the new process"
    );
}

/// Terminates every other session of the test's database, as a failover or an
/// idle-timeout proxy would: the worker's pool, its notification listener and
/// the connection holding its advisory lock.
async fn cut_every_connection(url: &str) -> u64 {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(url)
        .await
        .expect("connect to PostgreSQL");
    let cut: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .fetch_all(&mut conn)
    .await
    .expect("terminate the other sessions");
    cut.into_iter().filter(|t| *t).count() as u64
}

async fn a_worker_whose_database_connections_are_all_cut_keeps_its_id(db: Db) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let client = client(&db).await;
    let mut procs = Procs::new(&db);
    client
        .enqueue(EnqueueRequest::new("three", "q", ()).id("wf"))
        .await
        .unwrap();
    let a = procs.spawn(Spec::worker("x").stale_ms("3000"));
    let pid_a = procs.pid(a);
    procs
        .ledger
        .wait_for(&format!("wf step2 start {pid_a}"))
        .await;

    let cut = cut_every_connection(&db.url).await;
    assert!(cut > 0, "the worker's sessions were terminated");
    // A newcomer with the same id: the advisory lock is free now, but the
    // lease is live and its holder's process is alive; it must be refused.
    let b = procs.spawn(Spec::worker("x").stale_ms("3000"));
    let pid_b = procs.pid(b);
    let status = wait_exit(procs.child(b), WAIT).await;
    assert!(
        !status.success(),
        "a newcomer is not admitted while the holder's lease is live: {status}"
    );
    let output = procs.output(b);
    assert!(
        output.contains("already in use"),
        "the newcomer says the id is in use; output:\n{output}"
    );
    assert!(
        output.contains("waiting up to stale_after"),
        "the newcomer said that it waits; output:\n{output}"
    );
    procs.open_gate();
    wait_success(&client, "wf").await;

    let ledger = &procs.ledger;
    for step in ["step1", "step2", "step3"] {
        assert_eq!(
            ledger
                .lines()
                .iter()
                .filter(|l| l.starts_with(&format!("wf {step} start ")))
                .count(),
            1,
            "{step} ran exactly once, through the cut"
        );
    }
    assert_eq!(
        ledger.count(&format!("ready {pid_b}")),
        0,
        "the newcomer never ran as a worker"
    );
    assert!(
        procs.child(a).try_wait().unwrap().is_none(),
        "the holder lives on after its connections were cut"
    );
    assert_eq!(
        step_executors(&client, "wf").await,
        pairs(&[("step1", "x"), ("step2", "x"), ("step3", "x")]),
        "every step was recorded by the holder"
    );
    let executor = client
        .executors()
        .await
        .unwrap()
        .into_iter()
        .find(|e| e.id == "x")
        .expect("the executor row");
    assert_eq!(
        executor.pid,
        i64::from(pid_a),
        "the id still belongs to the first process"
    );
}

async fn a_paused_worker_taken_over_under_its_own_id_exits_non_zero_without_another_step_when_continued(
    db: Db,
) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let client = client(&db).await;
    let mut procs = Procs::new(&db);
    client
        .enqueue(EnqueueRequest::new("three", "q", ()).id("wf"))
        .await
        .unwrap();
    let a = procs.spawn(Spec::worker("x").stale_ms("2000"));
    let pid_a = procs.pid(a);
    procs
        .ledger
        .wait_for(&format!("wf step2 start {pid_a}"))
        .await;
    pause_outside_transactions(&procs.children.0[a], &procs.url).await;

    // Same id: admitted once the paused holder's lease runs out, resumes wf.
    let b = procs.spawn(Spec::worker("x").stale_ms("2000"));
    let pid_b = procs.pid(b);
    procs
        .ledger
        .wait_for(&format!("wf step2 start {pid_b}"))
        .await;
    procs.open_gate();
    wait_success(&client, "wf").await;

    signal(&procs.children.0[a], "CONT");
    let status = wait_exit(procs.child(a), WAIT).await;
    assert!(
        !status.success(),
        "the continued process, its id taken, exits non-zero: {status}"
    );
    let stderr = procs.stderr(a);
    assert!(
        stderr.contains("taken over") && stderr.contains(&format!("pid {pid_b}")),
        "it says its id was taken and by whom; stderr:\n{stderr}"
    );
    let ledger = &procs.ledger;
    assert_eq!(
        ledger.count(&format!("wf step3 start {pid_a}")),
        0,
        "the continued process starts no further step"
    );
    assert_eq!(
        (
            ledger.count(&format!("wf step2 start {pid_b}")),
            ledger.count(&format!("wf step3 start {pid_b}")),
        ),
        (1, 1),
        "the new holder ran the interrupted step and the rest, once each"
    );
    assert!(
        procs.child(b).try_wait().unwrap().is_none(),
        "the new holder keeps running"
    );
}

/// SIGTERMs a worker (a rolling update), waits for it to drain and exit.
async fn roll_out(procs: &mut Procs, i: usize) {
    signal(&procs.children.0[i], "TERM");
    wait_exit(procs.child(i), WAIT).await;
}

/// Enqueues the `versioned` workflow `id` under the version new work starts under now (this
/// code knows versions up to 2).
async fn enqueue_versioned(client: &Client, id: &str) -> u32 {
    let version = client
        .startable_version(2)
        .await
        .expect("the version new work starts under");
    client
        .enqueue(
            EnqueueRequest::new("versioned", "q", ())
                .id(id)
                .version(version),
        )
        .await
        .expect("enqueue");
    version
}

async fn a_worker_rolled_to_a_release_with_a_breaking_change_replays_what_it_held_under_the_old_version(
    db: Db,
) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let client = client(&db).await;
    let mut procs = Procs::new(&db);
    let old = procs.spawn(Spec::worker("w").release("1-1"));
    let pid_old = procs.pid(old);
    procs.ledger.wait_for(&format!("ready {pid_old}")).await;
    assert_eq!(
        enqueue_versioned(&client, "held").await,
        1,
        "with only the old release live, new work starts under version 1"
    );
    procs
        .ledger
        .wait_for(&format!("held step2 start {pid_old} v1"))
        .await;

    // The rolling update: the old release drains (step2 waits for the gate: the drain
    // times out and the workflow stays pending under its id); the new one takes the id.
    roll_out(&mut procs, old).await;
    let new = procs.spawn(Spec::worker("w").release("1-2"));
    let pid_new = procs.pid(new);
    procs
        .ledger
        .wait_for(&format!("held step2 start {pid_new} v1"))
        .await;
    assert_eq!(
        enqueue_versioned(&client, "fresh").await,
        2,
        "once only the new release is live, new work starts under version 2"
    );
    procs.open_gate();
    wait_success(&client, "held").await;
    wait_success(&client, "fresh").await;

    let ledger = &procs.ledger;
    assert_eq!(
        (
            ledger.count(&format!("held step1 done {pid_old} v1")),
            ledger.count(&format!("held step1 start {pid_new} v1")),
            ledger.count(&format!("held step2 done {pid_new} v1")),
        ),
        (1, 0, 1),
        "the new release replays the old deploy under version 1: step1 not run again, the \
         interrupted step2 run once"
    );
    assert!(
        !ledger.lines().iter().any(|l| l.starts_with("held prepare")),
        "version 2's new step never runs in a workflow started under version 1"
    );
    assert_eq!(
        ledger.count(&format!("fresh prepare done {pid_new} v2")),
        1,
        "new work runs version 2, its new step included"
    );
}

async fn a_worker_rolled_back_to_an_older_release_hands_back_what_it_cannot_replay_and_it_waits_for_one_that_can(
    db: Db,
) {
    manent_testkit::init_tracing();
    let db = TestDb::new(db).await;
    let client = client(&db).await;
    let mut procs = Procs::new(&db);
    let new = procs.spawn(Spec::worker("w").release("1-2"));
    let pid_new = procs.pid(new);
    procs.ledger.wait_for(&format!("ready {pid_new}")).await;
    assert_eq!(
        enqueue_versioned(&client, "held").await,
        2,
        "the held workflow is enqueued under version 2"
    );
    procs
        .ledger
        .wait_for(&format!("held step2 start {pid_new} v2"))
        .await;

    // Rolled back: the older release takes the id and cannot replay version 2.
    roll_out(&mut procs, new).await;
    let old = procs.spawn(Spec::worker("w").release("1-1"));
    let pid_old = procs.pid(old);
    procs.ledger.wait_for(&format!("ready {pid_old}")).await;
    eventually(
        "the older release hands the version-2 workflow back to the queue",
        WAIT,
        || async {
            let record = client.get("held").await.ok().flatten()?;
            (record.status == WorkflowStatus::Enqueued).then_some(())
        },
    )
    .await;
    procs.open_gate();
    assert_eq!(
        client.get("held").await.unwrap().unwrap().status,
        WorkflowStatus::Enqueued,
        "with the gate open and a worker live, it still waits: no live worker can replay it"
    );

    // A worker of a release that runs version 2 serves the queue: it finishes it.
    let other = procs.spawn(Spec::worker("other").release("1-2"));
    let pid_other = procs.pid(other);
    wait_success(&client, "held").await;
    let ledger = &procs.ledger;
    assert!(
        !ledger
            .lines()
            .iter()
            .any(|l| l.starts_with("held ") && l.contains(&format!(" {pid_old} "))),
        "the older release ran no step of it: {:?}",
        ledger.lines()
    );
    assert_eq!(
        (
            ledger.count(&format!("held prepare done {pid_new} v2")),
            ledger.count(&format!("held step1 done {pid_new} v2")),
            ledger.count(&format!("held step1 start {pid_other} v2")),
            ledger.count(&format!("held step2 done {pid_other} v2")),
        ),
        (1, 1, 0, 1),
        "the release that can replay it finishes it under version 2, no finished step again"
    );
}

// ----------------------------------------------------------------- child side

mod child {
    //! The roles a re-executed test binary runs; each ends the process.

    use std::{path::PathBuf, time::Duration};

    use manent_engine::{
        Database, Engine, EngineConfig, QueueSpec, WorkflowContext, WorkflowError,
        WorkflowVersions, store,
    };
    use tokio::signal::unix::{SignalKind, signal};

    use super::append;

    use manent_testkit::child_env::{number, required, var};

    pub(super) fn run(role: &str) -> ! {
        manent_testkit::init_tracing();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let code = runtime.block_on(async {
            match role {
                "worker" => worker().await,
                "migrate" => migrate().await,
                other => panic!("unknown child role {other}"),
            }
        });
        std::process::exit(code)
    }

    async fn wait_for_file(path: &std::path::Path) {
        while !path.exists() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits for the gate, opens (and migrates) the store, reports the version.
    async fn migrate() -> i32 {
        let ledger = PathBuf::from(required("MANENT_TEST_LEDGER"));
        wait_for_file(&PathBuf::from(required("MANENT_TEST_GATE"))).await;
        match store::open(&required("MANENT_TEST_DB")).await {
            Ok(store) => match store.schema_version().await {
                Ok(v) => {
                    append(&ledger, &format!("migrated {} {v}", std::process::id()));
                    0
                }
                Err(e) => {
                    eprintln!("cannot read the schema version: {e}");
                    2
                }
            },
            Err(e) => {
                eprintln!("cannot open the database: {e}");
                2
            }
        }
    }

    /// Runs an executor until SIGTERM, then shuts it down and exits 0.
    async fn worker() -> i32 {
        let id = required("MANENT_TEST_ID");
        let ledger = PathBuf::from(required("MANENT_TEST_LEDGER"));
        let gate = PathBuf::from(required("MANENT_TEST_GATE"));
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
        if let Some(range) = var("MANENT_TEST_VERSIONS") {
            let (min, max) = range.split_once('-').expect("versions as `min-max`");
            config.workflow_versions =
                WorkflowVersions::new(min.parse().unwrap(), max.parse().unwrap())
                    .expect("a valid range of versions");
        }
        let engine = Engine::new(Database::from(store), config);

        let mut queue = QueueSpec::new("q");
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

        // Three steps, each logged as it starts and ends; step2 waits for the gate.
        let (l, g) = (ledger.clone(), gate.clone());
        engine.register("three", move |ctx: WorkflowContext, (): ()| {
            let (ledger, gate) = (l.clone(), g.clone());
            async move {
                let wf = ctx.workflow_id().to_string();
                for n in 1..=3u32 {
                    let step = format!("step{n}");
                    let done = ctx
                        .step(&step, || async {
                            append(&ledger, &format!("{wf} {step} start {pid}"));
                            if n == 2 {
                                wait_for_file(&gate).await;
                            }
                            append(&ledger, &format!("{wf} {step} done {pid}"));
                            Ok::<_, String>(n)
                        })
                        .await;
                    if let Err(e) = done {
                        if matches!(e, WorkflowError::Fenced) {
                            append(&ledger, &format!("{wf} fenced {pid}"));
                        }
                        return Err(e);
                    }
                }
                Ok(3u32)
            }
        });

        // A workflow whose version 2 is a breaking change: a `prepare` step before version
        // 1's `step1` and `step2` (which waits for the gate). Each step is logged as it
        // starts and ends, with the version its code ran.
        let (l, g) = (ledger.clone(), gate.clone());
        engine.register("versioned", move |ctx: WorkflowContext, (): ()| {
            let (ledger, gate) = (l.clone(), g.clone());
            async move {
                let (wf, version) = (ctx.workflow_id().to_string(), ctx.workflow_version());
                let mut steps = vec!["step1", "step2"];
                if version >= 2 {
                    steps.insert(0, "prepare");
                }
                for step in steps {
                    ctx.step(step, || async {
                        append(&ledger, &format!("{wf} {step} start {pid} v{version}"));
                        if step == "step2" {
                            wait_for_file(&gate).await;
                        }
                        append(&ledger, &format!("{wf} {step} done {pid} v{version}"));
                        Ok::<_, String>(())
                    })
                    .await?;
                }
                Ok(version)
            }
        });

        // Two steps of simulated work, logged as begin/end with the partition and pid.
        let work = Duration::from_millis(number("MANENT_TEST_STEP_MS").unwrap_or(20));
        let l = ledger.clone();
        engine.register("limited", move |ctx: WorkflowContext, (): ()| {
            let ledger = l.clone();
            async move {
                let (wf, partition) = (ctx.workflow_id(), ctx.partition_key());
                for n in 0..2 {
                    ctx.step(&format!("work{n}"), || async {
                        append(&ledger, &format!("begin {partition} {pid} {wf}"));
                        tokio::time::sleep(work).await;
                        append(&ledger, &format!("end {partition} {pid} {wf}"));
                        Ok::<_, String>(())
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
        append(&ledger, &format!("ready {pid}"));
        tokio::select! {
            _ = terminate.recv() => {}
            lost = engine.lease_lost() => {
                append(&ledger, &format!("lost {pid}"));
                eprintln!("worker {id} (pid {pid}) stops: {lost}");
                return 4;
            }
        }
        let drain = Duration::from_millis(number("MANENT_TEST_DRAIN_MS").unwrap_or(10_000));
        engine.shutdown(drain).await;
        append(&ledger, &format!("stopped {pid}"));
        0
    }
}
