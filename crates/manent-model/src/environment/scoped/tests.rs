//! Tests of `variables` and `scoped_variables`: the effective value per target and its
//! source, and what the file is refused for.

use expect_test::{Expect, expect};

use crate::parse_environment;

const TARGETS: &str = "\
targets:
  - {name: web-1, host: a, region: eu, az: eu-1a, labels: {tier: web}}
  - {name: web-2, host: b, region: eu, az: eu-1b, labels: {tier: web, canary: \"yes\"}}
  - {name: api-1, host: c, region: us, az: us-1a, labels: {tier: api}}
  - {name: build, host: local}
";

/// Parses `TARGETS` + `extra` and renders each target's effective variables
/// (`target: NAME=value (source)`), or the file's problems.
fn check(extra: &str, expected: Expect) {
    let text = format!("{TARGETS}{extra}");
    let actual = match parse_environment(&text, "prod.yml", "web/shop", "prod") {
        Ok(env) => env
            .targets
            .iter()
            .map(|target| {
                let vars: Vec<String> = env
                    .variables_for(target)
                    .into_iter()
                    .map(|v| format!("{}={} ({})", v.name, v.value, v.source))
                    .collect();
                format!("{}: {}", target.name, vars.join(", "))
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Err(e) => e.to_string(),
    };
    expected.assert_eq(&actual);
}

#[test]
fn the_most_specific_match_wins_target_over_az_over_region_over_label_over_plain() {
    check(
        "\
variables: {DB_HOST: db.internal, PORT: 8080, DEBUG: false}
scoped_variables:
  - {match: {label: tier=web}, variables: {DB_HOST: db-web.internal}}
  - {match: {region: eu}, variables: {DB_HOST: db.eu.internal}}
  - {match: {az: eu-1b}, variables: {DB_HOST: db.eu-1b.internal}}
  - {match: {target: web-2}, variables: {PORT: 9090}}
  - {match: {label: tier=api}, variables: {DB_HOST: db-api.internal}}
",
        expect![[r#"
            web-1: DB_HOST=db.eu.internal (region eu), DEBUG=false (environment), PORT=8080 (environment)
            web-2: DB_HOST=db.eu-1b.internal (az eu-1b), DEBUG=false (environment), PORT=9090 (target web-2)
            api-1: DB_HOST=db-api.internal (label tier=api), DEBUG=false (environment), PORT=8080 (environment)
            build: DB_HOST=db.internal (environment), DEBUG=false (environment), PORT=8080 (environment)"#]],
    );
}

#[test]
fn a_scoped_variable_may_exist_only_for_the_targets_it_matches() {
    check(
        "scoped_variables:\n  - {match: {region: us}, variables: {US_ONLY: \"1\"}}\n",
        expect![[r#"
            web-1: 
            web-2: 
            api-1: US_ONLY=1 (region us)
            build: "#]],
    );
}

#[test]
fn two_entries_of_the_same_specificity_setting_a_variable_for_one_target_are_refused_naming_both() {
    check(
        "\
scoped_variables:
  - match: {label: tier=web}
    variables: {POOL: \"10\"}
  - match: {label: canary=yes}
    variables: {POOL: \"2\"}
  - match: {region: eu}
    variables: {A: \"1\"}
  - match: {region: eu}
    variables: {B: \"1\"}
",
        expect![
            "prod.yml:10: scoped_variables[1].variables.POOL: `POOL` is also set by scoped_variables[0] (prod.yml:7, label tier=web), and both match target `web-2` with the same specificity (label): which applies would be a guess; set it in one entry, or match more precisely (target over az over region over label)"
        ],
    );
}

#[test]
fn names_matches_and_values_are_checked_when_the_file_is_read() {
    check(
        "\
variables: {lower: x, MANENT_X: y, DB_PASSWORD: z, PATHS: [a]}
",
        expect![
            "prod.yml:6: variables.PATHS: expected text (a string, a number or true/false), found a list; fix the value"
        ],
    );
    check(
        "\
variables: {lower: x, MANENT_X: y, DB_PASSWORD: z, HTTP_PROXY: p}
secrets: {DB_PASSWORD: {env: DB}}
inherit_env: [HTTP_PROXY]
scoped_variables:
  - {match: {target: web-9}, variables: {A: \"1\"}}
  - {match: {region: eu, az: eu-1a}, variables: {A: \"1\"}}
  - {match: {label: tier}, variables: {A: \"1\"}}
  - {match: {region: eu}, variables: {}}
",
        expect![[r#"
            prod.yml:6: variables.DB_PASSWORD: `DB_PASSWORD` is also a secret, which sets it (masked); rename one of the two
            prod.yml:6: variables.MANENT_X: `MANENT_X` is not a variable name; use upper-case letters, digits and `_`, not starting with a digit or MANENT_
            prod.yml:6: variables.lower: `lower` is not a variable name; use upper-case letters, digits and `_`, not starting with a digit or MANENT_
            prod.yml:6: variables.HTTP_PROXY: `HTTP_PROXY` is also in inherit_env, which sets it from the worker; remove it from one of the two
            prod.yml:10: scoped_variables[0].match.target: `web-9` is not a target of this environment; use a name from targets
            prod.yml:11: scoped_variables[1].match: write exactly one of target, az, region or label (`key=value`)
            prod.yml:12: scoped_variables[2].match.label: `tier` is not `key=value`; write the label's key, `=` and its value
            prod.yml:13: scoped_variables[3].variables: is empty; write the variables these targets get, or remove the entry"#]],
    );
}

#[test]
fn a_descriptor_sets_variables_only_where_overrides_lists_variables_and_never_a_secret() {
    let sha = "0".repeat(64);
    let descriptor = |variables: &str| {
        crate::parse_descriptor(
            &format!(
                "application: web/shop\nenvironment: prod\nartifacts:\n  - {{name: a, type: t, \
                 version: \"1\", url: \"file:///a\", sha256: \"{sha}\"}}\ndeploy: {{variables: \
                 {variables}}}\n"
            ),
            "deploy.yml",
        )
        .expect("a valid descriptor")
    };
    let env = |overrides: &str| {
        parse_environment(
            &format!(
                "{TARGETS}deploy: {{dest: /srv}}\nvariables: {{PORT: 1}}\nsecrets: {{TOKEN: \
                 {{env: T}}}}\n{overrides}"
            ),
            "prod.yml",
            "web/shop",
            "prod",
        )
        .expect("a valid environment file")
    };
    let refused = crate::EffectiveDescriptor::build(&descriptor("{PORT: 2}"), &env(""))
        .expect_err("variables are not in the default overrides");
    assert!(
        refused.to_string().contains("deploy.variables")
            && refused.to_string().contains("overrides"),
        "the refusal names the key and overrides: {refused}"
    );
    let allowed = env("overrides: [params, variables]\n");
    let eff = crate::EffectiveDescriptor::build(&descriptor("{PORT: 2}"), &allowed)
        .expect("variables are allowed");
    let port = eff
        .variables_for(&eff.targets[0])
        .into_iter()
        .find(|v| v.name == "PORT")
        .expect("PORT is set");
    assert_eq!(
        (port.value.as_str(), port.source.to_string().as_str()),
        ("2", "descriptor"),
        "the descriptor's value wins over the environment file's"
    );
    let secret = crate::EffectiveDescriptor::build(&descriptor("{TOKEN: mine}"), &allowed)
        .expect_err("a descriptor cannot replace a secret");
    assert!(
        secret.to_string().contains("deploy.variables.TOKEN"),
        "the refusal names the variable: {secret}"
    );
}
