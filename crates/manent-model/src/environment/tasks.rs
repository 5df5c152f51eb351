//! Owns `deploy.tasks` (commands run from a new release, on the targets of some roles, or
//! once per deploy), the roles that select targets (`targets[].roles`, `checks[].roles`,
//! `tasks[].roles`), `deploy.mode` (the mode of release directories), and their validation
//! (docs/environments.md, "Tasks and roles", "Release directories").

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Check, EnvironmentFile, Target};
use crate::effective::EffectiveDescriptor;
use crate::serde_util::{duration, nullable};
use crate::source::Document;
use crate::{COMMAND_PLUGIN, DEFAULT_PLUGIN};

/// How long a task may run when its `timeout` is not written.
pub const DEFAULT_TASK_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// One of `deploy.tasks`: a command run from the new release on the targets having one of
/// `roles` (all when none), or on one of them per deploy (`once`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Task {
    /// Unique among the tasks; names its steps (`<target>: task <name>`).
    pub name: String,
    /// The shell command, run from the release directory (`MANENT_RELEASE`).
    pub run: String,
    /// Before the target is switched to the new release, or after and before its checks.
    pub when: TaskWhen,
    /// Run on one target per deploy: the first, in rollout order, having one of `roles`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub once: bool,
    /// The roles of the targets it runs on; every target when empty.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub roles: Vec<String>,
    /// The longest one run may take; it is stopped and fails past it.
    #[serde(default = "default_timeout", with = "duration")]
    pub timeout: Duration,
}

fn default_timeout() -> Duration {
    DEFAULT_TASK_TIMEOUT
}

/// `deploy.tasks[].when`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskWhen {
    /// From the new release once its files are in place, before it is activated; a `once`
    /// task of this kind runs before any target is switched.
    BeforeActivate,
    /// After the target is switched (its `activate`, or its commands), before its checks.
    AfterActivate,
}

impl TaskWhen {
    /// As written in the environment file.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskWhen::BeforeActivate => "before_activate",
            TaskWhen::AfterActivate => "after_activate",
        }
    }
}

/// Whether `target` has one of `roles`; every target has when `roles` is empty.
pub fn has_role(target: &Target, roles: &[String]) -> bool {
    roles.is_empty() || roles.iter().any(|role| target.roles.contains(role))
}

impl Check {
    /// Whether this check runs on `target` (`checks[].roles`).
    pub fn applies_to(&self, target: &Target) -> bool {
        has_role(target, &self.roles)
    }
}

impl EffectiveDescriptor {
    /// The target a `once` task runs on: the first, in rollout order (wave after wave),
    /// having one of its roles. None when no target has.
    pub fn once_target(&self, task: &Task) -> Option<Target> {
        crate::plan_waves(self)
            .into_iter()
            .flat_map(|wave| wave.targets)
            .find(|target| has_role(target, &task.roles))
    }

    /// The tasks that run `when` on `target` in this deploy, in the order written: those
    /// that are not `once` on each target having one of their roles, a `once` one only on
    /// its [`EffectiveDescriptor::once_target`].
    pub fn tasks_on(&self, target: &Target, when: TaskWhen) -> Vec<&Task> {
        self.tasks
            .iter()
            .filter(|task| task.when == when)
            .filter(|task| {
                if task.once {
                    self.once_target(task)
                        .is_some_and(|once| once.name == target.name)
                } else {
                    has_role(target, &task.roles)
                }
            })
            .collect()
    }

    /// The `once` tasks run before any target is switched, each with its target, in the
    /// order written.
    pub fn once_before_activate(&self) -> Vec<(&Task, Target)> {
        self.tasks
            .iter()
            .filter(|task| task.once && task.when == TaskWhen::BeforeActivate)
            .filter_map(|task| Some((task, self.once_target(task)?)))
            .collect()
    }
}

/// `deploy.mode`: the permission bits of the release directories manent makes, written as
/// an octal string (`"0750"`). Without it they follow the target user's umask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReleaseMode(pub u32);

impl ReleaseMode {
    /// The mode as `chmod` takes it: four octal digits.
    pub fn octal(self) -> String {
        format!("{:04o}", self.0)
    }

    fn parse(text: &str) -> Result<ReleaseMode, String> {
        let digits = text.strip_prefix("0o").unwrap_or(text);
        let valid =
            (3..=4).contains(&digits.len()) && digits.chars().all(|c| ('0'..='7').contains(&c));
        let mode = u32::from_str_radix(digits, 8)
            .ok()
            .filter(|_| valid)
            .filter(|mode| *mode <= 0o777)
            .ok_or_else(|| {
                format!(
                    "`{text}` is not a directory mode; write it in octal as a string, e.g. \
                     \"0755\" or \"0750\" (no setuid, setgid or sticky bit)"
                )
            })?;
        if mode & 0o700 != 0o700 {
            return Err(format!(
                "`{text}` takes from the deploying user what it needs in its own release \
                 directories (read, write and search: 07xx); write e.g. \"0750\""
            ));
        }
        Ok(ReleaseMode(mode))
    }
}

impl Serialize for ReleaseMode {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.octal())
    }
}

impl<'de> Deserialize<'de> for ReleaseMode {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = ReleaseMode;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an octal mode written as a string, such as \"0750\"")
            }

            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<ReleaseMode, E> {
                ReleaseMode::parse(text).map_err(E::custom)
            }

            fn visit_u64<E: serde::de::Error>(self, number: u64) -> Result<ReleaseMode, E> {
                Err(E::custom(format!(
                    "{number} is read as a decimal number; quote the mode so that it is read \
                     in octal, e.g. \"0{number}\""
                )))
            }

            fn visit_i64<E: serde::de::Error>(self, number: i64) -> Result<ReleaseMode, E> {
                self.visit_u64(number.unsigned_abs())
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// A role's name: lower-case letters, digits, `-` and `_`, starting with a letter or a
/// digit, at most 63 characters (`db`, `web`, `worker-eu`).
fn role_name(role: &str) -> Result<(), String> {
    let valid = !role.is_empty()
        && role.len() <= 63
        && role
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && role
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "`{role}` is not a role name; use lower-case letters, digits, `-` and `_` (at most \
             63, starting with a letter or digit), e.g. db, web, worker"
        ))
    }
}

/// Checks the roles of targets, checks and tasks, and the tasks themselves, pushing each
/// issue to `doc`: role names are valid and listed once; a role a check or task names is
/// some target's (a role no target has is a typo that would run nothing); task names are
/// unique, commands written, timeouts above zero, and tasks only under a built-in plugin.
pub(super) fn validate(doc: &mut Document<'_>, env: &EnvironmentFile) {
    let mut known: Vec<&str> = Vec::new();
    for (i, target) in env.targets.iter().enumerate() {
        for (r, role) in target.roles.iter().enumerate() {
            let at = format!("targets[{i}].roles[{r}]");
            if let Err(e) = role_name(role) {
                doc.issue(at, e);
            } else if target.roles[..r].contains(role) {
                doc.issue(at, format!("`{role}` is listed twice; keep one"));
            } else if !known.contains(&role.as_str()) {
                known.push(role);
            }
        }
    }
    for (i, check) in env.checks.iter().enumerate() {
        validate_selection(doc, &format!("checks[{i}].roles"), &check.roles, &known);
    }
    let tasks = &env.deploy.tasks;
    if !tasks.is_empty() && ![DEFAULT_PLUGIN, COMMAND_PLUGIN].contains(&env.deploy.plugin.as_str())
    {
        doc.issue(
            "deploy.tasks",
            format!(
                "tasks run under the built-in plugins ({DEFAULT_PLUGIN}, {COMMAND_PLUGIN}); this \
                 environment's is `{}`: remove the tasks or deploy with a built-in plugin",
                env.deploy.plugin
            ),
        );
    }
    if env.deploy.mode.is_some() && env.deploy.plugin != DEFAULT_PLUGIN {
        doc.issue(
            "deploy.mode",
            format!(
                "applies to the release directories of the {DEFAULT_PLUGIN} plugin only (this \
                 environment's is `{}`); remove it",
                env.deploy.plugin
            ),
        );
    }
    for (i, task) in tasks.iter().enumerate() {
        let at = |field: &str| format!("deploy.tasks[{i}].{field}");
        if let Err(e) = crate::rules::name(&task.name) {
            doc.issue(at("name"), format!("`{}` {e}", task.name));
        } else if tasks[..i].iter().any(|t| t.name == task.name) {
            doc.issue(
                at("name"),
                format!(
                    "`{}` is the name of an earlier task; task names must be unique",
                    task.name
                ),
            );
        }
        if task.run.trim().is_empty() {
            doc.issue(at("run"), "is empty; write the command the task runs");
        }
        if task.timeout.is_zero() {
            doc.issue(at("timeout"), "is 0; write a limit such as 10m");
        }
        validate_selection(doc, &at("roles"), &task.roles, &known);
    }
}

/// Checks the roles a check or a task selects targets by, at `field`.
fn validate_selection(doc: &mut Document<'_>, field: &str, roles: &[String], known: &[&str]) {
    for (r, role) in roles.iter().enumerate() {
        let at = format!("{field}[{r}]");
        if let Err(e) = role_name(role) {
            doc.issue(at, e);
        } else if !known.contains(&role.as_str()) {
            let have = if known.is_empty() {
                "no target has a role (targets[].roles)".to_string()
            } else {
                format!("the targets' roles are {}", known.join(", "))
            };
            doc.issue(
                at,
                format!("no target has the role `{role}`; {have}: fix the name or give a target the role"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_mode_is_an_octal_string_keeping_the_owners_access() {
        let parse = |text: &str| ReleaseMode::parse(text).map(ReleaseMode::octal);
        assert_eq!(parse("0750"), Ok("0750".into()), "the usual form");
        assert_eq!(parse("755"), Ok("0755".into()), "three digits are enough");
        for refused in ["0800", "07777", "4755", "", "rwx", "0650"] {
            assert!(
                parse(refused).is_err(),
                "`{refused}` is refused: {:?}",
                parse(refused)
            );
        }
    }

    #[test]
    fn role_names_are_short_lower_case_words() {
        for ok in ["db", "web", "worker-eu", "w_1", "1st"] {
            assert!(role_name(ok).is_ok(), "`{ok}` is a role name");
        }
        for bad in ["", "DB", "-db", "web server", "db,web", &"r".repeat(64)] {
            assert!(role_name(bad).is_err(), "`{bad}` is not a role name");
        }
    }
}
