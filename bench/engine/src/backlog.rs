//! The backlog mode: manent's throughput with 1,000, 10,000 and 100,000 workflows queued over
//! 5,000 partitions (partition concurrency 1), and the claim's query plan at each backlog.
//!
//! For each (backend, backlog) on a fresh database: the store is opened, the peers' workflow
//! (three trivial steps) registered and the queue listened to with worker concurrency 50 and
//! partition concurrency 1. The backlog is written with `Client::enqueue_many` in chunks
//! (`--chunk`, default 1,000 per call, one transaction each) before `engine.launch()`: no claim
//! loop exists yet, and none of this is timed. The clock starts when `launch()` returns and stops
//! when `min(backlog, --window)` workflows (default window 10,000) are in `SUCCESS`: the 1,000
//! and 10,000 backlogs drain completely, the 100,000 backlog is timed over its first 10,000, so
//! that it is measured with 90,000–100,000 still queued. Progress is watched through an
//! in-process counter of finished workflow bodies (no table scans while measuring); when it
//! reaches the window, the benchmark's own connection polls `SUCCESS` rows every millisecond
//! until the database agrees, and that moment stops the clock.
//!
//! When a tenth of the window has finished, the benchmark's own connection explains the
//! claim's two queries as the engine runs them at that moment (see `store/sql.rs`, `claim`):
//! the running counts, and the first page of the claimable backlog with the partitions that
//! are running left out. The plans go into the result line (`claim_plan`).

use std::time::{Duration, Instant, SystemTime};

use anyhow::{Result, anyhow, bail};
use manent_engine::{Engine, EngineConfig, EnqueueRequest, QueueSpec};

use crate::fresh::{FreshDb, loadavg};
use crate::{Args, Backend, EXECUTOR_ID, FINISHED, QUEUE, WORKFLOW, bench_workflow, round};

const DEFAULT_WORKER_CONCURRENCY: u32 = 50;
/// The claim's smallest page (`(free * 2).max(16)` in `store/sql.rs`): what a steady-state
/// claim, woken by one finished workflow, reads.
const CLAIM_PAGE: u32 = 16;

pub(crate) async fn run(args: &Args) -> Result<()> {
    for &backend in &args.backends {
        for &backlog in &args.backlogs {
            let line = measure(args, backend, backlog)
                .await
                .map_err(|e| anyhow!("manent backlog {} {backlog}: {e:#}", backend.name()))?;
            println!("{line}");
        }
    }
    Ok(())
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

async fn measure(args: &Args, backend: Backend, backlog: u64) -> Result<serde_json::Value> {
    let label = format!("manent backlog {} {backlog}", backend.name());
    let db = FreshDb::create(&args.database_url, backend, &format!("backlog{backlog}")).await?;
    let result = measure_on(args, backend, backlog, &db, &label).await;
    db.remove().await?;
    result
}

async fn measure_on(
    args: &Args,
    backend: Backend,
    backlog: u64,
    db: &FreshDb,
    label: &str,
) -> Result<serde_json::Value> {
    let store = db.open_store().await?;
    let probe = db.probe().await?;
    let concurrency = args
        .worker_concurrency
        .unwrap_or(DEFAULT_WORKER_CONCURRENCY);
    let config = EngineConfig::new(EXECUTOR_ID);
    let claim_batch = config.claim_batch;
    let engine = Engine::new(store, config);
    engine.register(WORKFLOW, bench_workflow);
    engine.listen(
        QueueSpec::new(QUEUE)
            .worker_concurrency(concurrency)
            .partition_concurrency(1),
    );
    let client = engine.client();

    // The backlog, untimed, before any claim loop exists.
    let enqueue_start = Instant::now();
    let mut next = 0u64;
    while next < backlog {
        let end = (next + args.chunk as u64).min(backlog);
        let requests: Vec<EnqueueRequest> = (next..end)
            .map(|i| {
                EnqueueRequest::new(WORKFLOW, QUEUE, i)
                    .partition(format!("p{}", i % args.partitions))
            })
            .collect();
        for outcome in client
            .enqueue_many(requests)
            .await
            .map_err(|e| anyhow!("enqueueing workflows {next}..{end}: {e}"))?
        {
            outcome.map_err(|e| anyhow!("enqueueing a workflow of {next}..{end}: {e}"))?;
        }
        next = end;
    }
    let enqueue_seconds = enqueue_start.elapsed().as_secs_f64();
    eprintln!("[{label}] enqueued {backlog} workflows in {enqueue_seconds:.2} s");

    let window = backlog.min(args.window);
    let succeeded_sql = format!(
        "SELECT count(*) FROM manent_workflows WHERE queue_name = '{QUEUE}' AND status = 'SUCCESS'"
    );
    FINISHED.store(0, std::sync::atomic::Ordering::SeqCst);
    let load_start = loadavg();
    let launch_start = Instant::now();
    engine
        .launch()
        .await
        .map_err(|e| anyhow!("launching the engine: {e}"))?;
    let started = Instant::now();
    let launch_seconds = (started - launch_start).as_secs_f64();
    let mut plan: Option<(String, u64)> = None;
    let mut timed_out = false;
    let seconds = loop {
        let finished = FINISHED.load(std::sync::atomic::Ordering::Relaxed);
        if plan.is_none() && finished >= (window / 10).max(1) {
            let explained = Instant::now();
            let text = explain_claim(&probe, backend, concurrency).await?;
            eprintln!(
                "[{label}] claim plan at {finished} finished ({:.1} ms to explain):\n{text}",
                explained.elapsed().as_secs_f64() * 1000.0
            );
            plan = Some((text, finished));
        }
        if finished >= window && probe.count(&succeeded_sql).await? >= window as i64 {
            break started.elapsed().as_secs_f64();
        }
        if started.elapsed() > args.timeout {
            timed_out = true;
            break started.elapsed().as_secs_f64();
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    let load_end = loadavg();
    let succeeded = probe.count(&succeeded_sql).await?;
    let failed = probe
        .count("SELECT count(*) FROM manent_workflows WHERE status IN ('ERROR', 'CANCELLED')")
        .await?;
    if failed > 0 {
        bail!("{failed} workflows did not succeed");
    }
    eprintln!(
        "[{label}] {} of {window} timed workflows in {seconds:.3} s{}",
        succeeded.min(window as i64),
        if timed_out { " (TIMED OUT)" } else { "" }
    );
    // What is still queued is left behind: the database is dropped.
    engine.shutdown(Duration::from_secs(5)).await;
    probe.close().await;
    let completed = if timed_out {
        succeeded.min(window as i64) as u64
    } else {
        window
    };
    let (plan_text, plan_at) = plan.unwrap_or_else(|| ("not captured".to_owned(), 0));
    let mut note = format!(
        "{backlog} queued over {} partitions (p{{i % {}}}), partition_concurrency=1, \
         worker_concurrency={concurrency}, claim_batch={claim_batch}, one executor; backlog \
         enqueued untimed with Client::enqueue_many in chunks of {} ({enqueue_seconds:.2}s); \
         clock from launch() return (launch took {launch_seconds:.3}s) to {window} in SUCCESS; \
         claim plan explained at {plan_at} finished",
        args.partitions.min(backlog),
        args.partitions,
        args.chunk
    );
    if timed_out {
        note.push_str(&format!(
            "; TIMED OUT after {seconds:.0}s, wf_per_s is completed/elapsed"
        ));
    }
    Ok(serde_json::json!({
        "engine": "manent",
        "mode": "backlog",
        "backend": backend.name(),
        "backlog": backlog,
        "partitions": args.partitions,
        "workflows": window,
        "completed": completed,
        "seconds": round(seconds, 3),
        "wf_per_s": round(completed as f64 / seconds, 1),
        "enqueue_seconds": round(enqueue_seconds, 2),
        "load_start": load_start,
        "load_end": load_end,
        "timed_out": timed_out,
        "claim_plan": plan_text,
        "claim_plan_at_finished": plan_at,
        "note": note,
    }))
}

/// The claim's two reads as the engine runs them now (its SQL, its session setting), with this
/// moment's running partitions written into the page query as literals where the engine binds
/// them.
async fn explain_claim(
    probe: &crate::fresh::Probe,
    backend: Backend,
    concurrency: u32,
) -> Result<String> {
    let running = probe
        .strings(&format!(
            "SELECT partition_key FROM manent_workflows WHERE queue_name = '{QUEUE}' \
             AND status = 'PENDING'"
        ))
        .await?;
    let counts = format!(
        "SELECT CAST(0 AS BIGINT), executor_id, partition_key, COUNT(*) FROM manent_workflows \
         WHERE queue_name = '{QUEUE}' AND status = 'PENDING' GROUP BY executor_id, partition_key \
         UNION ALL \
         SELECT CAST(1 AS BIGINT), executor_id, partition_key, COUNT(*) FROM manent_workflows \
         WHERE limit_group = NULL AND status = 'PENDING' GROUP BY executor_id, partition_key"
    );
    // The engine names the index on SQLite (`claim_page_sql` in store/sql.rs).
    let indexed_by = match backend {
        Backend::Postgres => "",
        Backend::Sqlite => " INDEXED BY manent_workflows_claimable",
    };
    let mut page = format!(
        "SELECT id, partition_key, priority, created_seq FROM manent_workflows{indexed_by} \
         WHERE queue_name = '{QUEUE}' AND status = 'ENQUEUED' AND not_before <= {}",
        now_ms()
    );
    if !running.is_empty() {
        let keys: Vec<String> = running
            .iter()
            .map(|k| format!("'{}'", k.replace('\'', "''")))
            .collect();
        page.push_str(&format!(" AND partition_key NOT IN ({})", keys.join(", ")));
    }
    let free = concurrency.saturating_sub(running.len() as u32);
    let limit = (free * 2).max(CLAIM_PAGE);
    page.push_str(&format!(
        " ORDER BY priority, created_seq, id LIMIT {limit}"
    ));
    Ok(format!(
        "-- running counts ({} running now)\n{}\n-- next claimable page (LIMIT {limit}, {} \
         running partitions left out)\n{}",
        running.len(),
        probe.explain(&counts).await?,
        running.len(),
        probe.explain(&page).await?
    ))
}
