//! A network namespace of a test's own, joined to the host by a veth pair on
//! a private /30 in 10.213.0.0/16, so a test can run a process "on another
//! machine" and cut its network (a partition) without touching anything else.
//!
//! Names carry the test process's pid (`mn<pid>x<n>`; the host side of the
//! veth is `mn<pid>h<n>`), so concurrent test processes never collide and a
//! later test removes what a killed test process left behind. Traffic only
//! ever goes between the namespace and the host side of its own veth.
//! Needs root (CAP_NET_ADMIN and `ip netns`).

use std::{
    process::Command,
    sync::atomic::{AtomicU32, Ordering},
};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A network namespace with a veth link to the host; removed when dropped.
pub struct NetNs {
    /// The namespace's name (for `ip netns exec`).
    pub name: String,
    /// The host side of the veth pair: what [`NetNs::cut`] takes down.
    pub host_if: String,
    /// The host side's address: what the namespace reaches the host at.
    pub host_addr: String,
    /// The namespace side's address.
    pub ns_addr: String,
    /// The /30 both addresses are in, in CIDR notation.
    pub network: String,
}

impl NetNs {
    /// Creates the namespace, the veth pair and their addresses, links up.
    pub fn new() -> NetNs {
        remove_leftovers();
        let pid = std::process::id();
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let name = format!("mn{pid}x{n}");
        let host_if = format!("mn{pid}h{n}");
        let ns_if = format!("mn{pid}n{n}");
        let (third, fourth) = free_subnet(pid, n);
        let host_addr = format!("10.213.{third}.{}", fourth + 1);
        let ns_addr = format!("10.213.{third}.{}", fourth + 2);
        let ns = NetNs {
            network: format!("10.213.{third}.{fourth}/30"),
            name,
            host_if,
            host_addr,
            ns_addr,
        };
        ip(&["netns", "add", &ns.name]);
        ip(&[
            "link",
            "add",
            &ns.host_if,
            "type",
            "veth",
            "peer",
            "name",
            &ns_if,
        ]);
        ip(&["link", "set", &ns_if, "netns", &ns.name]);
        ip(&[
            "addr",
            "add",
            &format!("{}/30", ns.host_addr),
            "dev",
            &ns.host_if,
        ]);
        ip(&["link", "set", &ns.host_if, "up"]);
        ip_in(
            &ns.name,
            &["addr", "add", &format!("{}/30", ns.ns_addr), "dev", &ns_if],
        );
        ip_in(&ns.name, &["link", "set", &ns_if, "up"]);
        ip_in(&ns.name, &["link", "set", "lo", "up"]);
        ns
    }

    /// A command that runs `program` inside the namespace (environment kept;
    /// `ip netns exec` execs it, so the child's pid is the program's).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name]).arg(program);
        cmd
    }

    /// Cuts the link (a partition): packets either way are dropped, connections hang.
    pub fn cut(&self) {
        ip(&["link", "set", &self.host_if, "down"]);
    }

    /// Restores the link cut by [`NetNs::cut`].
    pub fn heal(&self) {
        ip(&["link", "set", &self.host_if, "up"]);
    }
}

impl Default for NetNs {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        // Deleting one end of a veth pair deletes both.
        let _ = quiet(&["link", "del", &self.host_if]);
        let _ = quiet(&["netns", "del", &self.name]);
    }
}

/// A /30 in 10.213.0.0/16 no interface of this host uses, starting from one
/// derived from the pid so that concurrent test processes rarely even probe the same.
fn free_subnet(pid: u32, n: u32) -> (u32, u32) {
    let used = String::from_utf8_lossy(
        &Command::new("ip")
            .args(["-o", "-4", "addr", "show"])
            .output()
            .expect("run ip addr show")
            .stdout,
    )
    .into_owned();
    let start = pid.wrapping_mul(7).wrapping_add(n.wrapping_mul(13)) % 16384;
    for k in 0..16384 {
        let slot = (start + k) % 16384;
        let (third, fourth) = (slot / 64, (slot % 64) * 4);
        let prefix = format!("10.213.{third}.");
        let taken = used.lines().any(|l| {
            l.split_whitespace()
                .skip_while(|w| *w != "inet")
                .nth(1)
                .and_then(|a| a.split('/').next())
                .and_then(|a| a.strip_prefix(&prefix))
                .and_then(|last| last.parse::<u32>().ok())
                .is_some_and(|last| last / 4 * 4 == fourth)
        });
        if !taken {
            return (third, fourth);
        }
    }
    panic!("no free /30 in 10.213.0.0/16");
}

/// Deletes the namespaces and veths of test processes that are gone.
fn remove_leftovers() {
    let dead = |name: &str| -> bool {
        let Some(rest) = name.strip_prefix("mn") else {
            return false;
        };
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let after = &rest[digits.len()..];
        !digits.is_empty()
            && matches!(after.chars().next(), Some('x' | 'h' | 'n'))
            && !std::path::Path::new(&format!("/proc/{digits}")).exists()
    };
    if let Ok(out) = Command::new("ip").args(["netns", "list"]).output() {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let name = line.split_whitespace().next().unwrap_or_default();
            if dead(name) {
                let _ = quiet(&["netns", "del", name]);
            }
        }
    }
    if let Ok(out) = Command::new("ip").args(["-o", "link", "show"]).output() {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            // `<index>: <name>@<peer>: <flags> ...`
            let name = line
                .split(": ")
                .nth(1)
                .and_then(|n| n.split('@').next())
                .unwrap_or_default();
            if dead(name) {
                let _ = quiet(&["link", "del", name]);
            }
        }
    }
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {} failed ({}): {} (a network namespace needs root and iproute2)",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

fn ip_in(ns: &str, args: &[&str]) {
    let mut all = vec!["netns", "exec", ns, "ip"];
    all.extend_from_slice(args);
    ip(&all);
}

fn quiet(args: &[&str]) -> std::io::Result<std::process::ExitStatus> {
    Command::new("ip")
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
}
