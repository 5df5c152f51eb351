//! `rollout.analysis` against a real Prometheus (docs/analysis.md): every target serves an
//! error ratio from this test's HTTP server (high while it runs the version `bad`),
//! Prometheus scrapes them every second (`scripts/prometheus`), and a deploy's canary wave
//! is judged on it before the later waves start. Real processes on SQLite and PostgreSQL,
//! driven through the `manent` CLI.

mod common;

use std::{path::PathBuf, sync::Arc};

use common::{Site, WAIT, ledger_path};
use manent_testkit::{Db, eventually, on_both_backends, signal};
use serde_json::Value;

on_both_backends!(
    a_canary_whose_error_rate_stays_near_the_baseline_goes_on_to_every_wave,
    a_canary_whose_error_rate_rises_fails_the_deploy_and_the_later_waves_never_get_it,
    an_analysis_without_data_waits_for_a_decision_then_promote_goes_on_and_abort_rolls_back,
    a_bake_whose_worker_is_killed_goes_on_elsewhere_without_a_measurement_lost_or_repeated,
    a_plan_lists_the_analysis_after_each_wave_with_its_queries_filled_in_and_measures_nothing,
);

/// The Prometheus `scripts/prometheus` started, and its file_sd directory.
fn prometheus() -> (String, PathBuf) {
    let address = std::env::var("MANENT_TEST_PROMETHEUS").expect(
        "MANENT_TEST_PROMETHEUS: the analysis tests need a Prometheus; run them with \
         ./scripts/test, or eval \"$(./scripts/prometheus)\" and export what it prints",
    );
    let sd = std::env::var("MANENT_TEST_PROMETHEUS_SD").expect("MANENT_TEST_PROMETHEUS_SD");
    (address, PathBuf::from(sd))
}

/// The targets' metrics: an HTTP server on loopback answering `/metrics/<target>` with
/// `app_error_ratio`, 0.5 while the target runs the version `bad` (its `deployed-<target>`
/// file says which), 0.01 otherwise; known to Prometheus by a file_sd file of this run,
/// removed on drop.
struct Metrics {
    run: String,
    sd_file: PathBuf,
    server: tokio::task::JoinHandle<()>,
}

impl Metrics {
    async fn serve(site_dir: PathBuf, targets: &[&str]) -> Metrics {
        let (address, sd) = prometheus();
        let run = format!("r{}", uuid_like());
        let dir = Arc::new(site_dir);
        let app = axum::Router::new().route(
            "/metrics/{target}",
            axum::routing::get(
                move |axum::extract::Path(target): axum::extract::Path<String>| {
                    let dir = dir.clone();
                    async move {
                        let deployed =
                            std::fs::read_to_string(dir.join(format!("deployed-{target}")))
                                .unwrap_or_default();
                        let ratio = if deployed.trim() == "bad" { 0.5 } else { 0.01 };
                        format!("# TYPE app_error_ratio gauge\napp_error_ratio {ratio}\n")
                    }
                },
            ),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        let entries: Vec<Value> = targets
            .iter()
            .map(|t| {
                serde_json::json!({
                    "targets": [format!("127.0.0.1:{port}")],
                    "labels": {"__metrics_path__": format!("/metrics/{t}"), "instance": t, "run": run},
                })
            })
            .collect();
        let sd_file = sd.join(format!("{run}.json"));
        // Written whole, then renamed: Prometheus never reads half a file.
        let part = sd.join(format!("{run}.part"));
        std::fs::write(&part, serde_json::to_vec(&entries).unwrap()).unwrap();
        std::fs::rename(&part, &sd_file).unwrap();
        let metrics = Metrics {
            run,
            sd_file,
            server,
        };
        let query = format!("count(app_error_ratio{{run=\"{}\"}})", metrics.run);
        let want = targets.len() as f64;
        eventually("Prometheus has scraped every target", WAIT, || async {
            (query_value(&address, &query).await == Some(want)).then_some(())
        })
        .await;
        metrics
    }

    /// The query of the metric `errors`: the worst error ratio over `{targets}`.
    fn query(&self) -> String {
        format!(
            "max(app_error_ratio{{run=\"{}\",instance=~\"{{targets}}\"}})",
            self.run
        )
    }
}

impl Drop for Metrics {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.sd_file);
        self.server.abort();
    }
}

/// A name no other test run uses.
fn uuid_like() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{}{nanos}", std::process::id())
}

/// One instant query's value, if it has one.
async fn query_value(address: &str, query: &str) -> Option<f64> {
    let body: Value = reqwest::Client::new()
        .get(format!("{address}/api/v1/query"))
        .query(&[("query", query)])
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    body["data"]["result"][0]["value"][1].as_str()?.parse().ok()
}

/// acme/web's prod: targets t1 (the canary wave), t2 and t3; each deploy (its command) and
/// each rollback (the previous version's `activate`) writes the version into `deployed-<target>` and a
/// `<target> <version>` line into the ledger; `analysis`
/// is the text under `rollout.analysis:`.
fn write_environment(site: &Site, analysis: &str) {
    let dir = site.dir.display();
    let ledger = ledger_path(&site.dir);
    let command = serde_json::to_string(&format!(
        "echo $MANENT_VERSION > {dir}/deployed-$MANENT_TARGET; echo \"$MANENT_TARGET \
         $MANENT_VERSION\" >> {ledger}"
    ))
    .unwrap();
    site.write_environment(
        "acme/web",
        "prod",
        &format!(
            "targets:\n  - {{name: t1, host: local}}\n  - {{name: t2, host: local}}\n  - {{name: \
             t3, host: local}}\ndeploy:\n  plugin: command\n  commands: [{command}]\n  activate: {command}\nrollout:\n  \
             waves: [[t1], [t2, t3]]\n  analysis:\n{analysis}",
        ),
    );
}

/// The metric `errors` over Prometheus: the canary within 20% of the baseline (plus 0.01).
fn errors_metric(address: &str, query: &str, extra: &str) -> String {
    format!(
        "      - name: errors\n        success: \"result <= baseline * 1.2 + 0.01\"\n{extra}        \
         prometheus: {{address: \"{address}\", query: {}}}\n",
        serde_json::to_string(query).unwrap()
    )
}

/// Submits version `version` of acme/web; returns its id.
fn submit(site: &Site, token: &str, version: &str) -> String {
    let path = site.descriptor(version);
    let (code, v) = site.cli(token, &["deploy", "-f", path.to_str().unwrap()]);
    assert_eq!(code, 0, "submission of {version}: {v}");
    v["id"].as_str().unwrap().to_string()
}

fn measurements(status: &Value) -> Vec<Value> {
    status["measurements"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn target_status(status: &Value, name: &str) -> String {
    status["targets"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["name"] == name))
        .map_or("absent".into(), |t| {
            t["status"].as_str().unwrap_or("?").to_string()
        })
}

async fn a_canary_whose_error_rate_stays_near_the_baseline_goes_on_to_every_wave(db: Db) {
    let mut site = Site::new(db, &[]).await;
    let metrics = Metrics::serve(site.dir.clone(), &["t1", "t2", "t3"]).await;
    let (address, _) = prometheus();
    write_environment(
        &site,
        &format!(
            "    bake: 3s\n    interval: 1s\n    metrics:\n{}",
            errors_metric(&address, &metrics.query(), "")
        ),
    );
    let token = site.token();
    site.start("api", "api");
    site.start("worker", "w1");
    site.wait_api().await;
    let id = submit(&site, &token, "good");
    let done = site.wait_status(&token, &id, "SUCCESS").await;
    let taken = measurements(&done);
    assert_eq!(
        taken.len(),
        3,
        "bake 3s / interval 1s, after the canary wave only: {done}"
    );
    for m in &taken {
        assert_eq!(
            (
                m["wave"].as_u64(),
                m["metric"].as_str(),
                m["outcome"].as_str()
            ),
            (Some(1), Some("errors"), Some("passed")),
            "each measurement judged wave 1 and passed: {m}"
        );
        assert!(
            m["value"].as_f64().is_some()
                && m["baseline"].as_f64().is_some()
                && m["at"].is_string(),
            "with its value, its baseline (t2 and t3) and its time: {m}"
        );
    }
    for t in ["t1", "t2", "t3"] {
        assert_eq!(target_status(&done, t), "deployed", "{t}: {done}");
    }
    let (code, text) = site.cli_text(&token, &["status", &id]);
    assert!(
        code == 0
            && text.contains("analysis after wave 1")
            && text.contains("metric errors  condition `result <= baseline * 1.2 + 0.01`  3 passed, 0 failed, 0 inconclusive: passed"),
        "status shows the analysis per metric, its condition and outcome: {text}"
    );
}

async fn a_canary_whose_error_rate_rises_fails_the_deploy_and_the_later_waves_never_get_it(db: Db) {
    let mut site = Site::new(db, &[]).await;
    let metrics = Metrics::serve(site.dir.clone(), &["t1", "t2", "t3"]).await;
    let (address, _) = prometheus();
    write_environment(
        &site,
        &format!(
            "    bake: 30s\n    interval: 1s\n    metrics:\n{}",
            errors_metric(&address, &metrics.query(), "")
        ),
    );
    let token = site.token();
    site.start("api", "api");
    site.start("worker", "w1");
    site.wait_api().await;
    let good = submit(&site, &token, "good");
    let status = site.wait_status(&token, &good, "SUCCESS").await;
    let id = submit(&site, &token, "bad");
    let failed = site.wait_status(&token, &id, "ERROR").await;
    let error = failed["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("analysis after wave 1: metric errors failed 1 of")
            && error.contains("the next wave was not started"),
        "the deploy fails on the canary's analysis, long before its 30s bake ends: {failed}"
    );
    let last = measurements(&failed).last().cloned().unwrap_or_default();
    assert_eq!(
        (
            last["outcome"].as_str(),
            last["value"].as_f64(),
            last["baseline"].as_f64()
        ),
        (Some("failed"), Some(0.5), Some(0.01)),
        "the failing measurement: the canary's 0.5 against the baseline's 0.01: {failed}"
    );
    assert_eq!(
        target_status(&failed, "t1"),
        "rolled_back",
        "the canary: {failed}"
    );
    let ledger = site.ledger();
    assert!(
        !ledger.contains("t2 bad") && !ledger.contains("t3 bad"),
        "the later waves never received the bad version: {ledger}"
    );
    for t in ["t1", "t2", "t3"] {
        let deployed = std::fs::read_to_string(site.dir.join(format!("deployed-{t}"))).unwrap();
        assert_eq!(
            deployed.trim(),
            "good",
            "{t} runs the good version again: {status}"
        );
    }
}

async fn an_analysis_without_data_waits_for_a_decision_then_promote_goes_on_and_abort_rolls_back(
    db: Db,
) {
    let mut site = Site::new(db, &[]).await;
    let (address, _) = prometheus();
    // A series nobody exports: no data, an inconclusive measurement each time.
    let query = format!(
        "max(absent_metric{{run=\"{}\",instance=~\"{{targets}}\"}})",
        uuid_like()
    );
    write_environment(
        &site,
        &format!(
            "    bake: 30s\n    interval: 1s\n    metrics:\n{}",
            errors_metric(&address, &query, "        inconclusive_limit: 1\n")
        ),
    );
    let token = site.token();
    let deployer = site.token_named("dev", "deployer");
    site.start("api", "api");
    site.start("worker", "w1");
    site.wait_api().await;

    let id = submit(&site, &token, "1");
    let waiting = site
        .wait_until(&token, &id, "waits for a decision", |s| {
            s["phase"] == "waiting_decision"
        })
        .await;
    let taken = measurements(&waiting);
    assert!(
        taken.len() == 2 && taken.iter().all(|m| m["outcome"] == "inconclusive"),
        "two inconclusive measurements, one over the limit of 1, then the wait: {waiting}"
    );
    assert!(
        waiting["waiting_for"]
            .as_str()
            .is_some_and(|w| w.contains("no data") && w.contains(&format!("manent promote {id}"))),
        "it says why, and what to do: {waiting}"
    );
    let (code, said) = site.cli_stderr(&deployer, &["promote", &id]);
    assert_eq!(
        code, 4,
        "a deployer may not decide (approve's permission): {said}"
    );
    let (code, promoted) = site.cli(&token, &["promote", &id]);
    assert_eq!(code, 0, "promote: {promoted}");
    let done = site.wait_status(&token, &id, "SUCCESS").await;
    assert_eq!(
        target_status(&done, "t3"),
        "deployed",
        "the next wave ran: {done}"
    );

    let second = submit(&site, &token, "2");
    site.wait_until(&token, &second, "waits for a decision", |s| {
        s["phase"] == "waiting_decision"
    })
    .await;
    let (code, aborted) = site.cli(&token, &["abort", &second, "--reason", "too quiet"]);
    assert_eq!(code, 0, "abort: {aborted}");
    let failed = site.wait_status(&token, &second, "ERROR").await;
    assert!(
        failed["error"]
            .as_str()
            .is_some_and(|e| e.contains("aborted by ci: too quiet")),
        "the abort and its reason are the deploy's error: {failed}"
    );
    assert_eq!(
        target_status(&failed, "t1"),
        "rolled_back",
        "the canary: {failed}"
    );
    assert!(
        !site.ledger().contains("t2 2"),
        "the later waves never received version 2: {}",
        site.ledger()
    );
    let (code, said) = site.cli_stderr(&token, &["promote", &second]);
    assert!(
        code != 0 && said.contains("has ended"),
        "an ended deploy has nothing to promote: {said}"
    );
}

async fn a_bake_whose_worker_is_killed_goes_on_elsewhere_without_a_measurement_lost_or_repeated(
    db: Db,
) {
    let mut site = Site::new(db, &[]).await;
    let metrics = Metrics::serve(site.dir.clone(), &["t1", "t2", "t3"]).await;
    let (address, _) = prometheus();
    write_environment(
        &site,
        &format!(
            "    bake: 8s\n    interval: 1s\n    metrics:\n{}",
            errors_metric(&address, &metrics.query(), "")
        ),
    );
    let token = site.token();
    site.start("api", "api");
    let recovering = [("MANENT__RECOVERY__AUTOMATIC", "true")];
    let first = site.start_with("worker", "w1", &recovering);
    site.wait_api().await;
    let id = submit(&site, &token, "good");
    site.wait_until(&token, &id, "three measurements taken", |s| {
        measurements(s).len() >= 3
    })
    .await;
    signal(site.child(first), "KILL");
    site.child(first).wait().unwrap();
    site.start_with("worker", "w2", &recovering);
    let done = site.wait_status(&token, &id, "SUCCESS").await;

    let taken = measurements(&done);
    assert_eq!(
        taken.len(),
        8,
        "bake 8s / interval 1s: neither shortened nor started over: {done}"
    );
    let times: Vec<&str> = taken.iter().filter_map(|m| m["at"].as_str()).collect();
    let mut distinct = times.clone();
    distinct.dedup();
    assert_eq!(distinct.len(), 8, "no measurement counted twice: {times:?}");
    let steps = done["steps"].as_array().expect("steps");
    let measured: Vec<&Value> = steps
        .iter()
        .filter(|s| {
            s["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("wave 1: measure "))
        })
        .collect();
    assert_eq!(
        measured.len(),
        8,
        "one recorded step per measurement: {measured:?}"
    );
    let by = |worker: &str| {
        measured
            .iter()
            .filter(|s| s["executor_id"] == worker)
            .count()
    };
    assert!(
        by("w1") >= 3 && by("w2") >= 1 && by("w1") + by("w2") == 8,
        "w1 took the first measurements, w2 the rest: w1 {}, w2 {}",
        by("w1"),
        by("w2")
    );
}

async fn a_plan_lists_the_analysis_after_each_wave_with_its_queries_filled_in_and_measures_nothing(
    db: Db,
) {
    let mut site = Site::new(db, &[]).await;
    // Nothing answers there: a plan asks nothing of a provider.
    let address = "http://prometheus.invalid:9090";
    let p99 = "      - name: p99\n        success: \"result < 0.5\"\n        http: {url: \
               \"http://{host}:8080/{version}/stats\", value: /latency/p99}\n";
    write_environment(
        &site,
        &format!(
            "    bake: 5m\n    interval: 30s\n    timeout: 1h\n    metrics:\n{}{p99}",
            errors_metric(address, "max(app_error_ratio{instance=~\"{targets}\"})", "")
        ),
    );
    let token = site.token();
    site.start("api", "api");
    site.start("worker", "w1");
    site.wait_api().await;
    let path = site.descriptor("7");
    let (code, plan) = site.cli(&token, &["plan", "-f", path.to_str().unwrap()]);
    assert_eq!(code, 0, "the dry run succeeds: {plan}");
    let bakes = plan["analysis"].as_array().cloned().unwrap_or_default();
    assert_eq!(
        bakes.len(),
        1,
        "one bake: after wave 1 of 2, none after the last: {plan}"
    );
    let bake = &bakes[0];
    assert_eq!(
        (
            bake["after_wave"].as_u64(),
            bake["targets"].clone(),
            bake["baseline"].clone(),
            bake["measurements"].as_u64(),
            bake["interval"].as_str(),
            bake["bake"].as_str(),
            bake["timeout"].as_str(),
        ),
        (
            Some(1),
            serde_json::json!(["t1"]),
            serde_json::json!(["t2", "t3"]),
            Some(10),
            Some("30s"),
            Some("5m"),
            Some("1h")
        ),
        "the bake's wave, baseline, rhythm and wait: {bake}"
    );
    let errors = &bake["metrics"][0];
    assert_eq!(
        (
            errors["provider"].as_str(),
            errors["success"].as_str(),
            errors["asks"][0]["source"].as_str(),
            errors["asks"][0]["query"].as_str(),
            errors["asks"][0]["baseline_query"].as_str(),
        ),
        (
            Some("prometheus"),
            Some("result <= baseline * 1.2 + 0.01"),
            Some(address),
            Some("max(app_error_ratio{instance=~\"t1\"})"),
            Some("max(app_error_ratio{instance=~\"t2|t3\"})"),
        ),
        "the query over the canary and over the baseline, placeholders filled in: {errors}"
    );
    let p99 = &bake["metrics"][1];
    assert_eq!(
        (
            p99["asks"][0]["target"].as_str(),
            p99["asks"][0]["source"].as_str(),
            p99["asks"][0]["query"].as_str(),
            p99["asks"][0]["baseline_query"].clone(),
            p99["failure_limit"].as_u64(),
            p99["inconclusive_limit"].as_u64(),
        ),
        (
            Some("t1"),
            Some("http://local:8080/7/stats"),
            Some("/latency/p99"),
            Value::Null,
            Some(0),
            Some(2)
        ),
        "a per-target metric asks each target of the wave, with its limits: {p99}"
    );
    let id = plan["deploy_id"].as_str().unwrap_or_default().to_string();
    let dry_run = site.status(&token, &id);
    assert!(
        dry_run["measurements"].is_null(),
        "the dry run measured nothing: {dry_run}"
    );
    let (code, logs) = site.cli_text(&token, &["logs", &id]);
    assert!(
        code == 0
            && logs.contains("analysis after wave 1 would take 10 measurement(s) of each metric, one every 30s over 5m")
            && logs.contains("metric p99 on t1 (http, condition `result < 0.5`")
            && logs.contains("http://local:8080/7/stats: /latency/p99")
            && logs.contains("baseline: max(app_error_ratio{instance=~\"t2|t3\"})"),
        "the dry run's output lists the bake it did not run: {logs}"
    );
    let (code, text) = site.cli_text(&token, &["plan", "-f", path.to_str().unwrap()]);
    assert!(
        code == 0
            && text.contains("analysis after wave 1 (wave-1: t1; baseline t2, t3): 10 measurement(s), one every 30s over 5m")
            && text.contains(&format!("{address}: max(app_error_ratio{{instance=~\"t1\"}})"))
            && text.contains("baseline: max(app_error_ratio{instance=~\"t2|t3\"})"),
        "manent plan prints the analysis: {text}"
    );
}
