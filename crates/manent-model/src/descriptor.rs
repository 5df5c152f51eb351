//! Owns the descriptor, what a user submits (application, environment, artifacts, `deploy:`
//! overrides, schedule, `dry_run`, `depends_on`, `irreversible`): its types, parsing from
//! YAML or JSON and validation, which reports every problem at once with its file, line and
//! field.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::environment::{Dependency, validate_dependencies, validate_deploy_fields};
use crate::error::ModelError;
use crate::rules;
use crate::serde_util::nullable;
use crate::source::{Document, key_paths};

/// What a user submits to deploy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Descriptor {
    /// `tenant/app`, e.g. `ml/trainer`.
    pub application: String,
    /// The environment, e.g. `prod`.
    pub environment: String,
    /// What to deploy; at least one.
    pub artifacts: Vec<Artifact>,
    /// Overrides of the environment configuration's `deploy:` section.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deploy: Option<DeployOverrides>,
    /// When to deploy: once (`at`) or on every tick of `cron`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<Schedule>,
    /// Plan instead of act.
    #[serde(default)]
    pub dry_run: bool,
    /// Deploys that must have succeeded first, besides those of the environment file.
    #[serde(default, deserialize_with = "nullable")]
    pub depends_on: Vec<Dependency>,
    /// Why this deploy cannot be undone by running older code (a destructive schema
    /// migration, say): a rollback to a version deployed before it is refused unless forced
    /// (docs/environments.md, "The rollback guard").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub irreversible: Option<String>,
}

/// One artifact of a descriptor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Artifact {
    /// Its file name on the targets (`<dest>/<name>`); unique in the descriptor.
    pub name: String,
    /// Its type (`tarball`, `binary`, `ansible`, …): routes to a plugin's queue by
    /// `plugins.<name>.artifact_types` when the environment cannot be read.
    #[serde(rename = "type")]
    pub artifact_type: String,
    /// Its version, expanded as `{version}`.
    pub version: String,
    /// Where to fetch it: `file://`, `http://` or `https://`. Empty for an image pulled by
    /// `ref`.
    #[serde(default)]
    pub url: String,
    /// Hex SHA-256 of its content (lower case after parsing), verified after download; for
    /// an image pulled by `ref`, its digest (written or not, it is the reference's).
    #[serde(default)]
    pub sha256: String,
    /// An image in a registry, pinned by digest (`registry/app@sha256:<64 hex>`), pulled
    /// by the target instead of fetched from `url` (docs/containers.md, "Registry
    /// references").
    #[serde(rename = "ref", default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
}

/// `deploy:` in a descriptor: each field set here wins over the environment file's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeployOverrides {
    /// The plugin that deploys (`remote-copy`, `command`, or a configured plugin).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin: Option<String>,
    /// Where artifacts go on each target (placeholders: `{version}`, `{target}`,
    /// `{application}`, `{environment}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dest: Option<String>,
    /// Command run on each target after the artifacts are in place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activate: Option<String>,
    /// Commands of the `command` plugin, in order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commands: Option<Vec<String>>,
    /// Free plugin parameters; a mapping is merged key by key over the environment's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<serde_json::Value>,
    /// Variables over the environment file's (and its scoped ones), by name.
    #[serde(
        default,
        deserialize_with = "optional_values",
        skip_serializing_if = "Option::is_none"
    )]
    pub variables: Option<crate::VariableValues>,
}

fn optional_values<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<crate::VariableValues>, D::Error> {
    crate::environment::scoped::scalar_values(deserializer).map(Some)
}

/// `schedule:`: exactly one of `at` and `cron`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Schedule {
    /// One deploy at this RFC 3339 time (with its offset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    /// One deploy per tick of this five-field cron expression.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// The IANA time zone `cron` is read in (UTC when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// What a recurring schedule does with ticks missed while no worker ran:
    /// `run_once` (the default) runs the latest of them once, `skip` runs none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missed: Option<Missed>,
}

/// `schedule.missed`: the ticks of a recurring schedule that passed while no worker ran.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Missed {
    /// Run the latest missed tick once, at start.
    #[default]
    RunOnce,
    /// Run none of them; resume at the next tick.
    Skip,
}

impl Missed {
    pub fn as_str(self) -> &'static str {
        match self {
            Missed::RunOnce => "run_once",
            Missed::Skip => "skip",
        }
    }
}

impl Schedule {
    /// The missed-tick policy, `run_once` when not written.
    pub fn missed_policy(&self) -> Missed {
        self.missed.unwrap_or_default()
    }
}

impl Descriptor {
    /// The deploy's version: its first artifact's, empty without artifacts
    /// (docs/environments.md).
    pub fn version(&self) -> &str {
        self.artifacts.first().map_or("", |a| a.version.as_str())
    }

    /// The tenant, the part of `application` before `/`.
    pub fn tenant(&self) -> &str {
        crate::tenant_of(&self.application)
    }

    /// The plugin the descriptor asks for, if it overrides it.
    pub fn plugin_override(&self) -> Option<&str> {
        self.deploy.as_ref()?.plugin.as_deref()
    }

    /// The artifact names, in order.
    pub fn artifact_names(&self) -> impl Iterator<Item = &str> + Clone {
        self.artifacts.iter().map(|a| a.name.as_str())
    }
}

/// What to tell a descriptor that names a queue.
pub(crate) const QUEUE_REFUSED: &str = "a descriptor cannot choose its queue: routing is \
    operator configuration (queues, plugins.<name>.queue and tenants in manent.yml); remove \
    this field";

/// Parses and validates a descriptor written in YAML or JSON. `file_name` is used in
/// messages. Every problem found is returned at once in [`ModelError::DescriptorInvalid`].
pub fn parse_descriptor(text: &str, file_name: &str) -> Result<Descriptor, ModelError> {
    let mut doc = Document::new(text, file_name);
    let Some(value) = doc.syntax() else {
        return Err(invalid(doc));
    };
    if value.is_null() {
        doc.issue_at(
            ".",
            None,
            "the descriptor is empty; write application, environment and artifacts",
        );
        return Err(invalid(doc));
    }
    if !value.is_mapping() {
        doc.issue(
            ".",
            "expected a mapping with application, environment and artifacts; write \
             `key: value` lines (YAML) or an object (JSON)",
        );
        return Err(invalid(doc));
    }
    let queue_paths = key_paths(&value, "queue");
    for path in &queue_paths {
        doc.issue(path.clone(), QUEUE_REFUSED);
    }
    let mut descriptor = match doc.typed::<Descriptor>() {
        Ok(descriptor) => descriptor,
        Err(issue) => {
            // An unknown `queue` field was already reported, with a better message.
            if !queue_paths.contains(&issue.field) {
                doc.issues.push(issue);
            }
            return Err(invalid(doc));
        }
    };
    validate(&mut doc, &mut descriptor);
    if doc.issues.is_empty() {
        Ok(descriptor)
    } else {
        Err(invalid(doc))
    }
}

fn invalid(doc: Document<'_>) -> ModelError {
    ModelError::DescriptorInvalid {
        file: doc.file.to_owned(),
        issues: doc.issues,
    }
}

fn validate(doc: &mut Document<'_>, d: &mut Descriptor) {
    let app_ok = rules::application(&d.application)
        .map_err(|e| doc.issue("application", format!("`{}` {e}", d.application)))
        .is_ok();
    let env_ok = rules::name(&d.environment)
        .map_err(|e| doc.issue("environment", format!("`{}` {e}", d.environment)))
        .is_ok();

    if d.artifacts.is_empty() {
        doc.issue(
            "artifacts",
            "is empty; list at least one artifact (name, type, version, url, sha256)",
        );
    }
    let mut names = BTreeSet::new();
    for (i, artifact) in d.artifacts.iter_mut().enumerate() {
        let at = |field: &str| format!("artifacts[{i}].{field}");
        if let Err(e) = rules::artifact_name(&artifact.name) {
            doc.issue(at("name"), format!("`{}` {e}", artifact.name));
        } else if !names.insert(artifact.name.clone()) {
            doc.issue(
                at("name"),
                format!(
                    "`{}` is the name of an earlier artifact; artifact names must be unique \
                     (they are file names on the targets)",
                    artifact.name
                ),
            );
        }
        if let Err(e) = rules::name(&artifact.artifact_type) {
            doc.issue(at("type"), format!("`{}` {e}", artifact.artifact_type));
        }
        if let Err(e) = rules::version(&artifact.version) {
            doc.issue(at("version"), format!("`{}` {e}", artifact.version));
        }
        if artifact.reference.is_some() {
            match crate::environment::check_image_reference(artifact) {
                Ok(digest) => artifact.sha256 = digest,
                Err((field, e)) => doc.issue(at(field), e),
            }
            continue;
        }
        if artifact.url.is_empty() {
            doc.issue(
                at("url"),
                "is missing; write where to fetch the artifact (file://, http:// or https://), \
                 or `ref:` for an image in a registry",
            );
        } else if let Err(e) = rules::url(&artifact.url) {
            doc.issue(at("url"), format!("`{}` {e}", artifact.url));
        }
        match rules::sha256(&artifact.sha256) {
            Ok(()) => artifact.sha256.make_ascii_lowercase(),
            Err(e) => doc.issue(at("sha256"), e),
        }
    }

    if let Some(deploy) = &d.deploy {
        validate_overrides(doc, deploy);
    }
    if let Some(schedule) = &d.schedule {
        validate_schedule(doc, schedule);
    }
    if let Some(reason) = &d.irreversible
        && let Err(e) = rules::reason(reason)
    {
        doc.issue("irreversible", e);
    }
    let own = (app_ok && env_ok).then_some((d.application.as_str(), d.environment.as_str()));
    validate_dependencies(doc, "depends_on", &d.depends_on, own);
}

fn validate_overrides(doc: &mut Document<'_>, deploy: &DeployOverrides) {
    validate_deploy_fields(
        doc,
        deploy.plugin.as_deref(),
        deploy.dest.as_deref(),
        deploy.activate.as_deref(),
        deploy.commands.as_deref().unwrap_or_default(),
    );
    if deploy.commands.as_ref().is_some_and(Vec::is_empty) {
        doc.issue(
            "deploy.commands",
            "is empty; list the commands to run, or remove it to use the environment's",
        );
    }
    if let Some(variables) = &deploy.variables {
        crate::environment::scoped::validate_names(doc, "deploy.variables", variables.keys(), None);
    }
    if let Some(serde_json::Value::Object(params)) = &deploy.params {
        for key in params.keys() {
            if let Some(why) = reserved_param(key) {
                doc.issue(format!("deploy.params.{key}"), why);
            }
        }
    }
}

/// The variables ansible itself sets for a play (its "special variables" other than
/// `ansible_*`, which are refused as a prefix): set by a deploy as an extra variable, one
/// would change what a play runs on (`hostvars`, `groups`, `play_hosts`), where it reads
/// from (`playbook_dir`, `role_path`), what a task leaves out (`omit`) or what `vars[...]`
/// and `environment` answer. Play keywords (`port`, `timeout`, `name`) are not variables
/// and stay allowed (docs/security.md, "What a deployer can make a target run").
const ANSIBLE_MAGIC_VARIABLES: &[&str] = &[
    "hostvars",
    "groups",
    "group_names",
    "inventory_hostname",
    "inventory_hostname_short",
    "inventory_dir",
    "inventory_file",
    "playbook_dir",
    "play_hosts",
    "role_name",
    "role_names",
    "role_path",
    "role_uuid",
    "omit",
    "vars",
    "environment",
];

/// Why a deploy may not set the param `key`: the `ansible_*` connection, privilege and
/// interpreter variables and ansible's magic variables would let a deploy's params turn a
/// play against its targets into a play on the worker (`ansible_connection: local`). An
/// environment file (the operator's) may set them.
fn reserved_param(key: &str) -> Option<String> {
    let lower = key.to_ascii_lowercase();
    if lower.starts_with("ansible_") {
        Some(
            "variables named ansible_* choose how and where ansible connects, which user it \
             becomes and which interpreter it runs; a deploy may not set them (an environment \
             file may); remove it"
                .to_string(),
        )
    } else if ANSIBLE_MAGIC_VARIABLES.contains(&lower.as_str()) {
        Some(format!(
            "`{key}` is one of the variables ansible sets for a play (what it runs on, where \
             it reads from); a deploy may not set it; rename it"
        ))
    } else {
        None
    }
}

fn validate_schedule(doc: &mut Document<'_>, schedule: &Schedule) {
    match (&schedule.at, &schedule.cron) {
        (Some(_), Some(_)) => doc.issue(
            "schedule",
            "has both at and cron; write at for one deploy, or cron for recurring deploys",
        ),
        (None, None) => doc.issue(
            "schedule",
            "has neither at nor cron; write at: TIME for one deploy, or cron: EXPRESSION \
             (and timezone) for recurring deploys",
        ),
        _ => {}
    }
    if let Some(at) = &schedule.at {
        if let Err(e) = rules::rfc3339(at) {
            doc.issue("schedule.at", format!("`{at}` {e}"));
        }
        if schedule.timezone.is_some() && schedule.cron.is_none() {
            doc.issue(
                "schedule.timezone",
                "applies to cron only (at carries its own offset); remove it",
            );
        }
        if schedule.missed.is_some() && schedule.cron.is_none() {
            doc.issue(
                "schedule.missed",
                "applies to cron only (a deploy at a time runs once, however late); remove it",
            );
        }
    }
    if let Some(cron) = &schedule.cron
        && let Err(e) = cron_with_seconds(cron)
    {
        doc.issue("schedule.cron", format!("`{cron}` {e}"));
    }
    if let Some(timezone) = &schedule.timezone
        && let Err(e) = rules::timezone(timezone)
    {
        doc.issue("schedule.timezone", format!("`{timezone}` {e}"));
    }
}

/// Five cron fields, or six whose first is the second (0-59), for ticks closer than a minute.
fn cron_with_seconds(cron: &str) -> Result<(), String> {
    let fields: Vec<&str> = cron.split_whitespace().collect();
    if fields.len() != 6 {
        return rules::cron(cron);
    }
    // The second field has the minute's range and syntax.
    rules::cron(&format!("{} * * * *", fields[0]))
        .map_err(|e| e.replacen("minute field", "second field", 1))?;
    rules::cron(&fields[1..].join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{Expect, expect};

    const SHA: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn yaml(extra: &str) -> String {
        format!(
            "application: ml/trainer\nenvironment: prod\nartifacts:\n  - name: model.tgz\n    \
             type: tarball\n    version: 1.4.2\n    url: https://repo.example/model-1.4.2.tgz\n    \
             sha256: {SHA}\n{extra}"
        )
    }

    /// Parses `text` and renders the descriptor (as JSON) or every problem, one per line.
    fn check(text: &str, expected: Expect) {
        let actual = match parse_descriptor(text, "d.yml") {
            Ok(d) => serde_json::to_string_pretty(&d).unwrap(),
            Err(e) => e.to_string(),
        };
        expected.assert_eq(&actual);
    }

    #[test]
    fn valid_yaml() {
        check(
            &yaml(
                "deploy:\n  plugin: command\n  commands: [\"systemctl restart trainer\"]\n  \
                 params: {replicas: 2, tags: [a]}\nschedule:\n  cron: \"30 2 * * 1-5\"\n  \
                 timezone: Europe/Paris\ndry_run: true\ndepends_on:\n  - application: ml/features\n    \
                 environment: prod\n    timeout: 10m\n",
            ),
            expect![[r#"
                {
                  "application": "ml/trainer",
                  "environment": "prod",
                  "artifacts": [
                    {
                      "name": "model.tgz",
                      "type": "tarball",
                      "version": "1.4.2",
                      "url": "https://repo.example/model-1.4.2.tgz",
                      "sha256": "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
                    }
                  ],
                  "deploy": {
                    "plugin": "command",
                    "commands": [
                      "systemctl restart trainer"
                    ],
                    "params": {
                      "replicas": 2,
                      "tags": [
                        "a"
                      ]
                    }
                  },
                  "schedule": {
                    "cron": "30 2 * * 1-5",
                    "timezone": "Europe/Paris"
                  },
                  "dry_run": true,
                  "depends_on": [
                    {
                      "application": "ml/features",
                      "environment": "prod",
                      "timeout": "10m"
                    }
                  ]
                }"#]],
        );
    }

    #[test]
    fn numbers_are_read_as_text_where_text_is_expected() {
        let text = yaml("").replace("version: 1.4.2", "version: 2.0");
        let d = parse_descriptor(&text, "d.yml").unwrap();
        assert_eq!(d.artifacts[0].version, "2.0", "the artifact's version");
        assert!(!d.dry_run, "not a dry run unless asked");
        assert!(
            d.depends_on.is_empty(),
            "no dependencies unless given: {:?}",
            d.depends_on
        );
    }

    #[test]
    fn valid_json() {
        let text = format!(
            r#"{{
  "application": "web/shop",
  "environment": "staging",
  "artifacts": [
    {{"name": "shop", "type": "binary", "version": "7", "url": "file:///srv/shop",
      "sha256": "{}"}}
  ],
  "schedule": {{"at": "2030-01-01T00:00:00Z"}}
}}"#,
            SHA.to_uppercase()
        );
        check(
            &text,
            expect![[r#"
                {
                  "application": "web/shop",
                  "environment": "staging",
                  "artifacts": [
                    {
                      "name": "shop",
                      "type": "binary",
                      "version": "7",
                      "url": "file:///srv/shop",
                      "sha256": "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
                    }
                  ],
                  "schedule": {
                    "at": "2030-01-01T00:00:00Z"
                  },
                  "dry_run": false,
                  "depends_on": []
                }"#]],
        );
    }

    #[test]
    fn json_errors_name_field_and_line() {
        let text = format!(
            "{{\n\t\"application\": \"ml/x\",\n\t\"environment\": \"prod\",\n\t\"artifacts\": [{{\n\t\t\"name\": \"a\",\n\t\t\"type\": \"t\",\n\t\t\"version\": 1.10,\n\t\t\"url\": \"file:///a\",\n\t\t\"sha256\": \"{SHA}\",\n\t\t\"colour\": 1\n\t}}]\n}}\n"
        );
        check(
            &text,
            expect![
                "d.yml:10: artifacts[0].colour: unknown field `colour`; remove it or fix its spelling (fields allowed here: name, type, version, url, sha256, ref)"
            ],
        );
        let fixed = text.replace(",\n\t\t\"colour\": 1", "");
        let d = parse_descriptor(&fixed, "d.json").unwrap();
        assert_eq!(
            d.artifacts[0].version, "1.10",
            "a version that looks like a number stays text"
        );
        check(
            &fixed.replace("\"prod\"", "\"p/q\""),
            expect![
                "d.yml:3: environment: `p/q` contains '/'; use only letters, digits, `-`, `_` and `.`"
            ],
        );
    }

    #[test]
    fn syntax_errors() {
        check(
            "application: [ml\n",
            expect![[
                r#"d.yml:2: (top level): YAML syntax error: did not find expected ',' or ']' at line 2 column 1, while parsing a flow sequence at line 1 column 14; fix the indentation, colons or quotes there"#
            ]],
        );
        check(
            "{\"application\": \"ml/x\",\n \"environment\" \"prod\"}",
            expect![[
                r#"d.yml:2: (top level): JSON syntax error: expected `:`; fix the brackets, commas or quotes there"#
            ]],
        );
        check(
            "application: a\napplication: b\n",
            expect!["d.yml:2: application: `application` is written twice; keep only one"],
        );
        check(
            &yaml("deploy:\n  plugin: a\n  dest: /x\n  plugin: b\n"),
            expect!["d.yml:12: deploy.plugin: `plugin` is written twice; keep only one"],
        );
        check(
            "",
            expect![[
                r#"d.yml: (top level): the descriptor is empty; write application, environment and artifacts"#
            ]],
        );
        check(
            "- a\n",
            expect![[
                r#"d.yml: (top level): expected a mapping with application, environment and artifacts; write `key: value` lines (YAML) or an object (JSON)"#
            ]],
        );
    }

    #[test]
    fn structural_errors_name_field_and_line() {
        check(
            &yaml("colour: blue\n"),
            expect![
                "d.yml:9: colour: unknown field `colour`; remove it or fix its spelling (fields allowed here: application, environment, artifacts, deploy, schedule, dry_run, depends_on, irreversible)"
            ],
        );
        check(
            &yaml("").replace("    type: tarball\n", ""),
            expect![[r#"d.yml:4: artifacts[0].type: missing field `type`; add it"#]],
        );
        check(
            &yaml("dry_run: maybe\n"),
            expect![[
                r#"d.yml:9: dry_run: expected true or false, found "maybe"; write true or false, without quotes"#
            ]],
        );
        check(
            &yaml("depends_on:\n  - application: a/b\n    environment: x\n    timeout: 10\n"),
            expect![[
                r#"d.yml:12: depends_on[0].timeout: invalid duration "10" (time unit needed, for example 10sec or 10ms); write it like 10s, 5m, 1h or 250ms"#
            ]],
        );
        check(
            &yaml("deploy:\n  plugn: x\n"),
            expect![
                "d.yml:10: deploy.plugn: unknown field `plugn`; remove it or fix its spelling (fields allowed here: plugin, dest, activate, commands, params, variables)"
            ],
        );
        check(
            "application: a/b\nenvironment: e\n",
            expect![[r#"d.yml: artifacts: missing field `artifacts`; add it"#]],
        );
    }

    #[test]
    fn an_irreversible_reason_is_one_short_line_of_text() {
        let parsed = parse_descriptor(
            &yaml("irreversible: \"drops column users.legacy_name\"\n"),
            "d.yml",
        )
        .expect("a one-line reason is valid");
        assert_eq!(
            parsed.irreversible.as_deref(),
            Some("drops column users.legacy_name"),
            "the reason is kept as written"
        );
        check(
            &yaml("irreversible: \"  \"\n"),
            expect![[
                r#"d.yml:9: irreversible: is empty; say in a few words why this deploy cannot be undone (e.g. "drops column users.legacy_name"), or remove the field"#
            ]],
        );
        check(
            &yaml("irreversible: \"drops\\nusers\"\n"),
            expect![[
                r#"d.yml:9: irreversible: spans several lines; write the reason on one line"#
            ]],
        );
        check(
            &yaml("irreversible: \"drops \\e[31musers\"\n"),
            expect![[r#"d.yml:9: irreversible: contains the control character U+001B; remove it"#]],
        );
        check(
            &yaml(&format!("irreversible: {}\n", "x".repeat(201))),
            expect![[
                r#"d.yml:9: irreversible: is 201 characters long; write at most 200 (a sentence: it is shown in refusals and tables; link to the details)"#
            ]],
        );
        check(
            &yaml("irreversible: true\n"),
            expect![[
                r#"d.yml:9: irreversible: is `true`, not a reason: the field marks the deploy by saying why it cannot be undone (e.g. "drops column users.legacy_name"); remove it for a deploy that can"#
            ]],
        );
    }

    #[test]
    fn a_deploy_may_not_set_ansibles_connection_or_magic_variables() {
        check(
            &yaml(
                "deploy:\n  params: {ansible_connection: local, Ansible_Host: x, hostvars: 1, tag: ok}\n",
            ),
            expect![[r#"
                d.yml:10: deploy.params.Ansible_Host: variables named ansible_* choose how and where ansible connects, which user it becomes and which interpreter it runs; a deploy may not set them (an environment file may); remove it
                d.yml:10: deploy.params.ansible_connection: variables named ansible_* choose how and where ansible connects, which user it becomes and which interpreter it runs; a deploy may not set them (an environment file may); remove it
                d.yml:10: deploy.params.hostvars: `hostvars` is one of the variables ansible sets for a play (what it runs on, where it reads from); a deploy may not set it; rename it"#]],
        );
    }

    #[test]
    fn a_deploy_may_not_set_the_variables_ansible_sets_for_a_play_but_may_use_keyword_names() {
        check(
            &yaml(
                "deploy:\n  params: {play_hosts: [web1], Vars: {}, environment: prod, role_path: /x, \
                 port: 8080, timeout: 5, name: shop}\n",
            ),
            expect![[r#"
                d.yml:10: deploy.params.Vars: `Vars` is one of the variables ansible sets for a play (what it runs on, where it reads from); a deploy may not set it; rename it
                d.yml:10: deploy.params.environment: `environment` is one of the variables ansible sets for a play (what it runs on, where it reads from); a deploy may not set it; rename it
                d.yml:10: deploy.params.play_hosts: `play_hosts` is one of the variables ansible sets for a play (what it runs on, where it reads from); a deploy may not set it; rename it
                d.yml:10: deploy.params.role_path: `role_path` is one of the variables ansible sets for a play (what it runs on, where it reads from); a deploy may not set it; rename it"#]],
        );
    }

    #[test]
    fn a_descriptor_cannot_choose_its_queue() {
        check(
            &yaml("queue: gpu\n"),
            expect![[
                r#"d.yml:9: queue: a descriptor cannot choose its queue: routing is operator configuration (queues, plugins.<name>.queue and tenants in manent.yml); remove this field"#
            ]],
        );
        check(
            &yaml("deploy:\n  queue: gpu\n  params: {queue: x}\n"),
            expect![[r#"
                d.yml:10: deploy.queue: a descriptor cannot choose its queue: routing is operator configuration (queues, plugins.<name>.queue and tenants in manent.yml); remove this field
                d.yml:11: deploy.params.queue: a descriptor cannot choose its queue: routing is operator configuration (queues, plugins.<name>.queue and tenants in manent.yml); remove this field"#]],
        );
        // In free parameters the rest of the descriptor is still checked.
        check(
            &yaml("deploy:\n  params: {queue: x}\ndry_run: true\n").replace("prod", "pr od"),
            expect![[r#"
                d.yml:10: deploy.params.queue: a descriptor cannot choose its queue: routing is operator configuration (queues, plugins.<name>.queue and tenants in manent.yml); remove this field
                d.yml:2: environment: `pr od` contains ' '; use only letters, digits, `-`, `_` and `.`"#]],
        );
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let text = format!(
            "application: trainer\nenvironment: \"\"\nartifacts:\n  - name: ../x\n    type: t\n    \
             version: a/b\n    url: s3://b/x\n    sha256: abc\n  - {{name: a, type: t, version: \"1\", \
             url: \"file:///a\", sha256: {SHA}}}\n  - {{name: a, type: t, version: \"1\", \
             url: \"http://h/a\", sha256: {SHA}}}\n"
        );
        check(
            &text,
            expect![[r#"
                d.yml:1: application: `trainer` must be qualified with its tenant, as `tenant/app` (e.g. `ml/trainer`)
                d.yml:2: environment: `` is empty; write a name of letters, digits, `-`, `_` or `.`
                d.yml:4: artifacts[0].name: `../x` is used as a file name on the targets: remove `/`, `\` and `..` from it
                d.yml:6: artifacts[0].version: `a/b` can be expanded into paths ({version}): remove `/`, `\` and `..`
                d.yml:7: artifacts[0].url: `s3://b/x` must start with file://, http:// or https://; other schemes are not supported
                d.yml:8: artifacts[0].sha256: must be 64 hexadecimal digits (found 3 characters); write the output of `sha256sum FILE`
                d.yml:10: artifacts[2].name: `a` is the name of an earlier artifact; artifact names must be unique (they are file names on the targets)"#]],
        );
        check(
            "application: a/b\nenvironment: e\nartifacts: []\n",
            expect![[
                r#"d.yml:3: artifacts: is empty; list at least one artifact (name, type, version, url, sha256)"#
            ]],
        );
    }

    #[test]
    fn overrides_schedules_and_dependencies() {
        check(
            &yaml(
                "deploy:\n  plugin: \"my plugin\"\n  dest: /opt/{app}/{version}\n  commands: []\n  \
                 activate: \" \"\n",
            ),
            expect![[r#"
                d.yml:10: deploy.plugin: `my plugin` contains ' '; use only letters, digits, `-`, `_` and `.`
                d.yml:11: deploy.dest: unknown placeholder `{app}`; the placeholders allowed here are {version}, {target}, {application}, {environment}
                d.yml:13: deploy.activate: is empty; write the command to run, or remove it
                d.yml:12: deploy.commands: is empty; list the commands to run, or remove it to use the environment's"#]],
        );
        check(
            &yaml("schedule:\n  at: 2030-01-01T00:00:00Z\n  cron: \"* * * * *\"\n"),
            expect![[
                r#"d.yml:9: schedule: has both at and cron; write at for one deploy, or cron for recurring deploys"#
            ]],
        );
        check(
            &yaml("schedule: {timezone: UTC}\n"),
            expect![[
                r#"d.yml:9: schedule: has neither at nor cron; write at: TIME for one deploy, or cron: EXPRESSION (and timezone) for recurring deploys"#
            ]],
        );
        check(
            &yaml("schedule:\n  at: tomorrow\n  timezone: UTC\n"),
            expect![[r#"
                d.yml:10: schedule.at: `tomorrow` is not a date-time; write an RFC 3339 time with its offset, e.g. 2025-03-01T02:00:00Z or 2025-03-01T02:00:00+01:00
                d.yml:11: schedule.timezone: applies to cron only (at carries its own offset); remove it"#]],
        );
        check(
            &yaml("schedule:\n  cron: \"61 * * * *\"\n  timezone: \"Mars Base\"\n"),
            expect![[r#"
                d.yml:10: schedule.cron: `61 * * * *` minute field `61` has 61, out of range 0-59
                d.yml:11: schedule.timezone: `Mars Base` is not a time zone name; write an IANA name such as UTC or Europe/Paris"#]],
        );
        check(
            &yaml("schedule:\n  at: 2030-01-01T00:00:00Z\n  missed: skip\n"),
            expect![[
                r#"d.yml:11: schedule.missed: applies to cron only (a deploy at a time runs once, however late); remove it"#
            ]],
        );
        check(
            &yaml("schedule:\n  cron: \"*/2 * * * * *\"\n  missed: sometimes\n"),
            expect![
                "d.yml:11: schedule.missed: unknown value `sometimes`; use one of: run_once, skip"
            ],
        );
        check(
            &yaml("schedule:\n  cron: \"60 * * * * *\"\n"),
            expect![
                "d.yml:10: schedule.cron: `60 * * * * *` second field `60` has 60, out of range 0-59"
            ],
        );
        check(
            &yaml(
                "schedule:\n  cron: \"*/5 0 2 * * 1-5\"\n  timezone: Europe/Paris\n  missed: skip\n",
            ),
            expect![[r#"
                {
                  "application": "ml/trainer",
                  "environment": "prod",
                  "artifacts": [
                    {
                      "name": "model.tgz",
                      "type": "tarball",
                      "version": "1.4.2",
                      "url": "https://repo.example/model-1.4.2.tgz",
                      "sha256": "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
                    }
                  ],
                  "schedule": {
                    "cron": "*/5 0 2 * * 1-5",
                    "timezone": "Europe/Paris",
                    "missed": "skip"
                  },
                  "dry_run": false,
                  "depends_on": []
                }"#]],
        );
        check(
            &yaml(
                "depends_on:\n  - {application: ml/trainer, environment: prod}\n  - {application: x, \
                 environment: prod}\n  - {application: a/b, environment: e}\n  - {application: a/b, \
                 environment: e}\n",
            ),
            expect![[r#"
                d.yml:10: depends_on[0]: ml/trainer/prod depends on itself; remove this entry
                d.yml:11: depends_on[1].application: `x` must be qualified with its tenant, as `tenant/app` (e.g. `ml/x`)
                d.yml:13: depends_on[3]: a/b/e is listed twice; keep one entry"#]],
        );
    }
}
