//! The queues of the configuration: which ones a worker registers and
//! dequeues, with which limits, and which exist at all (for `manent queues`).

use manent_config::Config;
use manent_engine::{LimitGroup, QueueSpec};
pub use manent_model::{DEFAULT_QUEUE, QueueKind, region_queue};

/// The limit group of every deploy queue (default, tenant, plugin and routed):
/// `dbos.concurrency`, `dbos.global_concurrency` and `environment_concurrency`
/// count the deploys running on all of them together. Region queues (the
/// passes of a deploy that already holds its slot) and the gate queue (waits)
/// are not in it.
pub const DEPLOY_LIMIT_GROUP: &str = "deploys";

/// A queue with the limits every worker that serves it enforces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclaredQueue {
    pub name: String,
    pub kind: QueueKind,
    /// `dbos.concurrency`: deploys running on one worker, over all deploy queues.
    pub concurrency: u32,
    /// `dbos.environment_concurrency`: deploys of one `<application>/<environment>`
    /// running at once, over all deploy queues and workers.
    pub environment_concurrency: u32,
    /// `dbos.global_concurrency`: deploys running in total; 0 = no limit.
    pub global_concurrency: u32,
    /// A routed queue's own `concurrency`: caps that queue in total and on
    /// each worker, on top of the limits above.
    pub queue_concurrency: Option<u32>,
}

impl DeclaredQueue {
    fn with_limits_of_default(config: &Config, name: &str, kind: QueueKind) -> Self {
        DeclaredQueue {
            name: name.to_string(),
            kind,
            concurrency: config.dbos.concurrency,
            environment_concurrency: config.dbos.environment_concurrency,
            global_concurrency: config.dbos.global_concurrency,
            queue_concurrency: None,
        }
    }

    /// Whether its deploys count against the shared deploy limits ([`DEPLOY_LIMIT_GROUP`]).
    pub fn in_deploy_group(&self) -> bool {
        self.kind != QueueKind::Region
    }

    /// The most deploys of this queue running on one worker at once.
    pub fn worker_cap(&self) -> u32 {
        self.queue_concurrency
            .map_or(self.concurrency, |c| c.min(self.concurrency))
    }

    /// The most deploys of this queue running at once in total; 0 = no limit.
    pub fn total_cap(&self) -> u32 {
        match (self.queue_concurrency, self.global_concurrency) {
            (Some(q), 0) => q,
            (Some(q), g) => q.min(g),
            (None, g) => g,
        }
    }

    /// The deploy limits shared by every deploy queue.
    pub fn deploy_group(&self) -> LimitGroup {
        LimitGroup {
            name: DEPLOY_LIMIT_GROUP.to_string(),
            worker: Some(self.concurrency),
            partition: Some(self.environment_concurrency),
            global: (self.global_concurrency > 0).then_some(self.global_concurrency),
        }
    }

    pub fn spec(&self) -> QueueSpec {
        let spec = QueueSpec::new(&self.name).kind(self.kind.as_str());
        if self.in_deploy_group() {
            // The queue's own limits are only a routed queue's cap; the rest
            // is counted over the group.
            spec.worker_concurrency(self.worker_cap())
                .global_concurrency(self.queue_concurrency.unwrap_or(0))
                .group(self.deploy_group())
        } else {
            // A region queue runs the passes of deploys counted on their own
            // queue; it keeps per-queue limits so a pass never waits for a
            // slot its own deploy holds.
            spec.worker_concurrency(self.concurrency)
                .partition_concurrency(self.environment_concurrency)
                .global_concurrency(self.global_concurrency)
        }
    }
}

/// Every queue the configuration declares: the default queue, the tenants'
/// queues, the plugins' queues and the routed queues (region queues exist
/// only where a worker declares its region). Routed queues are listed also
/// while no worker serves them.
pub fn declared_queues(config: &Config) -> Vec<DeclaredQueue> {
    manent_model::queue_kinds(config)
        .into_iter()
        .map(|(name, kind)| DeclaredQueue {
            queue_concurrency: config
                .routed_queue(&name)
                .filter(|_| kind == QueueKind::Routed)
                .and_then(|routed| routed.concurrency),
            ..DeclaredQueue::with_limits_of_default(config, &name, kind)
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
            (gpu.total_cap(), gpu.worker_cap()),
            (2, 2),
            "2 overall and at most 2 per worker"
        );
        let spec = gpu.spec();
        assert_eq!(
            (spec.global_concurrency, spec.worker_concurrency),
            (2, 2),
            "the queue's own claims are capped at 2 in total and per worker"
        );
        let group = spec.group.expect("a routed queue shares the deploy limits");
        assert_eq!(
            (
                group.name.as_str(),
                group.worker,
                group.partition,
                group.global
            ),
            (DEPLOY_LIMIT_GROUP, Some(8), Some(1), None),
            "dbos.concurrency 8 per worker and environment_concurrency 1 over all deploy queues"
        );
    }

    #[test]
    fn default_tenant_and_plugin_queues_share_the_deploy_limits_and_region_queues_do_not() {
        let c = config(
            "dbos: {region_routing: true, region: eu, global_concurrency: 3}",
            &[],
        );
        for q in worker_queues(&c) {
            let spec = q.spec();
            match q.kind {
                QueueKind::Region => assert!(
                    spec.group.is_none(),
                    "{}: a pass must not wait for the slot its deploy holds",
                    q.name
                ),
                _ => assert_eq!(
                    spec.group.as_ref().and_then(|g| g.global),
                    Some(3),
                    "{}: global_concurrency counts over all deploy queues",
                    q.name
                ),
            }
        }
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
