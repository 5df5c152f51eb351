//! What one claim may take: the free slots and each partition's allowance,
//! computed from the running workflows counted inside the claiming
//! transaction (the queue's own and its limit group's). Pure arithmetic, so
//! the SQL of `sql.rs` only reads counts and writes the chosen rows.

use std::collections::HashMap;

use super::ClaimLimits;

/// Running workflows under one (scope, executor, partition), as the claim reads them.
pub(crate) struct Running {
    /// Counted under the queue's limit group (else under the queue itself).
    pub in_group: bool,
    pub executor_id: Option<String>,
    pub partition_key: String,
    pub count: i64,
}

/// How much one claim may take without exceeding any limit.
#[derive(Debug)]
pub(crate) struct ClaimPlan {
    /// Workflows the claim may take in all.
    pub free: i64,
    /// Per partition with running work: how many more it may start.
    allowance: HashMap<String, i64>,
    /// What a partition with no running work may start.
    idle_allowance: i64,
}

const UNLIMITED: i64 = i64::MAX / 4;

fn limit(n: Option<u32>) -> i64 {
    n.map_or(UNLIMITED, i64::from)
}

impl ClaimPlan {
    pub fn new(limits: &ClaimLimits, executor_id: &str, max: u32, running: &[Running]) -> Self {
        let group = limits.group.as_ref();
        let (mut queue_mine, mut queue_total, mut group_mine, mut group_total) = (0, 0, 0, 0);
        let mut queue_partition: HashMap<&str, i64> = HashMap::new();
        let mut group_partition: HashMap<&str, i64> = HashMap::new();
        for r in running {
            let mine = r.executor_id.as_deref() == Some(executor_id);
            let (own, total, partitions) = if r.in_group {
                (&mut group_mine, &mut group_total, &mut group_partition)
            } else {
                (&mut queue_mine, &mut queue_total, &mut queue_partition)
            };
            if mine {
                *own += r.count;
            }
            *total += r.count;
            *partitions.entry(r.partition_key.as_str()).or_default() += r.count;
        }
        let queue_global = if limits.global > 0 {
            i64::from(limits.global)
        } else {
            UNLIMITED
        };
        let mut free = (i64::from(limits.worker) - queue_mine)
            .min(queue_global - queue_total)
            .min(i64::from(max));
        if let Some(g) = group {
            free = free
                .min(limit(g.worker) - group_mine)
                .min(limit(g.global) - group_total);
        }
        let queue_part_limit = limit(limits.partition);
        let group_part_limit = limit(group.and_then(|g| g.partition));
        let idle_allowance = queue_part_limit.min(group_part_limit);
        let mut allowance = HashMap::new();
        for key in queue_partition.keys().chain(group_partition.keys()) {
            let left = (queue_part_limit - queue_partition.get(key).copied().unwrap_or(0))
                .min(group_part_limit - group_partition.get(key).copied().unwrap_or(0));
            allowance.insert((*key).to_string(), left);
        }
        ClaimPlan {
            free: if idle_allowance <= 0 { 0 } else { free.max(0) },
            allowance,
            idle_allowance,
        }
    }

    /// Partitions that may start nothing now (the claim's scan leaves them out).
    pub fn full_partitions(&self) -> impl Iterator<Item = &str> {
        self.allowance
            .iter()
            .filter(|(_, left)| **left <= 0)
            .map(|(key, _)| key.as_str())
    }

    /// Leaves `partition` out of the rest of this claim: its next workflow is one this
    /// executor cannot run (another workflow version), and a partition's workflows start
    /// in order, so nothing queued behind it is taken either. Workflows without a
    /// partition (`""`) have no order among them and are never blocked.
    pub fn block(&mut self, partition: &str) {
        if !partition.is_empty() {
            self.allowance.insert(partition.to_string(), 0);
        }
    }

    /// Takes one slot of `partition` if it has one left.
    pub fn take(&mut self, partition: &str) -> bool {
        let idle = self.idle_allowance;
        let left = self.allowance.entry(partition.to_string()).or_insert(idle);
        if *left > 0 && self.free > 0 {
            *left -= 1;
            self.free -= 1;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::LimitGroup;

    fn run(in_group: bool, executor: &str, partition: &str, count: i64) -> Running {
        Running {
            in_group,
            executor_id: Some(executor.into()),
            partition_key: partition.into(),
            count,
        }
    }

    fn group(worker: Option<u32>, partition: Option<u32>, global: Option<u32>) -> ClaimLimits {
        ClaimLimits {
            worker: 10,
            partition: None,
            global: 0,
            group: Some(LimitGroup {
                name: "deploys".into(),
                worker,
                partition,
                global,
            }),
        }
    }

    #[test]
    fn the_group_worker_limit_counts_this_executors_work_on_every_queue_of_the_group() {
        // 2 of mine run in the group (claimed from other queues), 1 of another executor's.
        let running = [run(true, "me", "a", 2), run(true, "other", "b", 1)];
        let plan = ClaimPlan::new(&group(Some(3), None, None), "me", 64, &running);
        assert_eq!(plan.free, 1, "3 per worker over the group, 2 taken by me");
    }

    #[test]
    fn the_group_global_limit_counts_every_executor() {
        let running = [run(true, "me", "a", 1), run(true, "other", "b", 2)];
        let plan = ClaimPlan::new(&group(None, None, Some(3)), "me", 64, &running);
        assert_eq!(plan.free, 0, "3 in total over the group are running");
    }

    #[test]
    fn a_partition_running_on_another_queue_of_the_group_is_full() {
        let running = [run(true, "other", "app/prod", 1)];
        let mut plan = ClaimPlan::new(&group(None, Some(1), None), "me", 64, &running);
        assert_eq!(
            plan.full_partitions().collect::<Vec<_>>(),
            vec!["app/prod"],
            "the partition at its limit is the full one"
        );
        assert!(!plan.take("app/prod"), "app/prod already runs once");
        assert!(plan.take("app/staging"), "an idle partition may start one");
        assert!(!plan.take("app/staging"), "and only one");
    }

    #[test]
    fn the_queues_own_limit_caps_it_on_top_of_the_group() {
        let mut limits = group(Some(10), None, None);
        limits.worker = 2;
        limits.global = 2;
        // The queue has 1 running elsewhere, counted in both scopes.
        let running = [run(false, "other", "x", 1), run(true, "other", "x", 1)];
        let plan = ClaimPlan::new(&limits, "me", 64, &running);
        assert_eq!(plan.free, 1, "the queue's total of 2 leaves one");
    }

    #[test]
    fn a_queue_without_group_counts_only_itself() {
        let limits = ClaimLimits {
            worker: 2,
            partition: Some(1),
            global: 0,
            group: None,
        };
        let mut plan = ClaimPlan::new(&limits, "me", 64, &[run(false, "me", "p", 1)]);
        assert_eq!(plan.free, 1, "2 per worker, 1 mine");
        assert!(!plan.take("p"), "p is at its limit");
        assert!(plan.take("q"), "a queue with room is taken");
        assert!(!plan.take("r"), "no slot left");
    }
}
