//! The environment file's parsing and validation, case by case (`check(text, expect![[...]])`).

use super::*;
use expect_test::{Expect, expect};

const TARGETS: &str = "targets:\n  - {name: web-1, host: 10.0.0.1, region: eu, az: eu-a}\n  - \
                       {name: web-2, host: 10.0.0.2, region: us, az: us-a}\n";

/// Parses `text` as `ml/trainer`'s `prod` and renders the result (JSON) or its problems.
fn check(text: &str, expected: Expect) {
    let actual = match parse_environment(text, "prod.yml", "ml/trainer", "prod") {
        Ok(env) => serde_json::to_string(&env).unwrap(),
        Err(e) => e.to_string(),
    };
    expected.assert_eq(&actual);
}

fn waves(text: &str) -> Waves {
    parse_environment(text, "prod.yml", "ml/trainer", "prod")
        .unwrap()
        .rollout
        .waves
}

#[test]
fn defaults() {
    check(
        "targets:\n  - name: local\n    host: local\n",
        expect![[
            r#"{"targets":[{"name":"local","host":"local","port":22}],"ssh":{"strict_host_key_checking":true,"verify":"auto"},"deploy":{"plugin":"remote-copy","commands":[]},"rollout":{"waves":"all","max_parallel":5},"checks":[],"depends_on":[],"rollback":{"on_failure":"reactivate_previous"}}"#
        ]],
    );
    check(
        "targets:\n  - {name: a, host: a}\nssh:\ndeploy:\nrollout:\nchecks:\ndepends_on:\nrollback:\n",
        expect![[
            r#"{"targets":[{"name":"a","host":"a","port":22}],"ssh":{"strict_host_key_checking":true,"verify":"auto"},"deploy":{"plugin":"remote-copy","commands":[]},"rollout":{"waves":"all","max_parallel":5},"checks":[],"depends_on":[],"rollback":{"on_failure":"reactivate_previous"}}"#
        ]],
    );
    let env = parse_environment(
        "targets: [{name: a, host: a}]\napproval: {approvers: [alice, bob]}\n",
        "prod.yml",
        "ml/trainer",
        "prod",
    )
    .unwrap();
    assert_eq!(
        env.approval,
        Some(Approval {
            required: true,
            approvers: vec!["alice".into(), "bob".into()],
            count: 1,
            timeout: None,
            allow_self_approval: false,
        }),
        "the approval as written"
    );
    assert!(
        !env.targets[0].is_local(),
        "a target with a host is not local"
    );
}

#[test]
fn complete_file() {
    let text = format!(
        "{TARGETS}  - name: web-3\n    host: web-3.example\n    port: 2222\n    user: deploy\n    \
         labels: {{tier: 1}}\n    region: us\n    az: us-b\nssh:\n  user: ops\n  \
         key: /etc/manent/id_ed25519\n  known_hosts: /etc/manent/known_hosts\n  \
         strict_host_key_checking: false\ndeploy:\n  plugin: command\n  dest: \
         /opt/{{application}}/{{version}}\n  activate: systemctl restart app\n  commands: [a, b]\n  \
         params: {{x: 1}}\nrollout:\n  waves: by_az\n  max_parallel: 2\n  pause: 30s\napproval:\n  \
         required: true\n  approvers: [alice]\n  timeout: 24h\n  allow_self_approval: true\n\
         depends_on:\n  - application: ml/features\n    environment: prod\n    version: \"3\"\n\
         rollback:\n  on_failure: none\n"
    );
    check(
        &text,
        expect![[
            r#"{"targets":[{"name":"web-1","host":"10.0.0.1","port":22,"region":"eu","az":"eu-a"},{"name":"web-2","host":"10.0.0.2","port":22,"region":"us","az":"us-a"},{"name":"web-3","host":"web-3.example","port":2222,"user":"deploy","region":"us","az":"us-b","labels":{"tier":"1"}}],"ssh":{"user":"ops","key":"/etc/manent/id_ed25519","known_hosts":"/etc/manent/known_hosts","strict_host_key_checking":false,"verify":"auto"},"deploy":{"plugin":"command","dest":"/opt/{application}/{version}","activate":"systemctl restart app","commands":["a","b"],"params":{"x":1}},"rollout":{"waves":"by_az","max_parallel":2,"pause":"30s"},"checks":[],"approval":{"required":true,"approvers":["alice"],"count":1,"timeout":"1day","allow_self_approval":true},"depends_on":[{"application":"ml/features","environment":"prod","version":"3"}],"rollback":{"on_failure":"none"}}"#
        ]],
    );
}

#[test]
fn each_kind_of_waves() {
    assert_eq!(waves(TARGETS), Waves::All, "all targets at once by default");
    assert_eq!(
        waves(&format!("{TARGETS}rollout: {{waves: all}}\n")),
        Waves::All,
        "waves: all"
    );
    assert_eq!(
        waves(&format!("{TARGETS}rollout: {{waves: by_region}}\n")),
        Waves::ByRegion,
        "waves: by_region"
    );
    assert_eq!(
        waves(&format!("{TARGETS}rollout: {{waves: by_az}}\n")),
        Waves::ByAz,
        "waves: by_az"
    );
    assert_eq!(
        waves(&format!(
            "{TARGETS}rollout:\n  waves:\n    - [web-2]\n    - [web-1]\n"
        )),
        Waves::Explicit(vec![vec!["web-2".into()], vec!["web-1".into()]]),
        "explicit waves, in the order written"
    );
}

#[test]
fn wave_errors() {
    check(
        &format!("{TARGETS}rollout: {{waves: by_zone}}\n"),
        expect![[
            r#"prod.yml:4: rollout.waves: unknown waves `by_zone`; write all, by_region, by_az, or a list of lists of target names, e.g. [[web-1], [web-2, web-3]]"#
        ]],
    );
    check(
        &format!("{TARGETS}rollout: {{waves: [web-1, web-2]}}\n"),
        expect![[r#"
            prod.yml:4: rollout.waves[0]: found the name `web-1` where a wave (a list of target names) was expected; waves is a list of lists, e.g. [[web-1], [web-2, web-3]]
            prod.yml:4: rollout.waves[1]: found the name `web-2` where a wave (a list of target names) was expected; waves is a list of lists, e.g. [[web-1], [web-2, web-3]]"#]],
    );
    check(
        &format!(
            "{TARGETS}  - {{name: db, host: db}}\nrollout:\n  waves:\n    - [web-1, nope]\n    - []\n    - [web-1]\n"
        ),
        expect![[r#"
            prod.yml:7: rollout.waves[0][1]: `nope` is not a target of this environment; use a name from targets
            prod.yml:8: rollout.waves[1]: is an empty wave; list its target names or remove it
            prod.yml:9: rollout.waves[2][0]: target `web-1` is already in a wave; list it only once
            prod.yml:6: rollout.waves: target(s) `web-2`, `db` are in no wave; add each to a wave (every target must be listed)"#]],
    );
    check(
        "targets:\n  - {name: a, host: a, region: eu}\n  - {name: b, host: b}\nrollout:\n  waves: by_region\n  max_parallel: 0\n",
        expect![[r#"
            prod.yml:6: rollout.max_parallel: is 0; write how many targets are deployed at once (1 or more)
            prod.yml:3: targets[1]: target `b` has no region, but rollout.waves is by_region; add its region"#]],
    );
    check(
        "targets:\n  - {name: a, host: a, region: eu}\nrollout:\n  waves: by_az\n",
        expect![[
            r#"prod.yml:2: targets[0]: target `a` has no az, but rollout.waves is by_az; add its az"#
        ]],
    );
}

#[test]
fn checks_of_each_type() {
    check(
        "targets: [{name: a, host: a}]\nchecks:\n  - type: http\n    url: http://{host}:8080/health\n  \
         - {name: port, type: tcp, host: \"{target}\", port: 80, retries: 0, interval: 2s, timeout: 1s}\n  \
         - {type: command, command: systemctl is-active app, expect_exit: 3}\n",
        expect![[
            r#"{"targets":[{"name":"a","host":"a","port":22}],"ssh":{"strict_host_key_checking":true,"verify":"auto"},"deploy":{"plugin":"remote-copy","commands":[]},"rollout":{"waves":"all","max_parallel":5},"checks":[{"type":"http","url":"http://{host}:8080/health","expect_status":200,"retries":3,"interval":"1s","timeout":"10s"},{"name":"port","type":"tcp","host":"{target}","port":80,"retries":0,"interval":"2s","timeout":"1s"},{"type":"command","command":"systemctl is-active app","expect_exit":3,"retries":3,"interval":"1s","timeout":"10s"}],"depends_on":[],"rollback":{"on_failure":"reactivate_previous"}}"#
        ]],
    );
    let env = parse_environment(
        "targets: [{name: web-1, host: 10.0.0.1}]\nchecks:\n  - {type: http, url: \"http://{host}/{target}\"}\n",
        "prod.yml",
        "ml/trainer",
        "prod",
    )
    .unwrap();
    assert_eq!(
        env.checks[0].kind_for(&env.targets[0]),
        CheckKind::Http {
            url: "http://10.0.0.1/web-1".into(),
            expect_status: 200
        },
        "the check's URL with its placeholders filled"
    );
    assert_eq!(
        env.checks[0].label(),
        "http http://{host}/{target}",
        "the check's label keeps its placeholders"
    );
}

#[test]
fn check_errors() {
    for (check_text, expected) in [
        (
            "{type: http}",
            expect![[r#"prod.yml:3: checks[0]: a http check needs `url`; add it"#]],
        ),
        (
            "{type: tcp, host: h, url: \"http://x\"}",
            expect![[
                r#"prod.yml:3: checks[0]: `url` does not apply to a tcp check (its fields: host, port); remove it or change type"#
            ]],
        ),
        (
            "{type: smtp}",
            expect![[
                r#"prod.yml:3: checks[0].type: unknown value `smtp`; use one of: http, tcp, command"#
            ]],
        ),
        (
            "{type: http, url: \"http://x\", colour: red}",
            expect![
                "prod.yml:3: checks[0].colour: unknown field `colour`; remove it or fix its spelling (fields allowed here: name, type, url, expect_status, host, port, command, expect_exit, retries, interval, timeout, roles)"
            ],
        ),
        (
            "{type: http, url: \"ftp://{x}\", expect_status: 42, timeout: 0s}",
            expect![[r#"
                prod.yml:3: checks[0].url: `ftp://{x}` must start with http:// or https://
                prod.yml:3: checks[0].expect_status: 42 is not an HTTP status; write one from 100 to 599
                prod.yml:3: checks[0].timeout: is 0; write a limit such as 10s"#]],
        ),
        (
            "{type: tcp, host: \"{hostname}\", port: 0}",
            expect![[r#"
                prod.yml:3: checks[0].host: unknown placeholder `{hostname}`; the placeholders allowed here are {target}, {host}
                prod.yml:3: checks[0].port: is 0; write the port to connect to"#]],
        ),
        (
            "{type: command, command: \" \", expect_exit: 300}",
            expect![[r#"
                prod.yml:3: checks[0].command: is empty; write the command to run
                prod.yml:3: checks[0].expect_exit: 300 is not an exit code; write one from 0 to 255"#]],
        ),
    ] {
        check(
            &format!("targets: [{{name: a, host: a}}]\nchecks:\n  - {check_text}\n"),
            expected,
        );
    }
}

#[test]
fn secrets_name_a_variable_and_exactly_one_place_to_read_it() {
    let base = "targets: [{name: a, host: a}]\ndeploy: {dest: /srv}\n";
    let ok = format!("{base}secrets:\n  DB_PASSWORD: {{file: /etc/s}}\n  K_2: {{env: X}}\n");
    let env = parse_environment(&ok, "prod.yml", "ml/trainer", "prod").expect("valid secrets");
    assert_eq!(env.secrets.len(), 2, "both secrets are read");
    for (bad, fragment) in [
        (
            "db_password: {file: /etc/s}",
            "not a secret's variable name",
        ),
        ("MANENT_X: {file: /etc/s}", "not a secret's variable name"),
        ("A: {file: relative/s}", "is relative"),
        ("A: {file: /etc/s, env: X}", "exactly one of file"),
        ("A: {}", "exactly one of file"),
    ] {
        let text = format!("{base}secrets:\n  {bad}\n");
        let err = parse_environment(&text, "prod.yml", "ml/trainer", "prod")
            .expect_err(bad)
            .to_string();
        assert!(err.contains(fragment), "{bad}: {err}");
    }
}

#[test]
fn target_and_other_errors() {
    check(
        "ssh: {user: ops}\n",
        expect![[
            r#"prod.yml: targets: no targets; list the hosts of this environment under targets (name, host; host: local for the worker's own machine)"#
        ]],
    );
    check(
        "",
        expect![[
            r#"prod.yml: targets: no targets; list the hosts of this environment under targets (name, host; host: local for the worker's own machine)"#
        ]],
    );
    check(
        "targets:\n  - {name: a, host: a, port: 0}\n  - {name: a, host: \"b c\", region: \"e u\", user: \"\"}\n",
        expect![[r#"
            prod.yml:2: targets[0].port: is 0; write the SSH port (default 22)
            prod.yml:3: targets[1].name: `a` is the name of an earlier target; target names must be unique
            prod.yml:3: targets[1].host: `b c` is not a host; write a host name or address, or local for the worker's own machine
            prod.yml:3: targets[1].user: is empty; write a user name or remove it
            prod.yml:3: targets[1].region: `e u` contains ' '; use only letters, digits, `-`, `_` and `.`"#]],
    );
    check(
        "targets:\n  - {name: a, host: a, port: 70000}\n",
        expect![
            "prod.yml:2: targets[0].port: expected a whole number from 0 to 65535, found 70000; write a number in that range"
        ],
    );
    check(
        "targets: [{name: a, host: a}]\nsshh: {}\n",
        expect![
            "prod.yml:2: sshh: unknown field `sshh`; remove it or fix its spelling (fields allowed here: targets, ssh, deploy, rollout, checks, approval, depends_on, dependents, rollback, overrides, secrets, inherit_env, variables, scoped_variables, templates, drift)"
        ],
    );
    check(
        "targets: [{name: a, host: a}]\nrollback: {on_failure: panic}\n",
        expect![[
            r#"prod.yml:2: rollback.on_failure: unknown value `panic`; use one of: reactivate_previous, none"#
        ]],
    );
    check(
        "targets: [{name: a, host: a}]\ndeploy:\n  plugin: \"\"\n  dest: /srv/{tenant}\n  commands: [\"\"]\n\
         approval:\n  count: 3\n  approvers: [a, a]\n  timeout: 0s\ndepends_on:\n  - {application: ml/trainer, environment: prod}\n",
        expect![[r#"
            prod.yml:3: deploy.plugin: `` is empty; write a name of letters, digits, `-`, `_` or `.`
            prod.yml:4: deploy.dest: unknown placeholder `{tenant}`; the placeholders allowed here are {version}, {target}, {application}, {environment}
            prod.yml:5: deploy.commands[0]: is empty; write a command or remove the entry
            prod.yml:8: approval.approvers[1]: `a` is listed twice; keep one entry
            prod.yml:7: approval.count: needs 3 approvals but only 2 approver(s) are listed; lower count or add approvers
            prod.yml:9: approval.timeout: is 0; write how long to wait, e.g. 24h, or remove it to wait forever
            prod.yml:11: depends_on[0]: ml/trainer/prod depends on itself; remove this entry"#]],
    );
}

#[test]
fn ssh_verify_is_auto_by_default_and_may_be_sftp_or_command() {
    let parse = |yaml: &str| parse_environment(yaml, "e.yml", "acme/web", "prod");
    let env = parse("targets: [{name: t, host: local}]\n").expect("valid");
    assert_eq!(
        env.ssh.verify,
        VerifyBy::Auto,
        "chosen by the file's size by default"
    );
    for (written, meant) in [("sftp", VerifyBy::Sftp), ("command", VerifyBy::Command)] {
        let env = parse(&format!(
            "targets: [{{name: t, host: local}}]\nssh: {{verify: {written}}}\n"
        ))
        .expect("valid");
        assert_eq!(
            env.ssh.verify, meant,
            "`verify: {written}` is taken as written"
        );
    }
    let err = parse("targets: [{name: t, host: local}]\nssh: {verify: rsync}\n")
        .expect_err("an unknown verify mode is refused")
        .to_string();
    assert!(
        err.contains("verify")
            && err.contains("auto")
            && err.contains("sftp")
            && err.contains("command"),
        "the error names the field and the choices: {err}"
    );
}

#[test]
fn inherit_env_names_variables_of_the_worker_once_and_not_a_secret() {
    let base = "targets: [{name: a, host: local}]\ndeploy: {dest: /srv}\n";
    let ok = format!("{base}inherit_env: [AWS_PROFILE, http_proxy]\n");
    let env = parse_environment(&ok, "prod.yml", "ml/trainer", "prod").expect("valid inherit_env");
    assert_eq!(
        env.inherit_env,
        ["AWS_PROFILE", "http_proxy"],
        "both names are read, as written"
    );
    for (bad, fragment) in [
        ("[\"1X\"]", "not a variable name"),
        ("[\"A-B\"]", "not a variable name"),
        ("[MANENT_DEPLOY_ID]", "not a variable name"),
        ("[A, A]", "listed twice"),
        ("[K]\nsecrets: {K: {env: K}}", "also a secret"),
    ] {
        let text = format!("{base}inherit_env: {bad}\n");
        let err = parse_environment(&text, "prod.yml", "ml/trainer", "prod")
            .expect_err(bad)
            .to_string();
        assert!(
            err.contains(fragment) && err.contains("inherit_env["),
            "{bad}: the error names the entry and why: {err}"
        );
    }
}

/// docs/cli.md promises every problem of a file in one `validate` run: unknown keys and
/// wrong values in different sections, several in one section, and the checks of the
/// sections that read.
#[test]
fn every_problem_of_a_file_is_reported_in_one_run() {
    check(
        "targets:\n  - {name: a, host: a, port: many}\n  - {name: b, hots: b}\n  - {name: c, host: c}\n\
         deploy:\n  dst: /srv\n  keep_releases: ten\nrollout:\n  waves: [[a], [nobody]]\n\
         checks: 3\nrollback:\n  on_failure: reactivate_previous\n  extra: 1\ndepends_on:\n  \
         - {application: ml/trainer, environment: prod}\n",
        expect![[r#"
            prod.yml:2: targets[0].port: expected a whole number from 0 to 65535, found "many"; write a whole number, without quotes
            prod.yml:3: targets[1].hots: unknown field `hots`; remove it or fix its spelling (fields allowed here: name, host, port, user, region, az, labels, roles)
            prod.yml:3: targets[1].host: missing field `host`; add it
            prod.yml:6: deploy.dst: unknown field `dst`; remove it or fix its spelling (fields allowed here: plugin, dest, activate, commands, params, keep_releases, shared, tasks, mode, container, proxy)
            prod.yml:7: deploy.keep_releases: expected a whole number, 0 or more, found "ten"; write a whole number, without quotes
            prod.yml:10: checks: expected a list, found 3; write a list, e.g. [a, b]
            prod.yml:13: rollback.extra: unknown field `extra`; remove it or fix its spelling (fields allowed here: on_failure, past_irreversible)
            prod.yml:9: rollout.waves[1][0]: `nobody` is not a target of this environment; use a name from targets
            prod.yml:9: rollout.waves: target(s) `c` are in no wave; add each to a wave (every target must be listed)
            prod.yml:15: depends_on[0]: ml/trainer/prod depends on itself; remove this entry"#]],
    );
}

const ROLES: &str = "targets:\n  - {name: db-1, host: h1, roles: [db, web]}\n  - {name: web-1, host: \
                     h2, roles: [web]}\n  - {name: w-1, host: h3}\n";

#[test]
fn tasks_roles_and_the_release_mode_as_written() {
    check(
        &format!(
            "{ROLES}deploy:\n  dest: /srv/{{version}}\n  mode: \"0750\"\n  tasks:\n    - {{name: \
             migrate, run: bin/migrate, when: before_activate, once: true, roles: [db]}}\n    - \
             {{name: warm, run: bin/warm, when: after_activate, timeout: 30s}}\nchecks:\n  - \
             {{type: tcp, host: \"{{host}}\", port: 80, roles: [web]}}\nrollback: \
             {{past_irreversible: true}}\n"
        ),
        expect![[
            r#"{"targets":[{"name":"db-1","host":"h1","port":22,"roles":["db","web"]},{"name":"web-1","host":"h2","port":22,"roles":["web"]},{"name":"w-1","host":"h3","port":22}],"ssh":{"strict_host_key_checking":true,"verify":"auto"},"deploy":{"plugin":"remote-copy","dest":"/srv/{version}","commands":[],"tasks":[{"name":"migrate","run":"bin/migrate","when":"before_activate","once":true,"roles":["db"],"timeout":"10m"},{"name":"warm","run":"bin/warm","when":"after_activate","timeout":"30s"}],"mode":"0750"},"rollout":{"waves":"all","max_parallel":5},"checks":[{"type":"tcp","host":"{host}","port":80,"retries":3,"interval":"1s","timeout":"10s","roles":["web"]}],"depends_on":[],"rollback":{"on_failure":"reactivate_previous","past_irreversible":true}}"#
        ]],
    );
}

#[test]
fn task_and_role_errors() {
    let cases = [
        (
            "targets: [{name: a, host: h, roles: [DB, db, db]}]\n",
            expect![[r#"
                prod.yml:1: targets[0].roles[0]: `DB` is not a role name; use lower-case letters, digits, `-` and `_` (at most 63, starting with a letter or digit), e.g. db, web, worker
                prod.yml:1: targets[0].roles[2]: `db` is listed twice; keep one"#]],
        ),
        (
            "targets: [{name: a, host: h, roles: [db]}]\nchecks: [{type: tcp, host: h, port: 1, \
             roles: [dbb]}]\n",
            expect![[
                r#"prod.yml:2: checks[0].roles[0]: no target has the role `dbb`; the targets' roles are db: fix the name or give a target the role"#
            ]],
        ),
        (
            "targets: [{name: a, host: h}]\ndeploy:\n  dest: /srv\n  tasks:\n    - {name: m, \
             run: \" \", when: before_activate, timeout: 0s, roles: [db]}\n    - {name: m, run: \
             x, when: after_activate}\n",
            expect![[r#"
                prod.yml:5: deploy.tasks[0].run: is empty; write the command the task runs
                prod.yml:5: deploy.tasks[0].timeout: is 0; write a limit such as 10m
                prod.yml:5: deploy.tasks[0].roles[0]: no target has the role `db`; no target has a role (targets[].roles): fix the name or give a target the role
                prod.yml:6: deploy.tasks[1].name: `m` is the name of an earlier task; task names must be unique"#]],
        ),
        (
            "targets: [{name: a, host: h}]\ndeploy:\n  tasks: [{name: m, run: x, when: later}]\n",
            expect![[
                r#"prod.yml:3: deploy.tasks[0].when: unknown value `later`; use one of: before_activate, after_activate"#
            ]],
        ),
        (
            "targets: [{name: a, host: h}]\ndeploy:\n  plugin: ansible\n  mode: \"0755\"\n  tasks: \
             [{name: m, run: x, when: after_activate}]\n",
            expect![[r#"
                prod.yml:5: deploy.tasks: tasks run under the built-in plugins (remote-copy, command); this environment's is `ansible`: remove the tasks or deploy with a built-in plugin
                prod.yml:4: deploy.mode: applies to the release directories of the remote-copy plugin only (this environment's is `ansible`); remove it"#]],
        ),
        (
            "targets: [{name: a, host: h}]\ndeploy: {dest: /srv, mode: 750}\n",
            expect![[
                r#"prod.yml:2: deploy.mode: 750 is read as a decimal number; quote the mode so that it is read in octal, e.g. "0750""#
            ]],
        ),
        (
            "targets: [{name: a, host: h}]\ndeploy: {dest: /srv, mode: \"0640\"}\n",
            expect![[
                r#"prod.yml:2: deploy.mode: `0640` takes from the deploying user what it needs in its own release directories (read, write and search: 07xx); write e.g. "0750""#
            ]],
        ),
    ];
    for (text, expected) in cases {
        check(text, expected);
    }
}

#[test]
fn a_once_task_runs_on_the_first_target_in_rollout_order_having_one_of_its_roles() {
    let env = parse_environment(
        &format!(
            "{ROLES}rollout: {{waves: [[w-1], [web-1, db-1]]}}\ndeploy:\n  dest: /srv\n  tasks:\n    \
             - {{name: migrate, run: m, when: before_activate, once: true, roles: [db, web]}}\n    \
             - {{name: assets, run: a, when: before_activate, roles: [web]}}\n    - {{name: \
             everywhere, run: e, when: after_activate}}\n"
        ),
        "prod.yml",
        "ml/trainer",
        "prod",
    )
    .unwrap();
    let descriptor = crate::parse_descriptor(
        &format!(
            "application: ml/trainer\nenvironment: prod\nartifacts: [{{name: a, type: t, version: \
             \"1\", url: \"file:///a\", sha256: {}}}]\n",
            "0".repeat(64)
        ),
        "d.yml",
    )
    .unwrap();
    let eff = crate::EffectiveDescriptor::build(&descriptor, &env).unwrap();
    let once: Vec<(&str, String)> = eff
        .once_before_activate()
        .into_iter()
        .map(|(task, target)| (task.name.as_str(), target.name))
        .collect();
    assert_eq!(
        once,
        vec![("migrate", "web-1".to_string())],
        "web-1 comes before db-1 in the second wave, and w-1 has neither role"
    );
    let names = |target: usize, when: TaskWhen| -> Vec<&str> {
        eff.tasks_on(&eff.targets[target], when)
            .into_iter()
            .map(|t| t.name.as_str())
            .collect()
    };
    assert_eq!(
        names(1, TaskWhen::BeforeActivate),
        vec!["migrate", "assets"],
        "web-1 runs the once task and its role's task"
    );
    assert_eq!(
        names(0, TaskWhen::BeforeActivate),
        vec!["assets"],
        "db-1 is a web target too, but the once task is web-1's"
    );
    assert!(
        names(2, TaskWhen::BeforeActivate).is_empty(),
        "w-1 has no role: only tasks without roles run there"
    );
    assert_eq!(
        names(2, TaskWhen::AfterActivate),
        vec!["everywhere"],
        "a task without roles runs on every target"
    );
}
