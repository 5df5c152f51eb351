//! Owns the routing decision made at submission: which queue a deploy goes to (plugin queue >
//! routed queue > tenant queue > default queue), region queue names, the partition key, and
//! the list of queues a configuration declares.

use manent_config::Config;
use serde::{Deserialize, Serialize};

use crate::descriptor::Descriptor;
use crate::environment::EnvironmentFile;
use crate::error::ModelError;

/// The queue deploys go to when nothing else routes them.
pub const DEFAULT_QUEUE: &str = "default";

/// What kind of queue a queue is (`manent queues`' `kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueKind {
    /// The default queue.
    Default,
    /// A tenant's dedicated queue (`tenants[].queue`).
    Tenant,
    /// `<queue>.<region>`, registered by workers with region routing.
    Region,
    /// A plugin's own queue (`plugins.<name>.queue`).
    Plugin,
    /// A routed queue (`queues[]`).
    Routed,
}

impl QueueKind {
    /// `default`, `tenant`, `region`, `plugin` or `routed`.
    pub fn as_str(self) -> &'static str {
        match self {
            QueueKind::Default => "default",
            QueueKind::Tenant => "tenant",
            QueueKind::Region => "region",
            QueueKind::Plugin => "plugin",
            QueueKind::Routed => "routed",
        }
    }
}

impl std::fmt::Display for QueueKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The route of a deploy, decided at submission and recorded in the request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    /// The queue's name.
    pub queue: String,
    /// Why this queue.
    pub kind: QueueKind,
    /// For a plugin queue, the plugin that owns it; `None` for other kinds.
    pub plugin: Option<String>,
}

impl Route {
    fn new(queue: &str, kind: QueueKind, plugin: Option<&str>) -> Route {
        Route {
            queue: queue.to_owned(),
            kind,
            plugin: plugin.map(str::to_owned),
        }
    }
}

/// Decides the queue of a deploy of `descriptor` at submission. `environment` is its
/// environment configuration, or why it could not be had.
///
/// 1. Plugin queue: the plugin of the effective descriptor (the descriptor's `deploy.plugin`,
///    else the environment file's `deploy.plugin`) if it has `plugins.<name>.queue`. When the
///    environment configuration cannot be had and the descriptor names no plugin, the first
///    artifact (in order) whose type is claimed by a plugin with a queue decides.
/// 2. Routed queue: the first `queues` entry whose `match` applies to the application
///    (qualified with its tenant), the artifact names and the environment.
/// 3. Tenant queue: the tenant's `queue` in the tenant registry.
/// 4. The default queue.
pub fn route(
    config: &Config,
    descriptor: &Descriptor,
    environment: Result<&EnvironmentFile, &ModelError>,
) -> Route {
    if let Some(route) = plugin_route(config, descriptor, environment) {
        return route;
    }
    if let Some(queue) = config.routed_queue_for(
        &descriptor.application,
        descriptor.artifact_names(),
        &descriptor.environment,
    ) {
        return Route::new(&queue.name, QueueKind::Routed, None);
    }
    if let Some(queue) = config
        .tenant(descriptor.tenant())
        .and_then(|tenant| tenant.queue.as_deref())
    {
        return Route::new(queue, QueueKind::Tenant, None);
    }
    Route::new(DEFAULT_QUEUE, QueueKind::Default, None)
}

fn plugin_route(
    config: &Config,
    descriptor: &Descriptor,
    environment: Result<&EnvironmentFile, &ModelError>,
) -> Option<Route> {
    // The descriptor's plugin is the effective one whatever the environment says.
    let effective_plugin = descriptor
        .plugin_override()
        .or_else(|| environment.ok().map(|env| env.deploy.plugin.as_str()));
    match effective_plugin {
        Some(plugin) => config
            .plugin_queue(plugin)
            .map(|queue| Route::new(queue, QueueKind::Plugin, Some(plugin))),
        // The environment configuration cannot be had: route by artifact type.
        None => descriptor.artifacts.iter().find_map(|artifact| {
            config
                .plugin_for_artifact_type(&artifact.artifact_type)
                .map(|(plugin, queue)| Route::new(queue, QueueKind::Plugin, Some(plugin)))
        }),
    }
}

/// `<queue>.<region>`: the queue of a region's passes under region routing.
pub fn region_queue(queue: &str, region: &str) -> String {
    format!("{queue}.{region}")
}

/// `<application>/<environment>`: the partition of the queue, limited by
/// `environment_concurrency`.
pub fn partition_key(application: &str, environment: &str) -> String {
    format!("{application}/{environment}")
}

/// Every queue `config` declares, once each: the default queue, the tenant queues (registry
/// order), the plugin queues (by plugin name) and the routed queues (in order). Region queues
/// are added by the workers that serve them.
pub fn queue_kinds(config: &Config) -> Vec<(String, QueueKind)> {
    let mut out: Vec<(String, QueueKind)> = vec![(DEFAULT_QUEUE.to_owned(), QueueKind::Default)];
    let mut add = |name: &str, kind: QueueKind| {
        if !out.iter().any(|(n, _)| n == name) {
            out.push((name.to_owned(), kind));
        }
    };
    for tenant in &config.tenants {
        if let Some(queue) = &tenant.queue {
            add(queue, QueueKind::Tenant);
        }
    }
    for plugin in config.plugins.values() {
        if let Some(queue) = &plugin.queue {
            add(queue, QueueKind::Plugin);
        }
    }
    for queue in &config.queues {
        add(&queue.name, QueueKind::Routed);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::{parse_descriptor, parse_environment};

    const SHA: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    /// Plugins with queues (ansible claims type `ansible`, helm claims `chart`), a built-in
    /// plugin without queue, routed queues and tenants with and without queues.
    const CONFIG: &str = r#"
plugins:
  ansible:
    external: {command: /usr/local/bin/manent-plugin-ansible, sha256: "0000000000000000000000000000000000000000000000000000000000000000"}
    artifact_types: [ansible]
    queue: ansible
  helm:
    external: {command: /usr/local/bin/manent-plugin-helm, sha256: "0000000000000000000000000000000000000000000000000000000000000000"}
    artifact_types: [chart]
    queue: helm-pool
  command:
    artifact_types: [script]
queues:
  - name: gpu
    match:
      applications: ["ml/*"]
      artifacts: [trainer, scorer]
      environments: [prod]
  - name: gpu-any
    match:
      applications: ["ml/*"]
      artifacts: [trainer]
  - name: edge
    match:
      environments: ["edge-*"]
tenants:
  - name: ml
    queue: ml
  - name: web
"#;

    fn config() -> Config {
        Config::from_yaml_str(CONFIG, "manent.yml", std::iter::empty()).unwrap()
    }

    /// `app env artifact:type,…` plus an optional `deploy.plugin`.
    fn descriptor(app: &str, env: &str, artifacts: &str, plugin: Option<&str>) -> Descriptor {
        let artifacts: Vec<String> = artifacts
            .split(',')
            .map(|a| {
                let (name, kind) = a.split_once(':').unwrap();
                format!(
                    "  - {{name: {name}, type: {kind}, version: \"1\", url: \"file:///{name}\", \
                     sha256: {SHA}}}\n"
                )
            })
            .collect();
        let deploy = plugin
            .map(|p| format!("deploy: {{plugin: {p}}}\n"))
            .unwrap_or_default();
        parse_descriptor(
            &format!(
                "application: {app}\nenvironment: {env}\nartifacts:\n{}{deploy}",
                artifacts.concat()
            ),
            "d.yml",
        )
        .unwrap()
    }

    fn env_with_plugin(plugin: &str) -> EnvironmentFile {
        parse_environment(
            &format!("targets: [{{name: a, host: local}}]\ndeploy: {{plugin: {plugin}}}\n"),
            "e.yml",
            "x/y",
            "z",
        )
        .unwrap()
    }

    #[test]
    fn routing_table() {
        let config = config();
        let unavailable = ModelError::EnvironmentUnavailable {
            path: PathBuf::from("/env/ml/trainer/prod.yml"),
            reason: "No such file or directory (os error 2)".into(),
        };
        let invalid = ModelError::environment_invalid(
            "e.yml",
            vec![crate::Issue {
                file: "e.yml".into(),
                line: Some(1),
                field: "targets".into(),
                message: "bad".into(),
            }],
        );
        /// The environment file's plugin, or how it could not be had.
        enum Env {
            Plugin(&'static str),
            Unavailable,
            Invalid,
        }
        use Env::*;
        /// (application, environment, `name:type,…` artifacts, descriptor's deploy.plugin).
        type Submitted = (
            &'static str,
            &'static str,
            &'static str,
            Option<&'static str>,
        );
        /// (queue, kind, plugin) of the expected route.
        type Expected = (&'static str, QueueKind, Option<&'static str>);
        #[rustfmt::skip]
        let table: &[(&str, Submitted, Env, Expected)] = &[
            // Plugin queue, from the descriptor's deploy.plugin.
            ("plugin from descriptor",
             ("web/site", "prod", "site:tarball", Some("ansible")), Plugin("remote-copy"),
             ("ansible", QueueKind::Plugin, Some("ansible"))),
            // Plugin queue, from the environment file's deploy.plugin.
            ("plugin from environment file",
             ("web/site", "prod", "site:tarball", None), Plugin("helm"),
             ("helm-pool", QueueKind::Plugin, Some("helm"))),
            // The descriptor's plugin wins over the environment file's.
            ("descriptor plugin without queue beats environment plugin with queue",
             ("web/site", "prod", "site:chart", Some("remote-copy")), Plugin("helm"),
             ("default", QueueKind::Default, None)),
            // A plugin without queue does not route.
            ("plugin without queue",
             ("web/site", "prod", "site:script", None), Plugin("command"),
             ("default", QueueKind::Default, None)),
            // Environment readable: artifact types do not route.
            ("artifact type ignored when the environment is readable",
             ("web/site", "prod", "play:ansible", None), Plugin("remote-copy"),
             ("default", QueueKind::Default, None)),
            // Environment unreadable: by artifact type.
            ("environment unreadable: by artifact type",
             ("web/site", "prod", "play:ansible", None), Unavailable,
             ("ansible", QueueKind::Plugin, Some("ansible"))),
            ("environment unreadable: first artifact with a claimed type",
             ("web/site", "prod", "site:tarball,chart:chart,play:ansible", None), Unavailable,
             ("helm-pool", QueueKind::Plugin, Some("helm"))),
            ("environment unreadable: descriptor plugin still decides",
             ("web/site", "prod", "play:ansible", Some("helm")), Unavailable,
             ("helm-pool", QueueKind::Plugin, Some("helm"))),
            ("environment unreadable: no claimed type, tenant queue",
             ("ml/site", "prod", "site:tarball", None), Unavailable,
             ("ml", QueueKind::Tenant, None)),
            ("environment invalid: by artifact type too",
             ("web/site", "prod", "play:ansible", None), Invalid,
             ("ansible", QueueKind::Plugin, Some("ansible"))),
            // Plugin queue beats routed and tenant queues.
            ("plugin queue beats routed and tenant queues",
             ("ml/trainer", "prod", "trainer:ansible", None), Plugin("ansible"),
             ("ansible", QueueKind::Plugin, Some("ansible"))),
            ("plugin queue by type beats routed and tenant queues",
             ("ml/trainer", "prod", "trainer:ansible", None), Unavailable,
             ("ansible", QueueKind::Plugin, Some("ansible"))),
            // Routed beats tenant; the first matching entry wins.
            ("routed beats tenant, first matching entry wins",
             ("ml/trainer", "prod", "trainer:tarball", None), Plugin("remote-copy"),
             ("gpu", QueueKind::Routed, None)),
            ("second entry when the first does not match",
             ("ml/trainer", "staging", "trainer:tarball", None), Plugin("remote-copy"),
             ("gpu-any", QueueKind::Routed, None)),
            ("any artifact matching is enough",
             ("ml/trainer", "prod", "data:tarball,scorer:tarball", None), Plugin("remote-copy"),
             ("gpu", QueueKind::Routed, None)),
            // Empty lists match everything.
            ("empty lists match everything",
             ("web/site", "edge-paris", "anything:tarball", None), Plugin("remote-copy"),
             ("edge", QueueKind::Routed, None)),
            ("applications are qualified with the tenant",
             ("web/ml", "prod", "trainer:tarball", None), Plugin("remote-copy"),
             ("default", QueueKind::Default, None)),
            // Tenant queue.
            ("tenant queue",
             ("ml/scorer", "staging", "scorer:tarball", None), Plugin("remote-copy"),
             ("ml", QueueKind::Tenant, None)),
            ("tenant without queue",
             ("web/site", "prod", "site:tarball", None), Plugin("remote-copy"),
             ("default", QueueKind::Default, None)),
            // Default.
            ("unknown tenant",
             ("ops/tool", "prod", "tool:tarball", None), Unavailable,
             ("default", QueueKind::Default, None)),
        ];
        for (case, (app, env_name, artifacts, plugin), env, (queue, kind, route_plugin)) in table {
            let descriptor = descriptor(app, env_name, artifacts, *plugin);
            let env_file;
            let environment = match env {
                Plugin(p) => {
                    env_file = env_with_plugin(p);
                    Ok(&env_file)
                }
                Unavailable => Err(&unavailable),
                Invalid => Err(&invalid),
            };
            let actual = route(&config, &descriptor, environment);
            assert_eq!(
                actual,
                Route {
                    queue: queue.to_string(),
                    kind: *kind,
                    plugin: route_plugin.map(str::to_owned),
                },
                "{case}"
            );
        }
    }

    #[test]
    fn empty_configuration_routes_to_default() {
        let config = Config::from_yaml_str("{}", "manent.yml", std::iter::empty()).unwrap();
        let descriptor = descriptor("ml/trainer", "prod", "trainer:ansible", None);
        let unavailable = ModelError::EnvironmentUnavailable {
            path: PathBuf::from("x"),
            reason: "gone".into(),
        };
        assert_eq!(
            route(&config, &descriptor, Err(&unavailable)),
            Route {
                queue: DEFAULT_QUEUE.into(),
                kind: QueueKind::Default,
                plugin: None
            },
            "an unreadable environment routes to the default queue"
        );
        assert_eq!(
            queue_kinds(&config),
            vec![("default".to_owned(), QueueKind::Default)],
            "the default queue only"
        );
    }

    #[test]
    fn names_and_kinds() {
        assert_eq!(
            region_queue("default", "eu-west-1"),
            "default.eu-west-1",
            "a region queue is the queue dot the region"
        );
        assert_eq!(
            region_queue("ml", "us"),
            "ml.us",
            "a region queue is the queue dot the region"
        );
        assert_eq!(
            partition_key("ml/trainer", "prod"),
            "ml/trainer/prod",
            "the partition key is application/environment"
        );
        assert_eq!(
            serde_json::to_string(&Route {
                queue: "gpu".into(),
                kind: QueueKind::Routed,
                plugin: None
            })
            .unwrap(),
            r#"{"queue":"gpu","kind":"routed","plugin":null}"#,
            "a route's JSON"
        );
        let kinds: Vec<String> = [
            QueueKind::Default,
            QueueKind::Tenant,
            QueueKind::Region,
            QueueKind::Plugin,
            QueueKind::Routed,
        ]
        .iter()
        .map(|k| format!("{}={}", k, serde_json::to_string(k).unwrap()))
        .collect();
        assert_eq!(
            kinds,
            [
                "default=\"default\"",
                "tenant=\"tenant\"",
                "region=\"region\"",
                "plugin=\"plugin\"",
                "routed=\"routed\""
            ],
            "every queue kind's serde name"
        );
        let listed: Vec<String> = queue_kinds(&config())
            .into_iter()
            .map(|(name, kind)| format!("{name}:{kind}"))
            .collect();
        assert_eq!(
            listed,
            [
                "default:default",
                "ml:tenant",
                "ansible:plugin",
                "helm-pool:plugin",
                "gpu:routed",
                "gpu-any:routed",
                "edge:routed"
            ],
            "every declared queue with its kind, in order"
        );
    }
}
