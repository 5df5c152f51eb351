//! Owns the tests of environment overrides of manent.yml (`MANENT_*` variables): every kind
//! of value, lists by name or index, whole sections as JSON, and the refusals that name the
//! variable.

use super::*;

#[test]
fn overrides_every_kind_of_value() {
    check_env(
        "plugins:\n  ansible:\n    queue: ansible\n",
        &[
            ("MANENT__DATABASE__URL", "postgres://manent@db/manent"),
            ("MANENT__API__PUBLIC_URL", "https://manent.example.com"),
            ("MANENT__DBOS__REGION", "eu-west-1"),
            ("MANENT__RECOVERY__AUTOMATIC", "true"),
            ("MANENT__DBOS__CONCURRENCY", "4"),
            ("MANENT__DBOS__PLUGINS", "ansible"),
            ("MANENT__RECOVERY__STALE_AFTER", "2m"),
            ("MANENT__LOG__FORMAT", "json"),
            ("MANENT__ENVIRONMENTS__SOURCE", "/srv/environments"),
            ("MANENT_SERVER", "http://not-a-config-key"),
            ("PATH", "/usr/bin"),
        ],
        expect![[r#"
            OK
            api.public_url = "https://manent.example.com"
            database.url = "postgres://manent@db/manent"
            dbos.concurrency = 4
            dbos.plugins = ["ansible"]
            dbos.region = "eu-west-1"
            environments.source = "/srv/environments"
            log.format = "json"
            plugins.ansible.queue = "ansible"
            recovery.automatic = true
            recovery.stale_after = "2m"
        "#]],
    );
}

#[test]
fn override_names_are_case_insensitive() {
    check_env(
        "",
        &[
            ("manent__Dbos__Region", "eu-west-1"),
            ("MANENT__recovery__AUTOMATIC", "TRUE"),
        ],
        expect![[r#"
            OK
            dbos.region = "eu-west-1"
            recovery.automatic = true
        "#]],
    );
}

#[test]
fn override_lists() {
    let queues = "queues:\n  - name: gpu\n    match: {environments: [prod]}\n  - name: cpu\n    match: {environments: [dev]}\n";
    check_env(
        queues,
        &[("MANENT__DBOS__QUEUES", " gpu, cpu ,")],
        expect![[r#"
            OK
            dbos.queues = ["gpu","cpu"]
            queues[0].match.environments = ["prod"]
            queues[0].name = "gpu"
            queues[1].match.environments = ["dev"]
            queues[1].name = "cpu"
        "#]],
    );
    check_env(
        queues,
        &[
            ("MANENT__DBOS__QUEUES", r#"["cpu"]"#),
            ("MANENT__DBOS__EXCLUSIVE", "1"),
        ],
        expect![[r#"
            OK
            dbos.exclusive = true
            dbos.queues = ["cpu"]
            queues[0].match.environments = ["prod"]
            queues[0].name = "gpu"
            queues[1].match.environments = ["dev"]
            queues[1].name = "cpu"
        "#]],
    );
    check_env(
        "dbos:\n  plugins: []\n",
        &[("MANENT__DBOS__PLUGINS", "")],
        expect![[r#"
            OK
        "#]],
    );
}

#[test]
fn override_list_entries_by_name_or_index() {
    let queues = "queues:\n  - name: gpu\n    match: {environments: [prod]}\n";
    check_env(
        queues,
        &[("MANENT__QUEUES__GPU__CONCURRENCY", "3")],
        expect![[r#"
            OK
            queues[0].concurrency = 3
            queues[0].match.environments = ["prod"]
            queues[0].name = "gpu"
        "#]],
    );
    check_env(
        queues,
        &[("MANENT__QUEUES__0__MATCH__APPLICATIONS", "ml/*,data/*")],
        expect![[r#"
            OK
            queues[0].match.applications = ["ml/*","data/*"]
            queues[0].match.environments = ["prod"]
            queues[0].name = "gpu"
        "#]],
    );
    // An index equal to the length adds an entry.
    check_env(
        "tenants:\n  - name: ml\n",
        &[
            ("MANENT__TENANTS__1__NAME", "web"),
            ("MANENT__TENANTS__1__QUEUE", "web-q"),
        ],
        expect![[r#"
            OK
            tenants[0].name = "ml"
            tenants[1].name = "web"
            tenants[1].queue = "web-q"
        "#]],
    );
}

#[test]
fn override_whole_sections_as_json() {
    check_env(
        "tenants:\n  - name: old\n",
        &[("MANENT__TENANTS", r#"[{"name": "ml", "queue": "ml-q"}]"#)],
        expect![[r#"
            OK
            tenants[0].name = "ml"
            tenants[0].queue = "ml-q"
        "#]],
    );
    // The more specific variable wins over the whole section.
    check_env(
        "",
        &[
            ("MANENT__DBOS__REGION", "eu-west-2"),
            (
                "MANENT__DBOS",
                r#"{"region": "eu-west-1", "concurrency": 3}"#,
            ),
        ],
        expect![[r#"
            OK
            dbos.concurrency = 3
            dbos.region = "eu-west-2"
        "#]],
    );
}

#[test]
fn override_plugins_by_name() {
    check_env(
        "plugins:\n  Ansible:\n    artifact_types: [ansible]\n",
        &[
            ("MANENT__PLUGINS__ANSIBLE__QUEUE", "ansible"),
            (
                "MANENT__PLUGINS__ANSIBLE__EXTERNAL",
                r#"{"command": "/bin/p", "sha256": "ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef0123456789"}"#,
            ),
            ("MANENT__PLUGINS__SHELL__ARTIFACT_TYPES", "script"),
            ("MANENT__PLUGINS__CUSTOM__ARTIFACT_TYPES", "a,b"),
        ],
        expect![[r#"
            OK
            plugins.Ansible.artifact_types = ["ansible"]
            plugins.Ansible.external.command = "/bin/p"
            plugins.Ansible.external.confinement = "bwrap"
            plugins.Ansible.external.sha256 = "ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef0123456789"
            plugins.Ansible.queue = "ansible"
            plugins.custom.artifact_types = ["a","b"]
            plugins.shell.artifact_types = ["script"]
        "#]],
    );
}

#[test]
fn override_optional_values_keep_their_type() {
    // An unset optional integer takes a number, an unset optional string keeps digits as text.
    check_env(
        "queues:\n  - name: gpu\n    match: {environments: [prod]}\n",
        &[
            ("MANENT__QUEUES__GPU__CONCURRENCY", "2"),
            ("MANENT__DBOS__REGION", "12"),
        ],
        expect![[r#"
            OK
            dbos.region = "12"
            queues[0].concurrency = 2
            queues[0].match.environments = ["prod"]
            queues[0].name = "gpu"
        "#]],
    );
    // An empty variable unsets an optional value; a required one stays empty and is refused.
    check_env(
        "dbos:\n  region: eu-west-1\n",
        &[("MANENT__DBOS__REGION", "")],
        expect![[r#"
            OK
        "#]],
    );
    check_env(
        "",
        &[("MANENT__RECOVERY__AUTOMATIC", " ")],
        expect![[r#"
            ERROR
            MANENT__RECOVERY__AUTOMATIC: recovery.automatic: expected true or false, found an empty value; write true or false, without quotes
        "#]],
    );
    check_env(
        "",
        &[("MANENT__DATABASE__URL", "")],
        expect![[r#"
            ERROR
            MANENT__DATABASE__URL: database.url: the database URL is empty; use sqlite://FILE (one machine) or postgres://USER@HOST/DB (several nodes)
        "#]],
    );
    check_env(
        "",
        &[("MANENT__API__PUBLIC_URL", "")],
        expect![[r#"
            OK
        "#]],
    );
}

#[test]
fn executor_id_precedence() {
    let file = "dbos:\n  executor_id: from-file\n";
    check(
        file,
        expect![[r#"
        OK
        dbos.executor_id = "from-file"
        executor_id from File
    "#]],
    );
    check_env(
        file,
        &[("MANENT__DBOS__EXECUTOR_ID", "from-manent")],
        expect![[r#"
            OK
            dbos.executor_id = "from-manent"
            executor_id from Environment("MANENT__DBOS__EXECUTOR_ID")
        "#]],
    );
    // DBOS__VMID wins over everything, whatever the order of the variables.
    for vars in [
        [
            ("DBOS__VMID", "build01-w1"),
            ("MANENT__DBOS__EXECUTOR_ID", "from-manent"),
        ],
        [
            ("MANENT__DBOS__EXECUTOR_ID", "from-manent"),
            ("DBOS__VMID", "build01-w1"),
        ],
    ] {
        let config = Config::from_yaml_str(file, "manent.yml", env(&vars)).unwrap();
        assert_eq!(
            config.effective_executor_id(),
            "build01-w1",
            "the executor id from DBOS__VMID"
        );
        assert_eq!(
            *config.executor_id_source(),
            ExecutorIdSource::Vmid,
            "its source is DBOS__VMID"
        );
        assert_eq!(
            config.dbos.executor_id.as_deref(),
            Some("build01-w1"),
            "dbos.executor_id holds it"
        );
    }
    let config = Config::from_env(env(&[("DBOS__VMID", "w2")])).unwrap();
    assert_eq!(
        config.effective_executor_id(),
        "w2",
        "the configured executor id"
    );
    // Default: the host name.
    let config = Config::from_yaml_str("", "manent.yml", env(&[])).unwrap();
    let host = hostname::get().unwrap().to_string_lossy().into_owned();
    assert_eq!(
        config.effective_executor_id(),
        host,
        "the host name when nothing sets it"
    );
}

#[test]
fn bad_overrides_name_the_variable() {
    check_env(
        "",
        &[("MANENT__DBOS__CONCURRENCY", "ten")],
        expect![[r#"
        ERROR
        MANENT__DBOS__CONCURRENCY: dbos.concurrency: expected an integer, found "ten"; write a whole number, without quotes
    "#]],
    );
    check_env(
        "",
        &[("MANENT__DBOS__CONCURRENCY", "-2")],
        expect![[r#"
        ERROR
        MANENT__DBOS__CONCURRENCY: dbos.concurrency: expected a whole number, 0 or more, found -2; write a whole number, 0 or more
    "#]],
    );
    check_env(
        "",
        &[("MANENT__RECOVERY__AUTOMATIC", "maybe")],
        expect![[r#"
        ERROR
        MANENT__RECOVERY__AUTOMATIC: recovery.automatic: expected true or false, found "maybe"; write true or false, without quotes
    "#]],
    );
    check_env(
        "",
        &[("MANENT__RECOVERY__STALE_AFTER", "soon")],
        expect![[r#"
        ERROR
        MANENT__RECOVERY__STALE_AFTER: recovery.stale_after: invalid duration "soon" (expected number at 0); write it like 30s, 5m, 1h or 250ms
    "#]],
    );
    check_env(
        "",
        &[("MANENT__DBOS__COLOUR", "blue")],
        expect![[r#"
        ERROR
        MANENT__DBOS__COLOUR: dbos.colour: unknown key `colour`; remove it or fix its spelling (keys allowed here: executor_id, region, region_routing, plugins, queues, exclusive, concurrency, environment_concurrency, global_concurrency, drain_timeout)
    "#]],
    );
    check_env(
        "",
        &[("MANENT__COLOUR", "blue")],
        expect![[r#"
            ERROR
            MANENT__COLOUR: colour: unknown key `colour`; remove it or fix its spelling (keys allowed here: database, api, dbos, recovery, plugins, queues, tenants, environments, artifacts, log, worker, schedules, retention, notifications)
        "#]],
    );
    check_env(
        "",
        &[("MANENT__LOG__FORMAT", "xml")],
        expect![[r#"
        ERROR
        MANENT__LOG__FORMAT: log.format: unknown value `xml`; use one of: text, json
    "#]],
    );
    check_env(
        "",
        &[
            ("MANENT__DBOS__REGION__NAME", "x"),
            ("MANENT__DBOS__REGION", "eu"),
        ],
        expect![[r#"
        ERROR
        MANENT__DBOS__REGION__NAME: dbos.region: this key holds a single value, it has no key `name`
    "#]],
    );
    check_env(
        "queues:\n  - name: gpu\n    match: {environments: [prod]}\n",
        &[("MANENT__QUEUES__CPU__CONCURRENCY", "1")],
        expect![[r#"
            ERROR
            MANENT__QUEUES__CPU__CONCURRENCY: queues: no entry named `cpu`; name an existing entry, use its index, or set the whole list as JSON in MANENT__QUEUES
        "#]],
    );
    check_env(
        "",
        &[("MANENT__TENANTS__3__NAME", "x")],
        expect![[r#"
        ERROR
        MANENT__TENANTS__3__NAME: tenants: there is no entry 3: the list has 0 (an index equal to the length adds one)
    "#]],
    );
    check_env(
        "",
        &[("MANENT__DBOS__", "x")],
        expect![[r#"
        ERROR
        MANENT__DBOS__: dbos.: empty key name; separate levels with a double underscore, e.g. MANENT__DBOS__REGION
    "#]],
    );
    check_env(
        "",
        &[("MANENT__TENANTS", "[{\"nom\": \"ml\"}]")],
        expect![[r#"
        ERROR
        MANENT__TENANTS: tenants[0].nom: unknown key `nom`; remove it or fix its spelling (keys allowed here: name, queue)
    "#]],
    );
}

#[test]
fn refusals_name_the_variable_that_set_the_key() {
    check_env(
        "dbos:\n  plugins: [ansible]\nplugins:\n  ansible: {queue: ansible}\n",
        &[("MANENT__DBOS__REGION_ROUTING", "true")],
        expect![[r#"
            ERROR
            manent.yml:2: dbos.plugins: dbos.plugins is not supported together with dbos.region_routing yet (dbos.region_routing, set by MANENT__DBOS__REGION_ROUTING); remove one of them
        "#]],
    );
    check_env(
        "",
        &[("DBOS__VMID", "")],
        expect![[r#"
        ERROR
        DBOS__VMID: dbos.executor_id: the executor id is empty; set it to a unique, stable name such as manent-0
    "#]],
    );
    check_env(
        "",
        &[("MANENT__RECOVERY__HEARTBEAT_INTERVAL", "1m")],
        expect![[r#"
            ERROR
            MANENT__RECOVERY__HEARTBEAT_INTERVAL: recovery.heartbeat_interval: heartbeat_interval (1m) must be shorter than stale_after (30s, recovery.stale_after), or live workers would look stale; e.g. heartbeat_interval: 5s with stale_after: 30s
        "#]],
    );
}
