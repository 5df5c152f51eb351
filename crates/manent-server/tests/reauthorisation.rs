//! Scheduled deploys are authorised again each time they fire (docs/security.md,
//! "Schedules are authorised at every tick"): the token store of manent-api behind
//! manent-deploy's ticker and workflow, as `manent-server` wires them. The ticker is driven
//! with its own clock (`tick_once` at a chosen instant), a `schedule.at` deploy by a worker
//! started once its token is revoked; and the bounds on schedules checked at creation.

use std::sync::Arc;

use manent_api::auth::{self, NewToken, Role};
use manent_config::Config;
use manent_deploy::{
    Submitter,
    background::schedules::{self, TickPolicy},
    request::{AUTHORISE_AT_START_STEP, Phase},
    submission::{self, SubmitError},
    views::deploy_views,
};
use manent_engine::{Client, Connections, Database, Engine, EngineConfig, WorkflowStatus, now_ms};
use manent_testkit::{Db, TestDb, eventually, on_both_backends};

on_both_backends!(
    a_schedule_whose_token_is_revoked_stops_producing_deploys_and_records_each_refused_tick,
    a_schedule_whose_environment_no_longer_allows_its_override_is_refused_at_its_next_tick,
    an_approval_rule_added_to_the_environment_makes_the_next_tick_wait_for_approval,
    a_deploy_at_a_time_whose_token_was_revoked_before_it_fired_ends_refused_with_the_reason,
    a_too_frequent_cron_and_one_schedule_over_the_tenant_cap_are_refused_at_creation,
    a_per_second_schedule_stored_before_the_minimum_interval_is_refused_at_its_ticks,
);

/// A safety net for waits that end on an event; never a measure of speed.
const WAIT: std::time::Duration = std::time::Duration::from_secs(90);
/// Every minute: the tests move the ticker's clock a minute at a time.
const EVERY_MINUTE: &str = "* * * * *";
const PAYLOAD: &str = "payload";
/// sha256("payload")
const PAYLOAD_SHA256: &str = "239f59ed55e737c77147cf55ad0c1b030b6d7ee748a7426952f9b852d5a935e5";

/// An installation over a fresh database: acme/web/prod (one local target, the command
/// plugin, `commands` handed over to descriptors), an artifact, at most two schedules per
/// tenant, and the token store as the workers and tickers ask it.
struct Installation {
    db: TestDb,
    config: Arc<Config>,
    client: Client,
}

impl Installation {
    async fn new(backend: Db) -> Installation {
        manent_testkit::init_tracing();
        let db = TestDb::new(backend).await;
        std::fs::write(db.path("artifact.txt"), PAYLOAD).unwrap();
        let installation_yaml = format!(
            "database: {{url: {}}}\nenvironments: {{source: {}}}\nartifacts: {{sources: [{}]}}\n\
             schedules: {{max_per_tenant: 2}}\ndbos: {{executor_id: {}}}\n",
            serde_json::to_string(&db.url).unwrap(),
            serde_json::to_string(&db.path("environments")).unwrap(),
            serde_json::to_string(&manent_testkit::temp_artifact_source()).unwrap(),
            serde_json::to_string(&format!("reauth-{}", std::process::id())).unwrap(),
        );
        let config = Config::from_yaml_str(&installation_yaml, "manent.yml", std::iter::empty())
            .expect("the test configuration is valid");
        let client = Client::new(
            Database::open(&db.url, &Connections::default())
                .await
                .expect("open the test database"),
        );
        let installation = Installation {
            db,
            config: Arc::new(config),
            client,
        };
        installation.environment("acme/web", "overrides: [params, commands]\n");
        installation
    }

    /// Writes `<application>/prod.yml`: one local target, the command plugin, and `extra`.
    fn environment(&self, application: &str, extra: &str) {
        let path = self
            .db
            .path("environments")
            .join(application)
            .join("prod.yml");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(
            path,
            format!(
                "targets: [{{name: t1, host: local}}]\ndeploy: {{plugin: command, commands: [\"true\"]}}\n{extra}"
            ),
        )
        .unwrap();
    }

    /// A deployer token on `acme/*`, as the API would record who submits with it.
    async fn deployer(&self, name: &str) -> Submitter {
        let (token, _secret) = auth::create(
            &self.client.records(),
            &NewToken {
                name: name.into(),
                role: Role::Deployer,
                on: Some("acme/*".into()),
                expires_at_ms: None,
            },
        )
        .await
        .expect("create a token");
        Submitter::new(token.name, token.id)
    }

    async fn revoke(&self, name: &str) {
        auth::revoke(&self.client.records(), name)
            .await
            .expect("revoke the token");
    }

    fn policy(&self) -> TickPolicy {
        TickPolicy {
            config: self.config.clone(),
            authority: Arc::new(auth::TokenAuthority::new(self.client.records())),
        }
    }

    /// A descriptor of `application` in prod, with `extra` (YAML lines) appended.
    fn descriptor(&self, application: &str, extra: &str) -> String {
        format!(
            "application: {application}\nenvironment: prod\nartifacts:\n  - {{name: artifact.txt, \
             type: file, version: \"1\", url: {}, sha256: {PAYLOAD_SHA256}}}\n{extra}",
            serde_json::to_string(&format!(
                "file://{}",
                self.db.path("artifact.txt").display()
            ))
            .unwrap()
        )
    }

    async fn submit(&self, text: String, by: &Submitter) -> Result<String, SubmitError> {
        let descriptor = submission::parse(text, "deploy.yml".into()).await?;
        let submitted =
            submission::submit(&self.client, &self.config, descriptor, false, by).await?;
        Ok(submitted.id)
    }

    /// Creates a schedule of acme/web firing every minute, with `extra` appended.
    async fn schedule(&self, extra: &str, by: &Submitter) -> schedules::ScheduleRecord {
        let text = self.descriptor(
            "acme/web",
            &format!("{extra}schedule: {{cron: \"{EVERY_MINUTE}\"}}\n"),
        );
        let id = self
            .submit(text, by)
            .await
            .expect("the schedule is created");
        schedules::get(&self.client, &id)
            .await
            .expect("read the schedule")
            .expect("the schedule is stored")
    }

    /// One ticker pass at `minutes` minutes and a few seconds after the schedule's creation:
    /// exactly one tick of every minute is due since the pass before.
    async fn tick_at(&self, schedule: &schedules::ScheduleRecord, minutes: i64) -> Vec<String> {
        let at = (schedule.created_at_ms.div_euclid(60_000) + minutes) * 60_000 + 5_000;
        schedules::tick_once(&self.client, &self.policy(), at)
            .await
            .expect("a ticker pass")
    }

    async fn refused_ticks(&self, id: &str) -> Vec<schedules::RefusedTickView> {
        schedules::show(&self.client, id)
            .await
            .expect("show the schedule")
            .expect("the schedule exists")
            .refused_ticks
    }

    /// A launched worker of this installation, asking the token store as `serve` does.
    async fn worker(&self) -> Engine {
        let database = Database::open(&self.db.url, &Connections::default())
            .await
            .unwrap();
        let engine = Engine::new(
            database,
            EngineConfig::new(self.config.effective_executor_id()),
        );
        for queue in manent_deploy::worker_queues(&self.config) {
            engine.listen(queue.spec());
        }
        manent_deploy::register_workflows(
            &engine,
            &self.config,
            Arc::new(auth::TokenAuthority::new(self.client.records())),
            // Its deploys reach nothing over HTTP.
            Arc::new(manent_deploy::http::NoClient),
        );
        engine.launch().await.expect("launch the worker");
        engine
    }

    async fn status(&self, id: &str) -> deploy_views::DeployStatus {
        deploy_views::status(&self.client, id)
            .await
            .expect("read the deploy")
            .expect("the deploy exists")
    }
}

impl Drop for Installation {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.config.worker_workdir());
    }
}

async fn a_schedule_whose_token_is_revoked_stops_producing_deploys_and_records_each_refused_tick(
    db: Db,
) {
    let site = Installation::new(db).await;
    let ci = site.deployer("ci").await;
    let schedule = site.schedule("", &ci).await;

    let first = site.tick_at(&schedule, 1).await;
    assert_eq!(
        first.len(),
        1,
        "while its token is valid, a due tick enqueues its deploy: {first:?}"
    );

    site.revoke("ci").await;
    for minute in [2, 3] {
        let enqueued = site.tick_at(&schedule, minute).await;
        assert!(
            enqueued.is_empty(),
            "a tick of a schedule whose token was revoked enqueues nothing: {enqueued:?}"
        );
    }
    let deploys = deploy_views::list(&site.client, &Default::default(), &|_| true)
        .await
        .expect("list the deploys");
    assert_eq!(
        deploys.iter().map(|d| d.id.clone()).collect::<Vec<_>>(),
        first,
        "the only deploy is the one of the tick before the revocation"
    );
    let refused = site.refused_ticks(&schedule.id).await;
    assert_eq!(
        refused.len(),
        2,
        "each refused tick is in the schedule's history: {refused:?}"
    );
    for tick in &refused {
        assert!(
            tick.reason.contains("`ci`") && tick.reason.contains("no longer exists"),
            "the reason names the token and what became of it: {tick:?}"
        );
    }
    let view = schedules::show(&site.client, &schedule.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        view.last_deploy,
        first.first().cloned(),
        "the last deploy stays the last one that ran: {view:?}"
    );
}

async fn a_schedule_whose_environment_no_longer_allows_its_override_is_refused_at_its_next_tick(
    db: Db,
) {
    let site = Installation::new(db).await;
    let ci = site.deployer("ci").await;
    let schedule = site
        .schedule("deploy: {commands: [\"echo from the descriptor\"]}\n", &ci)
        .await;
    assert_eq!(
        site.tick_at(&schedule, 1).await.len(),
        1,
        "the override is allowed at first, and the tick runs"
    );

    site.environment("acme/web", "overrides: []\n");
    let enqueued = site.tick_at(&schedule, 2).await;
    assert!(
        enqueued.is_empty(),
        "an override the environment no longer allows refuses the tick: {enqueued:?}"
    );
    let refused = site.refused_ticks(&schedule.id).await;
    assert!(
        refused.len() == 1 && refused[0].reason.contains("deploy.commands"),
        "the refused tick is recorded, naming the override refused: {refused:?}"
    );
}

async fn an_approval_rule_added_to_the_environment_makes_the_next_tick_wait_for_approval(db: Db) {
    let site = Installation::new(db).await;
    let ci = site.deployer("ci").await;
    let schedule = site.schedule("", &ci).await;
    let before = site.tick_at(&schedule, 1).await;
    let request = submission::recorded_request(&site.client, &before[0])
        .await
        .expect("the tick's request");
    assert!(
        !request.gated,
        "without an approval rule the tick goes straight to its queue"
    );

    site.environment(
        "acme/web",
        "overrides: [params, commands]\napproval: {count: 1}\n",
    );
    let after = site.tick_at(&schedule, 2).await;
    assert_eq!(after.len(), 1, "the tick is enqueued: {after:?}");
    let gated = submission::recorded_request(&site.client, &after[0])
        .await
        .expect("the tick's request");
    assert!(
        gated.gated
            && gated
                .effective
                .as_ref()
                .is_some_and(|eff| eff.approval.is_some()),
        "the tick is recorded under the environment's approval rule of now: {gated:?}"
    );
    let worker = site.worker().await;
    let waiting = eventually("the tick waits for an approval", WAIT, || async {
        let status = site.status(&after[0]).await;
        (status.phase == Phase::WaitingApproval).then_some(status)
    })
    .await;
    assert_eq!(
        waiting.status,
        WorkflowStatus::Pending,
        "it waits, neither run nor failed: {waiting:?}"
    );
    assert_eq!(
        waiting.queue, request.route.queue,
        "the queue decided at creation stays: {waiting:?}"
    );
    worker.shutdown(std::time::Duration::from_secs(5)).await;
}

async fn a_deploy_at_a_time_whose_token_was_revoked_before_it_fired_ends_refused_with_the_reason(
    db: Db,
) {
    let site = Installation::new(db).await;
    let ci = site.deployer("ci").await;
    let at = chrono::DateTime::from_timestamp_millis(now_ms() + 1_000)
        .unwrap()
        .to_rfc3339();
    let id = site
        .submit(
            site.descriptor("acme/web", &format!("schedule: {{at: \"{at}\"}}\n")),
            &ci,
        )
        .await
        .expect("the deploy at a time is accepted");
    site.revoke("ci").await;
    // No worker ran before the revocation: the deploy cannot have started earlier.
    let worker = site.worker().await;
    let ended = eventually("the deploy ends", WAIT, || async {
        let status = site.status(&id).await;
        status.status.is_terminal().then_some(status)
    })
    .await;
    assert_eq!(
        (ended.status, ended.phase.clone()),
        (WorkflowStatus::Error, Phase::Refused),
        "it ends refused: {ended:?}"
    );
    let error = ended.error.clone().unwrap_or_default();
    assert!(
        error.contains("refused when its time came") && error.contains("`ci`"),
        "its status says why, naming the token: {error}"
    );
    assert!(
        ended
            .steps
            .iter()
            .all(|s| s.name == AUTHORISE_AT_START_STEP || s.name.starts_with("manent.")),
        "nothing ran after the check: no fetch, no target: {:?}",
        ended.steps
    );
    let logs = deploy_views::logs(&site.client, &id, true)
        .await
        .unwrap()
        .unwrap()
        .lines
        .join("\n");
    assert!(
        logs.contains("no longer exists") && logs.contains("refused"),
        "its log says why: {logs}"
    );
    worker.shutdown(std::time::Duration::from_secs(5)).await;
}

async fn a_too_frequent_cron_and_one_schedule_over_the_tenant_cap_are_refused_at_creation(db: Db) {
    let site = Installation::new(db).await;
    site.environment("other/web", "");
    let ci = site.deployer("ci").await;
    let every_second = site.descriptor("acme/web", "schedule: {cron: \"* * * * * *\"}\n");
    let Err(SubmitError::Invalid { field, message }) = site.submit(every_second, &ci).await else {
        panic!("a per-second cron is refused at creation");
    };
    assert_eq!(
        field.as_deref(),
        Some("schedule.cron"),
        "the refusal names the field: {message}"
    );
    assert!(
        message.contains("schedules.min_interval") && message.contains("1s"),
        "and says what it found and which limit it passed: {message}"
    );

    let daily =
        |application: &str| site.descriptor(application, "schedule: {cron: \"0 3 * * *\"}\n");
    for _ in 0..2 {
        site.submit(daily("acme/web"), &ci)
            .await
            .expect("a tenant's schedules up to the cap are created");
    }
    let Err(SubmitError::Invalid { field, message }) = site.submit(daily("acme/web"), &ci).await
    else {
        panic!("a third schedule of acme is refused: the cap is two per tenant");
    };
    assert_eq!(field.as_deref(), Some("schedule.cron"), "{message}");
    assert!(
        message.contains("schedules.max_per_tenant") && message.contains("`acme`"),
        "the refusal names the tenant and the limit: {message}"
    );
    let other_tenant = Submitter::new("other-ci", "");
    let other = site
        .submit(daily("other/web"), &other_tenant)
        .await
        .expect("another tenant has its own count");
    assert!(other.starts_with("sch-"), "{other}");
}

async fn a_per_second_schedule_stored_before_the_minimum_interval_is_refused_at_its_ticks(db: Db) {
    let site = Installation::new(db).await;
    let ci = site.deployer("ci").await;
    let allowed = site.schedule("", &ci).await;
    // As a release without the limit stored it: the same descriptor, firing every second.
    let every_second = schedules::create(
        &site.client,
        allowed.descriptor.clone(),
        allowed.effective.clone(),
        allowed.route.clone(),
        "* * * * * *",
        "UTC",
        allowed.missed,
        &ci,
    )
    .await
    .expect("store a schedule as an older release did");
    schedules::delete(&site.client, &allowed.id).await.unwrap();

    let enqueued = site.tick_at(&every_second, 1).await;
    assert!(
        enqueued.is_empty(),
        "a schedule firing more often than schedules.min_interval enqueues nothing: {enqueued:?}"
    );
    let refused = site.refused_ticks(&every_second.id).await;
    assert!(
        !refused.is_empty()
            && refused
                .iter()
                .all(|t| t.reason.contains("schedules.min_interval")),
        "its ticks are refused, naming the limit: {refused:?}"
    );
}
