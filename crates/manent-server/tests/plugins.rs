//! External plugins through real processes: an API and a plain worker where the `ansible`
//! plugin is a stub (its executable does not even exist there), and a pool worker with
//! `dbos.plugins: [ansible]` that runs `manent-plugin-ansible`, which runs ansible-playbook
//! (ansible-core, installed by scripts/test into a virtualenv) against two real sshd hosts.

mod common;

use std::path::{Path, PathBuf};

use common::{Site, WAIT};
use manent_testkit::{Db, eventually, signal, sshd::SshHosts, wait_exit};
use serde_json::Value;

/// ansible-playbook of the test virtualenv; required in CI, skipped loudly elsewhere.
fn ansible_playbook() -> Option<PathBuf> {
    match std::env::var_os("MANENT_TEST_ANSIBLE_PLAYBOOK") {
        Some(path) => Some(PathBuf::from(path)),
        None if std::env::var_os("CI").is_some() => panic!(
            "MANENT_TEST_ANSIBLE_PLAYBOOK is not set: scripts/test installs ansible-core into \
             a virtualenv and sets it; CI must run the ansible test"
        ),
        None => {
            eprintln!(
                "\n*** SKIPPED: the ansible plugin test needs ansible-core; run ./scripts/test, \
                 or set MANENT_TEST_ANSIBLE_PLAYBOOK=<venv>/bin/ansible-playbook ***\n"
            );
            None
        }
    }
}

fn plugin_binary() -> PathBuf {
    manent_testkit::workspace_binary("manent-plugin-ansible", "manent-plugin-ansible")
}

/// The pids of the running processes whose executable is `exe`.
fn processes_of(exe: &Path) -> Vec<u32> {
    let exe = exe.canonicalize().unwrap();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|p| p == exe)
            // A zombie has no exe link; a reaped process has no /proc entry.
        })
        .collect()
}

/// Waits for the deploy's final state and asserts it is SUCCESS, with the logs if not.
async fn wait_success(site: &Site, hosts: &SshHosts, token: &str, id: &str) -> Value {
    let done = eventually(&format!("deploy {id} ends"), WAIT, || async {
        let s = site.cli(token, &["status", id]).1;
        matches!(
            s["status"].as_str(),
            Some("SUCCESS" | "ERROR" | "CANCELLED")
        )
        .then_some(s)
    })
    .await;
    assert_eq!(
        done["status"],
        "SUCCESS",
        "deploy {id} succeeds: {done}\n--- pool worker log ---\n{}\n--- plain worker log ---\n{}\n{}",
        std::fs::read_to_string(site.dir.join("worker-pool.log")).unwrap_or_default(),
        std::fs::read_to_string(site.dir.join("worker-plain.log")).unwrap_or_default(),
        hosts.logs()
    );
    done
}

const PLAYBOOK: &str = "- hosts: all
  gather_facts: false
  tasks:
    - name: write the version
      copy:
        content: \"{{ manent_version }}\"
        dest: \"{{ out_dir }}/{{ inventory_hostname }}.txt\"
    - name: write the deploy's note
      copy:
        content: \"{{ note }}\"
        dest: \"{{ out_dir }}/{{ inventory_hostname }}.note\"
";

/// A deploy param that ansible would run on the worker if it templated it.
const NOTE: &str = "{{ lookup('pipe', 'echo templated') }}";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ansible_deploy_runs_only_on_the_plugins_pool_and_configures_both_targets() {
    let Some(ansible_playbook) = ansible_playbook() else {
        return;
    };
    let plugin = plugin_binary();
    let sum = manent_plugin::host::file_sha256(&plugin).unwrap();
    let hosts = SshHosts::start(2).await;
    let mut site = Site::new(Db::Postgres, &["true"]).await;
    let out = site.dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let plugins = |command: &Path| {
        format!(
            "plugins:\n  ansible:\n    external: {{command: \"{}\", sha256: \"{sum}\"}}\n    \
             artifact_types: [ansible]\n    queue: ansible\n",
            command.display()
        )
    };

    // The API and the plain worker: the plugin is a stub there, its executable absent.
    site.set_config(&plugins(Path::new("/nonexistent/manent-plugin-ansible")));
    let token = site.token();
    site.start("api", "api");
    site.start("worker", "plain");
    site.wait_api().await;
    // A deploy on the default queue completing proves the plain worker is up and claiming.
    let plain = site.descriptor("1");
    let (code, v) = site.cli(&token, &["deploy", "-f", plain.to_str().unwrap(), "--wait"]);
    assert_eq!(code, 0, "the plain worker deploys the default queue: {v}");

    // The pool worker: the real executable, and dbos.plugins: [ansible].
    site.set_config(&plugins(&plugin));
    let pool = site.start_with(
        "worker",
        "pool",
        &[
            ("MANENT__DBOS__PLUGINS", "ansible"),
            (
                "MANENT_ANSIBLE_PLAYBOOK",
                ansible_playbook.to_str().unwrap(),
            ),
        ],
    );

    let targets: String = hosts
        .hosts
        .iter()
        .enumerate()
        .map(|(i, h)| {
            format!(
                "  - {{name: t{}, host: \"{}\", port: {}, region: eu, az: eu-{}}}\n",
                i + 1,
                h.addr,
                h.port,
                i + 1
            )
        })
        .collect();
    site.write_environment(
        "acme/site",
        "prod",
        &format!(
            "targets:\n{targets}ssh: {{user: \"{}\", key: \"{}\", known_hosts: \"{}\"}}\n\
             deploy:\n  plugin: ansible\n  params: {{out_dir: \"{}\", \
             ansible_python_interpreter: /usr/bin/python3}}\n",
            hosts.user,
            hosts.client_key.display(),
            hosts.known_hosts.display(),
            out.display()
        ),
    );
    let playbook = site.dir.join("site.yml");
    std::fs::write(&playbook, PLAYBOOK).unwrap();
    let playbook_sum = manent_plugin::host::file_sha256(&playbook).unwrap();
    let descriptor = site.dir.join("deploy-site.yml");
    std::fs::write(
        &descriptor,
        format!(
            "application: acme/site\nenvironment: prod\nartifacts:\n  - {{name: site.yml, \
             type: ansible, version: \"2.5\", url: \"file://{}\", sha256: \"{playbook_sum}\"}}\n\
             deploy:\n  params: {{note: {}}}\n",
            playbook.display(),
            serde_json::to_string(NOTE).unwrap()
        ),
    )
    .unwrap();
    // (The params are the playbook's extra vars; the interpreter is pinned because this
    // machine's login PATH may offer pyenv shims of Pythons that are not installed.)
    let written = |t: &str| std::fs::read_to_string(out.join(format!("{t}.txt"))).ok();

    // A dry-run: routed to the plugin's queue, planned on the pool worker, nothing written.
    let (code, v) = site.cli(
        &token,
        &["deploy", "-f", descriptor.to_str().unwrap(), "--dry-run"],
    );
    assert_eq!(code, 0, "the dry-run is accepted: {v}");
    assert_eq!(v["queue"], "ansible", "routed to the plugin's queue: {v}");
    let planned = wait_success(&site, &hosts, &token, v["id"].as_str().unwrap()).await;
    assert_eq!(
        planned["executor_id"], "pool",
        "planned by the pool worker: {planned}"
    );
    assert_eq!(
        (written("t1"), written("t2")),
        (None, None),
        "a dry-run changes nothing: {planned}"
    );

    // The deploy: ansible-playbook really configures both targets over SSH.
    let (code, v) = site.cli(&token, &["deploy", "-f", descriptor.to_str().unwrap()]);
    assert_eq!(code, 0, "the deploy is accepted: {v}");
    assert_eq!(v["queue"], "ansible", "routed to the plugin's queue: {v}");
    let id = v["id"].as_str().unwrap().to_string();
    let done = wait_success(&site, &hosts, &token, &id).await;
    assert_eq!(
        done["executor_id"], "pool",
        "only the pool worker runs it: {done}"
    );
    assert_eq!(done["queue"], "ansible", "the recorded route: {done}");
    assert_eq!(
        (written("t1"), written("t2")),
        (Some("2.5".to_string()), Some("2.5".to_string())),
        "each target has the file with the deploy's version"
    );
    let note = std::fs::read_to_string(out.join("t1.note")).unwrap_or_default();
    assert_eq!(
        note, NOTE,
        "a deploy's param reaches the playbook as text, never templated on the worker"
    );
    let statuses: Vec<(String, String)> = done["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap().to_string(),
                t["status"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        statuses,
        vec![
            ("t1".to_string(), "deployed".to_string()),
            ("t2".to_string(), "deployed".to_string())
        ],
        "per-target results come from ansible's recap: {done}"
    );

    // The plugin process is reused by the pool worker, and stopped after its engine.
    let running = processes_of(&plugin);
    assert_eq!(
        running.len(),
        1,
        "one manent-plugin-ansible process serves the pool worker"
    );
    signal(&site.children.0[pool], "TERM");
    let status = wait_exit(site.child(pool), WAIT).await;
    assert!(status.success(), "the pool worker stops cleanly: {status}");
    assert!(
        processes_of(&plugin).is_empty(),
        "no manent-plugin-ansible process survives the worker's SIGTERM (was {running:?})"
    );
    let log = std::fs::read_to_string(site.dir.join("worker-pool.log")).unwrap();
    let stopped = log
        .find("plugin stopped")
        .expect("the worker logs the plugin's stop");
    let engine_stopped = log
        .find("worker stopped")
        .expect("the worker logs its stop");
    assert!(
        engine_stopped < stopped,
        "the plugin is stopped after the engine:\n{log}"
    );
}
