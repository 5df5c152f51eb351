//! The queues of the configuration: which ones a worker registers and
//! dequeues, with which limits, and which exist at all (for `manent queues`).

use manent_config::Config;
use manent_engine::QueueSpec;
pub use manent_model::{DEFAULT_QUEUE, QueueKind, region_queue};

/// A queue with the limits every worker that serves it enforces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclaredQueue {
    pub name: String,
    pub kind: QueueKind,
    /// Per worker.
    pub concurrency: u32,
    /// Per `<application>/<environment>` partition, across workers.
    pub environment_concurrency: u32,
    /// Across workers; 0 = no limit.
    pub global_concurrency: u32,
}

impl DeclaredQueue {
    fn with_limits_of_default(config: &Config, name: &str, kind: QueueKind) -> Self {
        DeclaredQueue {
            name: name.to_string(),
            kind,
            concurrency: config.dbos.concurrency,
            environment_concurrency: config.dbos.environment_concurrency,
            global_concurrency: config.dbos.global_concurrency,
        }
    }

    pub fn spec(&self) -> QueueSpec {
        QueueSpec::new(&self.name)
            .kind(self.kind.as_str())
            .worker_concurrency(self.concurrency)
            .partition_concurrency(self.environment_concurrency)
            .global_concurrency(self.global_concurrency)
    }
}

/// Every queue the configuration declares: the default queue, the tenants'
/// queues, the plugins' queues and the routed queues (region queues exist
/// only where a worker declares its region). Routed queues are listed also
/// while no worker serves them.
pub fn declared_queues(config: &Config) -> Vec<DeclaredQueue> {
    manent_model::queue_kinds(config)
        .into_iter()
        .map(|(name, kind)| {
            match config
                .routed_queue(&name)
                .filter(|_| kind == QueueKind::Routed)
            {
                // A routed queue's own concurrency is its global limit, and also
                // caps its deploys on each worker (docs/configuration.md, `queues`).
                Some(routed) => DeclaredQueue {
                    concurrency: routed
                        .concurrency
                        .map_or(config.dbos.concurrency, |c| c.min(config.dbos.concurrency)),
                    global_concurrency: routed
                        .concurrency
                        .unwrap_or(config.dbos.global_concurrency),
                    ..DeclaredQueue::with_limits_of_default(config, &name, kind)
                },
                None => DeclaredQueue::with_limits_of_default(config, &name, kind),
            }
        })
        .collect()
}

/// The queues this worker registers and dequeues: the ones it knows, and no
/// other (as soon as plugin or routed queues exist, a worker must not take
/// theirs). With `dbos.exclusive`, only `dbos.queues` and `dbos.plugins`.
/// With `dbos.region` under region routing, also each queue's `<queue>.<region>`
/// for the passes on that region's targets.
pub fn worker_queues(config: &Config) -> Vec<DeclaredQueue> {
    let declared = declared_queues(config);
    let plugin_queues: Vec<&str> = config
        .dbos
        .plugins
        .iter()
        .filter_map(|p| config.plugins.get(p)?.queue.as_deref())
        .collect();
    let mine = |q: &DeclaredQueue| match q.kind {
        QueueKind::Default | QueueKind::Tenant => !config.dbos.exclusive,
        QueueKind::Plugin => plugin_queues.contains(&q.name.as_str()),
        QueueKind::Routed => config.dbos.queues.contains(&q.name),
        QueueKind::Region => false,
    };
    let mut out: Vec<DeclaredQueue> = declared.iter().filter(|q| mine(q)).cloned().collect();
    if config.dbos.region_routing
        && let Some(region) = &config.dbos.region
    {
        let regional: Vec<DeclaredQueue> = out
            .iter()
            .map(|q| DeclaredQueue {
                name: region_queue(&q.name, region),
                kind: QueueKind::Region,
                ..q.clone()
            })
            .collect();
        out.extend(regional);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(yaml: &str, env: &[(&str, &str)]) -> Config {
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        Config::from_yaml_str(yaml, "manent.yml", env).expect("valid test config")
    }

    fn check(yaml: &str, env: &[(&str, &str)], expected: &[&str]) {
        let names: Vec<String> = worker_queues(&config(yaml, env))
            .into_iter()
            .map(|q| q.name)
            .collect();
        assert_eq!(
            names, expected,
            "queues of a worker with config:\n{yaml}\nenv: {env:?}"
        );
    }

    const POOLS: &str = "
plugins:
  ansible:
    artifact_types: [ansible]
    queue: ansible
queues:
  - name: gpu
    match: {applications: [\"ml/*\"]}
    concurrency: 2
tenants:
  - name: ml
    queue: ml-queue
";

    #[test]
    fn a_plain_worker_serves_default_and_tenant_queues_only() {
        check(POOLS, &[], &["default", "ml-queue"]);
    }

    #[test]
    fn a_pool_worker_adds_its_plugins_and_routed_queues() {
        check(
            POOLS,
            &[
                ("MANENT__DBOS__PLUGINS", "ansible"),
                ("MANENT__DBOS__QUEUES", "gpu"),
            ],
            &["default", "ml-queue", "ansible", "gpu"],
        );
    }

    #[test]
    fn an_exclusive_worker_serves_only_its_pools() {
        check(
            POOLS,
            &[
                ("MANENT__DBOS__QUEUES", "gpu"),
                ("MANENT__DBOS__EXCLUSIVE", "true"),
            ],
            &["gpu"],
        );
    }

    #[test]
    fn a_regional_worker_also_serves_the_region_queues() {
        check(
            "dbos: {region_routing: true, region: eu}",
            &[],
            &["default", "default.eu"],
        );
    }

    #[test]
    fn a_routed_queue_concurrency_is_global_and_caps_each_worker() {
        let c = config(POOLS, &[("MANENT__DBOS__CONCURRENCY", "8")]);
        let gpu = declared_queues(&c)
            .into_iter()
            .find(|q| q.name == "gpu")
            .unwrap();
        assert_eq!(
            (gpu.global_concurrency, gpu.concurrency),
            (2, 2),
            "2 overall and at most 2 per worker"
        );
    }

    #[test]
    fn routed_queues_are_declared_even_without_workers() {
        let kinds: Vec<(String, QueueKind)> = declared_queues(&config(POOLS, &[]))
            .into_iter()
            .map(|q| (q.name, q.kind))
            .collect();
        assert!(
            kinds.contains(&("gpu".into(), QueueKind::Routed)),
            "{kinds:?}"
        );
        assert!(
            kinds.contains(&("ansible".into(), QueueKind::Plugin)),
            "{kinds:?}"
        );
    }
}
