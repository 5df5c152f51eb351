//! The proxy in front of one target's containers: HAProxy from the distribution, one
//! process per application, environment and target (`deploy.container.name`), its
//! configuration written and owned by manent under `$HOME/.manent/proxy/<name>/`, switched
//! through its runtime API (a unix socket, `socat`) so that requests in flight finish on
//! the old container while new ones go to the new (docs/containers.md, "The proxy").

use manent_ssh::shell_quote as q;

use super::commands::Names;

/// The exit status of a script when HAProxy or socat is missing, or HAProxy refuses.
pub const NO_PROXY: i32 = 6;

/// The lines every proxy script starts with: its directory, `api` (one runtime API
/// command), `running` (whether this proxy answers), `write_cfg` (the configuration with
/// one live server).
fn prelude(names: &Names, listen: &str) -> String {
    format!(
        "for tool in haproxy socat; do
  command -v $tool >/dev/null 2>&1 || {{ echo \"$tool is not installed on this target; install it (Debian: apt-get install haproxy socat), see docs/containers.md\" >&2; exit {NO_PROXY}; }}
done
dir=\"$HOME/.manent/proxy/\"{base}
[ -d \"$dir\" ] || mkdir -p \"$dir\" || exit $?
sock=\"$dir/admin.sock\"
cfg=\"$dir/haproxy.cfg\"
api() {{ printf '%s\\n' \"$1\" | socat -t 5 stdio \"unix-connect:$sock\"; }}
running() {{ [ -S \"$sock\" ] && case $(api 'show info' 2>/dev/null) in *Pid:*) true ;; *) false ;; esac; }}
# The shell's own printf: no process but the rename's.
write_cfg() {{
  printf '%s\\n' \\
    '# Written by manent (docs/containers.md); rewritten at each switch.' \\
    global \\
    \"    stats socket $sock mode 600 level admin\" \\
    \"    pidfile $dir/haproxy.pid\" \\
    '    daemon' \\
    defaults \\
    '    mode http' \\
    '    timeout connect 5s' \\
    '    timeout client 60s' \\
    '    timeout server 60s' \\
    '    option http-server-close' \\
    '    retries 3' \\
    '    option redispatch' \\
    'frontend manent' \\
    {bind} \\
    '    default_backend live' \\
    'backend live' \\
    \"    server $1 $2\" > \"$cfg.part\" || exit $?
  mv \"$cfg.part\" \"$cfg\"
}}
",
        base = q(&names.base),
        bind = q(&format!("    bind {listen}")),
    )
}

/// Points the proxy at `names.container` at `address` (`127.0.0.1:<port>`): starts the
/// proxy with it when it is not running; otherwise adds it as a server, makes it ready and
/// puts every other server in `drain` (no new requests; those in flight finish). Safe to
/// run twice. Prints what the proxy does now.
pub fn switch(names: &Names, listen: &str, address: &str) -> String {
    let server = q(&names.container);
    let (host, port) = address.rsplit_once(':').unwrap_or((address, "0"));
    format!(
        "{prelude}if running; then
  out=$(api \"add server live/\"{server}\" \"{address})
  case \"$out\" in
    *egistered*) ;;
    *lready*) api \"set server live/\"{server}\" addr {host} port {port}\" >/dev/null ;;
    *) echo \"the proxy refused the new container: $out\" >&2; exit {NO_PROXY} ;;
  esac
  api \"set server live/\"{server}\" state ready\" >/dev/null
  for s in $(api 'show servers state live' | awk 'NR > 2 && NF > 3 {{ print $4 }}'); do
    [ \"$s\" = {server} ] || api \"set server live/$s state drain\" >/dev/null
  done
  write_cfg {server} {address}
  echo \"proxy {listen_text} -> \"{server}\" ({address}), the others drained\"
else
  write_cfg {server} {address}
  haproxy -c -q -f \"$cfg\" || {{ echo \"haproxy refused the configuration $cfg\" >&2; exit {NO_PROXY}; }}
  setsid haproxy -f \"$cfg\" </dev/null >/dev/null 2>&1 || {{ echo \"haproxy did not start with $cfg\" >&2; exit {NO_PROXY}; }}
  echo \"proxy {listen_text} started -> \"{server}\" ({address})\"
fi
",
        prelude = prelude(names, listen),
        address = q(address),
        listen_text = listen.replace(['"', '$', '`', '\\'], ""),
    )
}

/// Waits until each server other than `names.container` has no request in flight (at most
/// `stop_timeout`), then takes it out of the proxy. Prints what it took out.
pub fn retire_others(names: &Names, listen: &str, stop_timeout: std::time::Duration) -> String {
    format!(
        "{prelude}end=
running && for s in $(api 'show servers state live' | awk 'NR > 2 && NF > 3 {{ print $4 }}'); do
  [ \"$s\" = {server} ] && continue
  api \"set server live/$s state drain\" >/dev/null
  while :; do
    cur=$(api 'show stat' | awk -F, -v s=\"$s\" '$1 == \"live\" && $2 == s {{ print $5 }}')
    [ \"${{cur:-0}}\" -eq 0 ] && break
    # The clock starts at the first server found busy (most have no request left).
    [ -n \"$end\" ] || end=$(( $(date +%s) + {secs} ))
    [ \"$(date +%s)\" -ge \"$end\" ] && {{ echo \"$s still had $cur request(s) in flight after {secs}s\"; break; }}
    sleep 0.2
  done
  api \"set server live/$s state maint\" >/dev/null
  api \"del server live/$s\" >/dev/null
  echo \"proxy: $s taken out\"
done
",
        prelude = prelude(names, listen),
        server = q(&names.container),
        secs = stop_timeout.as_secs().max(1),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_proxy_script_is_valid_sh() {
        let names = Names::new("web", "2");
        for (what, script) in [
            ("switch", switch(&names, "127.0.0.1:80", "127.0.0.1:4000")),
            (
                "retire",
                retire_others(&names, "127.0.0.1:80", std::time::Duration::from_secs(5)),
            ),
        ] {
            crate::containers::commands::tests::assert_parses(what, &script);
        }
    }

    #[test]
    fn the_configuration_names_the_admin_socket_the_listen_address_and_one_live_server() {
        let home = tempfile::tempdir().expect("a temporary directory");
        let names = Names::new("web", "2");
        // HAProxy and socat as functions: only the configuration is written here.
        let script = format!(
            "haproxy() {{ :; }}; socat() {{ :; }}\nHOME={}\n{}write_cfg web-2 127.0.0.1:4000\n",
            home.path().display(),
            prelude(&names, "10.0.0.1:80")
        );
        let out = std::process::Command::new("sh")
            .args(["-c", &script])
            .output()
            .expect("run sh");
        assert!(
            out.status.success(),
            "write_cfg ran: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let dir = home.path().join(".manent/proxy/web");
        let cfg = std::fs::read_to_string(dir.join("haproxy.cfg")).expect("the configuration");
        let expected = format!(
            "# Written by manent (docs/containers.md); rewritten at each switch.
global
    stats socket {dir}/admin.sock mode 600 level admin
    pidfile {dir}/haproxy.pid
    daemon
defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    option http-server-close
    retries 3
    option redispatch
frontend manent
    bind 10.0.0.1:80
    default_backend live
backend live
    server web-2 127.0.0.1:4000
",
            dir = dir.display()
        );
        assert_eq!(cfg, expected, "the whole configuration, line by line");
        assert!(
            !dir.join("haproxy.cfg.part").exists(),
            "written aside, then renamed into place"
        );
    }
}
