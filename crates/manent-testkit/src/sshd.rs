//! Real OpenSSH servers for tests: `SshHosts::start(n)` runs one `sshd` per loopback address
//! (127.0.0.2, 127.0.0.3, …), each a "host" with its own host key, port and scratch
//! directory, plus a client key they all accept and a `known_hosts` file that lists them.
//! `SshHosts::start_fleet(n, …)` reaches fleet sizes (hundreds of hosts) with one `sshd` per
//! 16 addresses, the most one OpenSSH server listens on; its hosts share that server's key.
//! Everything lives in a temporary directory; the servers are killed on drop.
//!
//! Requires Debian's `openssh-server` (`/usr/sbin/sshd`, or `MANENT_TEST_SSHD`) and
//! `ssh-keygen`. A test that cannot start sshd fails, it is never skipped in silence.
//! Works as root (tests log in as root) and as an ordinary user (who logs in as itself).

use std::{
    fs,
    net::{Ipv4Addr, TcpListener},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

/// How long one sshd may take to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// Attempts per sshd when a port picked turns out to be taken by the time sshd binds it.
const START_ATTEMPTS: usize = 5;
/// Addresses one sshd listens on in `start_fleet`: OpenSSH's `MAX_LISTEN_SOCKS`.
const ADDRESSES_PER_SSHD: usize = 16;
/// Hosts one harness may start: 127.0.0.2 … onwards, 250 addresses per third octet.
const MAX_HOSTS: usize = 1000;

/// One sshd, listening on `addr:port`.
pub struct SshHost {
    /// `127.0.K.N`, 2 ≤ N ≤ 251 (host i is `127.0.(i / 250).(i % 250 + 2)`: 127.0.0.2 first).
    pub addr: String,
    pub port: u16,
    /// A per-host scratch directory (exists, empty at start), e.g. a deploy destination.
    pub root_dir: PathBuf,
    /// The host's public key as a `known_hosts` key field: `ssh-ed25519 AAAA…`.
    pub host_key: String,
    /// sshd's log (its stderr), worth reading when a test fails; shared by the hosts of one
    /// sshd in `start_fleet`.
    pub log: PathBuf,
}

/// Running sshd servers and the files a client needs to reach them.
pub struct SshHosts {
    /// A private key (ed25519, no passphrase) that every host accepts.
    pub client_key: PathBuf,
    /// A private key that no host accepts.
    pub unauthorized_key: PathBuf,
    /// `[127.0.0.N]:port <host key>` for every host.
    pub known_hosts: PathBuf,
    /// The user to log in as: the current user (root in CI).
    pub user: String,
    pub hosts: Vec<SshHost>,
    children: Vec<Child>,
    dir: tempfile::TempDir,
}

fn sshd_path() -> PathBuf {
    std::env::var_os("MANENT_TEST_SSHD")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/sbin/sshd"))
}

fn current_user() -> String {
    let out = Command::new("id")
        .arg("-un")
        .output()
        .expect("run `id -un` to learn the current user");
    assert!(out.status.success(), "`id -un` failed: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn is_root() -> bool {
    let out = Command::new("id").arg("-u").output().expect("run `id -u`");
    String::from_utf8_lossy(&out.stdout).trim() == "0"
}

/// Generates an ed25519 key pair at `path` and `path.pub`; returns the public key's
/// `type base64` fields.
fn keygen(path: &Path) -> String {
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "", "-f"])
        .arg(path)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!("ssh-keygen is required for the sshd test harness (openssh-client): {e}")
        });
    assert!(
        out.status.success(),
        "ssh-keygen -f {} failed: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let public = fs::read_to_string(path.with_extension("pub")).expect("read the public key");
    public
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
}

fn free_port(addr: Ipv4Addr) -> u16 {
    TcpListener::bind((addr, 0))
        .and_then(|l| l.local_addr())
        .unwrap_or_else(|e| panic!("cannot bind a port on {addr} (loopback): {e}"))
        .port()
}

/// The address of host `index`: 127.0.0.2 … 127.0.0.251, then 127.0.1.2 …
fn host_addr(index: usize) -> Ipv4Addr {
    let third = u8::try_from(index / 250).expect("at most MAX_HOSTS hosts");
    let fourth = u8::try_from(index % 250 + 2).expect("below 252");
    Ipv4Addr::new(127, 0, third, fourth)
}

fn write_config(
    sshd_dir: &Path,
    listen: &[(Ipv4Addr, u16)],
    authorized_keys: &Path,
    extra: &str,
) -> PathBuf {
    let config = sshd_dir.join("sshd_config");
    let listen: String = listen
        .iter()
        .map(|(addr, port)| format!("ListenAddress {addr}:{port}\n"))
        .collect();
    let text = format!(
        "{listen}\
         HostKey {host_key}\n\
         PidFile {pid}\n\
         AuthorizedKeysFile {authorized_keys}\n\
         StrictModes no\n\
         UsePAM no\n\
         PubkeyAuthentication yes\n\
         PasswordAuthentication no\n\
         KbdInteractiveAuthentication no\n\
         PermitRootLogin prohibit-password\n\
         UseDNS no\n\
         MaxStartups 64\n\
         Subsystem sftp internal-sftp\n\
         LogLevel VERBOSE\n\
         {extra}\n",
        host_key = sshd_dir.join("ssh_host_ed25519_key").display(),
        pid = sshd_dir.join("sshd.pid").display(),
        authorized_keys = authorized_keys.display(),
    );
    fs::write(&config, text).expect("write sshd_config");
    config
}

impl SshHosts {
    /// Starts `n` sshd servers on 127.0.0.2 … 127.0.0.(n+1) and waits until each accepts
    /// TCP connections.
    pub async fn start(n: usize) -> SshHosts {
        SshHosts::start_with_config(n, "").await
    }

    /// `n` hosts (up to 1,000) for fleet-size benchmarks: one sshd per 16 consecutive
    /// addresses, each address its own host (port, scratch directory, `known_hosts` line);
    /// the hosts of one sshd share its host key. Every connection still gets its own sshd
    /// session process, as on separate machines. `login` as in [`SshHosts::start_as`].
    pub async fn start_fleet(n: usize, login: Option<&str>) -> SshHosts {
        SshHosts::start_full(n, "", login, ADDRESSES_PER_SSHD).await
    }

    /// Like `start`, with `extra` appended to every host's `sshd_config` (for example
    /// `SetEnv PATH=/somewhere` or `MaxSessions 2`).
    pub async fn start_with_config(n: usize, extra: &str) -> SshHosts {
        SshHosts::start_full(n, extra, None, 1).await
    }

    /// Like `start`, but the client logs in as the existing account `login` instead of the
    /// current user. Needs root. For benchmarks: an SSH session runs the account's login
    /// shell and its start-up files, and root's may do far more than a deploy account's
    /// (a `pyenv init` in `~/.bashrc` costs every session 0.2 s of CPU), which would
    /// measure the machine's root account instead of the tools. The harness's files the
    /// account must reach are opened to it: `authorized_keys` readable, each host's
    /// `root_dir` owned by it.
    pub async fn start_as(n: usize, login: &str) -> SshHosts {
        SshHosts::start_full(n, "", Some(login), 1).await
    }

    /// `n` hosts served by sshd processes of `per_sshd` addresses each.
    async fn start_full(n: usize, extra: &str, login: Option<&str>, per_sshd: usize) -> SshHosts {
        assert!(
            (1..=MAX_HOSTS).contains(&n),
            "between 1 and {MAX_HOSTS} hosts, asked for {n}"
        );
        let sshd = sshd_path();
        assert!(
            sshd.exists(),
            "OpenSSH's sshd is required at {} for this test: apt-get install openssh-server \
             (./scripts/test does), or set MANENT_TEST_SSHD",
            sshd.display()
        );
        if is_root() {
            // sshd running as root insists on its privilege-separation directory.
            fs::create_dir_all("/run/sshd").expect("create /run/sshd for sshd");
        }
        let dir = tempfile::tempdir().expect("a temporary directory for sshd");
        let client_key = dir.path().join("client_key");
        let client_public = keygen(&client_key);
        let unauthorized_key = dir.path().join("unauthorized_key");
        keygen(&unauthorized_key);
        let authorized_keys = dir.path().join("authorized_keys");
        fs::write(&authorized_keys, format!("{client_public}\n")).expect("write authorized_keys");

        let mut hosts = SshHosts {
            client_key,
            unauthorized_key,
            known_hosts: dir.path().join("known_hosts"),
            user: login.map_or_else(current_user, str::to_string),
            hosts: Vec::new(),
            children: Vec::new(),
            dir,
        };
        for first in (0..n).step_by(per_sshd) {
            let indices: Vec<usize> = (first..n.min(first + per_sshd)).collect();
            let sshd_dir = hosts.dir.path().join(format!("sshd{}", first + 1));
            fs::create_dir_all(&sshd_dir).expect("create the sshd's directory");
            let mut roots = Vec::new();
            for &i in &indices {
                let host_dir = hosts.dir.path().join(format!("host{}", i + 1));
                let root_dir = host_dir.join("root");
                fs::create_dir_all(&root_dir).expect("create the host's directories");
                if let Some(login) = login {
                    open_to(
                        login,
                        hosts.dir.path(),
                        &host_dir,
                        &root_dir,
                        &authorized_keys,
                    );
                }
                roots.push(root_dir);
            }
            let host_key = keygen(&sshd_dir.join("ssh_host_ed25519_key"));
            let log = sshd_dir.join("sshd.log");
            let addrs: Vec<Ipv4Addr> = indices.iter().map(|&i| host_addr(i)).collect();
            let (child, ports) =
                start_one(&sshd, &sshd_dir, &addrs, &authorized_keys, &log, extra).await;
            hosts.children.push(child);
            for ((addr, port), root_dir) in addrs.into_iter().zip(ports).zip(roots) {
                hosts.hosts.push(SshHost {
                    addr: addr.to_string(),
                    port,
                    root_dir,
                    host_key: host_key.clone(),
                    log: log.clone(),
                });
            }
        }
        let all = hosts.known_hosts_lines(|_, key| Some(key.to_string()));
        fs::write(&hosts.known_hosts, all).expect("write known_hosts");
        hosts
    }

    fn known_hosts_lines(&self, key_of: impl Fn(usize, &str) -> Option<String>) -> String {
        self.hosts
            .iter()
            .enumerate()
            .filter_map(|(i, h)| {
                key_of(i, &h.host_key).map(|key| format!("[{}]:{} {key}\n", h.addr, h.port))
            })
            .collect()
    }

    /// A `known_hosts` file listing every host but `hosts[index]` (unknown-host tests).
    pub fn known_hosts_without(&self, index: usize) -> PathBuf {
        assert!(index < self.hosts.len(), "no host {index}");
        let path = self.dir.path().join(format!("known_hosts_without_{index}"));
        let text = self.known_hosts_lines(|i, key| (i != index).then(|| key.to_string()));
        fs::write(&path, text).expect("write known_hosts");
        path
    }

    /// A `known_hosts` file where `hosts[index]` is recorded with another (freshly
    /// generated, same type) key (changed-key tests).
    pub fn known_hosts_with_wrong_key(&self, index: usize) -> PathBuf {
        assert!(index < self.hosts.len(), "no host {index}");
        let wrong = keygen(&self.dir.path().join(format!("wrong_host_key_{index}")));
        let path = self.dir.path().join(format!("known_hosts_wrong_{index}"));
        let text = self.known_hosts_lines(|i, key| {
            Some(if i == index {
                wrong.clone()
            } else {
                key.to_string()
            })
        });
        fs::write(&path, text).expect("write known_hosts");
        path
    }

    /// A scratch path inside the harness's temporary directory (not on any host).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The logs of every sshd, for a failing test's message.
    pub fn logs(&self) -> String {
        let mut seen = std::collections::HashSet::new();
        self.hosts
            .iter()
            .filter(|h| seen.insert(&h.log))
            .map(|h| {
                let log = fs::read_to_string(&h.log).unwrap_or_default();
                format!("--- sshd {}:{} ---\n{log}", h.addr, h.port)
            })
            .collect()
    }
}

/// Lets the account `login` reach what it needs as that user: the directories on the way
/// (search only), `authorized_keys` (sshd reads it as the user) and the host's scratch
/// directory (deploys write there).
fn open_to(login: &str, top: &Path, host_dir: &Path, root_dir: &Path, authorized_keys: &Path) {
    use std::os::unix::fs::PermissionsExt;
    assert!(
        is_root(),
        "logging in as {login} needs the harness to run as root"
    );
    for dir in [top, host_dir] {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o711))
            .unwrap_or_else(|e| panic!("chmod 711 {}: {e}", dir.display()));
    }
    fs::set_permissions(authorized_keys, fs::Permissions::from_mode(0o644))
        .unwrap_or_else(|e| panic!("chmod 644 {}: {e}", authorized_keys.display()));
    let status = Command::new("chown")
        .arg(format!("{login}:"))
        .arg(root_dir)
        .status()
        .expect("run chown");
    assert!(
        status.success(),
        "chown {login}: {} failed: does the account exist?",
        root_dir.display()
    );
}

/// Starts one sshd listening on a free port of each of `addrs` (ports in that order); picks
/// others if one was taken.
async fn start_one(
    sshd: &Path,
    sshd_dir: &Path,
    addrs: &[Ipv4Addr],
    authorized_keys: &Path,
    log: &Path,
    extra: &str,
) -> (Child, Vec<u16>) {
    let mut last_log = String::new();
    for _ in 0..START_ATTEMPTS {
        let listen: Vec<(Ipv4Addr, u16)> = addrs.iter().map(|&a| (a, free_port(a))).collect();
        let config = write_config(sshd_dir, &listen, authorized_keys, extra);
        let log_file = fs::File::create(log).expect("create the sshd log");
        let mut child = Command::new(sshd)
            .args(["-D", "-e", "-f"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            // Its own process group, so drop also ends the per-connection sshd processes.
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", sshd.display()));
        let mut listening = true;
        for &(addr, port) in &listen {
            if !wait_until_listening(&mut child, addr, port).await {
                listening = false;
                break;
            }
        }
        if listening {
            return (child, listen.into_iter().map(|(_, port)| port).collect());
        }
        let _ = child.kill();
        let _ = child.wait();
        last_log = fs::read_to_string(log).unwrap_or_default();
    }
    panic!("sshd did not start on {addrs:?} after {START_ATTEMPTS} attempts; its log:\n{last_log}");
}

/// Polls a TCP connect to `addr:port` (sshd accepting is the event waited for); false if
/// sshd exited or did not listen within `READY_TIMEOUT`.
async fn wait_until_listening(child: &mut Child, addr: Ipv4Addr, port: u16) -> bool {
    let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
    loop {
        if tokio::net::TcpStream::connect((addr, port)).await.is_ok() {
            return true;
        }
        if matches!(child.try_wait(), Ok(Some(_))) || tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

impl Drop for SshHosts {
    fn drop(&mut self) {
        for child in &mut self.children {
            // The whole group: the listener and the processes serving open connections.
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .stderr(Stdio::null())
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
