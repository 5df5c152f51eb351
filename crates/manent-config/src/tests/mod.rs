//! Owns the data-driven tests of loading and validating manent.yml (overrides by environment
//! variable live in `overrides.rs`): each case is a YAML text and an environment, and the
//! expected outcome is the keys that differ from the defaults, or the error message (update
//! with `UPDATE_EXPECT=1 cargo test`).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use expect_test::{Expect, expect};
use serde_json::Value;

use crate::{Config, ConfigError, ExecutorIdSource, LogFormat};

const EXAMPLE: &str = include_str!("../../../../manent.example.yml");

mod overrides;

fn env(vars: &[(&str, &str)]) -> Vec<(String, String)> {
    vars.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Flattens a JSON tree into `key.path = value` entries.
fn flatten(prefix: &str, value: &Value, out: &mut BTreeMap<String, String>) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        Value::Array(items) if items.iter().any(|v| v.is_object()) => {
            for (i, v) in items.iter().enumerate() {
                flatten(&format!("{prefix}[{i}]"), v, out);
            }
        }
        other => {
            out.insert(prefix.to_owned(), other.to_string());
        }
    }
}

/// The keys of `config` that differ from the defaults, and the executor id's source when
/// it is not the host name.
fn render(config: &Config) -> String {
    let mut actual = BTreeMap::new();
    flatten("", &serde_json::to_value(config).unwrap(), &mut actual);
    let mut defaults = BTreeMap::new();
    flatten(
        "",
        &serde_json::to_value(Config::default()).unwrap(),
        &mut defaults,
    );
    let mut out = String::from("OK\n");
    for (key, value) in &actual {
        // New entries (plugins, queues…) list their set keys only.
        let unset = value == "null" || value == "[]";
        if defaults.get(key).map_or(!unset, |default| default != value) {
            out.push_str(&format!("{key} = {value}\n"));
        }
    }
    match config.executor_id_source() {
        ExecutorIdSource::Hostname => {}
        source => out.push_str(&format!("executor_id from {source:?}\n")),
    }
    let refusals = config.worker_refusals();
    if !refusals.is_empty() {
        out.push_str("WORKERS REFUSE TO START\n");
        for issue in refusals {
            out.push_str(&format!("{issue}\n"));
        }
    }
    out
}

fn outcome(result: Result<Config, ConfigError>) -> String {
    match result {
        Ok(config) => render(&config),
        Err(err) => format!("ERROR\n{err}\n"),
    }
}

/// Loads `yaml` as `manent.yml` with the environment `vars` and compares the outcome.
fn check_env(yaml: &str, vars: &[(&str, &str)], expected: Expect) {
    expected.assert_eq(&outcome(Config::from_yaml_str(
        yaml,
        "manent.yml",
        env(vars),
    )));
}

fn check(yaml: &str, expected: Expect) {
    check_env(yaml, &[], expected);
}

// ---------------------------------------------------------------------------------------
// Defaults

#[test]
fn defaults() {
    let config = Config::default();
    assert_eq!(
        config.database.url, "sqlite://manent.db",
        "default database.url"
    );
    assert_eq!(config.api.listen, "127.0.0.1:8080", "default api.listen");
    assert_eq!(config.api.public_url, None, "no api.public_url by default");
    assert_eq!(config.dbos.region, None, "no dbos.region by default");
    assert!(!config.dbos.region_routing, "no region routing by default");
    assert!(
        config.dbos.plugins.is_empty() && config.dbos.queues.is_empty(),
        "no plugin or routed queue served by default"
    );
    assert!(!config.dbos.exclusive, "not exclusive by default");
    assert_eq!(config.dbos.concurrency, 10, "default dbos.concurrency");
    assert_eq!(
        config.dbos.environment_concurrency, 1,
        "default dbos.environment_concurrency"
    );
    assert_eq!(
        config.dbos.global_concurrency, 0,
        "no global limit by default"
    );
    assert_eq!(
        config.dbos.drain_timeout,
        Duration::from_secs(60),
        "default dbos.drain_timeout"
    );
    assert_eq!(
        config.recovery.stale_after,
        Duration::from_secs(30),
        "default recovery.stale_after"
    );
    assert_eq!(
        config.recovery.heartbeat_interval,
        Duration::from_secs(5),
        "default recovery.heartbeat_interval"
    );
    assert!(
        !config.recovery.automatic,
        "no automatic recovery by default"
    );
    assert!(
        config.plugins.is_empty() && config.queues.is_empty() && config.tenants.is_empty(),
        "no plugins, queues or tenants by default"
    );
    assert_eq!(
        config.environments.source,
        Path::new("environments"),
        "default environments.source"
    );
    assert_eq!(config.log.format, LogFormat::Text, "default log.format");
    assert_eq!(config.log.level, "info", "default log.level");
    let host = hostname::get().unwrap().to_string_lossy().into_owned();
    assert_eq!(
        config.effective_executor_id(),
        host,
        "the host name is the executor id by default"
    );
    assert_eq!(
        *config.executor_id_source(),
        ExecutorIdSource::Hostname,
        "and says where it came from"
    );
    assert_eq!(config.validate(), vec![], "the defaults are valid");
    assert!(
        !config.has_dedicated_queues(),
        "no dedicated queues by default"
    );
}

#[test]
fn empty_files_and_sections_take_the_defaults() {
    check(
        "",
        expect![[r#"
            OK
        "#]],
    );
    check(
        "# nothing but a comment\n",
        expect![[r#"
            OK
        "#]],
    );
    check(
        "database:\napi:\ndbos:\n  plugins:\nrecovery:\nplugins:\nqueues:\ntenants:\nenvironments:\nlog:\n",
        expect![[r#"
            OK
        "#]],
    );
    let from_env = Config::from_env(env(&[])).unwrap();
    assert_eq!(
        render(&from_env),
        "OK\n",
        "the variable's value is rendered"
    );
}

#[test]
fn values_from_the_file() {
    check(
        r#"
database:
  url: postgres://manent@db/manent
api:
  listen: 0.0.0.0:9000
  public_url: https://manent.example.com
dbos:
  executor_id: manent-1
  region: eu-west-1
  concurrency: 4
  environment_concurrency: 2
  global_concurrency: 50
  drain_timeout: 2m 30s
recovery:
  stale_after: 1m
  heartbeat_interval: 250ms
  automatic: true
environments:
  source: /etc/manent/environments
log:
  format: json
  level: info,manent_engine=debug
"#,
        expect![[r#"
            OK
            api.listen = "0.0.0.0:9000"
            api.public_url = "https://manent.example.com"
            database.url = "postgres://manent@db/manent"
            dbos.concurrency = 4
            dbos.drain_timeout = "2m 30s"
            dbos.environment_concurrency = 2
            dbos.executor_id = "manent-1"
            dbos.global_concurrency = 50
            dbos.region = "eu-west-1"
            environments.source = "/etc/manent/environments"
            log.format = "json"
            log.level = "info,manent_engine=debug"
            recovery.automatic = true
            recovery.heartbeat_interval = "250ms"
            recovery.stale_after = "1m"
            executor_id from File
        "#]],
    );
}

// ---------------------------------------------------------------------------------------
// The example file

#[test]
fn example_file_is_valid() {
    let config = Config::from_yaml_str(EXAMPLE, "manent.example.yml", env(&[])).unwrap();
    assert_eq!(config.validate(), vec![], "the example is valid");
    assert_eq!(
        config.plugin_queue_for_artifact_type("ansible"),
        Some("ansible"),
        "ansible artifacts go to the ansible queue"
    );
    assert_eq!(
        config.routed_queue("gpu").and_then(|q| q.concurrency),
        Some(2),
        "the gpu queue's own concurrency"
    );
    // The keys commented out in the example (those of one worker or of a pool) are valid too.
    let pool = env(&[
        ("DBOS__VMID", "ansible-0"),
        ("MANENT__DBOS__REGION", "eu-west-1"),
        ("MANENT__DBOS__PLUGINS", "ansible"),
        ("MANENT__DBOS__QUEUES", "gpu"),
        ("MANENT__DBOS__EXCLUSIVE", "true"),
        ("MANENT__API__PUBLIC_URL", "https://manent.example.com"),
    ]);
    let config = Config::from_yaml_str(EXAMPLE, "manent.example.yml", pool).unwrap();
    assert_eq!(
        config.effective_executor_id(),
        "ansible-0",
        "the executor id from DBOS__VMID"
    );
    assert_eq!(
        config.dbos.plugins,
        ["ansible"],
        "the plugins this worker serves"
    );
}

#[test]
fn the_quickstart_configuration_serves_its_releases_directory_and_not_its_database() {
    let examples = std::fs::canonicalize(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples"))
        .expect("the examples directory");
    let config = Config::load(&examples.join("manent.yml"), env(&[])).expect("a valid example");
    let sources = config.artifact_sources();
    let url = |path: &str| format!("file://{}/{path}", examples.display());
    assert!(
        sources
            .check("demo/hello", &url("releases/hello.txt"))
            .is_ok(),
        "the quickstart's artifact is admitted"
    );
    for beside in ["manent.db", "manent.yml", "environments/demo/hello/dev.yml"] {
        assert!(
            sources.check("demo/hello", &url(beside)).is_err(),
            "{beside} beside the configuration is not an artifact source"
        );
    }
}

#[test]
fn example_file_documents_every_key() {
    let config = Config::from_yaml_str(EXAMPLE, "manent.example.yml", env(&[])).unwrap();
    let mut keys = BTreeMap::new();
    flatten("", &serde_json::to_value(&config).unwrap(), &mut keys);
    for key in keys
        .keys()
        .chain(["api.public_url".to_owned(), "dbos.region".to_owned()].iter())
    {
        let last = key.rsplit('.').next().unwrap();
        let last = last.split('[').next().unwrap();
        assert!(
            EXAMPLE.contains(&format!("{last}:")),
            "manent.example.yml does not document `{key}`"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Startup refusals

#[test]
fn plugins_with_region_routing() {
    check(
        r#"
plugins:
  ansible:
    artifact_types: [ansible]
    queue: ansible
dbos:
  region: eu-west-1
  region_routing: true
  plugins: [ansible]
"#,
        expect![[r#"
            ERROR
            manent.yml:9: dbos.plugins: dbos.plugins is not supported together with dbos.region_routing yet (dbos.region_routing, line 8); remove one of them
        "#]],
    );
}

#[test]
fn routed_queues_with_region_routing() {
    check(
        r#"
dbos:
  region_routing: true
queues:
  - name: gpu
    match:
      applications: ["ml/*"]
"#,
        expect![[r#"
            ERROR
            manent.yml:4: queues: queues is not supported together with dbos.region_routing yet (dbos.region_routing, line 3); remove the routed queues or region routing
        "#]],
    );
}

#[test]
fn routed_queue_named_like_the_tenant_registry() {
    check(
        r#"
tenants:
  - name: ml
    queue: gpu
  - name: web
queues:
  - name: gpu
    match: {applications: ["ml/*"]}
  - name: web
    match: {environments: [prod]}
"#,
        expect![[r#"
            OK
            queues[0].match.applications = ["ml/*"]
            queues[0].name = "gpu"
            queues[1].match.environments = ["prod"]
            queues[1].name = "web"
            tenants[0].name = "ml"
            tenants[0].queue = "gpu"
            tenants[1].name = "web"
            WORKERS REFUSE TO START
            manent.yml:7: queues[0].name: queue name `gpu` is also in the tenant registry (the queue of tenant `ml`: tenants[0], line 3); workers refuse to start: rename the routed queue or the tenant queue
            manent.yml:9: queues[1].name: queue name `web` is also in the tenant registry (tenant `web`: tenants[1], line 5); workers refuse to start: rename the routed queue or the tenant queue
        "#]],
    );
}

#[test]
fn a_routed_or_tenant_queue_named_default_or_manent_dot_is_refused() {
    check(
        r#"
tenants:
  - name: ml
    queue: default
queues:
  - name: default
    match: {applications: ["ml/*"]}
  - name: manent.gate
    match: {environments: [prod]}
"#,
        expect![[r#"
            ERROR
            manent.yml:8: queues[1].name: invalid queue name `manent.gate`; use letters, digits, '-' and '_' only
        "#]],
    );
}

#[test]
fn a_tenant_or_routed_queue_named_default_stops_only_the_workers() {
    check(
        r#"
tenants:
  - name: ml
    queue: default
queues:
  - name: default
    match: {applications: ["ml/*"]}
"#,
        expect![[r#"
            OK
            queues[0].match.applications = ["ml/*"]
            queues[0].name = "default"
            tenants[0].name = "ml"
            tenants[0].queue = "default"
            WORKERS REFUSE TO START
            manent.yml:4: tenants[0].queue: `default` is the name of the default queue, which every worker serves; workers refuse to start: give this queue another name
            manent.yml:6: queues[0].name: `default` is the name of the default queue, which every worker serves; workers refuse to start: give this queue another name
            manent.yml:6: queues[0].name: queue name `default` is also in the tenant registry (the queue of tenant `ml`: tenants[0], line 3); workers refuse to start: rename the routed queue or the tenant queue
        "#]],
    );
}

#[test]
fn artifact_type_claimed_by_two_plugins_with_queues() {
    check(
        r#"
plugins:
  ansible:
    artifact_types: [ansible, playbook]
    queue: ansible
  salt:
    artifact_types: [salt, playbook]
    queue: salt
  remote-copy:
    artifact_types: [playbook]
"#,
        expect![[r#"
            ERROR
            manent.yml:7: plugins.salt.artifact_types[1]: artifact type `playbook` is claimed by plugins `ansible` and `salt`, which both have a queue; each artifact type may belong to at most one plugin with a queue, so remove it from one of them
        "#]],
    );
}

#[test]
fn match_needs_a_pattern() {
    check(
        r#"
queues:
  - name: gpu
  - name: cpu
    match: {}
  - name: io
    match:
      applications: []
      artifacts: []
"#,
        expect![[r#"
            ERROR
            manent.yml:3: queues[0].match: match needs at least one pattern: set applications, artifacts or environments (a queue matching everything would take every deploy)
            manent.yml:5: queues[1].match: match needs at least one pattern: set applications, artifacts or environments (a queue matching everything would take every deploy)
            manent.yml:7: queues[2].match: match needs at least one pattern: set applications, artifacts or environments (a queue matching everything would take every deploy)
        "#]],
    );
}

#[test]
fn worker_lists_unknown_plugins_and_queues() {
    check(
        r#"
plugins:
  remote-copy:
    artifact_types: [tarball]
queues:
  - name: gpu
    match: {environments: [prod]}
dbos:
  plugins:
    - ansible
    - remote-copy
  queues: [gpu, cpu]
"#,
        expect![[r#"
            ERROR
            manent.yml:10: dbos.plugins[0]: plugin `ansible` is not declared under plugins; declare plugins.ansible (with its queue) or remove it from dbos.plugins
            manent.yml:11: dbos.plugins[1]: plugin `remote-copy` has no queue, so every worker runs it; set plugins.remote-copy.queue or remove it from dbos.plugins
            manent.yml:12: dbos.queues[1]: `cpu` is not a routed queue (declared: gpu); declare it under queues or remove it from dbos.queues
        "#]],
    );
}

#[test]
fn duplicate_names() {
    check(
        r#"
queues:
  - name: gpu
    match: {environments: [prod]}
  - name: gpu
    match: {environments: [dev]}
tenants:
  - name: ml
  - name: ml
"#,
        expect![[r#"
            ERROR
            manent.yml:5: queues[1].name: routed queue `gpu` is declared twice (also queues[0], line 3); give each queue a unique name
            manent.yml:9: tenants[1].name: tenant `ml` is declared twice (also tenants[0], line 8); keep one entry
        "#]],
    );
}

#[test]
fn executor_id_and_limits() {
    check(
        r#"
dbos:
  executor_id: ""
  concurrency: 0
  environment_concurrency: 0
recovery:
  stale_after: 10s
  heartbeat_interval: 10s
queues:
  - name: gpu
    match: {environments: [prod]}
    concurrency: 0
"#,
        expect![[r#"
            ERROR
            manent.yml:3: dbos.executor_id: the executor id is empty; set it to a unique, stable name such as manent-0
            manent.yml:4: dbos.concurrency: must be at least 1: it is the number of deploys this worker runs at once
            manent.yml:5: dbos.environment_concurrency: must be at least 1: it is the number of deploys of one application/environment running at once (1 serializes them)
            manent.yml:8: recovery.heartbeat_interval: heartbeat_interval (10s) must be shorter than stale_after (10s, recovery.stale_after, line 7), or live workers would look stale; e.g. heartbeat_interval: 5s with stale_after: 30s
            manent.yml:12: queues[0].concurrency: must be at least 1; remove it for no limit of its own (the dbos limits still apply)
        "#]],
    );
    check(
        "recovery:\n  heartbeat_interval: 0s\n",
        expect![[r#"
        ERROR
        manent.yml:2: recovery.heartbeat_interval: must be longer than 0; write e.g. 5s
    "#]],
    );
    check(
        "dbos:\n  executor_id: ' w1'\n",
        expect![[r#"
        ERROR
        manent.yml:2: dbos.executor_id: the executor id ` w1` has leading or trailing spaces; remove them
    "#]],
    );
}

#[test]
fn external_plugin_environment_names_a_variable_or_sets_one_but_never_home() {
    check(
        r#"
plugins:
  ansible:
    external:
      command: /usr/local/bin/manent-plugin-ansible
      sha256: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
      env: [MANENT_ANSIBLE_PLAYBOOK, "ANSIBLE_FORKS=10", HOME, "TMPDIR=/tmp", "1X", "A-B=c"]
      confinement: none
"#,
        expect![[r#"
            ERROR
            manent.yml:7: plugins.ansible.external.env[2]: `HOME` is the plugin's own, private to each pass; remove it
            manent.yml:7: plugins.ansible.external.env[3]: `TMPDIR` is the plugin's own, private to each pass; remove it
            manent.yml:7: plugins.ansible.external.env[4]: `1X` is neither NAME nor NAME=value (a name is letters, digits and _, not starting with a digit)
            manent.yml:7: plugins.ansible.external.env[5]: `A-B=c` is neither NAME nor NAME=value (a name is letters, digits and _, not starting with a digit)
        "#]],
    );
    let config = crate::Config::from_yaml_str(
        "plugins:\n  a:\n    external: {command: x, sha256: \"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\", env: [KEPT, MISSING, \"SET=a=b\"]}\n",
        "manent.yml",
        std::iter::empty(),
    )
    .unwrap();
    let external = config.plugins["a"].external.as_ref().unwrap();
    assert_eq!(
        external.confinement,
        crate::Confinement::Bwrap,
        "confinement is on unless turned off"
    );
    assert_eq!(
        external.environment(|name| (name == "KEPT").then(|| "worker's".to_string())),
        (
            vec![
                ("KEPT".to_string(), "worker's".to_string()),
                ("SET".to_string(), "a=b".to_string())
            ],
            vec!["MISSING".to_string()]
        ),
        "a name passes the worker's value, NAME=value sets one, a missing one is reported"
    );
}

#[test]
fn external_plugin_sha256() {
    check(
        r#"
plugins:
  ansible:
    external:
      command: /usr/local/bin/manent-plugin-ansible
      sha256: abc123
  ok:
    external: {command: bin/ok, sha256: "0123456789abcdef0123456789ABCDEF0123456789abcdef0123456789abcdef"}
  bad:
    external: {command: "", sha256: "zz23456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}
"#,
        expect![[r#"
            ERROR
            manent.yml:6: plugins.ansible.external.sha256: `abc123` is not a SHA-256: expected 64 hexadecimal characters; compute it with `sha256sum /usr/local/bin/manent-plugin-ansible`
            manent.yml:10: plugins.bad.external.command: the command is empty; give the path of the plugin's executable
            manent.yml:10: plugins.bad.external.sha256: `zz23456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef` is not a SHA-256: expected 64 hexadecimal characters; compute it with `sha256sum EXECUTABLE`
        "#]],
    );
}

#[test]
fn a_pool_without_connections_or_closing_them_at_once_is_refused() {
    check(
        r#"
database:
  url: postgres://manent@db/manent
  max_connections: 0
  idle_timeout: 0s
"#,
        expect![[r#"
            ERROR
            manent.yml:4: database.max_connections: 0 would leave the pool without a connection; write e.g. 10, or remove it for the default of the process's role
            manent.yml:5: database.idle_timeout: 0s would close every connection as soon as it is returned; write e.g. 30s
        "#]],
    );
}

#[test]
fn other_refusals() {
    check(
        r#"
database:
  url: mysql://db
api:
  listen: "8080"
  public_url: manent.example.com
  max_connections: 0
  max_connections_per_source: 0
  header_read_timeout: 0s
dbos:
  region: eu.west
  exclusive: true
plugins:
  ansible:
    queue: shared
  salt:
    queue: shared
  gpu-plugin:
    queue: gpu
  "bad name":
    queue: "x y"
queues:
  - name: gpu
    match:
      applications: [trainer, "*", "ml/*", ""]
environments:
  source: ""
log:
  level: verbose
"#,
        expect![[r#"
            ERROR
            manent.yml:3: database.url: unsupported database URL `mysql://db`; use sqlite://FILE (one machine) or postgres://USER@HOST/DB (several nodes)
            manent.yml:5: api.listen: `8080` is not HOST:PORT; write e.g. 127.0.0.1:8080 or 0.0.0.0:8080
            manent.yml:6: api.public_url: `manent.example.com` is not an http:// or https:// URL; write e.g. https://manent.example.com
            manent.yml:7: api.max_connections: 0 would refuse every connection; write the most clients at once, e.g. 4096
            manent.yml:8: api.max_connections_per_source: 0 would refuse every connection; write the most connections one client address may hold, e.g. 128 (as many as max_connections lifts the cap)
            manent.yml:9: api.header_read_timeout: 0s would close every connection at once; write e.g. 30s
            manent.yml:11: dbos.region: invalid region name `eu.west`; use letters, digits, '-' and '_' only
            manent.yml:12: dbos.exclusive: an exclusive worker serves only dbos.queues and dbos.plugins, and both are empty; list its queues or plugins, or remove dbos.exclusive
            manent.yml:20: plugins.bad name: invalid plugin name `bad name`; use letters, digits, '-' and '_' only
            manent.yml:21: plugins.bad name.queue: invalid queue name `x y`; use letters, digits, '-' and '_' only
            manent.yml:17: plugins.salt.queue: queue `shared` is also the queue of plugin `ansible` (plugins.ansible.queue, line 15); give each plugin its own queue
            manent.yml:25: queues[0].match.applications[0]: application pattern `trainer` is not qualified with the tenant; write e.g. `trainer/*` (all of tenant trainer's applications) or `ml/trainer`
            manent.yml:25: queues[0].match.applications[3]: empty pattern; remove it
            manent.yml:19: plugins.gpu-plugin.queue: queue name `gpu` is also a routed queue (queues[0], line 23); give the plugin a queue of its own
            manent.yml:27: environments.source: empty path; give the directory of the environment configurations
            manent.yml:29: log.level: `verbose` is not a log level; use one of trace, debug, info, warn, error, off or a filter such as info,manent_engine=debug
        "#]],
    );
}

#[test]
fn validate_lists_every_problem() {
    let mut config = Config::default();
    config.dbos.concurrency = 0;
    config.dbos.region_routing = true;
    config.dbos.plugins = vec!["ansible".into()];
    let issues = config.validate();
    let keys: Vec<&str> = issues.iter().map(|issue| issue.key.as_str()).collect();
    assert_eq!(
        keys,
        ["dbos.concurrency", "dbos.plugins", "dbos.plugins[0]"],
        "every problem is listed, in order"
    );
    assert!(
        issues
            .iter()
            .all(|issue| issue.line.is_none() && issue.file == "<defaults>"),
        "defaults have no file line: {issues:?}"
    );
}

// ---------------------------------------------------------------------------------------
// Parse errors

#[test]
fn unknown_keys_name_the_key_and_line() {
    check(
        "database:\n  url: sqlite://x.db\nlogs:\n  level: debug\n",
        expect![[r#"
            ERROR
            manent.yml:3: logs: unknown key `logs`; remove it or fix its spelling (keys allowed here: database, api, dbos, recovery, plugins, queues, tenants, environments, artifacts, log, worker, schedules, retention, notifications)
        "#]],
    );
    check(
        "dbos:\n  region: x\n  concurency: 3\n",
        expect![[r#"
        ERROR
        manent.yml:3: dbos.concurency: unknown key `concurency`; remove it or fix its spelling (keys allowed here: executor_id, region, region_routing, plugins, queues, exclusive, concurrency, environment_concurrency, global_concurrency, drain_timeout)
    "#]],
    );
    check(
        "queues:\n  - name: gpu\n    match:\n      applicatons: [\"ml/*\"]\n",
        expect![[r#"
        ERROR
        manent.yml:4: queues[0].match.applicatons: unknown key `applicatons`; remove it or fix its spelling (keys allowed here: applications, artifacts, environments)
    "#]],
    );
    check(
        "plugins:\n  ansible:\n    external: {command: x, sha256: y, args: []}\n",
        expect![[r#"
            ERROR
            manent.yml:3: plugins.ansible.external.args: unknown key `args`; remove it or fix its spelling (keys allowed here: command, sha256, confinement, bwrap, env, read_only)
        "#]],
    );
}

#[test]
fn bad_durations() {
    check(
        "recovery:\n  stale_after: soon\n",
        expect![[r#"
        ERROR
        manent.yml:2: recovery.stale_after: invalid duration "soon" (expected number at 0); write it like 30s, 5m, 1h or 250ms
    "#]],
    );
    check(
        "dbos:\n  drain_timeout: 60\n",
        expect![[r#"
        ERROR
        manent.yml:2: dbos.drain_timeout: invalid duration "60" (time unit needed, for example 60sec or 60ms); write it like 30s, 5m, 1h or 250ms
    "#]],
    );
    check(
        "recovery:\n  heartbeat_interval: 5 parsecs\n",
        expect![[r#"
        ERROR
        manent.yml:2: recovery.heartbeat_interval: invalid duration "5 parsecs" (unknown time unit "parsecs", supported units: ns, us/µs, ms, sec, min, hours, days, weeks, months, years (and few variations)); write it like 30s, 5m, 1h or 250ms
    "#]],
    );
}

#[test]
fn bad_types() {
    check(
        "\ndbos:\n  region: x\n  concurrency: ten\n",
        expect![[r#"
        ERROR
        manent.yml:4: dbos.concurrency: expected an integer, found "ten"; write a whole number, without quotes
    "#]],
    );
    check(
        "dbos:\n  concurrency: -1\n",
        expect![[r#"
            ERROR
            manent.yml:2: dbos.concurrency: expected a whole number, 0 or more, found -1; write a whole number, 0 or more
        "#]],
    );
    check(
        "recovery:\n  automatic: yes\n",
        expect![[r#"
        ERROR
        manent.yml:2: recovery.automatic: expected true or false, found "yes"; write true or false, without quotes
    "#]],
    );
    check(
        "dbos:\n  plugins: ansible\n",
        expect![[r#"
        ERROR
        manent.yml:2: dbos.plugins: expected a list, found "ansible"; write a list, e.g. [a, b]
    "#]],
    );
    check(
        "dbos: [a]\n",
        expect![[r#"
        ERROR
        manent.yml:1: dbos: expected a mapping, found a list; write indented `key: value` lines under this key
    "#]],
    );
    check(
        "log:\n  format: xml\n",
        expect![[r#"
        ERROR
        manent.yml:2: log.format: unknown value `xml`; use one of: text, json
    "#]],
    );
    check(
        "queues:\n  - match: {environments: [prod]}\n",
        expect![[r#"
        ERROR
        manent.yml:2: queues[0]: missing key `name`; add it
    "#]],
    );
    check(
        "- a\n- b\n",
        expect![[r#"
            ERROR
            manent.yml:1: (top level): expected a mapping, found a list; write indented `key: value` lines under this key
        "#]],
    );
}

#[test]
fn syntax_errors_and_duplicates() {
    check(
        "dbos:\n  region: \"unterminated\n",
        expect![[r#"
        ERROR
        manent.yml:3: YAML syntax error: found unexpected end of stream at line 3 column 1, while scanning a quoted scalar at line 2 column 11; fix the indentation, colons or quotes there
    "#]],
    );
    check(
        "dbos:\n  region: a\n  region: b\n",
        expect![[r#"
            ERROR
            manent.yml:3: dbos.region: key `region` is written twice; keep only one
        "#]],
    );
    check(
        "plugins:\n  a: {queue: x}\n  a: {queue: y}\n",
        expect![[r#"
            ERROR
            manent.yml:3: plugins.a: key `a` is written twice; keep only one
        "#]],
    );
}

// ---------------------------------------------------------------------------------------
// Loading files and helpers

#[test]
fn load_reads_the_file_and_resolves_paths() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("manent.yml");
    std::fs::write(
        &path,
        "environments:\n  source: envs\nlog:\n  format: json\n",
    )
    .unwrap();
    let config = Config::load(&path, env(&[])).unwrap();
    assert_eq!(
        config.log.format,
        LogFormat::Json,
        "log.format from the file"
    );
    assert_eq!(
        config.environments_source(),
        dir.path().join("envs"),
        "environments.source relative to the file"
    );
    assert_eq!(
        config.resolve_path(Path::new("/abs")),
        Path::new("/abs"),
        "an absolute path stays as it is"
    );
    assert_eq!(
        config.file_name(),
        path.display().to_string(),
        "the file's name as errors show it"
    );

    std::fs::write(&path, "dbos:\n  concurrency: 0\n").unwrap();
    let err = Config::load(&path, env(&[])).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "{}:2: dbos.concurrency: must be at least 1: it is the number of deploys this worker runs at once",
            path.display()
        ),
        "the error names the file, line and key, and says why"
    );

    let missing = dir.path().join("missing.yml");
    let err = Config::load(&missing, env(&[])).unwrap_err();
    assert!(
        matches!(err, ConfigError::Read { .. }),
        "a missing file is a read error: {err:?}"
    );
    assert!(
        err.to_string()
            .starts_with(&format!("cannot read {}: ", missing.display())),
        "{err}"
    );
}

#[test]
fn routing_helpers() {
    let config = Config::from_yaml_str(
        r#"
plugins:
  ansible: {artifact_types: [ansible], queue: ansible}
  remote-copy: {artifact_types: [tarball]}
queues:
  - name: gpu
    match:
      applications: ["ml/*"]
      artifacts: [trainer, scorer]
      environments: [prod]
  - name: eu
    match: {environments: ["prod-eu-*"]}
tenants:
  - name: ml
    queue: ml
"#,
        "manent.yml",
        env(&[]),
    )
    .unwrap();
    assert!(config.has_dedicated_queues(), "plugin queues are dedicated");
    assert_eq!(
        config.plugin_queue_for_artifact_type("ansible"),
        Some("ansible"),
        "ansible artifacts go to the ansible queue"
    );
    assert_eq!(
        config.plugin_for_artifact_type("ansible"),
        Some(("ansible", "ansible")),
        "the plugin and queue of ansible artifacts"
    );
    assert_eq!(
        config.plugin_queue_for_artifact_type("tarball"),
        None,
        "a built-in type has no plugin queue"
    );
    assert_eq!(
        config.plugin_queue_for_artifact_type("other"),
        None,
        "an unknown type has no plugin queue"
    );
    assert_eq!(
        config.plugin_queue("ansible"),
        Some("ansible"),
        "the ansible plugin's queue"
    );
    assert_eq!(
        config.plugin_queue("remote-copy"),
        None,
        "a built-in plugin has no queue"
    );
    assert_eq!(
        config.routed_queue("gpu").map(|q| q.name.as_str()),
        Some("gpu"),
        "the routed queue gpu"
    );
    assert!(config.routed_queue("cpu").is_none(), "no queue named cpu");
    assert_eq!(
        config.tenant("ml").and_then(|t| t.queue.as_deref()),
        Some("ml"),
        "the ml tenant's queue"
    );

    let route = |app: &str, artifacts: &[&str], env: &str| {
        config
            .routed_queue_for(app, artifacts.iter().copied(), env)
            .map(|q| q.name.clone())
    };
    assert_eq!(
        route("ml/trainer", &["trainer", "config"], "prod"),
        Some("gpu".into()),
        "a trainer artifact of ml in prod goes to gpu"
    );
    assert_eq!(
        route("ml/trainer", &["config"], "prod"),
        None,
        "without the artifact no route"
    );
    assert_eq!(
        route("ml/trainer", &["trainer"], "staging"),
        None,
        "not in staging"
    );
    assert_eq!(
        route("web/api", &["trainer"], "prod"),
        None,
        "not for another application"
    );
    assert_eq!(
        route("web/api", &["api"], "prod-eu-west"),
        Some("eu".into()),
        "the eu rule matches prod-eu-west"
    );
}

// ---------------------------------------------------------------------------------------
// Schedules

#[test]
fn the_example_file_gives_the_schedule_bounds_their_defaults() {
    let config = Config::from_yaml_str(EXAMPLE, "manent.example.yml", env(&[])).unwrap();
    assert_eq!(
        config.schedules,
        crate::SchedulesConfig::default(),
        "manent.example.yml shows the defaults docs/configuration.md gives (60s, 100)"
    );
    assert_eq!(
        (
            config.schedules.min_interval,
            config.schedules.max_per_tenant
        ),
        (std::time::Duration::from_secs(60), 100),
        "the defaults of docs/configuration.md"
    );
}

#[test]
fn a_zero_minimum_interval_between_ticks_is_refused() {
    check(
        "schedules: {min_interval: 0s}\n",
        expect![[r#"
            ERROR
            manent.yml:1: schedules.min_interval: 0s would let a schedule fire every second; give the shortest time between two ticks a schedule may ask for (at least 1s; default 60s)
        "#]],
    );
}

// ---------------------------------------------------------------------------------------
// Retention

#[test]
fn the_example_file_gives_retention_its_defaults() {
    let config = Config::from_yaml_str(EXAMPLE, "manent.example.yml", env(&[])).unwrap();
    assert_eq!(
        config.retention,
        crate::RetentionConfig::default(),
        "manent.example.yml shows the defaults docs/configuration.md gives"
    );
}

#[test]
fn retention_that_would_remove_the_live_deploy_or_never_run_is_refused() {
    check(
        "retention: {keep_last: 0, every: 0s, batch: 0}\n",
        expect![[r#"
            ERROR
            manent.yml:1: retention.keep_last: must be at least 1: the live deploy of each environment is always kept; write e.g. keep_last: 20
            manent.yml:1: retention.every: must be longer than 0; write e.g. every: 10m
            manent.yml:1: retention.batch: 0 is outside 1..=10000: a batch is one transaction, which must stay short; write e.g. batch: 500
        "#]],
    );
}

// ---------------------------------------------------------------------------------------
// Notifications

#[test]
fn webhooks_with_a_duplicate_name_a_bad_url_two_secrets_or_a_bad_pattern_are_refused() {
    check(
        "notifications:\n  webhooks:\n    - {name: ops, url: \"https://h.example/a\"}\n    - {name: ops, url: \"ftp://h.example/b\", secret_file: s, secret_env: S, applications: [\"\"]}\n  max_attempts: 0\n",
        expect![[r#"
            ERROR
            manent.yml:4: notifications.webhooks[1].name: `ops` names two webhooks; give each its own name
            manent.yml:4: notifications.webhooks[1].url: "ftp://h.example/b" is not an http(s) URL; write e.g. https://hooks.example.com/manent
            manent.yml:4: notifications.webhooks[1].secret_env: give secret_file or secret_env, not both
            manent.yml:4: notifications.webhooks[1].applications[0]: empty application pattern: write e.g. `ml/*`
            manent.yml:5: notifications.max_attempts: must be at least 1; write e.g. max_attempts: 10
        "#]],
    );
}

#[test]
fn a_webhook_wants_its_events_on_its_applications_and_all_of_them_when_unsaid() {
    let config = Config::from_yaml_str(
        "notifications:\n  webhooks:\n    - {name: all, url: \"https://h.example/a\"}\n    - {name: some, url: \"https://h.example/b\", events: [failed], applications: [\"shop/*\"]}\n",
        "manent.yml",
        env(&[]),
    )
    .unwrap();
    let [all, some] = &config.notifications.webhooks[..] else {
        panic!("two webhooks")
    };
    use crate::NotificationEvent::{Failed, Started};
    assert!(
        all.wants(Started, "ml/trainer"),
        "no filter: every event, every application"
    );
    assert!(
        some.wants(Failed, "shop/web"),
        "a listed event of a listed application"
    );
    assert!(!some.wants(Started, "shop/web"), "an event it did not list");
    assert!(
        !some.wants(Failed, "ml/trainer"),
        "an application its patterns do not match"
    );
}
