//! The Python peers of the fan-out benchmark, each from PyPI in a virtualenv that
//! `run-fanout.sh` sets up: `ansible` (ansible-core, `ansible-playbook`), `mitogen` (the
//! same playbook under Mitogen's `mitogen_linear` strategy: one Python interpreter per
//! target over one SSH connection, modules run in it instead of being copied each time), and
//! `pyinfra` (operations compiled to shell, run over paramiko). Each deploys the same thing as
//! the others: the artifact copied (checksummed, renamed into place) under the target's
//! run directory, then `test -s` on it. See bench/README.md, "Fan-out over SSH".

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Instant,
};

use anyhow::{Context, Result, bail};
use tokio::process::Command;

use crate::{ARTIFACT, Outcome, Site, Workload, q, target_name};

/// Where the Python peers are (`--ansible-playbook`, `--mitogen-strategy`, `--pyinfra`).
pub(crate) struct Peers {
    pub ansible_playbook: PathBuf,
    /// `ansible_mitogen/plugins/strategy` of the installed Mitogen.
    pub mitogen_strategy: Option<PathBuf>,
    pub pyinfra: PathBuf,
}

/// Runs `command` (its output kept in `dir/output.txt`), timed; fails with its last lines.
async fn timed_run(mut command: Command, dir: &Path, what: &str) -> Result<f64> {
    let started = Instant::now();
    let out = command
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .with_context(|| format!("cannot run {what}"))?;
    let elapsed = started.elapsed().as_secs_f64();
    std::fs::write(dir.join("output.txt"), [&out.stdout[..], &out.stderr[..]].concat())?;
    if !out.status.success() {
        let stdout = String::from_utf8_lossy(&out.stdout);
        let tail: Vec<&str> = stdout.lines().rev().take(15).collect();
        bail!(
            "{what} exited {}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim_end(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    Ok(elapsed)
}

/// `ansible-playbook`, or with `mitogen` its `mitogen_linear` strategy.
pub(crate) async fn run_ansible(
    site: &Site,
    w: &Workload,
    run_id: &str,
    peers: &Peers,
    mitogen: bool,
) -> Result<Outcome> {
    let dir = site.scratch.join(format!("ansible-{run_id}"));
    std::fs::create_dir_all(&dir)?;
    // A short control path directory of its own: no master from an earlier run is reused.
    let cp = tempfile::Builder::new()
        .prefix("fo-cp-")
        .tempdir_in("/tmp")?;
    let known = site.hosts.known_hosts.display();
    let mut inventory = String::from("[targets]\n");
    for (i, h) in site.hosts.hosts.iter().enumerate() {
        inventory.push_str(&format!(
            "{name} ansible_host={addr} ansible_port={port} ansible_user={user} \
             ansible_ssh_private_key_file={key} \
             ansible_ssh_common_args='-o UserKnownHostsFile={known} -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes' \
             ansible_python_interpreter=/usr/bin/python3 root_dir={root}\n",
            name = target_name(i),
            addr = h.addr,
            port = h.port,
            user = site.hosts.user,
            key = site.hosts.client_key.display(),
            root = h.root_dir.display(),
        ));
    }
    std::fs::write(dir.join("inventory.ini"), inventory)?;
    let forks = site.hosts.hosts.len();
    let strategy = match (mitogen, &peers.mitogen_strategy) {
        (false, _) => String::new(),
        (true, Some(path)) => format!(
            "strategy_plugins = {}\nstrategy = mitogen_linear\n",
            path.display()
        ),
        (true, None) => bail!("mitogen needs --mitogen-strategy (run-fanout.sh passes it)"),
    };
    std::fs::write(
        dir.join("ansible.cfg"),
        format!(
            "[defaults]\nforks = {forks}\nhost_key_checking = True\ngathering = explicit\n\
             retry_files_enabled = False\nlocal_tmp = {tmp}/local\n{strategy}\
             [ssh_connection]\npipelining = True\n\
             ssh_args = -o ControlMaster=auto -o ControlPersist=60s\n\
             control_path_dir = {cp}\n",
            tmp = dir.display(),
            cp = cp.path().display(),
        ),
    )?;
    std::fs::write(
        dir.join("playbook.yml"),
        format!(
            "- hosts: targets\n  gather_facts: false\n  tasks:\n\
             \x20   - name: copy the artifact (SHA-1 verified, atomic rename)\n\
             \x20     ansible.builtin.copy:\n\
             \x20       src: {src}\n\
             \x20       dest: \"{{{{ root_dir }}}}/{run_id}/\"\n\
             \x20       checksum: {sha1}\n\
             \x20   - name: check\n\
             \x20     ansible.builtin.command: test -s \"{{{{ root_dir }}}}/{run_id}/{ARTIFACT}\"\n",
            src = q(w.path.to_string_lossy()),
            sha1 = q(&w.sha1),
        ),
    )?;
    let mut command = Command::new(&peers.ansible_playbook);
    command
        .current_dir(&dir)
        .env("ANSIBLE_CONFIG", dir.join("ansible.cfg"))
        .args(["-i", "inventory.ini", "playbook.yml"]);
    let what = if mitogen {
        "ansible-playbook (mitogen)"
    } else {
        "ansible-playbook"
    };
    let elapsed = timed_run(command, &dir, what).await?;
    // End the persisted masters (started by this run, one socket each) now rather than in 60 s.
    for socket in std::fs::read_dir(cp.path())?.flatten() {
        let _ = Command::new("ssh")
            .arg("-o")
            .arg(format!("ControlPath={}", socket.path().display()))
            .args(["-O", "exit", "placeholder"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await;
    }
    Ok(Outcome::timed(elapsed, String::new()))
}

/// `pyinfra INVENTORY DEPLOY -y --parallel N`: `files.put` (pyinfra uploads to a temporary
/// file and moves it into place), then the check.
pub(crate) async fn run_pyinfra(
    site: &Site,
    w: &Workload,
    run_id: &str,
    peers: &Peers,
) -> Result<Outcome> {
    let dir = site.scratch.join(format!("pyinfra-{run_id}"));
    std::fs::create_dir_all(&dir)?;
    let mut hosts = String::from("targets = [\n");
    for (i, h) in site.hosts.hosts.iter().enumerate() {
        hosts.push_str(&format!(
            "    ({name:?}, {{\"ssh_hostname\": {addr:?}, \"ssh_port\": {port}, \
             \"ssh_user\": {user:?}, \"ssh_key\": {key:?}, \"ssh_known_hosts_file\": {known:?}, \
             \"ssh_strict_host_key_checking\": \"yes\", \"root_dir\": {root:?}}}),\n",
            name = target_name(i),
            addr = h.addr.to_string(),
            port = h.port,
            user = site.hosts.user,
            key = site.hosts.client_key.display().to_string(),
            known = site.hosts.known_hosts.display().to_string(),
            root = h.root_dir.display().to_string(),
        ));
    }
    hosts.push_str("]\n");
    std::fs::write(dir.join("inventory.py"), hosts)?;
    std::fs::write(
        dir.join("deploy.py"),
        format!(
            "from pyinfra import host\n\
             from pyinfra.operations import files, server\n\
             dest = host.data.root_dir + {run:?}\n\
             files.put(name=\"copy the artifact\", src={src:?}, dest=dest + \"/{ARTIFACT}\")\n\
             server.shell(name=\"check\", commands=[\"test -s \" + dest + \"/{ARTIFACT}\"])\n",
            run = format!("/{run_id}"),
            src = w.path.display().to_string(),
        ),
    )?;
    let mut command = Command::new(&peers.pyinfra);
    command.current_dir(&dir).args([
        "inventory.py",
        "deploy.py",
        "-y",
        "--parallel",
        &site.hosts.hosts.len().to_string(),
    ]);
    let elapsed = timed_run(command, &dir, "pyinfra").await?;
    Ok(Outcome::timed(elapsed, String::new()))
}
