//! Recurring deploys (`schedule.cron`): the schedule records, the tick
//! computation (cron in a time zone, DST-correct) and the ticker that every
//! worker runs.
//!
//! A schedule is a record of kind [`SCHEDULE_KIND`], written only by the API
//! (create, pause, resume, delete). The tickers write only the tick state
//! (kind [`TICK_KIND`], same key), so a ticker can never undo a pause. Each
//! tick is enqueued as the deploy `<schedule id>@<tick unix seconds>`: the
//! engine starts an id once, so any number of tickers racing, or a lost
//! update of the tick state, yield one deploy per tick.
//!
//! Each tick is authorised again before it is enqueued (`gate::reauthorise`): the token
//! that created the schedule, and the environment's policy as it is at the tick. A refused
//! tick enqueues nothing; it is recorded in the tick state with its reason
//! ([`TickState::refused`]), which the schedule's views show.

use std::{collections::HashMap, sync::Arc, time::Duration};

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use croner::{
    Cron,
    parser::{CronParser, Seconds},
};
use manent_config::Config;
use manent_engine::{Client, EngineError, now_ms};
use manent_model::{Descriptor, EffectiveDescriptor, Missed, Route};
use serde::{Deserialize, Serialize};

use crate::{
    authority::Authority,
    views::platform::rfc3339,
    workflow::gate::{self, Reauthorised},
    workflow::{DeployRequest, Submitter},
};

/// Record kind of a schedule (written by the API only).
pub const SCHEDULE_KIND: &str = "schedule";
/// Record kind of a schedule's tick state (written by the tickers only).
pub const TICK_KIND: &str = "schedule-tick";
/// A tick more than this late (in seconds) was missed: no worker ran when it
/// was due. Later ticks are on time and each gets its deploy.
pub const MISSED_AFTER_SECS: i64 = 60;
/// At most this many on-time ticks are enqueued for one schedule in one pass.
const MAX_TICKS_PER_PASS: usize = 120;
/// A schedule's tick state keeps its latest this many refused ticks.
pub const REFUSED_TICKS_KEPT: usize = 20;
/// How many of an expression's next ticks the minimum interval is checked over: enough to
/// meet its densest stretch whatever the date (`0,1 0 1 1 *` fires twice a year, a
/// minute apart, and the first two ticks from now show it).
const INTERVAL_SAMPLE_TICKS: usize = 1000;

/// A recurring deploy, as recorded at submission.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleRecord {
    pub id: String,
    pub descriptor: Descriptor,
    /// Decided at submission: every tick goes to this queue, also after a `queues` change.
    pub route: Route,
    /// As resolved at creation (shown to no one for the ticks: each tick resolves the
    /// environment file again, `gate::reauthorise`).
    pub effective: Option<EffectiveDescriptor>,
    pub cron: String,
    /// IANA name; UTC when the descriptor gave none.
    pub timezone: String,
    pub missed: Missed,
    pub paused: bool,
    pub created_by: String,
    /// The creating token's stable id (empty in schedules made before ids existed).
    #[serde(default)]
    pub created_by_id: String,
    pub created_at_ms: i64,
    /// Ticks at or before this time are not run (set on resume: a pause drops its ticks).
    #[serde(default)]
    pub resumed_at_ms: Option<i64>,
    /// The first tick after creation (unix seconds), as computed then.
    pub next_tick: Option<i64>,
}

impl ScheduleRecord {
    /// Ticks at or before this time (unix ms) are never enqueued.
    fn floor_ms(&self, state: &TickState) -> i64 {
        let mut floor = self.created_at_ms.max(self.resumed_at_ms.unwrap_or(0));
        if let Some(t) = state.last_tick {
            floor = floor.max(t * 1000);
        }
        floor
    }
}

/// What the tickers record of a schedule.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TickState {
    /// The latest tick (unix seconds) enqueued, or passed over as missed.
    pub last_tick: Option<i64>,
    /// The deploy of `last_tick`, if it was enqueued.
    pub last_deploy: Option<String>,
    /// The latest ticks refused when they fell due (at most [`REFUSED_TICKS_KEPT`], oldest
    /// first): their token or their environment no longer allowed them. Absent in tick
    /// states written before re-authorisation existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<RefusedTick>,
}

/// A tick refused when it fell due: nothing was enqueued for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedTick {
    /// The tick (unix seconds).
    pub tick: i64,
    /// Why, as `gate::reauthorise` said.
    pub reason: String,
}

/// A refused tick, as the schedule's views show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedTickView {
    /// RFC 3339, in the schedule's time zone.
    pub tick: String,
    pub reason: String,
}

/// A schedule, as `manent schedules` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleView {
    pub id: String,
    pub application: String,
    pub environment: String,
    /// The version of the first artifact.
    pub version: String,
    pub cron: String,
    pub timezone: String,
    /// `None` for a schedule that cannot be read (see `error`).
    pub missed: Option<Missed>,
    pub paused: bool,
    pub queue: String,
    /// RFC 3339; none when paused or when the expression never matches again.
    pub next_tick: Option<String>,
    pub last_tick: Option<String>,
    /// The id of the deploy of the last tick.
    pub last_deploy: Option<String>,
    /// The name of the token that created it.
    pub created_by: String,
    pub created_at: String,
    /// Only for a stored schedule that cannot be read: why. Its other fields are empty.
    pub error: Option<String>,
    /// The latest ticks refused when they fell due, oldest first, with the reason.
    pub refused_ticks: Vec<RefusedTickView>,
}

/// The deploy id of one tick.
pub fn tick_id(schedule_id: &str, tick_secs: i64) -> String {
    format!("{schedule_id}@{tick_secs}")
}

/// Why a schedule's `cron` or `timezone` is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error(
        "`{expr}` is not a cron expression ({reason}); write five fields (minute hour \
         day-of-month month day-of-week) or six with a leading seconds field"
    )]
    Cron { expr: String, reason: String },
    #[error("`{name}` is not a known time zone; write an IANA name such as UTC or Europe/Paris")]
    TimeZone { name: String },
}

/// Refuses `cron` (`expr`, parsed) when its ticks come closer together than
/// `schedules.min_interval` allows: at creation (submission) and at each tick, so a
/// schedule created before the limit (or under a lower one) stops firing too often.
pub fn check_interval(
    config: &Config,
    expr: &str,
    cron: &Cron,
    tz: Tz,
    after_secs: i64,
) -> Result<(), String> {
    let min = config.schedules.min_interval;
    let min_secs = i64::try_from(min.as_secs()).unwrap_or(i64::MAX);
    match shortest_interval(cron, tz, after_secs) {
        Some(shortest) if shortest < min_secs => Err(format!(
            "`{expr}` fires {} after a tick at its most frequent, more often than this \
             installation allows (schedules.min_interval in manent.yml: {})",
            humantime::format_duration(Duration::from_secs(u64::try_from(shortest).unwrap_or(0))),
            humantime::format_duration(min)
        )),
        _ => Ok(()),
    }
}

/// The shortest time (seconds) between two consecutive ticks of `cron` in `tz`, over its
/// next [`INTERVAL_SAMPLE_TICKS`] ticks after `after_secs`; `None` when it fires at most
/// once from then on.
pub fn shortest_interval(cron: &Cron, tz: Tz, after_secs: i64) -> Option<i64> {
    let mut shortest: Option<i64> = None;
    let mut previous = next_tick(cron, tz, after_secs)?;
    for _ in 1..INTERVAL_SAMPLE_TICKS {
        let Some(tick) = next_tick(cron, tz, previous) else {
            break;
        };
        let gap = tick - previous;
        shortest = Some(shortest.map_or(gap, |s| s.min(gap)));
        if gap <= 1 {
            break;
        }
        previous = tick;
    }
    shortest
}

impl From<ScheduleError> for EngineError {
    fn from(e: ScheduleError) -> Self {
        EngineError::InvalidInput(e.to_string())
    }
}

/// Parses a cron expression: five fields, or six with a leading seconds field.
pub fn parse_cron(expr: &str) -> Result<Cron, ScheduleError> {
    CronParser::builder()
        .seconds(Seconds::Optional)
        .build()
        .parse(expr)
        .map_err(|e| ScheduleError::Cron {
            expr: expr.to_owned(),
            reason: e.to_string(),
        })
}

/// Parses an IANA time-zone name.
pub fn parse_timezone(name: &str) -> Result<Tz, ScheduleError> {
    name.parse::<Tz>().map_err(|_| ScheduleError::TimeZone {
        name: name.to_owned(),
    })
}

fn at(tz: Tz, secs: i64) -> Option<DateTime<Tz>> {
    tz.timestamp_opt(secs, 0).single()
}

/// The first tick strictly after `after_secs`.
pub fn next_tick(cron: &Cron, tz: Tz, after_secs: i64) -> Option<i64> {
    cron.find_next_occurrence(&at(tz, after_secs)?, false)
        .ok()
        .map(|t| t.timestamp())
}

/// The last tick at or before `secs`.
fn previous_tick(cron: &Cron, tz: Tz, secs: i64) -> Option<i64> {
    cron.find_previous_occurrence(&at(tz, secs)?, true)
        .ok()
        .map(|t| t.timestamp())
}

/// What one ticker pass does for one schedule.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TickPlan {
    /// Ticks (unix seconds) to enqueue, oldest first.
    pub enqueue: Vec<i64>,
    /// The new `last_tick`: the latest tick due, enqueued or passed over.
    pub last_tick: Option<i64>,
}

/// The ticks due in `(floor_secs, now_secs]`. Those at most
/// [`MISSED_AFTER_SECS`] late are each enqueued; older ones were missed
/// (nothing ran): `run_once` enqueues the latest of them, unless an on-time
/// tick runs anyway, and `skip` none.
pub fn plan(cron: &Cron, tz: Tz, missed: Missed, floor_secs: i64, now_secs: i64) -> TickPlan {
    let on_time_from = floor_secs.max(now_secs - MISSED_AFTER_SECS);
    let mut on_time = Vec::new();
    let mut cursor = on_time_from;
    while let Some(t) = next_tick(cron, tz, cursor) {
        if t > now_secs {
            break;
        }
        on_time.push(t);
        cursor = t;
    }
    if on_time.len() > MAX_TICKS_PER_PASS {
        on_time.drain(..on_time.len() - MAX_TICKS_PER_PASS);
    }
    let late = if floor_secs < now_secs - MISSED_AFTER_SECS {
        previous_tick(cron, tz, now_secs - MISSED_AFTER_SECS).filter(|t| *t > floor_secs)
    } else {
        None
    };
    let last_tick = on_time.last().copied().or(late);
    let enqueue = match (on_time.is_empty(), late, missed) {
        (true, Some(t), Missed::RunOnce) => vec![t],
        _ => on_time,
    };
    TickPlan { enqueue, last_tick }
}

/// Creates the schedule record; returns it.
#[allow(clippy::too_many_arguments)]
pub async fn create(
    client: &Client,
    descriptor: Descriptor,
    effective: Option<EffectiveDescriptor>,
    route: Route,
    cron: &str,
    timezone: &str,
    missed: Missed,
    created_by: &Submitter,
) -> Result<ScheduleRecord, EngineError> {
    let parsed = parse_cron(cron)?;
    let tz = parse_timezone(timezone)?;
    let now = now_ms();
    let record = ScheduleRecord {
        id: format!("sch-{}", uuid::Uuid::new_v4().simple()),
        descriptor,
        route,
        effective,
        cron: cron.to_string(),
        timezone: timezone.to_string(),
        missed,
        paused: false,
        created_by: created_by.name.clone(),
        created_by_id: created_by.token_id.clone(),
        created_at_ms: now,
        resumed_at_ms: None,
        next_tick: next_tick(&parsed, tz, now.div_euclid(1000)),
    };
    let value =
        serde_json::to_string(&record).map_err(|e| EngineError::InvalidInput(e.to_string()))?;
    client
        .records()
        .insert(SCHEDULE_KIND, &record.id, &value, now)
        .await?;
    Ok(record)
}

pub async fn get(client: &Client, id: &str) -> Result<Option<ScheduleRecord>, EngineError> {
    client
        .records()
        .get(SCHEDULE_KIND, id)
        .await?
        .map(|v| decode_schedule(id, &v))
        .transpose()
}

/// A stored schedule, or the reason it cannot be read (the record stays as it is).
fn decode_schedule(id: &str, value: &str) -> Result<ScheduleRecord, EngineError> {
    serde_json::from_str(value).map_err(|e| EngineError::Unreadable {
        kind: "schedule",
        id: id.to_string(),
        error: e.to_string(),
    })
}

/// A tick state; one that cannot be read is logged and read as no tick yet (ticks
/// are enqueued under fixed ids, so a tick enqueued again is found, not repeated).
/// A stored tick state, or why it cannot be read. An unreadable one is kept as it is and its
/// schedule stops ticking, shown with the error: ticking on from the schedule's start
/// would enqueue ticks already deployed (STYLE.md, "Nothing fails silently").
fn decode_tick_state(id: &str, value: &str) -> Result<TickState, String> {
    serde_json::from_str(value).map_err(|e| {
        tracing::error!(schedule = %id, error = %e, "a schedule's tick state cannot be read; it is kept and the schedule does not tick");
        format!(
            "the schedule's tick state cannot be read ({e}); it does not tick until an \
             operator repairs or deletes the record {TICK_KIND}/{id}"
        )
    })
}

async fn put(client: &Client, record: &ScheduleRecord) -> Result<(), EngineError> {
    let value =
        serde_json::to_string(record).map_err(|e| EngineError::InvalidInput(e.to_string()))?;
    Ok(client
        .records()
        .put(SCHEDULE_KIND, &record.id, &value, now_ms())
        .await?)
}

/// Each stored tick state by schedule id; a schedule that never ticked has none.
async fn tick_states(
    client: &Client,
) -> Result<HashMap<String, Result<TickState, String>>, EngineError> {
    Ok(client
        .records()
        .list(TICK_KIND)
        .await?
        .into_iter()
        .map(|(k, v)| {
            let state = decode_tick_state(&k, &v);
            (k, state)
        })
        .collect())
}

/// Every stored schedule: the readable ones, and the ids of those that cannot be
/// read with the reason (logged here; kept in the database as they are).
async fn records(
    client: &Client,
) -> Result<(Vec<ScheduleRecord>, Vec<(String, String)>), EngineError> {
    let mut readable = Vec::new();
    let mut unreadable = Vec::new();
    for (id, value) in client.records().list(SCHEDULE_KIND).await? {
        match decode_schedule(&id, &value) {
            Ok(record) => readable.push(record),
            Err(e) => {
                tracing::error!(schedule = %id, error = %e, "a stored schedule cannot be read; it does not tick");
                unreadable.push((id, e.to_string()));
            }
        }
    }
    Ok((readable, unreadable))
}

/// Every schedule, with its next tick.
/// Every schedule, with its next tick; one that cannot be read is listed with its
/// `error` (and no application, so only unscoped tokens see it).
pub async fn list(client: &Client) -> Result<Vec<ScheduleView>, EngineError> {
    let states = tick_states(client).await?;
    let now = now_ms();
    let (readable, unreadable) = records(client).await?;
    let mut views: Vec<ScheduleView> = readable
        .into_iter()
        .map(|r| {
            match states
                .get(&r.id)
                .cloned()
                .unwrap_or(Ok(TickState::default()))
            {
                Ok(state) => view(&r, &state, now),
                Err(error) => ScheduleView {
                    error: Some(error),
                    ..view(&r, &TickState::default(), now)
                },
            }
        })
        .collect();
    views.extend(
        unreadable
            .into_iter()
            .map(|(id, error)| unreadable_view(id, error)),
    );
    Ok(views)
}

fn unreadable_view(id: String, error: String) -> ScheduleView {
    ScheduleView {
        id,
        application: String::new(),
        environment: String::new(),
        version: String::new(),
        cron: String::new(),
        timezone: String::new(),
        missed: None,
        paused: false,
        queue: String::new(),
        next_tick: None,
        last_tick: None,
        last_deploy: None,
        created_by: String::new(),
        created_at: String::new(),
        error: Some(error),
        refused_ticks: Vec::new(),
    }
}

/// One schedule, with its next tick.
pub async fn show(client: &Client, id: &str) -> Result<Option<ScheduleView>, EngineError> {
    let Some(record) = get(client, id).await? else {
        return Ok(None);
    };
    let state = client
        .records()
        .get(TICK_KIND, id)
        .await?
        .map(|v| decode_tick_state(id, &v))
        .unwrap_or(Ok(TickState::default()));
    Ok(Some(match state {
        Ok(state) => view(&record, &state, now_ms()),
        Err(error) => ScheduleView {
            error: Some(error),
            ..view(&record, &TickState::default(), now_ms())
        },
    }))
}

fn view(r: &ScheduleRecord, state: &TickState, now: i64) -> ScheduleView {
    let next = if r.paused {
        None
    } else {
        match (parse_cron(&r.cron), parse_timezone(&r.timezone)) {
            (Ok(cron), Ok(tz)) => {
                let after = r.floor_ms(state).max(now).div_euclid(1000);
                next_tick(&cron, tz, after)
            }
            _ => None,
        }
    };
    let d = &r.descriptor;
    ScheduleView {
        id: r.id.clone(),
        application: d.application.clone(),
        environment: d.environment.clone(),
        version: d.version().to_string(),
        cron: r.cron.clone(),
        timezone: r.timezone.clone(),
        missed: Some(r.missed),
        paused: r.paused,
        queue: r.route.queue.clone(),
        next_tick: next.map(|s| rfc3339_secs(s, &r.timezone)),
        last_tick: state.last_tick.map(|s| rfc3339_secs(s, &r.timezone)),
        last_deploy: state.last_deploy.clone(),
        created_by: r.created_by.clone(),
        created_at: rfc3339(r.created_at_ms),
        error: None,
        refused_ticks: state
            .refused
            .iter()
            .map(|refused| RefusedTickView {
                tick: rfc3339_secs(refused.tick, &r.timezone),
                reason: refused.reason.clone(),
            })
            .collect(),
    }
}

/// A tick as RFC 3339 in the schedule's time zone (its offset shown).
fn rfc3339_secs(secs: i64, timezone: &str) -> String {
    match parse_timezone(timezone).ok().and_then(|tz| at(tz, secs)) {
        Some(t) => t.to_rfc3339(),
        None => Utc
            .timestamp_opt(secs, 0)
            .single()
            .map(|t| t.to_rfc3339())
            .unwrap_or_default(),
    }
}

/// Pauses (`true`) or resumes (`false`) a schedule; `None` if there is none.
/// Resuming drops the ticks that fell during the pause.
pub async fn set_paused(
    client: &Client,
    id: &str,
    paused: bool,
) -> Result<Option<ScheduleView>, EngineError> {
    let Some(mut record) = get(client, id).await? else {
        return Ok(None);
    };
    if record.paused != paused {
        record.paused = paused;
        if !paused {
            record.resumed_at_ms = Some(now_ms());
        }
        put(client, &record).await?;
    }
    show(client, id).await
}

/// Deletes a schedule; returns whether there was one. Deploys already
/// enqueued by it are left as they are.
pub async fn delete(client: &Client, id: &str) -> Result<bool, EngineError> {
    let deleted = client.records().delete(SCHEDULE_KIND, id).await?;
    client.records().delete(TICK_KIND, id).await?;
    Ok(deleted)
}

/// What each tick is authorised against as it falls due: manent.yml as this process read
/// it (artifact sources, the environment files) and who may still deploy.
#[derive(Clone)]
pub struct TickPolicy {
    pub config: Arc<Config>,
    pub authority: Arc<dyn Authority>,
}

/// How many readable schedules of tenant `tenant` are stored (`schedules.max_per_tenant`).
pub async fn count_of_tenant(client: &Client, tenant: &str) -> Result<usize, EngineError> {
    let (readable, _) = records(client).await?;
    Ok(readable
        .iter()
        .filter(|s| s.descriptor.tenant() == tenant)
        .count())
}

/// One pass over every schedule: enqueues the deploys of the ticks due, each authorised
/// again under `policy` (a refused tick is recorded in the schedule's tick state instead).
/// Returns the ids enqueued (or found already enqueued).
pub async fn tick_once(
    client: &Client,
    policy: &TickPolicy,
    now: i64,
) -> Result<Vec<String>, EngineError> {
    // Tick states first: one whose schedule is gone after that was deleted. A
    // schedule that cannot be read is not gone: its tick state stays.
    let states = tick_states(client).await?;
    let (schedules, unreadable) = records(client).await?;
    for id in states.keys() {
        let stored =
            schedules.iter().any(|s| &s.id == id) || unreadable.iter().any(|(u, _)| u == id);
        if !stored {
            client.records().delete(TICK_KIND, id).await?;
        }
    }
    let mut out = Vec::new();
    for schedule in schedules.iter().filter(|s| !s.paused) {
        // No tick state: the schedule never ticked. An unreadable one: it does not tick.
        let Ok(state) = states
            .get(&schedule.id)
            .cloned()
            .unwrap_or(Ok(TickState::default()))
        else {
            continue;
        };
        // One schedule failing (a bad record, a refused enqueue) does not stop the others.
        match tick_schedule(client, policy, schedule, state, now).await {
            Ok(ids) => out.extend(ids),
            Err(e) => {
                tracing::warn!(schedule = %schedule.id, error = %e, "schedule tick failed");
            }
        }
    }
    Ok(out)
}

async fn tick_schedule(
    client: &Client,
    policy: &TickPolicy,
    schedule: &ScheduleRecord,
    state: TickState,
    now: i64,
) -> Result<Vec<String>, EngineError> {
    let cron = parse_cron(&schedule.cron)?;
    let tz = parse_timezone(&schedule.timezone)?;
    let floor = schedule.floor_ms(&state).div_euclid(1000);
    let plan = plan(&cron, tz, schedule.missed, floor, now.div_euclid(1000));
    let Some(last_tick) = plan.last_tick else {
        return Ok(Vec::new());
    };
    let mut ids = Vec::new();
    let mut refused = state.refused;
    if !plan.enqueue.is_empty() {
        // Once per pass: the ticks due together are judged by the same token and files.
        // A store that cannot be read fails the pass (nothing is recorded; the next pass
        // tries again), never runs a tick unchecked.
        let submitter = Submitter::new(&schedule.created_by, &schedule.created_by_id);
        let verdict = match check_interval(&policy.config, &schedule.cron, &cron, tz, floor) {
            Err(message) => Reauthorised::Refused(format!(
                "schedule.cron: {message}; delete this schedule and create a less frequent one"
            )),
            Ok(()) => {
                gate::reauthorise(
                    &policy.config,
                    policy.authority.as_ref(),
                    &schedule.descriptor,
                    &submitter,
                )
                .await?
            }
        };
        match verdict {
            Reauthorised::Allowed(effective) => {
                let effective = effective.map(|eff| *eff);
                for tick in &plan.enqueue {
                    ids.push(enqueue_tick(client, schedule, effective.clone(), *tick).await?);
                }
            }
            Reauthorised::Refused(reason) => {
                tracing::warn!(schedule = %schedule.id, ticks = ?plan.enqueue, %reason, "schedule ticks refused: nothing enqueued");
                refused.extend(plan.enqueue.iter().map(|tick| RefusedTick {
                    tick: *tick,
                    reason: reason.clone(),
                }));
                let excess = refused.len().saturating_sub(REFUSED_TICKS_KEPT);
                refused.drain(..excess);
            }
        }
    } else {
        tracing::info!(schedule = %schedule.id, tick = last_tick, "missed ticks skipped (missed: skip)");
    }
    let state = TickState {
        last_tick: Some(last_tick),
        last_deploy: ids.last().cloned().or(state.last_deploy),
        refused,
    };
    let value =
        serde_json::to_string(&state).map_err(|e| EngineError::InvalidInput(e.to_string()))?;
    // A lost update (another ticker, a stale read) only re-enqueues existing ids.
    client
        .records()
        .put(TICK_KIND, &schedule.id, &value, now_ms())
        .await?;
    Ok(ids)
}

/// Enqueues the deploy of one tick, idempotently, on the schedule's recorded route, with
/// `effective` as resolved at the tick (so an approval or a dependency the environment asks
/// for now gates it).
async fn enqueue_tick(
    client: &Client,
    schedule: &ScheduleRecord,
    effective: Option<EffectiveDescriptor>,
    tick: i64,
) -> Result<String, EngineError> {
    let id = tick_id(&schedule.id, tick);
    let request = DeployRequest::new(
        schedule.descriptor.clone(),
        effective,
        schedule.route.clone(),
        &Submitter::new(&schedule.created_by, &schedule.created_by_id),
        tick * 1000,
    );
    // Idempotent on the id: a tick already enqueued (by another ticker) is returned as it is.
    let version = crate::request::startable_version(client).await?;
    client.enqueue(request.enqueue(version).id(&id)).await?;
    tracing::debug!(schedule = %schedule.id, deploy = %id, "tick enqueued");
    Ok(id)
}

/// The ticker of a worker process: a pass every `interval` until stopped.
pub struct Ticker {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Ticker {
    pub fn start(client: Client, policy: TickPolicy, interval: Duration) -> Ticker {
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        // Every second, idle or not: on the store's background connection.
        let task = tokio::spawn(manent_engine::background(async move {
            let mut every = tokio::time::interval(interval);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = every.tick() => {}
                    _ = stopped.wait_for(|s| *s) => return,
                }
                match tick_once(&client, &policy, now_ms()).await {
                    Ok(ids) if !ids.is_empty() => {
                        tracing::debug!(count = ids.len(), "schedule ticks enqueued");
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "schedule ticker pass failed"),
                }
            }
        }));
        Ticker { stop, task }
    }

    /// Stops the ticker after its current pass.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

#[cfg(test)]
mod tests;
