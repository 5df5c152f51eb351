//! The workers mode: the throughput of 1, 2 and 4 worker processes sharing one PostgreSQL, with
//! I/O-bound steps, and the worker child those processes run.
//!
//! Method, for each worker count K on a fresh database:
//! 1. This process creates the database and opens the store (the schema is migrated once here).
//! 2. It starts K child processes of its own binary, `--worker --executor-id bench-w<K>-<j>`,
//!    each one executor serving the queue with `--worker-concurrency` (default 10) and partition
//!    concurrency 1; the steps sleep `--step-sleep-ms` (default 50 ms) each.
//! 3. Each child launches its engine on the still empty queue and prints `ready`; this process
//!    waits for all K.
//! 4. It then enqueues the whole backlog (`--workflows`, default 3,000, keys `p{i % 5000}`) with
//!    ONE `Client::enqueue_many` call: one transaction, so no worker can see any of it before
//!    the commit, after which one NOTIFY wakes every worker. The clock starts when that call
//!    returns and stops when this process's own connection, polling every 10 ms, counts all of
//!    them in `SUCCESS`.
//! 5. It closes the children's stdin; each shuts its engine down and exits.
//!
//! The result line also has the span the database itself saw (first `started_at` to last
//! `finished_at`) and how many workflows each executor ran.

use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use manent_engine::{Client, Database, Engine, EngineConfig, EnqueueRequest, QueueSpec};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::fresh::{FreshDb, loadavg};
use crate::{Args, Backend, QUEUE, STEP_SLEEP_MS, WORKFLOW, bench_workflow, round};

const DEFAULT_WORKER_CONCURRENCY: u32 = 10;

pub(crate) async fn run(args: &Args) -> Result<()> {
    for &workers in &args.workers {
        let line = measure(args, workers)
            .await
            .map_err(|e| anyhow!("manent workers {workers}: {e:#}"))?;
        println!("{line}");
    }
    Ok(())
}

async fn measure(args: &Args, workers: u32) -> Result<serde_json::Value> {
    let db = FreshDb::create(
        &args.database_url,
        Backend::Postgres,
        &format!("workers{workers}"),
    )
    .await?;
    let result = measure_on(args, workers, &db).await;
    db.remove().await?;
    result
}

struct Worker {
    child: Child,
    executor_id: String,
}

async fn start_worker(
    args: &Args,
    url: &str,
    executor_id: String,
    concurrency: u32,
) -> Result<Worker> {
    let exe = std::env::current_exe().context("finding the benchmark's own binary")?;
    let mut command = Command::new(exe);
    command
        .arg("--worker")
        .args(["--database-url", url])
        .args(["--executor-id", &executor_id])
        .args(["--worker-concurrency", &concurrency.to_string()])
        .args(["--step-sleep-ms", &args.step_sleep_ms.to_string()]);
    if crate::RECORD_START.load(std::sync::atomic::Ordering::Relaxed) {
        command.arg("--record-start");
    }
    let child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting worker {executor_id}"))?;
    Ok(Worker { child, executor_id })
}

async fn measure_on(args: &Args, workers: u32, db: &FreshDb) -> Result<serde_json::Value> {
    let label = format!("manent workers {workers}");
    let concurrency = args
        .worker_concurrency
        .unwrap_or(DEFAULT_WORKER_CONCURRENCY);
    let store = db.open_store().await?;
    let probe = db.probe().await?;
    let client = Client::new(Database::from(store));

    let mut children = Vec::new();
    for j in 1..=workers {
        children.push(
            start_worker(args, db.url(), format!("bench-w{workers}-{j}"), concurrency).await?,
        );
    }
    let ready_by = Instant::now() + Duration::from_secs(120);
    for w in &mut children {
        let stdout = w.child.stdout.take().context("worker stdout")?;
        let mut line = String::new();
        tokio::time::timeout_at(ready_by.into(), BufReader::new(stdout).read_line(&mut line))
            .await
            .with_context(|| format!("worker {} not ready within 120 s", w.executor_id))??;
        if line.trim() != "ready" {
            bail!("worker {} said {line:?} instead of ready", w.executor_id);
        }
    }
    eprintln!("[{label}] {workers} worker processes ready");

    let requests: Vec<EnqueueRequest> = (0..args.workflows)
        .map(|i| {
            EnqueueRequest::new(WORKFLOW, QUEUE, i).partition(format!("p{}", i % args.partitions))
        })
        .collect();
    let load_start = loadavg();
    let enqueue_start = Instant::now();
    for outcome in client
        .enqueue_many(requests)
        .await
        .map_err(|e| anyhow!("enqueueing the backlog: {e}"))?
    {
        outcome.map_err(|e| anyhow!("enqueueing a workflow: {e}"))?;
    }
    let started = Instant::now();
    let enqueue_seconds = (started - enqueue_start).as_secs_f64();
    let target = args.workflows as i64;
    let mut timed_out = false;
    let (seconds, done) = loop {
        let done = probe
            .count(&format!(
                "SELECT count(*) FROM manent_workflows WHERE queue_name = '{QUEUE}' \
                 AND status = 'SUCCESS'"
            ))
            .await?;
        if done >= target {
            break (started.elapsed().as_secs_f64(), done);
        }
        if started.elapsed() > args.timeout {
            timed_out = true;
            break (started.elapsed().as_secs_f64(), done);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let load_end = loadavg();
    eprintln!(
        "[{label}] {done} of {target} workflows in {seconds:.3} s (enqueue took {enqueue_seconds:.3} s)"
    );
    let failed = probe
        .count("SELECT count(*) FROM manent_workflows WHERE status IN ('ERROR', 'CANCELLED')")
        .await?;
    let span_ms = probe
        .count(
            "SELECT COALESCE(MAX(finished_at) - MIN(started_at), 0) FROM manent_workflows \
             WHERE status = 'SUCCESS'",
        )
        .await?;
    let per_executor = probe
        .pairs(
            "SELECT executor_id, COUNT(*) FROM manent_workflows GROUP BY executor_id \
             ORDER BY executor_id",
        )
        .await?;
    probe.close().await;

    // Stop the workers: stdin closes, each drains and exits.
    for w in &mut children {
        drop(w.child.stdin.take());
    }
    for w in &mut children {
        match tokio::time::timeout(Duration::from_secs(30), w.child.wait()).await {
            Ok(Ok(status)) if status.success() => {}
            Ok(Ok(status)) => eprintln!("[{label}] worker {} exited {status}", w.executor_id),
            Ok(Err(e)) => eprintln!("[{label}] waiting for worker {}: {e}", w.executor_id),
            Err(_) => {
                eprintln!(
                    "[{label}] worker {} did not stop in 30 s; killing it",
                    w.executor_id
                );
                let _ = w.child.kill().await;
            }
        }
    }
    if failed > 0 {
        bail!("{failed} workflows did not succeed");
    }
    let per_executor: serde_json::Map<String, serde_json::Value> = per_executor
        .into_iter()
        .map(|(id, n)| (id.unwrap_or_else(|| "none".to_owned()), n.into()))
        .collect();
    // K workers x C concurrent workflows, each 3 sleeps long: the ceiling with free databases.
    let ideal = f64::from(workers * concurrency) / (3.0 * args.step_sleep_ms as f64 / 1000.0);
    let mut note = format!(
        "{workers} worker processes (re-exec --worker, executor ids bench-w{workers}-1..), each \
         worker_concurrency={concurrency}, partition_concurrency=1 over {} partitions, 3 steps \
         of {} ms sleep; all workers launched on an empty queue, then {} workflows enqueued in \
         one Client::enqueue_many call ({enqueue_seconds:.3}s, one transaction); clock from its \
         return to all in SUCCESS (polled every 10 ms); ceiling {ideal:.0} wf/s",
        args.partitions, args.step_sleep_ms, args.workflows
    );
    if timed_out {
        note.push_str(&format!(
            "; TIMED OUT after {seconds:.0}s, wf_per_s is completed/elapsed"
        ));
    }
    Ok(serde_json::json!({
        "engine": "manent",
        "mode": "workers",
        "backend": "postgres",
        "workers": workers,
        "worker_concurrency": concurrency,
        "step_sleep_ms": args.step_sleep_ms,
        "workflows": args.workflows,
        "completed": done,
        "seconds": round(seconds, 3),
        "wf_per_s": round(done as f64 / seconds, 1),
        "db_span_seconds": round(span_ms as f64 / 1000.0, 3),
        "ideal_wf_per_s": round(ideal, 1),
        "enqueue_seconds": round(enqueue_seconds, 3),
        "per_executor": per_executor,
        "load_start": load_start,
        "load_end": load_end,
        "timed_out": timed_out,
        "note": note,
    }))
}

/// The child: one executor on the queue until its stdin closes.
pub(crate) async fn serve(args: &Args) -> Result<()> {
    STEP_SLEEP_MS.store(args.step_sleep_ms, Ordering::SeqCst);
    let store = manent_engine::store::open(&args.database_url)
        .await
        .map_err(|e| anyhow!("opening the manent store: {e}"))?;
    let engine = Engine::new(
        Database::from(store),
        EngineConfig::new(args.executor_id.clone()),
    );
    engine.register(WORKFLOW, bench_workflow);
    engine.listen(
        QueueSpec::new(QUEUE)
            .worker_concurrency(
                args.worker_concurrency
                    .unwrap_or(DEFAULT_WORKER_CONCURRENCY),
            )
            .partition_concurrency(1),
    );
    engine
        .launch()
        .await
        .map_err(|e| anyhow!("launching worker {}: {e}", args.executor_id))?;
    println!("ready");
    // Everything until EOF is ignored: closing stdin is the stop signal.
    let mut sink = Vec::new();
    let _ = tokio::io::stdin().read_to_end(&mut sink).await;
    let report = engine.shutdown(Duration::from_secs(10)).await;
    if !report.left_pending.is_empty() {
        eprintln!(
            "worker {}: shutdown left {} workflows pending",
            args.executor_id,
            report.left_pending.len()
        );
    }
    Ok(())
}
