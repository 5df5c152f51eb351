//! `deploy.container` and `deploy.proxy` of an environment file: the `container` plugin's
//! settings (docs/containers.md): the runtime, the container's name, port, variables,
//! arguments and volumes, its health check, how long it may take to stop, how many
//! stopped versions stay for rollback; the proxy's listen address.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::serde_util::{duration, nullable};
use crate::source::Document;

/// The plugin that runs each version as a container behind a proxy.
pub const CONTAINER_PLUGIN: &str = "container";

/// The placeholders of `deploy.container.name`.
pub const CONTAINER_NAME_PLACEHOLDERS: &[&str] = &["target", "application", "environment"];

/// The placeholders of `deploy.proxy.listen`.
pub const PROXY_LISTEN_PLACEHOLDERS: &[&str] = &["host", "target"];

/// The artifact type of an image archive (`podman save`, `docker save`).
pub const IMAGE_ARTIFACT: &str = "image";

/// `deploy.container`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContainerSettings {
    /// `auto` (podman if the target has it, else docker), `podman` or `docker`.
    #[serde(default)]
    pub runtime: ContainerRuntime,
    /// The containers' name before `-<version>` (`{target}`, `{application}`,
    /// `{environment}`); default `{application}-{environment}`, `/` made `-`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The port the application listens on inside the container.
    pub port: u16,
    /// Variables set in the container, over the environment's variables and secrets.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub env: BTreeMap<String, String>,
    /// Arguments after the image (the image's command is replaced by them).
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub args: Vec<String>,
    /// Volumes, as the runtime's `-v` takes them (`/srv/data:/data`).
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub volumes: Vec<String>,
    /// What must answer 2xx before the proxy sends the new container anything.
    #[serde(default)]
    pub health: ContainerHealth,
    /// How long a container has to finish its requests and stop before it is killed.
    #[serde(default = "default_stop_timeout", with = "duration")]
    pub stop_timeout: Duration,
    /// Stopped versions kept on each target for rollback (with their images).
    #[serde(default = "default_keep")]
    pub keep: u32,
}

/// `deploy.container.runtime`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ContainerRuntime {
    #[default]
    Auto,
    Podman,
    Docker,
}

impl ContainerRuntime {
    pub fn as_str(self) -> &'static str {
        match self {
            ContainerRuntime::Auto => "auto",
            ContainerRuntime::Podman => "podman",
            ContainerRuntime::Docker => "docker",
        }
    }
}

/// `deploy.container.health`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContainerHealth {
    /// An HTTP path on the container's `port` (default `/`).
    #[serde(default = "default_health_path")]
    pub path: String,
    /// Between two attempts (default 1s).
    #[serde(default = "default_interval", with = "duration")]
    pub interval: Duration,
    /// How long it may take to answer 2xx before the new container is given up (default
    /// 30s).
    #[serde(default = "default_health_timeout", with = "duration")]
    pub timeout: Duration,
}

impl Default for ContainerHealth {
    fn default() -> Self {
        ContainerHealth {
            path: default_health_path(),
            interval: default_interval(),
            timeout: default_health_timeout(),
        }
    }
}

/// `deploy.proxy`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxySettings {
    /// Where the proxy listens on each target, `address:port` (`{host}`, `{target}`).
    pub listen: String,
}

/// What runs on a target under the `container` plugin once a deploy switched it (or a
/// rollback switched it back): its container, image and the proxy in front, as the
/// container steps recorded them (`manent status`, the release manifest, `manent drift`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunningContainer {
    /// `<name>-<version>`.
    pub name: String,
    /// The image's tag on the target (`localhost/manent/<name>:<version>`).
    pub image: String,
    /// The image's id as the runtime reports it (`sha256:…`, the digest of its
    /// configuration); empty when the runtime did not say.
    pub image_digest: String,
    /// Where the container's port is published on the target (`127.0.0.1:<port>`).
    pub address: String,
    /// The proxy in front of it.
    pub proxy: ProxyState,
}

/// The proxy in front of a target's containers, as the switch left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProxyState {
    /// `deploy.proxy.listen` expanded for the target.
    pub listen: String,
    /// The server it sends new requests to: the container's name.
    pub server: String,
    /// That server's address (the container's `address`).
    pub upstream: String,
}

fn default_stop_timeout() -> Duration {
    Duration::from_secs(10)
}

fn default_keep() -> u32 {
    2
}

fn default_health_path() -> String {
    "/".to_owned()
}

fn default_interval() -> Duration {
    Duration::from_secs(1)
}

fn default_health_timeout() -> Duration {
    Duration::from_secs(30)
}

/// An artifact's `ref` checked (docs/containers.md, "Registry references"): an image in
/// a registry pinned by digest, `registry/app@sha256:<64 hex>`, of type `image`, without a
/// `url`, and a `sha256` (if written) equal to the digest. The digest (lower case), or the
/// field at fault and what to do.
pub(crate) fn check_image_reference(
    artifact: &crate::Artifact,
) -> Result<String, (&'static str, String)> {
    let reference = artifact.reference.as_deref().unwrap_or_default();
    let digest = image_reference(reference).map_err(|e| ("ref", e))?;
    if artifact.artifact_type != IMAGE_ARTIFACT {
        return Err((
            "type",
            format!(
                "is `{}`, but a `ref` names an image in a registry; write type: {IMAGE_ARTIFACT}",
                artifact.artifact_type
            ),
        ));
    }
    if !artifact.url.is_empty() {
        return Err((
            "url",
            "is set beside `ref`; keep one: `ref` for an image the target pulls, `url` for an \
             archive manent fetches"
                .to_owned(),
        ));
    }
    if !artifact.sha256.is_empty() && !artifact.sha256.eq_ignore_ascii_case(&digest) {
        return Err((
            "sha256",
            format!(
                "is not the digest of `ref` ({digest}); remove it (the reference's digest is \
                 the one verified) or correct it"
            ),
        ));
    }
    Ok(digest)
}

/// The digest of `reference` if it is `name@sha256:<64 hex>`, `name` a registry's image
/// name (lower-case letters, digits, `.`, `_`, `-`, `/`, and a `:port` after the registry).
pub fn image_reference(reference: &str) -> Result<String, String> {
    let pin = "pin it by digest: `registry.example.com/app@sha256:<64 hex digits>` (the \
               digest `podman image inspect --format '{{.Digest}}' IMAGE` or the registry \
               prints); a tag can be moved to another image, a digest cannot";
    let Some((name, digest)) = reference.split_once('@') else {
        return Err(format!("`{reference}` is not pinned by digest; {pin}"));
    };
    let Some(hex) = digest.strip_prefix("sha256:") else {
        return Err(format!(
            "`{reference}`: the digest must be `sha256:` and 64 hexadecimal digits; {pin}"
        ));
    };
    if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!(
            "`{reference}`: the digest must be `sha256:` and 64 hexadecimal digits (found {} \
             characters); {pin}",
            hex.chars().count()
        ));
    }
    let path = name
        .split_once(':')
        .map_or(name, |(registry, port_and_path)| {
            // `registry:5000/app`: the port belongs to the registry, a tag after it is refused.
            if port_and_path.split('/').next().is_some_and(|p| {
                !p.is_empty()
                    && p.chars().all(|c| c.is_ascii_digit())
                    && port_and_path.contains('/')
            }) {
                registry
            } else {
                ""
            }
        });
    let valid = !name.is_empty()
        && !path.is_empty()
        && name.chars().all(|c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-' | '/' | ':')
        })
        && name.matches(':').count() <= 1
        && !name.starts_with(['/', '.', '-'])
        && !name.ends_with('/')
        && !name.contains("//");
    if !valid {
        return Err(format!(
            "`{reference}`: `{name}` is not an image name (lower-case letters, digits, `.`, `_`, \
             `-`, `/`, a registry's `:port`; no tag beside the digest); {pin}"
        ));
    }
    Ok(hex.to_ascii_lowercase())
}

/// Whether `name` may be a variable name passed to a container.
fn variable_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Checks `deploy.container` and `deploy.proxy`, each problem an issue of the document.
pub(super) fn validate(doc: &mut Document<'_>, deploy: &super::DeploySettings) {
    let is_container = deploy.plugin == CONTAINER_PLUGIN;
    match (&deploy.container, is_container) {
        (None, true) => doc.issue(
            "deploy.container",
            "the container plugin needs deploy.container (at least its port); see \
             docs/containers.md",
        ),
        (Some(_), false) => doc.issue(
            "deploy.container",
            format!(
                "is set, but deploy.plugin is `{}`; set deploy.plugin: {CONTAINER_PLUGIN} or \
                 remove deploy.container",
                deploy.plugin
            ),
        ),
        _ => {}
    }
    match (&deploy.proxy, is_container) {
        (None, true) => doc.issue(
            "deploy.proxy",
            "the container plugin needs deploy.proxy.listen, where the proxy in front of the \
             containers listens (`{host}:80`)",
        ),
        (Some(_), false) => doc.issue(
            "deploy.proxy",
            format!("is set, but only the {CONTAINER_PLUGIN} plugin runs a proxy"),
        ),
        _ => {}
    }
    if let Some(c) = &deploy.container {
        if c.port == 0 {
            doc.issue(
                "deploy.container.port",
                "is 0; write the port the application listens on in the container",
            );
        }
        if let Some(name) = &c.name
            && let Err(e) = crate::rules::placeholders(name, CONTAINER_NAME_PLACEHOLDERS)
        {
            doc.issue("deploy.container.name", e);
        }
        for name in c.env.keys().filter(|n| !variable_name(n)) {
            doc.issue(
                format!("deploy.container.env.{name}"),
                "is not a variable name (letters, digits and `_`, not starting with a digit)",
            );
        }
        if !c.health.path.starts_with('/') || c.health.path.contains(char::is_whitespace) {
            doc.issue(
                "deploy.container.health.path",
                format!(
                    "`{}` is not a path; write one starting with `/`",
                    c.health.path
                ),
            );
        }
        if c.health.interval.is_zero() {
            doc.issue(
                "deploy.container.health.interval",
                "is 0; write a duration such as 1s",
            );
        }
    }
    if let Some(p) = &deploy.proxy {
        if let Err(e) = crate::rules::placeholders(&p.listen, PROXY_LISTEN_PLACEHOLDERS) {
            doc.issue("deploy.proxy.listen", e);
        } else if !p.listen.chars().all(|c| {
            c.is_ascii_alphanumeric() || matches!(c, '.' | ':' | '[' | ']' | '-' | '{' | '}' | '*')
        }) {
            doc.issue(
                "deploy.proxy.listen",
                format!("`{}` holds a character an address never has", p.listen),
            );
        } else if !p
            .listen
            .rsplit_once(':')
            .is_some_and(|(_, port)| port.parse::<u16>().is_ok_and(|p| p > 0))
        {
            doc.issue(
                "deploy.proxy.listen",
                format!(
                    "`{}` is not `address:port`; write one such as `{{host}}:80`",
                    p.listen
                ),
            );
        }
    }
}

/// The name of a container of `version`: `<name>-<version>`, each character a runtime
/// refuses in a name made `-` (`/` of `tenant/app`, `+` of a version).
pub fn container_name(base: &str, version: &str) -> String {
    sanitise(&format!("{base}-{version}"))
}

/// `deploy.container.name` expanded for a target (or its default), made a valid name.
pub fn container_base(
    settings: &ContainerSettings,
    target: &str,
    application: &str,
    environment: &str,
) -> String {
    let template = settings
        .name
        .as_deref()
        .unwrap_or("{application}-{environment}");
    sanitise(&crate::rules::expand(
        template,
        &[
            ("target", target),
            ("application", application),
            ("environment", environment),
        ],
    ))
}

fn sanitise(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    if !out.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        out.insert(0, 'c');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_container_is_named_after_its_application_and_version_in_characters_a_runtime_takes() {
        let settings: ContainerSettings = yaml_serde::from_str("port: 8080").unwrap();
        let base = container_base(&settings, "web1", "shop/api", "prod");
        expect_test::expect!["shop-api-prod-1.2+build3"].assert_eq(&format!("{base}-1.2+build3"));
        expect_test::expect!["shop-api-prod-1.2-build3"]
            .assert_eq(&container_name(&base, "1.2+build3"));
    }

    #[test]
    fn a_registry_reference_is_taken_only_pinned_by_digest() {
        let hex = "ab".repeat(32);
        assert_eq!(
            image_reference(&format!(
                "registry.example.com:5000/shop/api@sha256:{}",
                hex.to_uppercase()
            )),
            Ok(hex.clone()),
            "a reference with a registry's port and a digest is taken, the digest lower-cased"
        );
        for (reference, why) in [
            ("registry.example.com/shop/api:1.4", "not pinned by digest"),
            (
                "registry.example.com/shop/api@sha256:abc",
                "found 3 characters",
            ),
            ("registry.example.com/shop/api@md5:abc", "must be `sha256:`"),
            (
                &format!("registry.example.com/shop/api:1.4@sha256:{hex}"),
                "no tag beside the digest",
            ),
            (&format!("Shop/API@sha256:{hex}"), "is not an image name"),
        ] {
            let e = image_reference(reference).unwrap_err();
            assert!(
                e.contains(why) && e.contains("pin it by digest"),
                "`{reference}` is refused saying {why:?} and what to write: {e}"
            );
        }
    }

    #[test]
    fn a_descriptor_with_an_unpinned_reference_is_refused_naming_its_file_line_and_field() {
        let text = |reference: &str| {
            format!(
                "application: shop/api\nenvironment: prod\nartifacts:\n  - name: api\n    \
                 type: image\n    version: \"1.4\"\n    ref: {reference}\n"
            )
        };
        let e = crate::parse_descriptor(&text("registry.example.com/shop/api:1.4"), "deploy.yml")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("deploy.yml:7: artifacts[0].ref:") && e.contains("pin it by digest"),
            "the error names the file, line and field, and says to pin the digest: {e}"
        );
        let hex = "cd".repeat(32);
        let d = crate::parse_descriptor(
            &text(&format!("registry.example.com/shop/api@sha256:{hex}")),
            "deploy.yml",
        )
        .expect("a pinned reference is taken");
        assert_eq!(
            (d.artifacts[0].sha256.as_str(), d.artifacts[0].url.as_str()),
            (hex.as_str(), ""),
            "the artifact's sha256 is the reference's digest and it has no url: {d:?}"
        );
    }

    #[test]
    fn container_settings_have_defaults_for_all_but_the_port() {
        let settings: ContainerSettings = yaml_serde::from_str("port: 8080").unwrap();
        assert_eq!(
            (
                settings.runtime,
                settings.keep,
                settings.stop_timeout,
                settings.health.path.as_str()
            ),
            (ContainerRuntime::Auto, 2, Duration::from_secs(10), "/"),
            "the defaults of docs/containers.md: {settings:?}"
        );
        let missing = yaml_serde::from_str::<ContainerSettings>("name: x").unwrap_err();
        assert!(
            missing.to_string().contains("port"),
            "the port is required: {missing}"
        );
    }
}
