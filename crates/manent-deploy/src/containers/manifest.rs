//! Containers in the release manifest and in drift (docs/containers.md, "Drift"): once a
//! target's checks pass, its manifest records the container it runs, the image's id and
//! the proxy's upstream (no release directory is listed: a container has none). A drift
//! check reads back, in one command on the target, the running containers of that
//! application and environment, the recorded one's state and image, and the servers the
//! proxy sends new requests to; each that differs from the record is a difference.

use manent_engine::{StepPolicy, WorkflowContext, WorkflowError};
use manent_model::{EffectiveDescriptor, RunningContainer, Target};
use manent_ssh::{ConnectionPool, shell_quote as q};

use super::commands;
use crate::{
    manifests::{MANIFEST_KIND, Manifest, key, record},
    plugins::PassContext,
    run::targets::{self, TargetError},
};

/// The step `<target>: manifest` of a container target after its checks (`<target>:
/// manifest after rollback` once a rollback switched it back to `eff`'s version): the line
/// it adds to the target's detail. A failure to record is shown and fails nothing (the
/// version is live and checked).
pub(super) async fn record_step(
    ctx: &WorkflowContext,
    pass: &PassContext<'_>,
    eff: &EffectiveDescriptor,
    target: &Target,
    running: &RunningContainer,
) -> Result<String, WorkflowError> {
    let step = if std::ptr::eq(eff, pass.eff) {
        format!("{}: manifest", target.name)
    } else {
        format!("{}: manifest after rollback", target.name)
    };
    let manifest = Manifest {
        container: Some(running.clone()),
        ..record::of_run(eff, target, pass.deploy_id)
    };
    let recorded: Result<String, WorkflowError> = ctx
        .step_with(&step, StepPolicy::default().recording_start(), || async {
            let text = serde_json::to_string(&manifest).map_err(|e| e.to_string())?;
            pass.records
                .put(
                    MANIFEST_KIND,
                    &key(&eff.application, &eff.environment, &target.name),
                    &text,
                    record::now_ms(),
                )
                .await
                .map_err(|e| format!("the manifest could not be stored: {e}"))?;
            Ok::<_, String>(format!(
                "manifest: container {}, proxy {} -> {}",
                running.name, running.proxy.listen, running.proxy.upstream
            ))
        })
        .await;
    match recorded {
        Ok(line) => Ok(line),
        Err(WorkflowError::Step { message, .. }) => Ok(format!("manifest not recorded: {message}")),
        Err(other) => Err(other),
    }
}

/// One way a target differs from its recorded container: what (`container <name>`,
/// `proxy <listen>`), what the record says and what the target has (`None`: nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub what: String,
    pub expected: Option<String>,
    pub found: Option<String>,
}

/// What a target runs now, as [`drift_script`] printed it.
#[derive(Debug, Default, PartialEq, Eq)]
struct Seen {
    /// The running containers of the application and environment.
    running: Vec<String>,
    /// The recorded container: `None` when it is gone, else whether it runs and its image.
    recorded: Option<(bool, String)>,
    /// The servers the proxy sends new requests to, `name (address)`; `None` when the
    /// proxy does not answer.
    ready: Option<Vec<String>>,
}

/// The command that prints what [`Seen`] reads: `running <name>` lines, `recorded <true|false>
/// <image id>` or `recorded missing`, and the proxy's `show servers state live` each line
/// after `haproxy ` (or `proxy down`).
fn drift_script(eff: &EffectiveDescriptor, base: &str, running: &RunningContainer) -> String {
    let runtime = eff
        .container
        .as_ref()
        .map(|c| c.runtime)
        .unwrap_or_default();
    format!(
        "{runtime}list=$($rt ps --filter label=manent.owner={base} --format '{{{{.Names}}}}') || exit $?
for c in $list; do echo \"running $c\"; done
if r=$($rt container inspect --format '{{{{.State.Running}}}} {{{{.Image}}}}' {name} 2>/dev/null); then echo \"recorded $r\"; else echo 'recorded missing'; fi
sock=\"$HOME/.manent/proxy/\"{base}\"/admin.sock\"
if [ -S \"$sock\" ] && command -v socat >/dev/null 2>&1 && out=$(printf 'show servers state live\\n' | socat -t 5 stdio \"unix-connect:$sock\" 2>/dev/null) && [ -n \"$out\" ]; then
  printf '%s\\n' \"$out\" | sed 's/^/haproxy /'
else
  echo 'proxy down'
fi
",
        runtime = commands::runtime(runtime),
        base = q(base),
        name = q(&running.name),
    )
}

/// Reads what [`drift_script`] printed.
fn parse(printed: &str) -> Seen {
    let mut seen = Seen::default();
    let mut haproxy = Vec::new();
    for line in printed.lines() {
        if let Some(name) = line.strip_prefix("running ") {
            seen.running.push(name.trim().to_string());
        } else if let Some(rest) = line.strip_prefix("recorded ") {
            seen.recorded = match rest.trim().split_once(' ') {
                _ if rest.trim() == "missing" => None,
                Some((state, image)) => Some((state == "true", digest(image))),
                None => Some((rest.trim() == "true", String::new())),
            };
        } else if let Some(line) = line.strip_prefix("haproxy ") {
            haproxy.push(line);
        }
    }
    if !haproxy.is_empty() {
        seen.ready = Some(ready_servers(&haproxy));
    }
    seen.running.sort();
    seen
}

/// `sha256:<id>` whichever way the runtime printed it.
fn digest(image: &str) -> String {
    let image = image.trim();
    if image.is_empty() || image.starts_with("sha256:") {
        image.to_string()
    } else {
        format!("sha256:{image}")
    }
}

/// The servers of `show servers state live` that take new requests (administrative state
/// 0: neither drained nor in maintenance), `name (address:port)`, sorted. The columns are
/// found by the header's names (`# be_id be_name srv_id srv_name srv_addr …`).
fn ready_servers(lines: &[&str]) -> Vec<String> {
    let Some(header) = lines.iter().find_map(|l| l.strip_prefix("# ")) else {
        return Vec::new();
    };
    let columns: Vec<&str> = header.split_whitespace().collect();
    let at = |name: &str| columns.iter().position(|c| *c == name);
    let (Some(name), Some(addr), Some(admin)) =
        (at("srv_name"), at("srv_addr"), at("srv_admin_state"))
    else {
        return Vec::new();
    };
    let port = at("srv_port");
    let mut ready: Vec<String> = lines
        .iter()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.len() > name.max(addr).max(admin) && f[admin] == "0")
        .map(|f| match port.and_then(|p| f.get(p)) {
            Some(port) => format!("{} ({}:{port})", f[name], f[addr]),
            None => format!("{} ({})", f[name], f[addr]),
        })
        .collect();
    ready.sort();
    ready
}

/// How `seen` differs from `recorded`.
fn mismatches(recorded: &RunningContainer, seen: &Seen) -> Vec<Mismatch> {
    let mut found = Vec::new();
    let container = format!("container {}", recorded.name);
    match &seen.recorded {
        None => found.push(Mismatch {
            what: container.clone(),
            expected: Some("running".into()),
            found: None,
        }),
        Some((false, _)) => found.push(Mismatch {
            what: container.clone(),
            expected: Some("running".into()),
            found: Some("stopped".into()),
        }),
        Some((true, _)) => {}
    }
    if let Some((_, image)) = &seen.recorded
        && !recorded.image_digest.is_empty()
        && !image.is_empty()
        && *image != recorded.image_digest
    {
        found.push(Mismatch {
            what: format!("{container} image"),
            expected: Some(recorded.image_digest.clone()),
            found: Some(image.clone()),
        });
    }
    for other in seen.running.iter().filter(|c| **c != recorded.name) {
        found.push(Mismatch {
            what: format!("container {other}"),
            expected: None,
            found: Some("running".into()),
        });
    }
    let upstream = format!("{} ({})", recorded.proxy.server, recorded.proxy.upstream);
    let shown = |servers: &[String]| format!("-> {}", servers.join(", "));
    match &seen.ready {
        Some(ready) if *ready == [upstream.clone()] => {}
        ready => found.push(Mismatch {
            what: format!("proxy {}", recorded.proxy.listen),
            expected: Some(format!("-> {upstream}")),
            found: ready.as_deref().map(shown),
        }),
    }
    found
}

/// A container target against its recorded container: the mismatches, or why the target
/// could not be read.
pub async fn drift(
    pool: &ConnectionPool,
    eff: &EffectiveDescriptor,
    target: &Target,
    recorded: &RunningContainer,
) -> Result<Vec<Mismatch>, TargetError> {
    let Some(settings) = &eff.container else {
        return Err(TargetError::Script(format!(
            "the release recorded container {} but {}/{} is no longer deployed with \
             deploy.container; deploy it again",
            recorded.name, eff.application, eff.environment
        )));
    };
    let base =
        manent_model::container_base(settings, &target.name, &eff.application, &eff.environment);
    let conn = targets::connection(pool, eff, target).await?;
    let out = conn
        .exec(&drift_script(eff, &base, recorded), &[])
        .await
        .map_err(|e| TargetError::Transport(e.to_string()))?;
    if !out.success() {
        return Err(TargetError::Script(crate::run::release_scripts::failure(
            &out.stderr,
            out.status,
        )));
    }
    Ok(mismatches(recorded, &parse(&out.stdout)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorded() -> RunningContainer {
        RunningContainer {
            name: "web-2".into(),
            image: "localhost/manent/web:2".into(),
            image_digest: "sha256:abc".into(),
            address: "127.0.0.1:41000".into(),
            proxy: manent_model::ProxyState {
                listen: "10.0.0.1:80".into(),
                server: "web-2".into(),
                upstream: "127.0.0.1:41000".into(),
            },
        }
    }

    const STATE: &str = "haproxy 1\nhaproxy # be_id be_name srv_id srv_name srv_addr srv_op_state \
        srv_admin_state srv_uweight srv_iweight srv_time_since_last_change srv_check_status \
        srv_check_result srv_check_health srv_check_state srv_agent_state bk_f_forced_id \
        srv_f_forced_id srv_fqdn srv_port\n";

    #[test]
    fn a_target_as_recorded_has_no_mismatch() {
        let printed = format!(
            "running web-2\nrecorded true abc\n{STATE}haproxy 3 live 1 web-2 127.0.0.1 2 0 1 1 \
             5 1 0 0 0 0 0 0 - 41000\n"
        );
        assert_eq!(
            mismatches(&recorded(), &parse(&printed)),
            [],
            "the recorded container runs its image and the proxy sends it everything"
        );
    }

    #[test]
    fn another_container_a_stopped_one_and_a_proxy_pointing_elsewhere_are_each_a_mismatch() {
        let printed = format!(
            "running web-9\nrecorded false sha256:abc\n{STATE}haproxy 3 live 1 web-2 127.0.0.1 2 \
             8 1 1 5 1 0 0 0 0 0 0 - 41000\nhaproxy 3 live 2 web-9 127.0.0.1 2 0 1 1 5 1 0 0 \
             0 0 0 0 - 42000\n"
        );
        let shown: Vec<String> = mismatches(&recorded(), &parse(&printed))
            .iter()
            .map(|m| format!("{} {:?} {:?}", m.what, m.expected, m.found))
            .collect();
        assert_eq!(
            shown,
            [
                r#"container web-2 Some("running") Some("stopped")"#,
                r#"container web-9 None Some("running")"#,
                r#"proxy 10.0.0.1:80 Some("-> web-2 (127.0.0.1:41000)") Some("-> web-9 (127.0.0.1:42000)")"#,
            ],
            "the stopped record, the other container and the drained server each once"
        );
        let gone = mismatches(&recorded(), &parse("recorded missing\nproxy down\n"));
        assert_eq!(
            (gone[0].found.clone(), gone[1].found.clone()),
            (None, None),
            "a removed container and a proxy that does not answer are found as nothing: {gone:?}"
        );
    }
}
