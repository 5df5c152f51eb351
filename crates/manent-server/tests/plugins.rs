//! External plugins through real processes: an API and a plain worker where the `ansible`
//! plugin is a stub (its executable does not even exist there), and a pool worker with
//! `dbos.plugins: [ansible]` that runs `manent-plugin-ansible`, which runs ansible-playbook
//! (ansible-core, installed by scripts/test into a virtualenv) against two real sshd hosts.
//! The plugin runs confined (the default): a bubblewrap sandbox per pass that sees the
//! virtualenv (`read_only`), its pass's files and nothing of the worker's; a playbook that
//! tries every way out finds nothing, and a worker killed mid-pass leaves no process behind.
//! A pass interrupted on its pool worker (killed, frozen, drained, upgraded) and run again
//! never runs its task on the target beside the earlier run's (docs/scaling-and-recovery.md,
//! "Ansible on the targets"), shown from a ledger the target's task appends to.

mod common;

use std::path::{Path, PathBuf};

use common::{Site, WAIT};
use manent_testkit::{
    Db, eventually, pause_outside_transactions, signal, sshd::SshHosts, wait_exit,
};
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

/// The running processes a site's plugin started: the plugin, bwrap, ansible-playbook and
/// what they run (their `HOME` is the pass's, inside the site's directory), and any whose
/// command line holds `marker`: `(pid, command line)`. Other tests' processes are not
/// counted.
fn plugin_processes(site_dir: &Path, marker: &str) -> Vec<(u32, String)> {
    let home = format!("HOME={}", site_dir.display());
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| !manent_testkit::process_gone(*pid as i32))
        .filter_map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let ours = String::from_utf8_lossy(&environ)
                .split('\0')
                .any(|v| v.starts_with(&home))
                || cmdline.contains(marker);
            ours.then_some((pid, cmdline))
        })
        .collect()
}

/// `plugins.ansible` for a worker running `command` confined, with `extra` keys of
/// `external`: ansible-playbook comes from the test's virtualenv, which (with the Python it
/// was made from) the sandbox shows read-only.
fn ansible_plugin(command: &Path, sum: &str, ansible_playbook: &Path, extra: &str) -> String {
    let venv = ansible_playbook
        .parent()
        .and_then(Path::parent)
        .expect("ansible-playbook lies in <venv>/bin");
    let mut read_only = vec![venv.to_path_buf()];
    let cfg = std::fs::read_to_string(venv.join("pyvenv.cfg")).unwrap_or_default();
    if let Some(home) = cfg.lines().find_map(|l| l.strip_prefix("home = ")) {
        read_only.extend(Path::new(home.trim()).parent().map(Path::to_path_buf));
    }
    format!(
        "plugins:\n  ansible:\n    external: {{command: \"{}\", sha256: \"{sum}\", \
         env: [MANENT_ANSIBLE_PLAYBOOK], read_only: {}{extra}}}\n    \
         artifact_types: [ansible]\n    queue: ansible\n",
        command.display(),
        serde_json::to_string(&read_only).unwrap(),
    )
}

/// Writes the environment `application`/prod over `hosts` (ansible plugin), with `extra`
/// appended to the file.
fn ansible_environment(
    site: &Site,
    hosts: &SshHosts,
    application: &str,
    params: &str,
    extra: &str,
) {
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
    // (The interpreter is pinned because this machine's login PATH may offer pyenv shims of
    // Pythons that are not installed.)
    site.write_environment(
        application,
        "prod",
        &format!(
            "targets:\n{targets}ssh: {{user: \"{}\", key: \"{}\", known_hosts: \"{}\"}}\n\
             deploy:\n  plugin: ansible\n  params: {{{params}ansible_python_interpreter: /usr/bin/python3}}\n{extra}",
            hosts.user,
            hosts.client_key.display(),
            hosts.known_hosts.display(),
        ),
    );
}

/// A descriptor deploying `playbook` (written to the site) to `application`/prod.
fn ansible_descriptor(site: &Site, application: &str, playbook: &str, params: &str) -> PathBuf {
    let name = application.replace('/', "-");
    let path = site.dir.join(format!("{name}.yml"));
    std::fs::write(&path, playbook).unwrap();
    let sum = manent_plugin::host::file_sha256(&path).unwrap();
    let descriptor = site.dir.join(format!("deploy-{name}.yml"));
    std::fs::write(
        &descriptor,
        format!(
            "application: {application}\nenvironment: prod\nartifacts:\n  - {{name: site.yml, \
             type: ansible, version: \"2.5\", url: \"file://{}\", sha256: \"{sum}\"}}\n\
             deploy:\n  params: {{{params}}}\n",
            path.display(),
        ),
    )
    .unwrap();
    descriptor
}

/// What each ansible test starts from: ansible-playbook, the plugin's executable and its
/// sha256, `targets` sshd hosts and a site on `backend`; `None` where ansible is not
/// installed (the test is skipped, loudly).
async fn ansible_site(
    backend: Db,
    targets: usize,
) -> Option<(PathBuf, PathBuf, String, SshHosts, Site)> {
    let ansible_playbook = ansible_playbook()?;
    let plugin = plugin_binary();
    let sum = manent_plugin::host::file_sha256(&plugin).unwrap();
    let hosts = SshHosts::start(targets).await;
    let site = Site::new(backend, &["true"]).await;
    Some((ansible_playbook, plugin, sum, hosts, site))
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
    let Some((ansible_playbook, plugin, sum, hosts, mut site)) =
        ansible_site(Db::Postgres, 2).await
    else {
        return;
    };
    let out = site.dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let plugins = |command: &Path| ansible_plugin(command, &sum, &ansible_playbook, "");

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

    ansible_environment(
        &site,
        &hosts,
        "acme/site",
        &format!("out_dir: \"{}\", ", out.display()),
        "",
    );
    // (The params are the playbook's extra vars.)
    let descriptor = ansible_descriptor(
        &site,
        "acme/site",
        PLAYBOOK,
        &format!("note: {}", serde_json::to_string(NOTE).unwrap()),
    );
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

    // Confined, each pass had a process of its own, gone with its answer.
    let running = plugin_processes(&site.dir, "manent-plugin-ansible-unused-marker");
    assert_eq!(
        running,
        vec![],
        "no plugin process outlives its pass on a confined worker"
    );
    signal(&site.children.0[pool], "TERM");
    let status = wait_exit(site.child(pool), WAIT).await;
    assert!(status.success(), "the pool worker stops cleanly: {status}");
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

/// A deployer's playbook trying each way out of its pass on the worker (issue 26): the
/// worker's environment, another environment's key and secret, the database and the
/// configuration, writing beside them and listing other deploys' work directories, the
/// worker's processes through /proc. What it finds is written to the targets, with its own
/// environment's secret as the proof that its lookups work.
const ESCAPE_PLAYBOOK: &str = r#"- hosts: all
  gather_facts: false
  tasks:
    - name: look where a playbook must not see
      set_fact:
        found_env: "{{ lookup('env', 'MANENT_TEST_CANARY') | default('', true) }}"
        found_other_key: "{{ lookup('file', other_key, errors='ignore') | default('', true) }}"
        found_other_secret: "{{ lookup('file', other_secret, errors='ignore') | default('', true) }}"
        found_config: "{{ lookup('file', config_file, errors='ignore') | default('', true) }}"
        own_secret: "{{ lookup('file', own_secret_file, errors='ignore') | default('', true) }}"
    - name: the database
      stat: {path: "{{ db_file }}"}
      delegate_to: localhost
      register: db
    - name: write beside the database and the configuration
      copy: {content: planted, dest: "{{ db_dir }}/planted.txt"}
      delegate_to: localhost
      ignore_errors: true
    - name: list the worker's deploys
      find: {paths: "{{ work_root }}", file_type: any}
      delegate_to: localhost
      register: work
      ignore_errors: true
    - name: read every process's environment
      shell: "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c MANENT_TEST_CANARY || true"
      delegate_to: localhost
      register: proc_env
    - name: record the findings on the target
      copy:
        content: "{{ {'env': found_env, 'other_key': found_other_key, 'other_secret': found_other_secret, 'config': found_config, 'own_secret': own_secret, 'db_exists': db.stat.exists, 'work': (work.files | default([])) | map(attribute='path') | list, 'proc_env': proc_env.stdout} | to_json }}"
        dest: "{{ out_dir }}/{{ inventory_hostname }}.findings.json"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_playbook_run_confined_finds_nothing_of_the_worker_or_other_environments_and_still_deploys()
 {
    let Some((ansible_playbook, plugin, sum, hosts, mut site)) = ansible_site(Db::Sqlite, 2).await
    else {
        return;
    };
    let out = site.dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    site.set_config(&ansible_plugin(&plugin, &sum, &ansible_playbook, ""));
    let db_file = PathBuf::from(site.db.url.strip_prefix("sqlite://").unwrap());

    // Another environment, with its own key and secret file on this worker.
    let other_key = site.dir.join("keys/other_id");
    let other_secret = site.dir.join("keys/other-secret");
    let own_secret = site.dir.join("own-secret");
    std::fs::create_dir_all(other_key.parent().unwrap()).unwrap();
    std::fs::write(&other_key, "OTHER-ENVIRONMENT-KEY").unwrap();
    std::fs::write(&other_secret, "other-environment-secret").unwrap();
    std::fs::write(&own_secret, "own-environment-secret").unwrap();
    site.write_environment(
        "acme/other",
        "prod",
        &format!(
            "targets:\n  - {{name: o1, host: 127.0.0.1}}\nssh: {{key: \"{}\"}}\n\
             secrets:\n  OTHER_TOKEN: {{file: \"{}\"}}\n",
            other_key.display(),
            other_secret.display()
        ),
    );
    ansible_environment(
        &site,
        &hosts,
        "acme/site",
        &format!("out_dir: \"{}\", ", out.display()),
        &format!(
            "secrets:\n  OWN_TOKEN: {{file: \"{}\"}}\n",
            own_secret.display()
        ),
    );
    // Another deploy's work directory on the same worker.
    let work_root = site.dir.join("work-pool");
    std::fs::create_dir_all(work_root.join("another-deploy")).unwrap();
    std::fs::write(work_root.join("another-deploy/site.yml"), "its playbook").unwrap();

    let token = site.token();
    site.start("api", "api");
    site.start_with(
        "worker",
        "pool",
        &[
            ("MANENT__DBOS__PLUGINS", "ansible"),
            (
                "MANENT_ANSIBLE_PLAYBOOK",
                ansible_playbook.to_str().unwrap(),
            ),
            ("MANENT_TEST_CANARY", "the-worker's-environment"),
        ],
    );
    site.wait_api().await;
    let params = [
        ("other_key", other_key.clone()),
        ("other_secret", other_secret.clone()),
        ("config_file", site.dir.join("manent.yml")),
        ("own_secret_file", own_secret.clone()),
        ("db_file", db_file.clone()),
        ("db_dir", db_file.parent().unwrap().to_path_buf()),
        ("work_root", work_root.clone()),
    ]
    .iter()
    .map(|(k, v)| format!("{k}: {}", serde_json::to_string(v).unwrap()))
    .collect::<Vec<_>>()
    .join(", ");
    let descriptor = ansible_descriptor(&site, "acme/site", ESCAPE_PLAYBOOK, &params);
    let (code, v) = site.cli(&token, &["deploy", "-f", descriptor.to_str().unwrap()]);
    assert_eq!(code, 0, "the deploy is accepted: {v}");
    let id = v["id"].as_str().unwrap().to_string();
    wait_success(&site, &hosts, &token, &id).await;
    assert!(
        db_file.exists(),
        "the site's SQLite database is at {}",
        db_file.display()
    );

    let text = std::fs::read_to_string(out.join("t1.findings.json"))
        .expect("the playbook recorded its findings on the target");
    let findings: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        findings["own_secret"], "own-environment-secret",
        "the playbook reads its own environment's secret, so its lookups work: {findings}"
    );
    for key in ["env", "other_key", "other_secret", "config"] {
        assert_eq!(
            findings[key], "",
            "the playbook finds nothing at `{key}`: {findings}"
        );
    }
    assert_eq!(
        findings["db_exists"], false,
        "the database is out of the playbook's sight: {findings}"
    );
    assert_eq!(
        findings["proc_env"], "0",
        "no process the playbook can see has the worker's environment: {findings}"
    );
    let work: Vec<&str> = findings["work"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert!(
        !work.iter().any(|p| p.contains("another-deploy")),
        "another deploy's work directory is out of sight: {findings}"
    );
    assert!(
        !db_file.parent().unwrap().join("planted.txt").exists(),
        "the playbook wrote nothing beside the database: {findings}"
    );
    assert_eq!(
        std::fs::read_to_string(work_root.join("another-deploy/site.yml")).unwrap(),
        "its playbook",
        "another deploy's files are untouched"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_during_a_confined_pass_leaves_no_plugin_process_behind() {
    worker_killed_mid_pass_leaves_nothing("").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_during_an_unconfined_pass_leaves_no_plugin_process_behind() {
    // The plugin leads a process group and asked for SIGTERM at the worker's death.
    worker_killed_mid_pass_leaves_nothing(", confinement: none").await;
}

/// Kills a pool worker (SIGKILL) while a pass of its plugin runs, with `external` keys
/// added to the plugin's configuration, and waits until no process of the pass is left.
async fn worker_killed_mid_pass_leaves_nothing(external: &str) {
    let Some((ansible_playbook, plugin, sum, hosts, mut site)) = ansible_site(Db::Sqlite, 1).await
    else {
        return;
    };
    site.set_config(&ansible_plugin(&plugin, &sum, &ansible_playbook, external));
    ansible_environment(&site, &hosts, "acme/site", "", "");
    // A pass that runs until it is killed: a sleep on the worker, under ansible-playbook,
    // under the plugin, under bwrap. The marker makes the sleep this test's own.
    let marker = format!("3599.{}", site.port);
    let descriptor = ansible_descriptor(
        &site,
        "acme/site",
        "- hosts: all\n  gather_facts: false\n  tasks:\n    - command: \"sleep {{ nap }}\"\n      \
         delegate_to: localhost\n",
        &format!("nap: \"{marker}\""),
    );
    let token = site.token();
    site.start("api", "api");
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
    site.wait_api().await;
    let (code, v) = site.cli(&token, &["deploy", "-f", descriptor.to_str().unwrap()]);
    assert_eq!(code, 0, "the deploy is accepted: {v}");
    let sleep = format!("sleep {marker}");
    let running = eventually("the pass's sleep runs", WAIT, || async {
        let found = plugin_processes(&site.dir, &sleep);
        found
            .iter()
            .any(|(_, c)| c.contains(&sleep))
            .then_some(found)
    })
    .await;
    assert!(
        running.iter().any(|(_, c)| c.contains("ansible-playbook")),
        "ansible-playbook runs the pass: {running:?}"
    );

    signal(&site.children.0[pool], "KILL");
    wait_exit(site.child(pool), WAIT).await;
    let left = eventually(
        "the plugin's processes die with their worker",
        WAIT,
        || async {
            let left = plugin_processes(&site.dir, &sleep);
            left.is_empty().then_some(left)
        },
    )
    .await;
    assert!(left.is_empty(), "no process of the pass is left: {left:?}");
}

#[test]
fn check_config_says_when_a_confined_plugin_has_no_bwrap_and_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("manent.yml");
    let write = |external: &str| {
        std::fs::write(
            &config,
            format!(
                "database: {{url: \"sqlite://manent.db\"}}\nplugins:\n  ansible:\n    external: \
                 {{command: /bin/true, sha256: \"{}\"{external}}}\n",
                "0".repeat(64)
            ),
        )
        .unwrap();
        let out = std::process::Command::new(common::SERVER)
            .arg("-c")
            .arg(&config)
            .args(["admin", "check-config"])
            .output()
            .expect("run manent-server admin check-config");
        assert!(
            out.status.success(),
            "a missing bwrap is a warning: {out:?}"
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let text = write(", bwrap: /nonexistent/bwrap");
    assert!(
        text.contains(
            "warning: plugins.ansible.external.confinement is bwrap, but /nonexistent/bwrap"
        ) && text.contains("confinement: none"),
        "check-config names the plugin, the missing bwrap and what to do: {text}"
    );
    let text = write(", bwrap: /nonexistent/bwrap, confinement: none");
    assert!(
        !text.contains("warning"),
        "an unconfined plugin needs no bwrap: {text}"
    );
}

/// How many lines one full run of the ledger's task appends on the target, one each
/// quarter of a second: ten seconds, longer than a worker takes to come back.
const LEDGER_LINES: usize = 40;

/// A task on the target (not the worker) that appends `<pid of its shell> <n>` lines.
const LEDGER_PLAYBOOK: &str = "- hosts: all
  gather_facts: false
  tasks:
    - name: append to the ledger
      shell: \"i=0; while [ $i -lt 40 ]; do echo \\\"$$ $i\\\" >> {{ ledger }}; i=$((i+1)); sleep 0.25; done\"
";

/// What stops the pool worker in the middle of the ledger's task, and what runs the pass
/// again.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Interruption {
    /// `kill -9`, then a worker under the same id at once (it resumes the deploy).
    Kill,
    /// SIGSTOP past `stale_after`; another worker recovers the deploy.
    Freeze,
    /// SIGTERM with a drain shorter than the task, then a worker under the same id.
    Drain,
    /// An upgrade: a drain, then the "next release" under the same id: the same bytes of
    /// manent-server and manent-plugin-ansible installed at new paths, the configuration
    /// naming the new plugin. The guard's record on the target is what one build hands
    /// to the next.
    Upgrade,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_killed_with_its_worker_and_resumed_at_once_never_runs_beside_its_earlier_run_on_the_target()
 {
    interrupted_pass_never_overlaps(Interruption::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_workers_pass_recovered_by_another_worker_never_runs_beside_its_earlier_run_on_the_target()
 {
    interrupted_pass_never_overlaps(Interruption::Freeze).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_drained_and_resumed_never_runs_beside_its_earlier_run_on_the_target() {
    interrupted_pass_never_overlaps(Interruption::Drain).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_resumed_by_the_next_release_never_runs_beside_its_earlier_run_on_the_target() {
    interrupted_pass_never_overlaps(Interruption::Upgrade).await;
}

/// Starts the ledger's pass on a pool worker, interrupts it `how` once the task writes on
/// the target, lets the pass run again to its success, and reads the ledger: the earlier
/// run's lines all precede the later run's first, and the later run ran the task once,
/// whole.
async fn interrupted_pass_never_overlaps(how: Interruption) {
    let Some((ansible_playbook, plugin, sum, hosts, mut site)) = ansible_site(Db::Sqlite, 1).await
    else {
        return;
    };
    // A drain shorter than the task: the deploy is left pending, its plugin stopped.
    let config = |command: &Path| {
        format!(
            "{}dbos: {{drain_timeout: 1s}}\n",
            ansible_plugin(command, &sum, &ansible_playbook, "")
        )
    };
    site.set_config(&config(&plugin));
    ansible_environment(&site, &hosts, "acme/site", "", "");
    let ledger = hosts.hosts[0].root_dir.join("ledger");
    let descriptor = ansible_descriptor(
        &site,
        "acme/site",
        LEDGER_PLAYBOOK,
        &format!("ledger: \"{}\"", ledger.display()),
    );
    let token = site.token();
    site.start("api", "api");
    let pool_env = [
        ("MANENT__DBOS__PLUGINS", "ansible"),
        (
            "MANENT_ANSIBLE_PLAYBOOK",
            ansible_playbook.to_str().unwrap(),
        ),
        ("MANENT__RECOVERY__AUTOMATIC", "true"),
    ];
    let first = site.start_with("worker", "pool", &pool_env);
    site.wait_api().await;
    let (code, v) = site.cli(&token, &["deploy", "-f", descriptor.to_str().unwrap()]);
    assert_eq!(code, 0, "the deploy is accepted: {v}");
    let id = v["id"].as_str().expect("a deploy id").to_string();
    eventually(
        "the first run's task writes on the target",
        WAIT,
        || async { ledger.exists().then_some(()) },
    )
    .await;

    match how {
        Interruption::Kill | Interruption::Drain | Interruption::Upgrade => {
            signal(
                &site.children.0[first],
                if how == Interruption::Kill {
                    "KILL"
                } else {
                    "TERM"
                },
            );
            wait_exit(site.child(first), WAIT).await;
            if how == Interruption::Upgrade {
                let release = site.dir.join("release-2");
                std::fs::create_dir_all(&release).unwrap();
                for (from, name) in [
                    (Path::new(common::SERVER), "manent-server"),
                    (&plugin, "manent-plugin-ansible"),
                ] {
                    let to = release.join(name);
                    std::fs::hard_link(from, &to)
                        .or_else(|_| std::fs::copy(from, &to).map(|_| ()))
                        .unwrap();
                }
                site.set_config(&config(&release.join("manent-plugin-ansible")));
                site.start_binary(&release.join("manent-server"), "worker", "pool", &pool_env);
            } else {
                site.start_with("worker", "pool", &pool_env);
            }
        }
        Interruption::Freeze => {
            pause_outside_transactions(&site.children.0[first], &site.db.url).await;
            site.start_with("worker", "pool-2", &pool_env);
        }
    }
    wait_success(&site, &hosts, &token, &id).await;
    if how == Interruption::Freeze {
        signal(&site.children.0[first], "CONT");
    }

    let runs = common::ledger_runs(&std::fs::read_to_string(&ledger).unwrap_or_default());
    common::assert_stopped_then_run_once(&runs, LEDGER_LINES, &format!("{how:?}"));
}
