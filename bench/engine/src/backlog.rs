//! The backlog mode: manent's throughput with 1,000, 10,000 and 100,000 workflows queued over
//! 5,000 partitions (partition concurrency 1), and the claim's query plan at each backlog.
//!
//! For each (backend, backlog N) on a fresh database: the store is opened, the peers' workflow
//! (three trivial steps) registered and the queue listened to with worker concurrency 50 and
//! partition concurrency 1. The backlog is written with `Client::enqueue_many` in chunks
//! (`--chunk`, default 1,000 per call, one transaction each) before `engine.launch()`: no claim
//! loop exists yet, and none of this is timed. Workflow `i` has key `p{i % partitions}`.
//!
//! # Constant backlog (`--backlog-method constant`, the default)
//!
//! Every N is measured the same way, with N queued from the first timed workflow to the last,
//! so that the ratio between two backlogs compares like with like. A task of its own tops the
//! queue up with `Client::enqueue_many` in chunks of `--top-up` (default 100, one transaction
//! each), continuing `i` and its keys `p{i % partitions}`, so the pressure on each partition stays
//! that of the initial backlog. It is driven by the in-process counter of finished workflow
//! bodies (no table scans): it enqueues a chunk whenever enqueued - finished has fallen to
//! N + worker concurrency - chunk, so that with every worker busy about N (between N - chunk and
//! N) stay ENQUEUED. After `launch()` the first `--warmup` workflows (default a tenth of the
//! window) finish untimed; then the claim's plan is explained and the ENQUEUED rows counted
//! (both before the clock starts); the clock runs from that moment's finished count f0 to
//! f0 + window finished, read from the same counter (finished bodies: the commits of their
//! SUCCESS lag by the same few ms at both ends). The ENQUEUED rows are counted again once the
//! clock has stopped and the top-up has ended. During the window the queued count is also
//! followed by counter arithmetic (rows enqueued by committed calls - bodies begun), whose
//! extremes go into the result line.
//!
//! # Drain (`--backlog-method drain`, the method before 2026-12-01 06:00 UTC)
//!
//! The clock starts when `launch()` returns and stops when `min(N, --window)` workflows are in
//! `SUCCESS`: the 1,000 and 10,000 backlogs drain completely, the 100,000 backlog is timed over
//! its first 10,000. When the counter reaches the window, the benchmark's own connection polls
//! `SUCCESS` rows every millisecond until the database agrees. The claim plan is explained when
//! a tenth of the window has finished, inside the timed window.
//!
//! The claim's plan (either method): the benchmark's own connection explains the claim's two
//! queries as the engine runs them at that moment (see `store/sql.rs`, `claim`): the running
//! counts, and the first page of the claimable backlog with the partitions that are running
//! left out. The plans go into the result line (`claim_plan`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Result, anyhow, bail};
use manent_engine::{Client, Database, Engine, EngineConfig, EnqueueRequest, QueueSpec};
use tokio::task::JoinHandle;

use crate::fresh::{FreshDb, Probe, loadavg};
use crate::{
    Args, Backend, BacklogMethod, EXECUTOR_ID, FINISHED, QUEUE, STARTED, WORKFLOW, bench_workflow,
    round,
};

const DEFAULT_WORKER_CONCURRENCY: u32 = 50;
/// The claim's smallest page (`(free * 2).max(16)` in `store/sql.rs`): what a steady-state
/// claim, woken by one finished workflow, reads.
const CLAIM_PAGE: u32 = 16;
const ENQUEUED_SQL: &str =
    "SELECT count(*) FROM manent_workflows WHERE queue_name = 'bench' AND status = 'ENQUEUED'";

/// Every (backend, backlog) `--rounds` times; within a round the backlogs of a backend run
/// one after the other, so the ratio of two backlogs compares runs minutes apart at most.
pub(crate) async fn run(args: &Args) -> Result<()> {
    for round in 1..=args.rounds {
        for &backend in &args.backends {
            for &backlog in &args.backlogs {
                let mut line = measure(args, backend, backlog).await.map_err(|e| {
                    anyhow!(
                        "manent backlog {} {backlog}, round {round}: {e:#}",
                        backend.name()
                    )
                })?;
                line["round"] = serde_json::json!(round);
                println!("{line}");
            }
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

/// Workflows `from..to` (input `i`, key `p{i % partitions}`), `chunk` per `enqueue_many` call.
async fn enqueue_range(client: &Client, args: &Args, from: u64, to: u64, chunk: u64) -> Result<()> {
    let mut next = from;
    while next < to {
        let end = (next + chunk).min(to);
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
    Ok(())
}

/// What one timed window measured, whichever the method.
#[derive(Default)]
struct Timed {
    seconds: f64,
    completed: u64,
    timed_out: bool,
    load_start: String,
    load_end: String,
    plan: Option<(String, u64)>,
    /// Method-specific fields of the result line.
    fields: serde_json::Map<String, serde_json::Value>,
    note: String,
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
    let engine = Engine::new(Database::from(store), config);
    engine.register(WORKFLOW, bench_workflow);
    engine.listen(
        QueueSpec::new(QUEUE)
            .worker_concurrency(concurrency)
            .partition_concurrency(1),
    );
    let client = engine.client();

    // The backlog, untimed, before any claim loop exists.
    let enqueue_start = Instant::now();
    enqueue_range(&client, args, 0, backlog, args.chunk as u64).await?;
    let enqueue_seconds = enqueue_start.elapsed().as_secs_f64();
    eprintln!("[{label}] enqueued {backlog} workflows in {enqueue_seconds:.2} s");

    FINISHED.store(0, Ordering::SeqCst);
    STARTED.store(0, Ordering::SeqCst);
    let launch_start = Instant::now();
    engine
        .launch()
        .await
        .map_err(|e| anyhow!("launching the engine: {e}"))?;
    let launched = Instant::now();
    let launch_seconds = (launched - launch_start).as_secs_f64();
    let timed = match args.backlog_method {
        BacklogMethod::Constant => {
            constant(args, backend, backlog, concurrency, &client, &probe, label).await
        }
        BacklogMethod::Drain => drain(args, backend, backlog, concurrency, &probe, label).await,
    };
    let timed = match timed {
        Ok(timed) => timed,
        Err(e) => {
            engine.shutdown(Duration::from_secs(5)).await;
            probe.close().await;
            return Err(e);
        }
    };
    let failed = probe
        .count("SELECT count(*) FROM manent_workflows WHERE status IN ('ERROR', 'CANCELLED')")
        .await?;
    if failed > 0 {
        bail!("{failed} workflows did not succeed");
    }
    eprintln!(
        "[{label}] {} of {} timed workflows in {:.3} s{}",
        timed.completed,
        args.window,
        timed.seconds,
        if timed.timed_out { " (TIMED OUT)" } else { "" }
    );
    // What is still queued is left behind: the database is dropped.
    engine.shutdown(Duration::from_secs(5)).await;
    probe.close().await;
    let (plan_text, plan_at) = timed.plan.unwrap_or_else(|| ("not captured".to_owned(), 0));
    let mut note = format!(
        "{backlog} queued over {} partitions (p{{i % {}}}), partition_concurrency=1, \
         worker_concurrency={concurrency}, claim_batch={claim_batch}, one executor; backlog \
         enqueued untimed with Client::enqueue_many in chunks of {} ({enqueue_seconds:.2}s) \
         before launch() (which took {launch_seconds:.3}s); {}; claim plan explained at \
         {plan_at} finished",
        args.partitions.min(backlog),
        args.partitions,
        args.chunk,
        timed.note
    );
    if timed.timed_out {
        note.push_str(&format!(
            "; TIMED OUT after {:.0}s, wf_per_s is completed/elapsed",
            timed.seconds
        ));
    }
    let mut line = serde_json::json!({
        "engine": "manent",
        "mode": "backlog",
        "method": args.backlog_method.name(),
        "backend": backend.name(),
        "backlog": backlog,
        "partitions": args.partitions,
        "workflows": match args.backlog_method {
            BacklogMethod::Constant => args.window,
            BacklogMethod::Drain => backlog.min(args.window),
        },
        "completed": timed.completed,
        "seconds": round(timed.seconds, 3),
        "wf_per_s": round(timed.completed as f64 / timed.seconds, 1),
        "enqueue_seconds": round(enqueue_seconds, 2),
        "load_start": timed.load_start,
        "load_end": timed.load_end,
        "timed_out": timed.timed_out,
        "claim_plan": plan_text,
        "claim_plan_at_finished": plan_at,
        "note": note,
    });
    if let Some(map) = line.as_object_mut() {
        map.extend(timed.fields);
    }
    Ok(line)
}

/// Rows enqueued by committed calls minus workflow bodies begun: the ENQUEUED rows, give or
/// take the few claimed whose bodies have not begun yet.
fn queued_by_counters(enqueued: &AtomicU64) -> u64 {
    enqueued
        .load(Ordering::SeqCst)
        .saturating_sub(STARTED.load(Ordering::SeqCst))
}

/// The top-up task: keeps enqueued - finished at N + worker concurrency (within one chunk), so
/// that about N stay ENQUEUED while every worker is busy. Ends when `stop` is set.
fn spawn_top_up(
    args: &Args,
    client: Client,
    backlog: u64,
    concurrency: u32,
    enqueued: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> JoinHandle<Result<()>> {
    let chunk = args.top_up;
    let partitions = args.partitions;
    let outstanding_target = backlog + u64::from(concurrency);
    tokio::spawn(async move {
        let mut next = enqueued.load(Ordering::SeqCst);
        while !stop.load(Ordering::SeqCst) {
            let outstanding = next.saturating_sub(FINISHED.load(Ordering::Relaxed));
            if outstanding + chunk <= outstanding_target {
                let requests: Vec<EnqueueRequest> = (next..next + chunk)
                    .map(|i| {
                        EnqueueRequest::new(WORKFLOW, QUEUE, i)
                            .partition(format!("p{}", i % partitions))
                    })
                    .collect();
                for outcome in client
                    .enqueue_many(requests)
                    .await
                    .map_err(|e| anyhow!("topping up workflows {next}..: {e}"))?
                {
                    outcome.map_err(|e| anyhow!("topping up a workflow of {next}..: {e}"))?;
                }
                next += chunk;
                enqueued.store(next, Ordering::SeqCst);
                continue;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(())
    })
}

async fn constant(
    args: &Args,
    backend: Backend,
    backlog: u64,
    concurrency: u32,
    client: &Client,
    probe: &Probe,
    label: &str,
) -> Result<Timed> {
    let warmup = args.warmup.unwrap_or(args.window / 10);
    let enqueued = Arc::new(AtomicU64::new(backlog));
    let stop = Arc::new(AtomicBool::new(false));
    let top_up = spawn_top_up(
        args,
        client.clone(),
        backlog,
        concurrency,
        enqueued.clone(),
        stop.clone(),
    );
    let result: Result<Option<Timed>> = async {
        let began = Instant::now();
        // Warm-up: untimed.
        while FINISHED.load(Ordering::Relaxed) < warmup {
            if top_up.is_finished() || began.elapsed() > args.timeout {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        if top_up.is_finished() {
            return Ok(None);
        }
        if began.elapsed() > args.timeout {
            return Ok(Some(Timed {
                timed_out: true,
                seconds: began.elapsed().as_secs_f64(),
                note: format!("TIMED OUT in the warm-up of {warmup}"),
                ..Timed::default()
            }));
        }
        // Before the clock: the plan at this backlog, and one count of ENQUEUED rows.
        let at = FINISHED.load(Ordering::Relaxed);
        let explained = Instant::now();
        let text = explain_claim(probe, backend, concurrency).await?;
        eprintln!(
            "[{label}] claim plan at {at} finished ({:.1} ms to explain):\n{text}",
            explained.elapsed().as_secs_f64() * 1000.0
        );
        let queued_start = probe.count(ENQUEUED_SQL).await?;
        let load_start = loadavg();
        let f0 = FINISHED.load(Ordering::SeqCst);
        let e0 = enqueued.load(Ordering::SeqCst);
        let started = Instant::now();
        let counted_start = queued_by_counters(&enqueued);
        let (mut low, mut high) = (counted_start, counted_start);
        let mut timed_out = false;
        let seconds = loop {
            let finished = FINISHED.load(Ordering::Relaxed);
            let queued = queued_by_counters(&enqueued);
            low = low.min(queued);
            high = high.max(queued);
            if finished >= f0 + args.window {
                break started.elapsed().as_secs_f64();
            }
            if top_up.is_finished() {
                return Ok(None);
            }
            if started.elapsed() > args.timeout {
                timed_out = true;
                break started.elapsed().as_secs_f64();
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        let f1 = FINISHED.load(Ordering::SeqCst);
        let counted_end = queued_by_counters(&enqueued);
        let load_end = loadavg();
        let e1 = enqueued.load(Ordering::SeqCst);
        Ok(Some(Timed {
            seconds,
            completed: (f1 - f0).min(args.window),
            timed_out,
            load_start,
            load_end,
            plan: Some((text, at)),
            fields: serde_json::Map::from_iter([
                ("warmup".to_owned(), warmup.into()),
                ("top_up".to_owned(), args.top_up.into()),
                ("queued_start".to_owned(), queued_start.into()),
                ("queued_start_counter".to_owned(), counted_start.into()),
                ("queued_end_counter".to_owned(), counted_end.into()),
                ("queued_min_counter".to_owned(), low.into()),
                ("queued_max_counter".to_owned(), high.into()),
                ("topped_up_in_window".to_owned(), (e1 - e0).into()),
            ]),
            note: format!(
                "constant backlog: topped up with Client::enqueue_many in chunks of {} from a \
                 task driven by the in-process finished counter, to keep enqueued - finished at \
                 {backlog} + {concurrency} (about {backlog} ENQUEUED while {concurrency} run); \
                 warm-up of {warmup} finished untimed, then the claim plan and one ENQUEUED \
                 count, then the clock over {} finished (in-process counter, f0={f0}); {} \
                 enqueued during the window; queued by counter arithmetic (enqueued - begun) \
                 {counted_start} at the start, {counted_end} at the end, {low}..{high} during; \
                 queued_start/queued_end are count queries before the clock and after it and \
                 the top-up stopped",
                args.top_up,
                args.window,
                e1 - e0
            ),
        }))
    }
    .await;
    stop.store(true, Ordering::SeqCst);
    let ended = top_up.await.map_err(|e| anyhow!("the top-up task: {e}"))?;
    ended?;
    let mut timed = result?.ok_or_else(|| anyhow!("the top-up task ended on its own"))?;
    if !timed.timed_out || timed.plan.is_some() {
        let queued_end = probe.count(ENQUEUED_SQL).await?;
        timed
            .fields
            .insert("queued_end".to_owned(), queued_end.into());
    }
    Ok(timed)
}

async fn drain(
    args: &Args,
    backend: Backend,
    backlog: u64,
    concurrency: u32,
    probe: &Probe,
    label: &str,
) -> Result<Timed> {
    let window = backlog.min(args.window);
    let succeeded_sql = format!(
        "SELECT count(*) FROM manent_workflows WHERE queue_name = '{QUEUE}' AND status = 'SUCCESS'"
    );
    let load_start = loadavg();
    let started = Instant::now();
    let mut plan: Option<(String, u64)> = None;
    let mut timed_out = false;
    let seconds = loop {
        let finished = FINISHED.load(Ordering::Relaxed);
        if plan.is_none() && finished >= (window / 10).max(1) {
            let explained = Instant::now();
            let text = explain_claim(probe, backend, concurrency).await?;
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
    let completed = if timed_out {
        succeeded.min(window as i64) as u64
    } else {
        window
    };
    Ok(Timed {
        seconds,
        completed,
        timed_out,
        load_start,
        load_end,
        plan,
        fields: serde_json::Map::new(),
        note: format!(
            "drain: clock from launch() return to {window} in SUCCESS (claim plan explained \
             inside the timed window)"
        ),
    })
}

/// The claim's two reads as the engine runs them now (its SQL, its session setting), with this
/// moment's running partitions written into the page query as literals where the engine binds
/// them.
async fn explain_claim(probe: &Probe, backend: Backend, concurrency: u32) -> Result<String> {
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
