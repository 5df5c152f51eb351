//! Tests of `templates`: reading their sources, the names they use, rendering, modes, and
//! the secret providers' validation beside them.

use std::path::Path;

use expect_test::{Expect, expect};

use super::line_of_name;
use crate::{EffectiveDescriptor, parse_descriptor, parse_environment_in};

const TARGETS: &str = "\
targets:
  - {name: web-1, host: a, region: eu}
  - {name: web-2, host: b, region: us}
deploy: {dest: \"/srv/shop/{version}\"}
";

/// An environment directory holding `files` (name, text) beside `prod.yml`.
fn site(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a temporary directory");
    for (name, text) in files {
        let path = dir.path().join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    dir
}

/// Reads `TARGETS` + `extra` in `dir`: `ok` or every problem (the directory shown as `<dir>`).
fn read(dir: &Path, extra: &str) -> Result<crate::EnvironmentFile, String> {
    parse_environment_in(
        &format!("{TARGETS}{extra}"),
        "prod.yml",
        "web/shop",
        "prod",
        dir,
    )
    .map_err(|e| e.to_string().replace(&dir.display().to_string(), "<dir>"))
}

fn check(files: &[(&str, &str)], extra: &str, expected: Expect) {
    let dir = site(files);
    let actual = match read(dir.path(), extra) {
        Ok(env) => format!("ok: {} template(s) read", env.templates.len()),
        Err(e) => e,
    };
    expected.assert_eq(&actual);
}

const APP_ENV: &str = "DB={{ DB_HOST }}\n{% if REGION_ONLY %}x{% endif %}\n";

#[test]
fn a_template_naming_a_variable_a_target_lacks_is_refused_naming_template_line_variable_and_target()
{
    check(
        &[("app.env.j2", APP_ENV)],
        "variables: {DB_HOST: db}\nscoped_variables:\n  - {match: {region: eu}, variables: \
         {REGION_ONLY: \"1\"}}\ntemplates:\n  - {src: app.env.j2, dest: app.env}\n",
        expect![[r#"
            prod.yml:9: templates[0].src: template app.env.j2 line 2: `REGION_ONLY` is not set for target web-2: it is no variable, secret or MANENT_* value of that target; set it in variables: (or in scoped_variables: for that target), or correct the name"#]],
    );
    check(
        &[("app.env.j2", APP_ENV)],
        "variables: {DB_HOST: db, REGION_ONLY: \"\"}\nsecrets: {TOKEN: {env: T}}\ntemplates:\n  \
         - {src: app.env.j2, dest: app.env}\n",
        expect!["ok: 1 template(s) read"],
    );
}

#[test]
fn sources_are_read_beside_the_environment_file_bounded_and_never_outside_it() {
    let big = "x".repeat(crate::MAX_TEMPLATE_BYTES + 1);
    let dir = site(&[("big.j2", &big)]);
    std::os::unix::fs::symlink("/etc/hostname", dir.path().join("escape.j2")).unwrap();
    let refused = read(
        dir.path(),
        "templates:\n  - {src: missing.j2, dest: a}\n  - {src: big.j2, dest: b}\n  - {src: \
         escape.j2, dest: c}\n  - {src: ../x.j2, dest: d}\n  - {src: e.j2, dest: \"../e\"}\n",
    )
    .expect_err("each of these is refused");
    expect![[r#"
        prod.yml:9: templates[3].src: `../x.j2` must be a path relative to the environment file's directory, without `.`, `..` or empty parts (`templates/app.env.j2`)
        prod.yml:10: templates[4].dest: `../e` must be a file path relative to the release directory (`config/app.yml`) or absolute (`/etc/shop/app.env`), without `.`, `..` or empty parts"#]]
    .assert_eq(&refused);
    let refused = read(
        dir.path(),
        "templates:\n  - {src: missing.j2, dest: a}\n  - {src: big.j2, dest: b}\n  - {src: \
         escape.j2, dest: c}\n",
    )
    .expect_err("each of these is refused");
    expect![[r#"
        prod.yml:6: templates[0].src: cannot read <dir>/missing.j2: No such file or directory (os error 2)
        prod.yml:7: templates[1].src: <dir>/big.j2 has 65537 bytes, more than a template may (65536): its text travels with every deploy; split it or keep large files in an artifact
        prod.yml:8: templates[2].src: <dir>/escape.j2 leads outside the environment file's directory (a symbolic link); keep template sources beside the environment file"#]]
    .assert_eq(&refused);
}

#[test]
fn a_mode_is_octal_text_or_the_octal_digits_of_a_number() {
    let dir = site(&[("a.j2", "a\n")]);
    let mode = |written: &str| {
        read(
            dir.path(),
            &format!("templates:\n  - {{src: a.j2, dest: a, mode: {written}}}\n"),
        )
        .map(|env| env.templates[0].mode.to_string())
    };
    assert_eq!(mode("\"0640\"").as_deref(), Ok("0640"), "quoted octal text");
    assert_eq!(
        mode("640").as_deref(),
        Ok("0640"),
        "YAML's decimal 640 read as octal"
    );
    assert_eq!(
        mode("0755").as_deref(),
        Ok("0755"),
        "YAML 1.2 reads 0755 as 755"
    );
    let default = read(dir.path(), "templates:\n  - {src: a.j2, dest: a}\n").unwrap();
    assert_eq!(
        default.templates[0].mode.to_string(),
        "0600",
        "the default mode"
    );
    for bad in ["\"0689\"", "\"04755\"", "1000", "rw"] {
        let refused = mode(bad).expect_err("not a mode");
        assert!(
            refused.contains("templates[0].mode") && refused.contains("octal"),
            "{bad}: {refused}"
        );
    }
}

#[test]
fn templates_are_refused_with_another_plugin_under_a_shared_path_or_twice() {
    check(
        &[("a.j2", "a")],
        "overrides: []\nrollback: {on_failure: none}\ntemplates:\n  - {src: a.j2, dest: \
         log/a}\n  - {src: a.j2, dest: log/a}\n",
        expect![
            "prod.yml:9: templates[1].dest: `log/a` is the dest of an earlier template; each file is written once"
        ],
    );
    let shared = "targets: [{name: a, host: a}]\ndeploy:\n  dest: /srv/{version}\n  shared: {dir: \
                  /srv/shared, paths: [log/]}\ntemplates:\n  - {src: a.j2, dest: log/app.conf}\n";
    let dir = site(&[("a.j2", "a")]);
    let refused = parse_environment_in(shared, "prod.yml", "web/shop", "prod", dir.path())
        .expect_err("a template under a shared path is refused");
    assert!(
        refused.to_string().contains("shared path `log/`"),
        "{refused}"
    );
    let other = "targets: [{name: a, host: a}]\ndeploy: {plugin: ansible}\ntemplates:\n  - {src: \
                 a.j2, dest: /etc/a}\n";
    let refused = parse_environment_in(other, "prod.yml", "web/shop", "prod", dir.path())
        .expect_err("another plugin does not write templates");
    assert!(refused.to_string().contains("`ansible`"), "{refused}");
}

/// A descriptor of version 1.2 with one artifact `shop.tgz`.
fn descriptor() -> crate::Descriptor {
    let sha = "0".repeat(64);
    parse_descriptor(
        &format!(
            "application: web/shop\nenvironment: prod\nartifacts:\n  - {{name: shop.tgz, type: \
             t, version: \"1.2\", url: \"file:///a\", sha256: \"{sha}\"}}\n"
        ),
        "deploy.yml",
    )
    .expect("a valid descriptor")
}

#[test]
fn a_deploy_renders_each_template_per_target_with_its_values_and_keeps_the_final_newline() {
    let text = "host={{ DB_HOST }}\nversion={{ MANENT_VERSION }}\nshop={{ MANENT_ARTIFACT_SHOP_TGZ }}\n\
                {% for n in range(2) %}{{ n }}{% endfor %}\n";
    let dir = site(&[("conf/app.j2", text)]);
    let env = read(
        dir.path(),
        "variables: {DB_HOST: db}\nscoped_variables:\n  - {match: {target: web-2}, variables: \
         {DB_HOST: db2}}\ntemplates:\n  - {src: conf/app.j2, dest: config/app.env, mode: \
         \"0640\"}\n  - {src: conf/app.j2, dest: /etc/shop.env}\n",
    )
    .expect("a valid environment");
    let eff = EffectiveDescriptor::build(&descriptor(), &env).expect("a valid deploy");
    let web2 = &eff.targets[1];
    let mut values: std::collections::BTreeMap<String, String> = eff
        .variables_for(web2)
        .into_iter()
        .map(|v| (v.name, v.value))
        .collect();
    values.insert("MANENT_VERSION".into(), "1.2".into());
    values.insert(
        "MANENT_ARTIFACT_SHOP_TGZ".into(),
        "/srv/shop/1.2/shop.tgz".into(),
    );
    let rendered = eff.templates_for(web2, &values).expect("both render");
    let shown: Vec<String> = rendered
        .iter()
        .map(|r| {
            format!(
                "{} {} {:?}",
                r.path,
                r.mode,
                String::from_utf8_lossy(&r.bytes)
            )
        })
        .collect();
    expect![[r#"
        /srv/shop/1.2/config/app.env 0640 "host=db2\nversion=1.2\nshop=/srv/shop/1.2/shop.tgz\n01\n"
        /etc/shop.env 0600 "host=db2\nversion=1.2\nshop=/srv/shop/1.2/shop.tgz\n01\n""#]]
    .assert_eq(&shown.join("\n"));
    values.remove("DB_HOST");
    let missing = eff
        .templates_for(web2, &values)
        .expect_err("an undefined value is an error");
    assert_eq!(
        (missing.src.as_str(), missing.line),
        ("conf/app.j2", Some(1)),
        "the error names the template and the line: {missing}"
    );
}

#[test]
fn a_deploy_is_refused_when_a_template_names_an_artifact_it_does_not_have_or_writes_over_one() {
    let dir = site(&[("a.j2", "{{ MANENT_ARTIFACT_OTHER }}")]);
    let env = read(dir.path(), "templates:\n  - {src: a.j2, dest: a}\n")
        .expect("any MANENT_ARTIFACT_* passes while the artifacts are not known");
    let refused = EffectiveDescriptor::build(&descriptor(), &env)
        .expect_err("the deploy has no artifact `other`");
    expect![[r#"web/shop/prod: templates[0]: template a.j2 line 1: `MANENT_ARTIFACT_OTHER` is not set for target web-1: it is no variable, secret or MANENT_* value of that target; set it in variables: (or in scoped_variables: for that target), or correct the name"#]]
    .assert_eq(&refused.to_string());
    let env = read(dir.path(), "templates:\n  - {src: a.j2, dest: shop.tgz}\n").unwrap();
    let refused = EffectiveDescriptor::build(&descriptor(), &env).expect_err("an artifact's name");
    assert!(
        refused.to_string().contains("templates[0].dest"),
        "{refused}"
    );
}

#[test]
fn a_syntax_error_is_refused_naming_its_line() {
    check(
        &[("a.j2", "ok\n{% if %}\n")],
        "templates:\n  - {src: a.j2, dest: a}\n",
        expect![[r#"
            prod.yml:6: templates[0].src: template a.j2 line 2: syntax error: unexpected end of block"#]],
    );
}

#[test]
fn the_line_of_a_name_is_where_a_tag_uses_it_whole() {
    let text = "DB_HOST is text here\n{{ 'DB_HOST' }} {{ x.DB_HOST }} {# DB_HOST #}\n\
                {{ DB_HOSTS }}\n{% if a %}{{ DB_HOST }}{% endif %}\n";
    assert_eq!(
        line_of_name(text, "DB_HOST"),
        Some(4),
        "only a whole name in a tag counts"
    );
    assert_eq!(
        line_of_name(text, "NOWHERE"),
        None,
        "a name the text does not hold has no line"
    );
}

#[test]
fn secret_providers_are_checked_when_the_file_is_read() {
    let dir = site(&[]);
    let refused = read(
        dir.path(),
        "secrets:\n  A: {command: \"vault kv get -field=x k\", timeout: 0s}\n  B: {age: ../b.age, \
         identity: /etc/k}\n  C: {age: c.age}\n  D: {command: x, file: /f}\n  E: {env: E, \
         identity: /k}\n  F: {command: \"op read op://v/i/f\", timeout: 10s}\n  G: {age: \
         g.age, identity: /etc/manent/age.key}\n",
    )
    .expect_err("each but F and G is refused");
    expect![[r#"
        prod.yml:6: secrets.A.timeout: is 0; write a limit such as 30s
        prod.yml:7: secrets.B.age: `../b.age` must be absolute, or relative to the environment file without `.` or `..`
        prod.yml:8: secrets.C.identity: is missing; write the age identity file on the worker that decrypts it
        prod.yml:9: secrets.D: write exactly one of file (a path on the worker), env (a variable of the worker process), command (run on the worker; its output) or age (an age-encrypted file, with identity)
        prod.yml:10: secrets.E.identity: applies to age only; remove it"#]]
    .assert_eq(&refused);
}
