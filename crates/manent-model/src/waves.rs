//! Owns wave planning: how an effective descriptor's targets are grouped into the waves a
//! rollout deploys one after the other, deterministically.

use serde::{Deserialize, Serialize};

use crate::effective::EffectiveDescriptor;
use crate::environment::{Target, Waves};

/// A group of targets deployed together, after the previous wave.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wave {
    /// `all`, the region, `region/az` (or the az alone), or `wave-N` for explicit waves.
    pub name: String,
    /// The region all its targets share, if they share one.
    pub region: Option<String>,
    /// The az all its targets share, if they share one.
    pub az: Option<String>,
    /// Its targets, in the order of the environment file (explicit waves: as listed).
    pub targets: Vec<Target>,
}

impl Wave {
    fn new(name: String, targets: Vec<Target>) -> Wave {
        let shared = |field: fn(&Target) -> &Option<String>| {
            let first = field(targets.first()?).as_ref()?;
            targets
                .iter()
                .all(|t| field(t).as_ref() == Some(first))
                .then(|| first.clone())
        };
        Wave {
            region: shared(|t| &t.region),
            az: shared(|t| &t.az),
            name,
            targets,
        }
    }

    /// The wave's targets grouped by region, in order of first appearance: one pass each
    /// (under region routing each pass runs from `<queue>.<region>`). Targets without a
    /// region form the pass of `None`.
    pub fn passes(&self) -> Vec<(Option<String>, Vec<&Target>)> {
        group(&self.targets, |t| t.region.clone())
            .into_iter()
            .map(|(region, targets)| (region, targets.into_iter().collect()))
            .collect()
    }
}

/// Groups `targets` by `key`, groups in order of first appearance, targets in their order.
fn group<K: PartialEq>(targets: &[Target], key: impl Fn(&Target) -> K) -> Vec<(K, Vec<&Target>)> {
    let mut groups: Vec<(K, Vec<&Target>)> = Vec::new();
    for target in targets {
        let k = key(target);
        match groups.iter_mut().find(|(g, _)| *g == k) {
            Some((_, members)) => members.push(target),
            None => groups.push((k, vec![target])),
        }
    }
    groups
}

/// The waves of a deploy: `all` is one wave; `by_region` one per region and `by_az` one per
/// (region, az), in order of first appearance among the targets; explicit waves as listed
/// (validation guarantees each target is listed once; any left out would form a final
/// `unlisted` wave rather than be skipped).
pub fn plan_waves(eff: &EffectiveDescriptor) -> Vec<Wave> {
    let owned = |targets: Vec<&Target>| targets.into_iter().cloned().collect::<Vec<_>>();
    match &eff.rollout.waves {
        Waves::All => {
            if eff.targets.is_empty() {
                Vec::new()
            } else {
                vec![Wave::new("all".to_owned(), eff.targets.clone())]
            }
        }
        Waves::ByRegion => group(&eff.targets, |t| t.region.clone())
            .into_iter()
            .map(|(region, targets)| {
                Wave::new(
                    region.unwrap_or_else(|| "no-region".to_owned()),
                    owned(targets),
                )
            })
            .collect(),
        Waves::ByAz => group(&eff.targets, |t| (t.region.clone(), t.az.clone()))
            .into_iter()
            .map(|((region, az), targets)| {
                let az = az.unwrap_or_else(|| "no-az".to_owned());
                let name = match region {
                    Some(region) => format!("{region}/{az}"),
                    None => az,
                };
                Wave::new(name, owned(targets))
            })
            .collect(),
        Waves::Explicit(lists) => {
            let mut listed = std::collections::BTreeSet::new();
            let mut waves: Vec<Wave> = lists
                .iter()
                .enumerate()
                .map(|(i, names)| {
                    let targets = names
                        .iter()
                        .filter(|name| listed.insert(name.as_str()))
                        .filter_map(|name| eff.targets.iter().find(|t| &t.name == name))
                        .cloned()
                        .collect();
                    Wave::new(format!("wave-{}", i + 1), targets)
                })
                .filter(|wave| !wave.targets.is_empty())
                .collect();
            let unlisted: Vec<Target> = eff
                .targets
                .iter()
                .filter(|t| !listed.contains(t.name.as_str()))
                .cloned()
                .collect();
            if !unlisted.is_empty() {
                waves.push(Wave::new("unlisted".to_owned(), unlisted));
            }
            waves
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{parse_descriptor, parse_environment};

    const SHA: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    const TARGETS: &str = "\
targets:
  - {name: eu-1, host: h, region: eu, az: eu-a}
  - {name: us-1, host: h, region: us, az: us-a}
  - {name: eu-2, host: h, region: eu, az: eu-b}
  - {name: eu-3, host: h, region: eu, az: eu-a}
deploy: {dest: /srv}
";

    /// Plans the waves of `rollout` over [`TARGETS`] and renders `name[region,az]: targets`.
    fn check(rollout: &str, expected: &[&str]) {
        let env = parse_environment(&format!("{TARGETS}{rollout}"), "prod.yml", "ml/app", "prod")
            .unwrap();
        let descriptor = parse_descriptor(
            &format!(
                "application: ml/app\nenvironment: prod\nartifacts: [{{name: a, type: t, \
                 version: \"1\", url: \"file:///a\", sha256: {SHA}}}]\n"
            ),
            "d.yml",
        )
        .unwrap();
        let eff = EffectiveDescriptor::build(&descriptor, &env).unwrap();
        let actual: Vec<String> = plan_waves(&eff)
            .iter()
            .map(|w| {
                let names: Vec<&str> = w.targets.iter().map(|t| t.name.as_str()).collect();
                format!(
                    "{}[{},{}]: {}",
                    w.name,
                    w.region.as_deref().unwrap_or("-"),
                    w.az.as_deref().unwrap_or("-"),
                    names.join(" ")
                )
            })
            .collect();
        assert_eq!(actual, expected, "{rollout}");
    }

    #[test]
    fn plans_each_kind() {
        check("", &["all[-,-]: eu-1 us-1 eu-2 eu-3"]);
        check(
            "rollout: {waves: by_region}\n",
            &["eu[eu,-]: eu-1 eu-2 eu-3", "us[us,us-a]: us-1"],
        );
        check(
            "rollout: {waves: by_az}\n",
            &[
                "eu/eu-a[eu,eu-a]: eu-1 eu-3",
                "us/us-a[us,us-a]: us-1",
                "eu/eu-b[eu,eu-b]: eu-2",
            ],
        );
        check(
            "rollout: {waves: [[eu-3], [us-1, eu-1, eu-2]]}\n",
            &["wave-1[eu,eu-a]: eu-3", "wave-2[-,-]: us-1 eu-1 eu-2"],
        );
    }

    #[test]
    fn passes_group_a_wave_by_region() {
        let targets: Vec<Target> = ["eu", "us", "eu"]
            .iter()
            .enumerate()
            .map(|(i, region)| Target {
                name: format!("t{i}"),
                host: "h".into(),
                port: 22,
                user: None,
                region: Some(region.to_string()),
                az: None,
                labels: Default::default(),
                roles: Vec::new(),
            })
            .collect();
        let wave = Wave::new("all".into(), targets);
        let passes: Vec<(Option<String>, Vec<&str>)> = wave
            .passes()
            .into_iter()
            .map(|(r, ts)| (r, ts.iter().map(|t| t.name.as_str()).collect()))
            .collect();
        assert_eq!(
            passes,
            vec![
                (Some("eu".to_owned()), vec!["t0", "t2"]),
                (Some("us".to_owned()), vec!["t1"])
            ],
            "one pass per region, in target order"
        );
    }

    #[test]
    fn targets_left_out_of_explicit_waves_are_not_skipped() {
        let mut eff_targets = Vec::new();
        for name in ["a", "b", "c"] {
            eff_targets.push(Target {
                name: name.into(),
                host: "h".into(),
                port: 22,
                user: None,
                region: None,
                az: None,
                labels: Default::default(),
                roles: Vec::new(),
            });
        }
        let env = crate::EnvironmentFile {
            targets: eff_targets,
            rollout: crate::Rollout {
                waves: Waves::Explicit(vec![vec!["b".into(), "zz".into(), "b".into()]]),
                ..Default::default()
            },
            deploy: crate::DeploySettings {
                dest: Some("/srv".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let descriptor = parse_descriptor(
            &format!(
                "application: ml/app\nenvironment: prod\nartifacts: [{{name: a, type: t, \
                 version: \"1\", url: \"file:///a\", sha256: {SHA}}}]\n"
            ),
            "d.yml",
        )
        .unwrap();
        let eff = EffectiveDescriptor::build(&descriptor, &env).unwrap();
        let waves: Vec<(String, usize)> = plan_waves(&eff)
            .into_iter()
            .map(|w| (w.name, w.targets.len()))
            .collect();
        assert_eq!(
            waves,
            vec![("wave-1".into(), 1), ("unlisted".into(), 2)],
            "listed targets first, the others in a wave of their own"
        );
    }
}
