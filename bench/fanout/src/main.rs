//! Fan-out benchmark (issues 4 and 30): one artifact to 20, 100 and 300 loopback OpenSSH
//! targets (copy, verify sha256, rename into place, one check command), timed for manent
//! (in-process engine on a fresh SQLite file — `manent` — or a fresh PostgreSQL database —
//! `manent-pg` —, every step checkpointed; `manent-warm` a second deploy over the first's
//! connections, with the worker's memory sampled), plain parallel `scp` + `ssh`,
//! `ansible-playbook`, ansible under Mitogen (`mitogen`), `pyinfra` (the Python peers in
//! `peers.rs`), and `floor`: the same bytes over already-open OpenSSH connections
//! (ControlMaster, manent's cipher) with `cat > file && sync` on each target. A diagnostic
//! row (`transport`) does manent's per-target work through `manent-ssh` alone, without the
//! engine, to show what the engine adds.
//!
//! Every "host" shares this machine's filesystem, so each target writes under its own
//! host scratch directory (`SshHost::root_dir`). See bench/README.md, "Fan-out over SSH".

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail, ensure};
use manent_config::Config;
use manent_engine::{Connections, Database, Engine, EngineConfig, StepRecord, WorkflowStatus};
use manent_ssh::{Address, ConnectionPool, SshAuth};
use manent_testkit::{Db, TestDb, sshd::SshHosts};
use sha2::{Digest, Sha256};
use tokio::process::Command;

mod peers;
mod report;
use peers::{Peers, run_ansible, run_pyinfra};
use report::report;

/// Longest one engine may take for one workload before the run is called failed.
const RUN_TIMEOUT: Duration = Duration::from_secs(900);
const ARTIFACT: &str = "app.bin";
const ENGINES: [&str; 9] = [
    "manent",
    "manent-pg",
    "manent-warm",
    "scp",
    "ansible",
    "mitogen",
    "pyinfra",
    "floor",
    "transport",
];
/// The cipher manent's SSH client prefers (`manent-ssh`'s `PREFERRED_CIPHERS`), which the
/// floor's OpenSSH connections use too: the floor is the same transport, not a cheaper one.
const FLOOR_CIPHER: &str = "aes128-gcm@openssh.com";

struct Args {
    /// Target counts, each a fleet of its own (`--targets 20,100,300`).
    targets: Vec<usize>,
    sizes_mb: Vec<u64>,
    /// A workload runs at a target count only when size × targets stays within this many MB:
    /// every target writes to the same disk here (`--max-total-mb`).
    max_total_mb: u64,
    engines: Vec<String>,
    peers: Peers,
    json: Option<PathBuf>,
    postgres_url: Option<String>,
    /// The account every engine logs in as (`--login-user`); the current user when `None`.
    login_user: Option<String>,
    /// manent's `ssh.verify` (`--ssh-verify auto|sftp|command`); its default when `None`.
    ssh_verify: Option<String>,
    /// The longest one engine's run of one workload may take (`--run-timeout SECS`).
    run_timeout: Duration,
}

fn usage() -> &'static str {
    "usage: manent-fanout-bench [--targets 20,100,300] [--sizes-mb 50,1] [--max-total-mb 1000] \
     [--engines manent,manent-pg,manent-warm,scp,ansible,mitogen,pyinfra,floor,transport] \
     [--postgres-url ADMIN_URL] [--ansible-playbook PATH] [--mitogen-strategy DIR] [--pyinfra PATH] \
     [--json FILE] [--run-timeout SECS] [--login-user ACCOUNT] [--ssh-verify auto|sftp|command]\n\
     manent runs on a fresh SQLite file, manent-pg on a fresh PostgreSQL database created \
     (and dropped) through ADMIN_URL (default $MANENT_TEST_POSTGRES, else \
     postgres://postgres@127.0.0.1:5432/postgres); --login-user (as root): every engine logs in \
     to the targets as that existing account instead of the current user"
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        targets: vec![20, 100, 300],
        sizes_mb: vec![50, 1],
        max_total_mb: 1000,
        engines: ENGINES.iter().map(|s| s.to_string()).collect(),
        peers: Peers {
            ansible_playbook: PathBuf::from("ansible-playbook"),
            mitogen_strategy: None,
            pyinfra: PathBuf::from("pyinfra"),
        },
        json: None,
        postgres_url: None,
        login_user: None,
        ssh_verify: None,
        run_timeout: Duration::from_secs(300),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .ok_or_else(|| anyhow!("{flag} needs a value\n{}", usage()))
        };
        match flag.as_str() {
            "--targets" => {
                args.targets = value()?
                    .split(',')
                    .map(|s| s.trim().parse::<usize>().context("--targets"))
                    .collect::<Result<_>>()?
            }
            "--max-total-mb" => args.max_total_mb = value()?.parse().context("--max-total-mb")?,
            "--sizes-mb" => {
                args.sizes_mb = value()?
                    .split(',')
                    .map(|s| s.trim().parse::<u64>().context("--sizes-mb"))
                    .collect::<Result<_>>()?
            }
            "--engines" => {
                args.engines = value()?.split(',').map(|s| s.trim().to_string()).collect();
                for e in &args.engines {
                    ensure!(
                        ENGINES.contains(&e.as_str()),
                        "unknown engine {e}\n{}",
                        usage()
                    );
                }
            }
            "--ansible-playbook" => args.peers.ansible_playbook = value()?.into(),
            "--mitogen-strategy" => args.peers.mitogen_strategy = Some(value()?.into()),
            "--pyinfra" => args.peers.pyinfra = value()?.into(),
            "--run-timeout" => {
                args.run_timeout =
                    Duration::from_secs(value()?.parse().context("--run-timeout (seconds)")?)
            }
            "--json" => args.json = Some(value()?.into()),
            "--postgres-url" => args.postgres_url = Some(value()?),
            "--login-user" => args.login_user = Some(value()?),
            "--ssh-verify" => {
                let how = value()?;
                ensure!(
                    ["auto", "sftp", "command"].contains(&how.as_str()),
                    "--ssh-verify is auto, sftp or command, not {how}"
                );
                args.ssh_verify = Some(how);
            }
            "-h" | "--help" => {
                println!("{}", usage());
                std::process::exit(0);
            }
            other => bail!("unknown argument {other}\n{}", usage()),
        }
    }
    ensure!(
        args.targets.iter().all(|n| (1..=1000).contains(n)),
        "--targets: each count between 1 and 1000"
    );
    Ok(args)
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let scratch = tempfile::Builder::new()
        .prefix("manent-fanout-")
        .tempdir()
        .context("a scratch directory")?;
    // The testkit creates manent-pg's fresh databases through this admin URL.
    if let Some(url) = &args.postgres_url {
        // SAFETY: set before the runtime starts any thread; nothing else reads the environment yet.
        unsafe { std::env::set_var("MANENT_TEST_POSTGRES", url) };
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run(args, scratch.path()))
}

/// The files and facts one workload needs.
struct Workload {
    label: String,
    size: u64,
    /// `<scratch>/<label>/app.bin`.
    path: PathBuf,
    sha256: String,
    sha1: String,
}

/// The world every engine runs against.
struct Site {
    hosts: SshHosts,
    scratch: PathBuf,
    /// `<base>/t<i>` is host i's `root_dir` (manent's `deploy.dest` is `<base>/{target}/{version}`).
    base: PathBuf,
    /// manent's `ssh.verify`, when set.
    ssh_verify: Option<String>,
}

struct Measurement {
    targets: usize,
    workload: String,
    engine: String,
    seconds: Option<f64>,
    note: String,
    /// The worker's resident memory (KiB) before the timed deploy and its peak during it
    /// (manent rows: the engine runs in this process).
    worker_rss_kib: Option<(u64, u64)>,
    /// The machine's load average (1, 5, 15 minutes) when the run started.
    load: String,
}

/// What one engine's run returns: its wall time, a note, and the worker's memory.
struct Outcome {
    seconds: f64,
    note: String,
    worker_rss_kib: Option<(u64, u64)>,
}

impl Outcome {
    fn timed(seconds: f64, note: String) -> Outcome {
        Outcome {
            seconds,
            note,
            worker_rss_kib: None,
        }
    }
}

async fn run(args: Args, scratch: &Path) -> Result<()> {
    let mut results = Vec::new();
    for &targets in &args.targets {
        let sizes: Vec<u64> = args
            .sizes_mb
            .iter()
            .copied()
            .filter(|mb| mb * targets as u64 <= args.max_total_mb)
            .collect();
        if sizes.is_empty() {
            eprintln!("== {targets} targets: no workload within --max-total-mb, skipped");
            continue;
        }
        let site = start_site(&args, scratch, targets).await?;
        for (w, mb) in sizes.iter().enumerate() {
            let workload = make_workload(scratch, *mb).await?;
            eprintln!(
                "== {targets} targets, workload {}: {} bytes, sha256 {}",
                workload.label, workload.size, workload.sha256
            );
            for engine in &args.engines {
                settle().await;
                let run_id = format!(
                    "{engine}-{targets}-{}-{}-{w}",
                    workload.label,
                    std::process::id()
                );
                eprintln!(
                    "-- {engine} {targets} targets {} (load {})",
                    workload.label,
                    loadavg().unwrap_or_default()
                );
                let m = measure(&site, &args, &workload, engine, &run_id).await;
                eprintln!(
                    "   {engine} {targets} targets {}: {} {}",
                    m.workload,
                    m.seconds
                        .map(|s| format!("{s:.3} s"))
                        .unwrap_or_else(|| "FAILED".into()),
                    m.note
                );
                results.push(m);
                clean(&site, &run_id);
            }
            let _ = std::fs::remove_dir_all(workload.path.parent().unwrap());
        }
        drop(site);
    }
    report(&args, &results)?;
    Ok(())
}

/// Starts `targets` sshd hosts (one server per 16 loopback addresses) with their scratch
/// directories at `<scratch>/targets-<n>/t<i>`; every host answers before it returns.
async fn start_site(args: &Args, scratch: &Path, targets: usize) -> Result<Site> {
    eprintln!("starting {targets} sshd targets");
    let mut hosts = SshHosts::start_fleet(targets, args.login_user.as_deref()).await;
    eprintln!("logging in as {}", hosts.user);
    let base = scratch.join(format!("targets-{targets}"));
    std::fs::create_dir_all(&base)?;
    if args.login_user.is_some() {
        // The deploy destinations are reached through `<scratch>/targets-<n>/t<i>`: the
        // account must be able to pass through (not list) the scratch directory.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(scratch, std::fs::Permissions::from_mode(0o711))?;
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o711))?;
    }
    // Real directories, owned as the hosts' own: manent refuses a release path that passes
    // through a symbolic link (docs/environments.md), so `<base>/t<i>` becomes each host's
    // scratch directory, where every engine writes and every copy is verified.
    for (i, h) in hosts.hosts.iter_mut().enumerate() {
        use std::os::unix::fs::MetadataExt;
        let dir = base.join(target_name(i));
        std::fs::create_dir_all(&dir)?;
        let owner = std::fs::metadata(&h.root_dir)?;
        std::os::unix::fs::chown(&dir, Some(owner.uid()), Some(owner.gid()))?;
        h.root_dir = dir;
    }
    let site = Site {
        hosts,
        scratch: scratch.to_path_buf(),
        base,
        ssh_verify: args.ssh_verify.clone(),
    };
    // Untimed: every host answers `ssh … true` (and first-touch costs are paid by nobody).
    warm_up(&site).await?;
    Ok(site)
}

/// Runs `engine` once on `w`, then verifies every target's copy (untimed).
async fn measure(
    site: &Site,
    args: &Args,
    w: &Workload,
    engine: &str,
    run_id: &str,
) -> Measurement {
    let load = loadavg().unwrap_or_default();
    let cpu_before = cpu_ticks();
    let run = async {
        match engine {
            "manent" => run_manent(site, w, run_id, Db::Sqlite, false).await,
            "manent-pg" => run_manent(site, w, run_id, Db::Postgres, false).await,
            // A second deploy to the same targets: the first's SSH connections are warm.
            "manent-warm" => run_manent(site, w, run_id, Db::Sqlite, true).await,
            "scp" => run_scp(site, w, run_id).await,
            "ansible" => run_ansible(site, w, run_id, &args.peers, false).await,
            "mitogen" => run_ansible(site, w, run_id, &args.peers, true).await,
            "pyinfra" => run_pyinfra(site, w, run_id, &args.peers).await,
            "floor" => run_floor(site, w, run_id).await,
            "transport" => run_transport(site, w, run_id).await,
            _ => unreachable!(),
        }
    };
    // Bounded: an engine that hangs (a peer that cannot reach a target) costs its timeout,
    // then the run goes on with the next (the peers' processes are killed with it).
    let outcome = match tokio::time::timeout(args.run_timeout, run).await {
        Ok(outcome) => outcome,
        Err(_) => Err(anyhow!(
            "gave up after {} s (--run-timeout)",
            args.run_timeout.as_secs()
        )),
    };
    // manent's rows measure their timed deploy's CPU themselves (manent-warm's first deploy
    // is untimed).
    let outcome = outcome.map(|mut o| {
        if !engine.starts_with("manent") {
            let cpu = cpu_note(cpu_before, cpu_ticks());
            o.note = if o.note.is_empty() {
                cpu
            } else {
                format!("{}; {cpu}", o.note)
            };
        }
        o
    });
    let measurement = |seconds, note, worker_rss_kib| Measurement {
        targets: site.hosts.hosts.len(),
        workload: w.label.clone(),
        engine: engine.to_string(),
        seconds,
        note,
        worker_rss_kib,
        load: load.clone(),
    };
    match outcome {
        Ok(o) => match verify(site, w, run_id).await {
            Ok(()) => measurement(Some(o.seconds), o.note, o.worker_rss_kib),
            Err(e) => measurement(None, format!("verification failed: {e:#}"), None),
        },
        Err(e) => measurement(None, format!("failed: {e:#}"), None),
    }
}

fn target_name(i: usize) -> String {
    format!("t{}", i + 1)
}

fn loadavg() -> Option<String> {
    let s = std::fs::read_to_string("/proc/loadavg").ok()?;
    Some(s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
}

/// CPU time of the whole machine from `/proc/stat`, in clock ticks: (busy, steal). Busy is
/// user + nice + system + irq + softirq of every process (the targets' sshd included), so a
/// run's figure is the work the fan-out cost, less noisy than its wall time when 2 cores are
/// saturated. Steal is time the hypervisor gave to other machines.
fn cpu_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    let at = |i: usize| f.get(i).copied().unwrap_or(0);
    Some((at(0) + at(1) + at(2) + at(5) + at(6), at(7)))
}

/// "cpu B s, steal S s" between two [`cpu_ticks`] readings (USER_HZ is 100 on Linux).
fn cpu_note(before: Option<(u64, u64)>, after: Option<(u64, u64)>) -> String {
    match (before, after) {
        (Some((b0, s0)), Some((b1, s1))) => format!(
            "cpu {:.2} s, steal {:.2} s",
            b1.saturating_sub(b0) as f64 / 100.0,
            s1.saturating_sub(s0) as f64 / 100.0
        ),
        _ => "cpu n/a".into(),
    }
}

/// Flushes the previous run's writes and lets the machine calm down a little.
async fn settle() {
    let _ = Command::new("sync").status().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
}

async fn make_workload(scratch: &Path, mb: u64) -> Result<Workload> {
    let label = format!("{mb}MB");
    let dir = scratch.join(format!("artifact-{label}"));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(ARTIFACT);
    let size = mb * 1024 * 1024;
    let sha256 = {
        let path = path.clone();
        tokio::task::spawn_blocking(move || -> Result<String> {
            use std::io::{Read, Write};
            let mut random = std::fs::File::open("/dev/urandom")?;
            let mut out = std::fs::File::create(&path)?;
            let mut hasher = Sha256::new();
            let mut buf = vec![0u8; 1024 * 1024];
            let mut left = size;
            while left > 0 {
                let n = left.min(buf.len() as u64) as usize;
                random.read_exact(&mut buf[..n])?;
                hasher.update(&buf[..n]);
                out.write_all(&buf[..n])?;
                left -= n as u64;
            }
            out.sync_all()?;
            Ok(hex::encode(hasher.finalize()))
        })
        .await??
    };
    // ansible's copy module takes a SHA-1 (`checksum:`); sha1sum is coreutils.
    let out = Command::new("sha1sum").arg(&path).output().await?;
    ensure!(out.status.success(), "sha1sum failed");
    let sha1 = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string();
    Ok(Workload {
        label,
        size,
        path,
        sha256,
        sha1,
    })
}

/// OpenSSH client options shared by the scp and ssh peers: no connection sharing.
fn ssh_opts(site: &Site) -> Vec<String> {
    let mut opts = ssh_login_opts(site);
    opts.extend(["-o".into(), "ControlMaster=no".into()]);
    opts
}

/// The key, `known_hosts` and batch options every OpenSSH client here uses.
fn ssh_login_opts(site: &Site) -> Vec<String> {
    [
        "-i".to_string(),
        site.hosts.client_key.display().to_string(),
        "-o".into(),
        format!("UserKnownHostsFile={}", site.hosts.known_hosts.display()),
        "-o".into(),
        "StrictHostKeyChecking=yes".into(),
        "-o".into(),
        "BatchMode=yes".into(),
        "-o".into(),
        "IdentitiesOnly=yes".into(),
    ]
    .into()
}

async fn checked(cmd: &mut Command, what: &str) -> Result<()> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .await
        .with_context(|| format!("cannot run {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} exited {}: {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim_end(),
            String::from_utf8_lossy(&out.stdout).trim_end()
        );
    }
    Ok(())
}

async fn warm_up(site: &Site) -> Result<()> {
    let mut tasks = Vec::new();
    for h in &site.hosts.hosts {
        let mut cmd = Command::new("ssh");
        cmd.args(ssh_opts(site))
            .args(["-p", &h.port.to_string()])
            .arg(format!("{}@{}", site.hosts.user, h.addr))
            .arg("true");
        tasks.push(async move { checked(&mut cmd, "ssh warm-up").await });
    }
    for r in futures_join(tasks).await {
        r?;
    }
    Ok(())
}

/// Runs every future at once and collects the results in order.
async fn futures_join<F, T>(futures: Vec<F>) -> Vec<T>
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("a benchmark task panicked"));
    }
    out
}

/// Where engine `engine`'s copy of the artifact must be on host `i` after run `run_id`.
fn final_path(site: &Site, i: usize, run_id: &str) -> PathBuf {
    site.hosts.hosts[i].root_dir.join(run_id).join(ARTIFACT)
}

/// Untimed: every target holds the artifact with the right sha256 and no `.part` is left.
async fn verify(site: &Site, w: &Workload, run_id: &str) -> Result<()> {
    let paths: Vec<PathBuf> = (0..site.hosts.hosts.len())
        .map(|i| final_path(site, i, run_id))
        .collect();
    let roots: Vec<PathBuf> = site
        .hosts
        .hosts
        .iter()
        .map(|h| h.root_dir.clone())
        .collect();
    let expected = w.sha256.clone();
    tokio::task::spawn_blocking(move || -> Result<()> {
        for p in &paths {
            let bytes = std::fs::read(p).with_context(|| format!("{} missing", p.display()))?;
            let sum = hex::encode(Sha256::digest(&bytes));
            ensure!(sum == expected, "{}: sha256 {sum}", p.display());
        }
        for r in &roots {
            for entry in walk(r) {
                ensure!(
                    !entry.to_string_lossy().ends_with(".part"),
                    "{} left behind",
                    entry.display()
                );
            }
        }
        Ok(())
    })
    .await?
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(entries) = std::fs::read_dir(&d) {
            for e in entries.flatten() {
                let p = e.path();
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    stack.push(p.clone());
                }
                out.push(p);
            }
        }
    }
    out
}

fn clean(site: &Site, run_id: &str) {
    for h in &site.hosts.hosts {
        let _ = std::fs::remove_dir_all(h.root_dir.join(run_id));
        let _ = std::fs::remove_file(h.root_dir.join(format!(".{run_id}.part")));
    }
}

// ---- manent ----

fn q(s: impl AsRef<str>) -> String {
    serde_json::to_string(s.as_ref()).expect("a string serialises")
}

/// Writes `bench/fanout/prod.yml` under `source`: every target, remote-copy to
/// `<base>/{target}/{version}`, all in one wave, a command check.
fn write_environment(site: &Site, source: &Path) -> Result<()> {
    let targets: String = site
        .hosts
        .hosts
        .iter()
        .enumerate()
        .map(|(i, h)| {
            format!(
                "  - {{name: {}, host: {}, port: {}, user: {}}}\n",
                target_name(i),
                q(&h.addr),
                h.port,
                q(&site.hosts.user)
            )
        })
        .collect();
    let text = format!(
        "targets:\n{targets}\
         ssh: {{key: {key}, known_hosts: {known_hosts}{verify}}}\n\
         deploy:\n  plugin: remote-copy\n  dest: {dest}\n\
         rollout: {{max_parallel: {n}}}\n\
         checks:\n  - {{type: command, command: {check}}}\n",
        key = q(site.hosts.client_key.to_string_lossy()),
        known_hosts = q(site.hosts.known_hosts.to_string_lossy()),
        verify = site
            .ssh_verify
            .as_ref()
            .map(|v| format!(", verify: {v}"))
            .unwrap_or_default(),
        dest = q(format!("{}/{{target}}/{{version}}", site.base.display())),
        n = site.hosts.hosts.len(),
        check = q("test -s \"$MANENT_ARTIFACT_APP_BIN\""),
    );
    let dir = source.join("bench/fanout");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("prod.yml"), text)?;
    Ok(())
}

async fn run_manent(
    site: &Site,
    w: &Workload,
    run_id: &str,
    backend: Db,
    second: bool,
) -> Result<Outcome> {
    let dir = site.scratch.join(format!("manent-{run_id}"));
    let source = dir.join("environments");
    write_environment(site, &source)?;
    // A fresh database: a SQLite file in `dir`, or a PostgreSQL database dropped with `_db`.
    let (url, _db) = match backend {
        Db::Sqlite => (
            format!("sqlite://{}", dir.join("manent.db").display()),
            None,
        ),
        Db::Postgres => {
            let db = TestDb::new(Db::Postgres).await;
            (db.url.clone(), Some(db))
        }
    };
    let executor_id = format!("fanout-{run_id}");
    // The artifact's directory is the only source deploys may fetch from.
    let artifact_dir = w
        .path
        .parent()
        .ok_or_else(|| anyhow!("the artifact has no directory"))?;
    // Fetched artifacts are kept in our scratch directory (removed below).
    let yaml = format!(
        "database: {{url: {}}}\ndbos: {{executor_id: {}}}\nenvironments: {{source: {}}}\n\
         artifacts: {{sources: [{}]}}\nworker: {{workdir: {}}}\n",
        q(&url),
        q(&executor_id),
        q(source.to_string_lossy()),
        q(artifact_dir.to_string_lossy()),
        q(site.scratch.join("manent-work").to_string_lossy()),
    );
    let config = Config::from_yaml_str(&yaml, "manent.yml", std::iter::empty())
        .map_err(|e| anyhow!("{e}"))?;
    let database = Database::open(&config.database.url, &Connections::default())
        .await
        .map_err(|e| anyhow!("open {url}: {e}"))?;
    let mut engine_config = EngineConfig::new(config.effective_executor_id());
    engine_config.stale_after = config.recovery.stale_after;
    engine_config.heartbeat_interval = config.recovery.heartbeat_interval;
    let engine = Engine::new(database, engine_config);
    let queues = manent_deploy::worker_queues(&config);
    ensure!(!queues.is_empty(), "the worker serves no queue");
    for queue in &queues {
        engine.listen(queue.spec());
    }
    // The benchmark submits no schedule.at deploy: the authority that refuses them all does.
    manent_deploy::register_workflows(
        &engine,
        &config,
        std::sync::Arc::new(manent_deploy::authority::NoTokens),
        // A `file://` artifact and command checks: nothing over HTTP.
        std::sync::Arc::new(manent_deploy::http::NoClient),
    );
    engine.launch().await.map_err(|e| anyhow!("launch: {e}"))?;
    let client = engine.client();

    let first = if second {
        // Untimed: opens the connections the timed deploy finds warm.
        let warm_up = format!("{run_id}-first");
        let outcome = deploy_once(&client, &config, w, &warm_up).await;
        clean(site, &warm_up);
        Some(outcome)
    } else {
        None
    };
    let result = match first {
        Some(Err(e)) => Err(e.context("the first (untimed) deploy")),
        _ => {
            let before = cpu_ticks();
            let rss_before = rss_kib().unwrap_or(0);
            let sampler = RssSampler::start();
            let deployed = deploy_once(&client, &config, w, run_id).await;
            let rss_peak = sampler.stop().await.max(rss_before);
            let targets = site.hosts.hosts.len() as u64;
            deployed.map(|(secs, note)| Outcome {
                seconds: secs,
                note: format!(
                    "{note}; {}; worker rss {:.1} MB before, peak +{:.1} MB ({} KiB per target)",
                    cpu_note(before, cpu_ticks()),
                    rss_before as f64 / 1024.0,
                    (rss_peak - rss_before) as f64 / 1024.0,
                    (rss_peak - rss_before) / targets,
                ),
                worker_rss_kib: Some((rss_before, rss_peak)),
            })
        }
    };
    engine.shutdown(Duration::from_secs(10)).await;
    let _ = std::fs::remove_dir_all(site.scratch.join("manent-work"));
    result
}

/// The resident memory of this process (the worker's, for manent's rows), in KiB.
fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Samples [`rss_kib`] every 10 ms on a thread of its own until stopped; keeps the peak.
/// (`VmHWM` would not do: it is the peak of the whole process, earlier runs included.)
struct RssSampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl RssSampler {
    fn start() -> RssSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut peak = 0;
            while !flag.load(Ordering::Relaxed) {
                peak = peak.max(rss_kib().unwrap_or(0));
                std::thread::sleep(Duration::from_millis(10));
            }
            peak.max(rss_kib().unwrap_or(0))
        });
        RssSampler { stop, thread }
    }

    async fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        tokio::task::spawn_blocking(move || self.thread.join().unwrap_or(0))
            .await
            .unwrap_or(0)
    }
}

/// Submits one deploy of `w` at version `version` (its destination directory) and waits
/// for it; returns its duration and where the time went.
async fn deploy_once(
    client: &manent_engine::Client,
    config: &Config,
    w: &Workload,
    version: &str,
) -> Result<(f64, String)> {
    // The version names the destination directory: <root>/<run_id>/app.bin.
    let descriptor = format!(
        "application: bench/fanout\nenvironment: prod\nartifacts:\n  - \
         {{name: {ARTIFACT}, type: binary, version: {}, url: {}, sha256: {}}}\n",
        q(version),
        q(format!("file://{}", w.path.display())),
        q(&w.sha256),
    );
    let started = Instant::now();
    let submitted_ms = manent_engine::now_ms();
    let parsed = manent_deploy::submission::parse(descriptor, "deploy.yml".into())
        .await
        .map_err(|e| anyhow!("parse: {e}"))?;
    let submitted = manent_deploy::submission::submit(
        client,
        &std::sync::Arc::new(config.clone()),
        parsed,
        false,
        &manent_deploy::Submitter::named("bench"),
    )
    .await
    .map_err(|e| anyhow!("submit: {e}"))?;
    let record = client
        .wait(&submitted.id, RUN_TIMEOUT)
        .await
        .map_err(|e| anyhow!("wait: {e}"))?;
    let elapsed = started.elapsed().as_secs_f64();
    if record.status == WorkflowStatus::Success {
        let steps = client
            .steps(&submitted.id)
            .await
            .map_err(|e| anyhow!("steps: {e}"))?;
        Ok((
            elapsed,
            breakdown(&steps, submitted_ms, record.updated_at_ms),
        ))
    } else {
        let status = manent_deploy::views::deploy_views::status(client, &submitted.id)
            .await
            .ok()
            .flatten();
        Err(anyhow!(
            "deploy ended {}: {:?}; targets: {:?}",
            record.status,
            record.error,
            status.map(|s| s
                .targets
                .into_iter()
                .filter(|t| t.status != "deployed")
                .map(|t| format!("{} {} {:?}", t.name, t.status, t.detail))
                .collect::<Vec<_>>())
        ))
    }
}

/// Where manent's time went, from its own step records: claim (submit → first step),
/// fetch, per-target upload (connect + SFTP mkdir + SFTP write + fsync + sha256sum + rename)
/// and check spans, and the tail (last step → SUCCESS).
fn breakdown(steps: &[StepRecord], submitted_ms: i64, done_ms: i64) -> String {
    let span = |s: &StepRecord| s.finished_at_ms.unwrap_or(s.started_at_ms) - s.started_at_ms;
    let of = |kind: &str| -> Vec<i64> {
        let mut v: Vec<i64> = steps
            .iter()
            .filter(|s| s.name.contains(kind))
            .map(span)
            .collect();
        v.sort_unstable();
        v
    };
    let stats = |v: &[i64]| -> String {
        if v.is_empty() {
            return "-".into();
        }
        format!("{}/{}/{}", v[0], v[v.len() / 2], v[v.len() - 1])
    };
    let first = steps
        .iter()
        .map(|s| s.started_at_ms)
        .min()
        .unwrap_or(done_ms);
    let last = steps
        .iter()
        .map(|s| s.finished_at_ms.unwrap_or(s.started_at_ms))
        .max()
        .unwrap_or(done_ms);
    let fetch = of("fetch ");
    format!(
        "steps {}; claim {} ms; fetch {} ms; upload min/med/max {} ms; check {} ms; tail {} ms",
        steps.len(),
        first - submitted_ms,
        fetch.iter().sum::<i64>(),
        stats(&of(": upload ")),
        stats(&of(": check ")),
        done_ms - last
    )
}

// ---- transport only (diagnostic) ----

async fn run_transport(site: &Site, w: &Workload, run_id: &str) -> Result<Outcome> {
    let auth = SshAuth::new(&site.hosts.client_key, &site.hosts.known_hosts);
    let pool = Arc::new(ConnectionPool::new(auth));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (i, h) in site.hosts.hosts.iter().enumerate() {
        let pool = pool.clone();
        let addr = Address::new(&h.addr, h.port, &site.hosts.user);
        let dest = site
            .base
            .join(target_name(i))
            .join(run_id)
            .join(ARTIFACT)
            .display()
            .to_string();
        let (local, expected) = (w.path.clone(), w.sha256.clone());
        tasks.push(async move {
            let t0 = Instant::now();
            let conn = pool.get(&addr).await.map_err(|e| anyhow!("connect: {e}"))?;
            let connected = t0.elapsed();
            conn.put_file_verified(&local, &dest, &expected)
                .await
                .map_err(|e| anyhow!("upload: {e}"))?;
            let uploaded = t0.elapsed();
            let out = conn
                .exec(&format!("test -s '{dest}'"), &[])
                .await
                .map_err(|e| anyhow!("check: {e}"))?;
            ensure!(out.success(), "check exited {}", out.status);
            Ok((connected, uploaded, t0.elapsed()))
        });
    }
    let results = futures_join(tasks).await;
    let elapsed = started.elapsed().as_secs_f64();
    let mut connect = Vec::new();
    let mut upload = Vec::new();
    for r in results {
        let (c, u, _) = r?;
        connect.push(c.as_millis());
        upload.push((u - c).as_millis());
    }
    connect.sort_unstable();
    upload.sort_unstable();
    let n = connect.len();
    Ok(Outcome::timed(
        elapsed,
        format!(
            "connect min/med/max {}/{}/{} ms; upload+rename min/med/max {}/{}/{} ms",
            connect[0],
            connect[n / 2],
            connect[n - 1],
            upload[0],
            upload[n / 2],
            upload[n - 1]
        ),
    ))
}

// ---- peer 1: scp + ssh ----

async fn run_scp(site: &Site, w: &Workload, run_id: &str) -> Result<Outcome> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for h in &site.hosts.hosts {
        let opts = ssh_opts(site);
        let login = format!("{}@{}", site.hosts.user, h.addr);
        let port = h.port.to_string();
        let root = h.root_dir.display().to_string();
        // The .part sits in the (existing) host directory, on the same filesystem as the
        // destination, so the `mv` is a rename.
        let part = format!("{root}/.{run_id}.part");
        let dir = format!("{root}/{run_id}");
        let dest = format!("{dir}/{ARTIFACT}");
        let local = w.path.clone();
        let remote = format!(
            "cd '{root}' && printf '%s  %s\\n' '{sha}' '.{run_id}.part' | sha256sum -c --quiet - \
             && mkdir -p '{dir}' && mv -f '{part}' '{dest}' && test -s '{dest}'",
            sha = w.sha256
        );
        tasks.push(async move {
            let mut scp = Command::new("scp");
            scp.args(&opts)
                .args(["-q", "-P", &port])
                .arg(&local)
                .arg(format!("{login}:{part}"));
            checked(&mut scp, "scp").await?;
            let mut ssh = Command::new("ssh");
            ssh.args(&opts).args(["-p", &port]).arg(&login).arg(remote);
            checked(&mut ssh, "ssh").await
        });
    }
    for r in futures_join(tasks).await {
        r?;
    }
    Ok(Outcome::timed(
        started.elapsed().as_secs_f64(),
        String::new(),
    ))
}

// ---- the floor: the same bytes over already-open OpenSSH connections ----

/// Opens one OpenSSH master connection per target (untimed, manent's cipher), then sends the
/// artifact through each at once: `mkdir -p <dir> && cat > <dir>/app.bin && sync`. No
/// verification and no rename: what is left of a deploy when the protocol's work is gone,
/// but the bytes still cross an encrypted connection and reach the disk.
async fn run_floor(site: &Site, w: &Workload, run_id: &str) -> Result<Outcome> {
    // Control sockets need a short path (sun_path is 108 bytes).
    let cp = tempfile::Builder::new()
        .prefix("fo-fl-")
        .tempdir_in("/tmp")?;
    let master_opts = |i: usize| -> Vec<String> {
        let mut opts = ssh_login_opts(site);
        opts.extend([
            "-o".into(),
            format!("Ciphers={FLOOR_CIPHER}"),
            "-S".into(),
            cp.path().join(format!("{i}")).display().to_string(),
        ]);
        opts
    };
    let login = |i: usize| format!("{}@{}", site.hosts.user, site.hosts.hosts[i].addr);
    let port = |i: usize| site.hosts.hosts[i].port.to_string();
    let n = site.hosts.hosts.len();
    // Untimed: `-M -N -f` authenticates, then leaves the master running in the background.
    let mut masters = Vec::new();
    for i in 0..n {
        let mut ssh = Command::new("ssh");
        ssh.args(master_opts(i))
            .args(["-M", "-N", "-f", "-p", &port(i)])
            .arg(login(i));
        masters.push(async move { checked(&mut ssh, "ssh master").await });
    }
    for r in futures_join(masters).await {
        r?;
    }
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..n {
        let dir = format!("{}/{run_id}", site.hosts.hosts[i].root_dir.display());
        let mut ssh = Command::new("ssh");
        ssh.args(master_opts(i))
            .args(["-o", "ControlMaster=no", "-p", &port(i)])
            .arg(login(i))
            .arg(format!(
                "mkdir -p '{dir}' && cat > '{dir}/{ARTIFACT}' && sync"
            ));
        let local = w.path.clone();
        tasks.push(async move {
            let file = std::fs::File::open(&local)?;
            let out = ssh
                .stdin(Stdio::from(file))
                .output()
                .await
                .context("cannot run ssh")?;
            ensure!(
                out.status.success(),
                "ssh cat exited {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim_end()
            );
            Ok(())
        });
    }
    let results = futures_join(tasks).await;
    let elapsed = started.elapsed().as_secs_f64();
    let mut exits = Vec::new();
    for i in 0..n {
        let mut ssh = Command::new("ssh");
        ssh.args(master_opts(i))
            .args(["-O", "exit", "-p", &port(i)])
            .arg(login(i))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        exits.push(async move { ssh.stdin(Stdio::null()).status().await.map(|_| ()) });
    }
    for r in futures_join(exits).await {
        r?;
    }
    for r in results {
        r?;
    }
    Ok(Outcome::timed(elapsed, format!("cipher {FLOOR_CIPHER}")))
}
