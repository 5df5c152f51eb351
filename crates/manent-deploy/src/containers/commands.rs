//! The shell the `container` plugin runs on a target, one small object per action (load an
//! image, start a container, wait for its health, stop the others, prune): each a few
//! lines that find the runtime first and are safe to run twice (docs/containers.md).

use manent_model::ContainerRuntime;
use manent_ssh::shell_quote as q;

/// What one target's containers of one application and environment are called.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    /// `deploy.container.name` expanded: the owner label of all its containers, the
    /// proxy's directory.
    pub base: String,
    /// `<base>-<version>`.
    pub container: String,
    /// The image's tag on the target, `localhost/manent/<base>:<version>`.
    pub tag: String,
    /// The version, as in the container's `manent.version` label.
    pub version: String,
}

impl Names {
    pub fn new(base: &str, version: &str) -> Names {
        let container = manent_model::container_name(base, version);
        let tag_version = container[base.len() + 1..].to_string();
        Names {
            base: base.to_string(),
            tag: format!(
                "localhost/manent/{}:{tag_version}",
                base.to_ascii_lowercase()
            ),
            container,
            version: version.to_string(),
        }
    }
}

/// The exit status of a script when the runtime is missing.
pub const NO_RUNTIME: i32 = 3;

/// Sets `$rt` to the runtime (`auto`: podman if the target has it, else docker).
pub fn runtime(runtime: ContainerRuntime) -> String {
    let missing = |what: &str| {
        format!(
            "echo {} >&2; exit {NO_RUNTIME}",
            q(&format!(
                "{what} is not installed on this target; install podman (Debian: apt-get \
                 install podman) or docker, see docs/containers.md"
            ))
        )
    };
    match runtime {
        ContainerRuntime::Auto => format!(
            "if command -v podman >/dev/null 2>&1; then rt=podman\n\
             elif command -v docker >/dev/null 2>&1; then rt=docker\n\
             else {}; fi\n",
            missing("neither podman nor docker")
        ),
        named => {
            let name = named.as_str();
            format!(
                "rt={name}\ncommand -v {name} >/dev/null 2>&1 || {{ {}; }}\n",
                missing(name)
            )
        }
    }
}

/// Takes the host's lock on image names (fd 9, `flock` where the host has it): loads, tags
/// and untags of one host take turns; `exec 9>&-` lets go.
const IMAGE_LOCK: &str = "if command -v flock >/dev/null 2>&1; then
  exec 9>\"${TMPDIR:-/tmp}/manent-image-load.lock\" && flock 9
fi
";

/// Loads the archive `file` (unless the image is there), tags it as the version's image and
/// prints its id. Loads and tags on one host take turns (`flock` where the host has it):
/// targets or environments sharing a runtime's storage and loading the same image at once
/// made one load's tag vanish ("image not known"), and so did two tags of one image at once
/// (podman: each rewrites the image's names, the second without the first's). Whether the image is there is asked by the id the
/// archive's `manifest.json` names (a content hash): an image the runtime holds (this
/// version's, or another application's, environment's or target's of this host that loaded
/// the same archive) is only tagged, and that id is the one printed after a load too. An
/// archive that names no id (an OCI archive) or is not on the target (an upload skipped by
/// an older build because the image was tagged) is asked about by the version's tag, unless
/// `absent` (an older build's upload step found the tag missing just before).
pub fn load(names: &Names, file: &str, absent: bool) -> String {
    let tag = q(&names.tag);
    let file = q(file);
    let maybe_tagged = if absent {
        "false".to_string()
    } else {
        format!("$rt image inspect {tag} >/dev/null 2>&1")
    };
    format!(
        "id= tagged=
# The image's id, as the archive's manifest names it (docker-archive: `<id>.json`, or
# `blobs/sha256/<id>`); empty when it names none. Read before the lock: only what the
# runtime holds is shared.
ref=$(tar -xOf {file} manifest.json 2>/dev/null | sed -n 's/.*\"Config\": *\"\\([^\"]*\\)\".*/\\1/p' | head -n 1)
ref=${{ref#blobs/sha256/}}; ref=${{ref%.json}}
case \"$ref\" in *[!0-9a-f]*) ref= ;; esac
[ ${{#ref}} -eq 64 ] || ref=
{lock}if [ -n \"$ref\" ] && $rt image inspect \"$ref\" >/dev/null 2>&1; then
  id=$ref
elif [ -z \"$ref\" ] && {maybe_tagged}; then
  tagged=1
else
  # The id the manifest names is the loaded image's: not asked again.
  id=$ref
  out=$($rt load -i {file}) || exit $?
  ref=$(printf '%s\\n' \"$out\" | sed -n 's/^Loaded image[^:]*: *//p' | tail -n 1)
  ref=${{ref%%,*}}
  [ -n \"$ref\" ] || {{ echo \"the runtime loaded \"{file}\" but named no image: $out\" >&2; exit 4; }}
fi
[ -n \"$tagged\" ] || $rt tag \"$ref\" {tag} || exit $?
exec 9>&-
[ -n \"$id\" ] || id=$($rt image inspect --format '{{{{.Id}}}}' {tag}) || exit $?
case \"$id\" in sha256:*) echo \"$id\" ;; *) echo \"sha256:$id\" ;; esac
",
        lock = IMAGE_LOCK
    )
}

/// Pulls `reference` (an image pinned by digest, docs/containers.md "Registry references")
/// unless the version's image is there, tags it as the version's image and prints its id.
/// The runtime verifies what it pulls against the digest.
pub fn pull(names: &Names, reference: &str) -> String {
    let tag = q(&names.tag);
    let reference = q(reference);
    format!(
        "if ! $rt image inspect {tag} >/dev/null 2>&1; then
  $rt pull -q {reference} >/dev/null || {{ echo \"the target could not pull \"{reference}\"; check that it reaches the registry and is logged in to it ($rt login)\" >&2; exit 4; }}
  {IMAGE_LOCK}  $rt tag {reference} {tag} || exit $?
  exec 9>&-
fi
id=$($rt image inspect --format '{{{{.Id}}}}' {tag}) || exit $?
case \"$id\" in sha256:*) echo \"$id\" ;; *) echo \"sha256:$id\" ;; esac
"
    )
}

/// What a container is started with.
pub struct Start<'a> {
    pub names: &'a Names,
    /// The port the application listens on in the container.
    pub port: u16,
    /// The variables passed to it by name (their values are in the command's environment).
    pub env: Vec<String>,
    pub args: &'a [String],
    pub volumes: &'a [String],
    /// Where the archive was (a label, so pruning removes it with the image).
    pub archive: &'a str,
    /// Whether a container that stops as it starts is removed (a new one; never the kept
    /// one a rollback starts again).
    pub remove_on_failure: bool,
    /// The image's id when the deploy has just loaded it (the runtime is not asked again).
    pub image_id: Option<&'a str>,
}

/// The line that removes a container that failed, if it is to be removed.
fn removal(names: &Names, remove: bool) -> String {
    if remove {
        format!(
            "$rt rm -f {} >/dev/null 2>&1; echo \"the container was removed; traffic stays where it was\" >&2\n  ",
            q(&names.container)
        )
    } else {
        String::new()
    }
}

/// The `container inspect` template [`start`] asks with: `running|<address> …|<image
/// id>|<log driver>|<log file>`. The log file is podman's (`k8s-file`); docker's
/// (`json-file`) is not read directly, so its template names none.
fn started_format(port: u16, podman: bool) -> String {
    let mut format = String::from("{{.State.Running}}|{{range $k, $v := .NetworkSettings.Ports}}");
    format.push_str(&format!("{{{{if eq $k \"{port}/tcp\"}}}}"));
    format.push_str("{{range $v}}{{.HostIP}}:{{.HostPort}} {{end}}{{end}}{{end}}|{{.Image}}|");
    format.push_str("{{.HostConfig.LogConfig.Type}}|");
    if podman {
        format.push_str("{{.HostConfig.LogConfig.Path}}");
    }
    format
}

/// Starts the version's container if it is not running (again if it is stopped, created
/// from the image if it is gone), its port published on 127.0.0.1 only, and prints
/// `127.0.0.1:<port> sha256:<image id> <log file>` ([`started`] reads it). One `container
/// inspect` asks whether it runs, its address, image and log file (read by [`health`]
/// instead of starting `logs`); a runtime whose inspect refuses the template is asked for
/// the port alone. Run twice, the run is refused for the name it already has and the
/// container is found (started again if it stopped): never a second one. Its error is
/// shown only when there is no container.
pub fn start(s: &Start<'_>) -> String {
    let name = q(&s.names.container);
    let mut run = format!(
        "$rt run -d --init --name {name} --label manent.owner={} --label manent.version={} \
         --label manent.archive={} -p 127.0.0.1::{}",
        q(&s.names.base),
        q(&s.names.version),
        q(s.archive),
        s.port
    );
    for var in &s.env {
        run.push_str(&format!(" -e {}", q(var)));
    }
    for volume in s.volumes {
        run.push_str(&format!(" -v {}", q(volume)));
    }
    run.push(' ');
    run.push_str(&q(&s.names.tag));
    for arg in s.args {
        run.push(' ');
        run.push_str(&q(arg));
    }
    format!(
        "err=$({run} 2>&1 >/dev/null) || {{
  st=$?
  # It exists already (a run again after a crash, a rollback), or it cannot be made.
  state=$($rt container inspect --format '{{{{.State.Running}}}}' {name} 2>/dev/null)
  case \"$state\" in
    true) ;;
    false) $rt start {name} >/dev/null || {{ st=$?; printf '%s\\n' \"$err\" >&2; exit $st; }} ;;
    *)
      printf '%s\\n' \"$err\" >&2
      $rt image inspect {tag} >/dev/null 2>&1 || {{ echo \"the image \"{tag}\" is not on this target any more: deploy version \"{version}\" again\" >&2; exit 4; }}
      exit $st ;;
  esac
}}
if [ \"$rt\" = podman ]; then format={podman_format}; else format={other_format}; fi
if info=$($rt container inspect --format \"$format\" {name} 2>/dev/null) && [ -n \"$info\" ]; then
  running=${{info%%|*}}; info=${{info#*|}}
  address=${{info%%|*}}; address=${{address%% *}}; info=${{info#*|}}
  inspected=${{info%%|*}}; info=${{info#*|}}
  driver=${{info%%|*}}; logfile=${{info#*|}}
  [ \"$driver\" = k8s-file ] || logfile=
else
  running=true inspected= logfile=
  address=$($rt port {name} {port}/tcp 2>/dev/null | head -n 1)
fi
if [ \"$running\" != true ] || [ -z \"$address\" ]; then
  echo \"the container \"{name}\" stopped as it started (no port {port} published); the last lines of its log:\" >&2
  $rt logs --tail 20 {name} >&2 2>&1
  {remove}exit {UNHEALTHY}
fi
{image}
case \"$image\" in ''|sha256:*) ;; *) image=\"sha256:$image\" ;; esac
echo \"$address $image $logfile\"
",
        tag = q(&s.names.tag),
        version = q(&s.names.version),
        port = s.port,
        remove = removal(s.names, s.remove_on_failure),
        podman_format = q(&started_format(s.port, true)),
        other_format = q(&started_format(s.port, false)),
        image = match s.image_id {
            Some(id) => format!("image={}", q(id)),
            None => "image=$inspected".to_string(),
        },
    )
}

/// What [`start`] printed: the container's address, its image's id (empty when the
/// runtime did not say) and its log file (empty when it is not read directly, and in what
/// builds before it printed).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Started {
    pub address: String,
    pub image: String,
    pub log: String,
}

/// Reads what [`start`] printed.
pub fn started(printed: &str) -> Started {
    let mut parts = printed.trim().splitn(3, ' ');
    let mut next = || parts.next().unwrap_or_default().trim().to_string();
    Started {
        address: next(),
        image: next(),
        log: next(),
    }
}

/// How the health of a new container is awaited.
pub struct Health<'a> {
    pub names: &'a Names,
    /// `127.0.0.1:<port>`, as [`start`] printed it.
    pub address: &'a str,
    /// Its log file, as [`start`] printed it (empty: the runtime's `logs` is asked).
    pub log: &'a str,
    pub path: &'a str,
    pub interval: std::time::Duration,
    pub timeout: std::time::Duration,
    /// Whether a container that never answers is removed (a new one; never the kept one a
    /// rollback starts again).
    pub remove_on_failure: bool,
}

/// The exit status of a container whose health never passed.
pub const UNHEALTHY: i32 = 5;

/// Polls `path` until it answers 2xx or `timeout` passes (or the container exits); on a
/// failure prints the last lines of the container's log to stderr (the step's error shows
/// them) and removes the container. On success prints the start of its log (`manent logs`),
/// read from its log file when [`start`] found one (podman's `k8s-file`: `<time> <stream>
/// <F|P> <line>`), which spares a runtime process per target.
pub fn health(h: &Health<'_>) -> String {
    let name = q(&h.names.container);
    let url = q(&format!("http://{}{}", h.address, h.path));
    let interval = format!("{:.3}", h.interval.as_secs_f64());
    let remove = removal(h.names, h.remove_on_failure);
    format!(
        "get() {{
  if command -v curl >/dev/null 2>&1; then curl -s -o /dev/null -m 5 -w '%{{http_code}}' \"$1\"
  else wget -q -T 5 -O /dev/null \"$1\" && echo 200; fi
}}
started=$(date +%s)
end=$(( started + {timeout} ))
next=$(( started + 2 ))
why=\"did not answer 2xx on {path} within {timeout_text}\"
while :; do
  code=$(get {url} 2>/dev/null)
  case \"$code\" in 2[0-9][0-9])
    if [ -n {log} ] && [ -r {log} ]; then
      # Its first 20 lines without their time, stream and tag, read by the shell itself.
      n=0
      while [ $n -lt 20 ] && IFS= read -r line; do
        n=$((n + 1))
        rest=${{line#* std[a-z]* [FP] }}
        [ \"$rest\" = \"$line\" ] || line=${{rest}}
        printf '%s\\n' \"$line\"
      done < {log}
    else
      $rt logs {name} 2>&1 | head -n 20
    fi
    echo \"GET {path}: $code\"
    exit 0 ;;
  esac
  now=$(date +%s)
  # Whether it still runs, asked of the runtime once a second after the first full second
  # (each question costs a process as heavy as the start-up being waited for; most
  # containers answer before).
  if [ \"$now\" -ge \"$next\" ]; then
    next=$(( now + 1 ))
    running=$($rt container inspect --format '{{{{.State.Running}}}}' {name} 2>/dev/null)
    if [ \"$running\" != true ]; then why=\"exited before it answered on {path}\"; break; fi
  fi
  [ \"$now\" -ge \"$end\" ] && break
  sleep {interval}
done
echo \"the container \"{name}\" $why (last answer: ${{code:-none}}); the last lines of its log:\" >&2
$rt logs --tail 20 {name} >&2 2>&1
{remove}exit {UNHEALTHY}
",
        log = q(h.log),
        timeout = h.timeout.as_secs().max(1),
        timeout_text = humantime_text(h.timeout),
        path = h.path.replace(['"', '$', '`', '\\'], ""),
    )
}

fn humantime_text(d: std::time::Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// Stops the running containers of `names.base` other than `names.container`, each given
/// `stop_timeout` to finish, and prints what it stopped.
pub fn stop_others(names: &Names, stop_timeout: std::time::Duration) -> String {
    format!(
        "for c in $($rt ps --filter label=manent.owner={base} --format '{{{{.Names}}}}'); do
  [ \"$c\" = {live} ] && continue
  $rt stop -t {secs} \"$c\" >/dev/null || exit $?
  echo \"stopped $c\"
done
",
        base = q(&names.base),
        live = q(&names.container),
        secs = stop_timeout.as_secs().max(1),
    )
}

/// Removes the stopped containers of `names.base` past the `keep` newest other than the
/// live one, with their images and archives, and prints what it kept and removed. A
/// container other than the live one that still runs is being stopped beside this prune
/// (the deploy's `stop all but` step): it counts as the newest kept and is never removed.
/// One `inspect` reads every container's state, end time, image and archive.
pub fn prune(names: &Names, keep: u32) -> String {
    format!(
        "kept=0; removed=
all=$($rt ps -a --filter label=manent.owner={base} --format '{{{{.Names}}}}') || exit $?
listed=
if [ -n \"$all\" ]; then
  info=$($rt container inspect --format '{{{{.State.Running}}}}|{{{{.State.FinishedAt}}}}|{{{{.Name}}}}|{{{{.Config.Image}}}}|{{{{index .Config.Labels \"manent.archive\"}}}}' $all) || exit $?
  # Running ones first (they stop now), then the stopped, last stopped first.
  listed=$(printf '%s\\n' \"$info\" | sed 's/^true|[^|]*|/true|9999|/' | LC_ALL=C sort -t '|' -k 2,2 -r)
fi
while IFS='|' read -r running finished c image archive; do
  [ -n \"$c\" ] || continue
  c=${{c#/}}
  [ \"$c\" = {live} ] && continue
  if [ \"$kept\" -lt {keep} ]; then kept=$((kept + 1)); continue; fi
  [ \"$running\" = true ] && continue
  $rt rm \"$c\" >/dev/null || exit $?
  # An untag rewrites the image's names like a tag: under the host's lock.
  ( {IMAGE_LOCK}$rt rmi \"$image\" >/dev/null 2>&1 )
  [ -n \"$archive\" ] && rm -f -- \"$archive\"
  removed=\"$removed $c\"
done <<MANENT_EOF
$listed
MANENT_EOF
echo \"$kept version(s) kept for a rollback, removed:${{removed:- none}}\"
",
        base = q(&names.base),
        live = q(&names.container),
    )
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    #[test]
    fn every_script_is_valid_sh() {
        let names = Names::new("web", "2");
        let start = start(&Start {
            names: &names,
            port: 8080,
            env: vec!["A".into()],
            args: &["--x".into()],
            volumes: &["/srv:/srv".into()],
            archive: "/a.tar",
            remove_on_failure: true,
            image_id: None,
        });
        let health = health(&Health {
            names: &names,
            address: "127.0.0.1:1",
            log: "/var/lib/x/ctr.log",
            path: "/up",
            interval: std::time::Duration::from_millis(100),
            timeout: std::time::Duration::from_secs(5),
            remove_on_failure: true,
        });
        for (what, script) in [
            ("load", load(&names, "/a.tar", false)),
            ("pull", pull(&names, "registry/app@sha256:00")),
            ("start", start),
            ("health", health),
            (
                "stop",
                stop_others(&names, std::time::Duration::from_secs(5)),
            ),
            ("prune", prune(&names, 1)),
        ] {
            assert_parses(
                what,
                &format!("{}{script}", runtime(ContainerRuntime::Auto)),
            );
        }
    }

    /// Asserts that `script` (the `what` script) parses in `sh -n`.
    pub(in crate::containers) fn assert_parses(what: &str, script: &str) {
        let out = std::process::Command::new("sh")
            .args(["-n", "-c", script])
            .output()
            .expect("run sh");
        assert!(
            out.status.success(),
            "the {what} script parses: {}\n{script}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn a_load_runs_in_a_real_shell_under_the_hosts_lock_and_prints_the_images_id() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let names = Names::new("web", "2");
        // A runtime that has no image until it loads one, then knows the tag.
        let fake = format!(
            "rt() {{ case \"$1 $2\" in \
               'image inspect') [ -f {d}/tagged ] && echo abc123 || return 1 ;; \
               'load -i') echo 'Loaded image: localhost/app:2' ;; \
               'tag localhost/app:2') touch {d}/tagged; \
                 flock -n {d}/manent-image-load.lock true 2>/dev/null || touch {d}/tagged-locked ;; \
               *) return 9 ;; esac; }}\nrt=rt\nTMPDIR={d}\n",
            d = dir.path().display()
        );
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("{fake}{}", load(&names, "/srv/app.tar", false)))
            .output()
            .expect("run sh");
        assert_eq!(
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).trim()
            ),
            (Some(0), "sha256:abc123"),
            "loaded, tagged and its id printed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let locked = dir.path().join("manent-image-load.lock").exists();
        let has_flock = std::process::Command::new("sh")
            .args(["-c", "command -v flock"])
            .output()
            .is_ok_and(|o| o.status.success());
        assert_eq!(
            locked, has_flock,
            "the load takes the host's lock where flock exists"
        );
        assert_eq!(
            dir.path().join("tagged-locked").exists(),
            has_flock,
            "the tag is made under the host's lock too: two tags of one image at once lose one"
        );
    }

    /// Runs `script` in a real sh after `fake` (a runtime as a shell function named `rt`, or
    /// another it sets `$rt` to):
    /// its exit status, stdout and the calls the fake logged to `$log`.
    fn run_with_fake_runtime(fake: &str, script: &str) -> (Option<i32>, String, String) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let log = dir.path().join("calls");
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("log={}\nrt=rt\n{fake}\n{script}", log.display()))
            .output()
            .expect("run sh");
        let calls = std::fs::read_to_string(&log).unwrap_or_default();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
            calls,
        )
    }

    #[test]
    fn a_prune_keeps_the_newest_stopped_versions_and_removes_the_rest_with_their_images() {
        let names = Names::new("web", "4");
        // web-4 runs; web-3 stopped last, then web-2, then web-1 (docker's `/` before names).
        let fake = r#"rt() { echo "$*" >> "$log"; case "$1 $2" in
  'ps -a') printf 'web-4\nweb-3\nweb-2\nweb-1\n' ;;
  'container inspect')
    echo 'true|0001-01-01 00:00:00 +0000 UTC|web-4|localhost/manent/web:4|'
    echo 'false|2026-12-06 10:00:00 +0000 UTC|/web-3|localhost/manent/web:3|/h/3.tar'
    echo 'false|2026-12-06 08:00:00 +0000 UTC|web-1|localhost/manent/web:1|'
    echo 'false|2026-12-06 09:00:00 +0000 UTC|web-2|localhost/manent/web:2|/nonexistent/2.tar' ;;
  'rm web-2'|'rm web-1'|'rmi localhost/manent/web:2'|'rmi localhost/manent/web:1') ;;
  *) echo "unexpected: $*" >&2; return 9 ;;
esac; }"#;
        let (status, out, calls) = run_with_fake_runtime(fake, &prune(&names, 1));
        assert_eq!(
            (status, out.as_str()),
            (
                Some(0),
                "1 version(s) kept for a rollback, removed: web-2 web-1"
            ),
            "the newest stopped (web-3) is kept, the two older removed, the live one untouched"
        );
        assert_eq!(
            calls
                .lines()
                .filter(|l| l.starts_with("container inspect"))
                .count(),
            1,
            "one inspect reads every container: {calls}"
        );
        assert!(
            calls.contains("rmi localhost/manent/web:2") && !calls.contains("web:3"),
            "the removed versions' images go with them, the kept one's stays: {calls}"
        );
    }

    #[test]
    fn a_container_still_being_stopped_counts_as_the_newest_kept_and_is_never_removed() {
        let names = Names::new("web", "4");
        // web-4 is live; web-3 still runs (the step beside the prune is stopping it);
        // web-2 stopped before it.
        let fake = r#"rt() { echo "$*" >> "$log"; case "$1 $2" in
  'ps -a') printf 'web-4\nweb-3\nweb-2\n' ;;
  'container inspect')
    echo 'true|0001-01-01T00:00:00Z|/web-4|localhost/manent/web:4|'
    echo 'false|2026-12-06T09:00:00Z|/web-2|localhost/manent/web:2|'
    echo 'true|0001-01-01T00:00:00Z|/web-3|localhost/manent/web:3|' ;;
  'rm web-2'|'rmi localhost/manent/web:2') ;;
  *) echo "unexpected: $*" >&2; return 9 ;;
esac; }"#;
        let (status, out, calls) = run_with_fake_runtime(fake, &prune(&names, 1));
        assert_eq!(
            (status, out.as_str()),
            (Some(0), "1 version(s) kept for a rollback, removed: web-2"),
            "web-3, stopping now, is the one kept: web-2 goes, as once web-3 had stopped"
        );
        let (status, out, calls_keep_0) = run_with_fake_runtime(fake, &prune(&names, 0));
        assert_eq!(
            (status, out.as_str()),
            (Some(0), "0 version(s) kept for a rollback, removed: web-2"),
            "with keep 0 a running container is still not removed: {calls_keep_0}"
        );
        assert!(
            !calls.contains("rm web-3")
                && !calls.contains("web:3")
                && !calls_keep_0.contains("rm web-3"),
            "the container being stopped is not touched: {calls}"
        );
    }

    #[test]
    fn a_prune_whose_inspect_fails_says_so_and_removes_nothing() {
        let fake = r#"rt() { echo "$*" >> "$log"; case "$1 $2" in
  'ps -a') printf 'web-2\nweb-1\n' ;;
  'container inspect') echo 'no such container web-1' >&2; return 125 ;;
  *) echo "unexpected: $*" >&2; return 9 ;;
esac; }"#;
        let (status, _, calls) = run_with_fake_runtime(fake, &prune(&Names::new("web", "2"), 0));
        assert_eq!(
            status,
            Some(125),
            "the runtime's failure is the step's (shown as not pruned), not an empty list: {calls}"
        );
        assert!(!calls.contains("rm "), "nothing is removed: {calls}");
    }

    #[test]
    fn a_prune_with_no_container_of_its_own_removes_nothing() {
        let fake =
            r#"rt() { echo "$*" >> "$log"; case "$1 $2" in 'ps -a') ;; *) return 9 ;; esac; }"#;
        let (status, out, _) = run_with_fake_runtime(fake, &prune(&Names::new("web", "1"), 2));
        assert_eq!(
            (status, out.as_str()),
            (Some(0), "0 version(s) kept for a rollback, removed: none"),
            "nothing to inspect, nothing removed"
        );
    }

    /// An archive in `dir` whose `manifest.json` names the image `id`, as `docker save` and
    /// `podman save` write one.
    fn archive_naming(dir: &std::path::Path, id: &str) -> std::path::PathBuf {
        std::fs::write(
            dir.join("manifest.json"),
            format!(r#"[{{"Config":"{id}.json","RepoTags":["x:1"],"Layers":[]}}]"#),
        )
        .expect("write manifest.json");
        let archive = dir.join("app.tar");
        let made = std::process::Command::new("tar")
            .args(["-cf", &archive.display().to_string(), "-C"])
            .arg(dir)
            .arg("manifest.json")
            .status()
            .expect("run tar");
        assert!(made.success(), "tar made the archive");
        archive
    }

    /// Runs version 2 of `web`'s load of `archive` with a fake runtime answering the calls
    /// `cases` (arms of a `case "$*"`; any other call fails): its exit status, stdout and
    /// the calls made.
    fn load_with(
        dir: &std::path::Path,
        cases: &str,
        archive: &std::path::Path,
        absent: bool,
    ) -> (Option<i32>, String, String) {
        let fake = format!(
            r#"rt() {{ echo "$*" >> "$log"; case "$*" in
{cases}
  *) echo "unexpected: $*" >&2; return 9 ;;
esac; }}
TMPDIR={d}"#,
            d = dir.display()
        );
        let script = load(
            &Names::new("web", "2"),
            &archive.display().to_string(),
            absent,
        );
        run_with_fake_runtime(&fake, &script)
    }

    #[test]
    fn a_loaded_image_is_known_by_the_id_its_archive_names_without_asking_again() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let id = "cd".repeat(32);
        let archive = archive_naming(dir.path(), &id);
        // A runtime that has no such image until it loads the archive.
        let cases = "'image inspect '*) return 1 ;;
  'load -i '*) echo 'Loaded image: localhost/app:2' ;;
  'tag localhost/app:2 '*) ;;";
        let (status, out, calls) = load_with(dir.path(), cases, &archive, false);
        assert_eq!(
            (status, out),
            (Some(0), format!("sha256:{id}")),
            "loaded, tagged, and the manifest's id printed: {calls}"
        );
        assert_eq!(
            calls
                .lines()
                .filter(|l| l.starts_with("image inspect"))
                .count(),
            1,
            "only whether the runtime had it already is asked, not the id after the load: {calls}"
        );
    }

    #[test]
    fn an_image_already_tagged_whose_archive_an_older_build_never_uploaded_is_used_as_it_is() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let cases = "'image inspect localhost/manent/web:2') ;;
  'image inspect --format '*) echo abc123 ;;";
        let missing = dir.path().join("never-uploaded.tar");
        let (status, out, calls) = load_with(dir.path(), cases, &missing, false);
        assert_eq!(
            (status, out.as_str()),
            (Some(0), "sha256:abc123"),
            "the tagged image's id is printed: {calls}"
        );
        assert!(
            !calls.contains("load") && !calls.contains("tag "),
            "nothing is loaded or tagged again: {calls}"
        );
    }

    #[test]
    fn an_image_the_runtime_has_by_the_archives_id_is_tagged_not_loaded_again() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let id = "ab".repeat(32);
        let archive = archive_naming(dir.path(), &id);
        // A runtime that has the image by its id (another target on this host loaded it).
        let cases = format!(
            "'image inspect {id}') ;;
  'image inspect --format '*) echo {id} ;;
  'tag {id} localhost/manent/web:2') ;;"
        );
        let (status, out, calls) = load_with(dir.path(), &cases, &archive, false);
        assert_eq!(
            (status, out),
            (Some(0), format!("sha256:{id}")),
            "tagged and its id printed: {calls}"
        );
        assert!(
            !calls.contains("load"),
            "the image the runtime holds is not loaded a second time: {calls}"
        );
    }

    /// The start of `web` version 2 on port 8080, its image id unknown.
    fn start_web_2() -> String {
        start(&Start {
            names: &Names::new("web", "2"),
            port: 8080,
            env: vec![],
            args: &[],
            volumes: &[],
            archive: "/a.tar",
            remove_on_failure: true,
            image_id: None,
        })
    }

    #[test]
    fn a_started_container_is_known_by_one_inspect_its_address_image_and_log_file() {
        // podman's answer to the template: running, two bindings, the image, k8s-file.
        let fake = r#"podman() { echo "$*" >> "$log"; case "$1 $2" in
  'run -d') ;;
  'container inspect') echo 'true|127.0.0.1:40001 127.0.0.1:40002 |abc123|k8s-file|/var/lib/c/ctr.log' ;;
  *) echo "unexpected: $*" >&2; return 9 ;;
esac; }
rt=podman"#;
        let (status, out, calls) = run_with_fake_runtime(fake, &start_web_2());
        assert_eq!(
            (status, started(&out)),
            (
                Some(0),
                Started {
                    address: "127.0.0.1:40001".into(),
                    image: "sha256:abc123".into(),
                    log: "/var/lib/c/ctr.log".into(),
                }
            ),
            "the first binding, the image id and the log file are printed: {calls}"
        );
        assert!(
            !calls.contains("port ") && calls.contains("{{.HostConfig.LogConfig.Path}}"),
            "one inspect, no `port`: {calls}"
        );
    }

    #[test]
    fn a_log_file_of_another_driver_is_not_named_and_a_refused_template_falls_back_to_port() {
        let journald = r#"rt() { echo "$*" >> "$log"; case "$1 $2" in
  'run -d') ;;
  'container inspect') echo 'true|127.0.0.1:40001 |sha256:abc|journald|' ;;
  *) return 9 ;;
esac; }"#;
        let (status, out, calls) = run_with_fake_runtime(journald, &start_web_2());
        assert_eq!(
            (status, out.as_str()),
            (Some(0), "127.0.0.1:40001 sha256:abc"),
            "no log file: the health step asks the runtime's `logs`: {calls}"
        );
        assert!(
            !calls.contains("LogConfig.Path"),
            "a runtime other than podman is not asked for podman's field: {calls}"
        );
        let old = r#"rt() { echo "$*" >> "$log"; case "$1 $2" in
  'run -d') ;;
  'container inspect') echo "template: can't evaluate field" >&2; return 125 ;;
  'port web-2') echo 127.0.0.1:40003 ;;
  *) return 9 ;;
esac; }"#;
        let (status, out, calls) = run_with_fake_runtime(old, &start_web_2());
        assert_eq!(
            (status, out.as_str()),
            (Some(0), "127.0.0.1:40003"),
            "an inspect that refuses the template: the port is asked as before: {calls}"
        );
    }

    #[test]
    fn a_container_that_stopped_as_it_started_is_removed_with_its_logs_tail() {
        let fake = r#"rt() { echo "$*" >> "$log"; case "$1 $2" in
  'run -d') ;;
  'container inspect') echo 'false||abc|k8s-file|/x/ctr.log' ;;
  'logs --tail') echo 'panic: no config' ;;
  'rm -f') ;;
  *) return 9 ;;
esac; }"#;
        let (status, _, calls) = run_with_fake_runtime(fake, &start_web_2());
        assert_eq!(
            status,
            Some(UNHEALTHY),
            "a container that no longer runs fails its start: {calls}"
        );
        assert!(
            calls.contains("logs --tail 20 web-2") && calls.contains("rm -f web-2"),
            "its log's tail is shown and it is removed: {calls}"
        );
    }

    #[test]
    fn what_start_printed_is_read_with_or_without_a_log_file() {
        assert_eq!(
            started("127.0.0.1:1 sha256:ab /var/lib/my containers/ctr.log\n"),
            Started {
                address: "127.0.0.1:1".into(),
                image: "sha256:ab".into(),
                log: "/var/lib/my containers/ctr.log".into(),
            },
            "the log file is the rest of the line, spaces and all"
        );
        assert_eq!(
            started("127.0.0.1:1 sha256:ab"),
            Started {
                address: "127.0.0.1:1".into(),
                image: "sha256:ab".into(),
                log: String::new(),
            },
            "a start recorded by an earlier build names no log file"
        );
    }

    #[test]
    fn a_healthy_containers_first_lines_are_read_from_its_log_file_not_asked_of_the_runtime() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let log = dir.path().join("ctr.log");
        std::fs::write(
            &log,
            "2026-12-06T21:43:17.06+00:00 stdout F hello start\n\
             2026-12-06T21:43:17.07+00:00 stderr F listening on :8080\n",
        )
        .expect("write the log");
        let names = Names::new("web", "2");
        let log = log.display().to_string();
        let script = health(&Health {
            names: &names,
            address: "127.0.0.1:1",
            log: &log,
            path: "/up",
            interval: std::time::Duration::from_millis(100),
            timeout: std::time::Duration::from_secs(5),
            remove_on_failure: true,
        });
        let fake = r#"rt() { echo "$*" >> "$log"; return 9; }
curl() { echo 200; }"#;
        let (status, out, calls) = run_with_fake_runtime(fake, &script);
        assert_eq!(
            (status, out.as_str()),
            (Some(0), "hello start\nlistening on :8080\nGET /up: 200"),
            "the log's lines without their time and stream, then the answer: {calls}"
        );
        assert!(calls.is_empty(), "the runtime is not asked: {calls}");
    }

    #[test]
    fn a_version_has_one_container_name_and_one_image_tag() {
        let names = Names::new("web1-shop-api", "1.2+b3");
        expect_test::expect![[r#"
            Names {
                base: "web1-shop-api",
                container: "web1-shop-api-1.2-b3",
                tag: "localhost/manent/web1-shop-api:1.2-b3",
                version: "1.2+b3",
            }
        "#]]
        .assert_debug_eq(&names);
    }

    #[test]
    fn a_registry_image_is_pulled_by_its_pinned_reference_and_tagged_as_the_version() {
        let names = Names::new("shop-api-prod", "1.4");
        let reference = format!("registry.example.com/shop/api@sha256:{}", "ab".repeat(32));
        let script = pull(&names, &reference);
        assert!(
            script.contains(&format!("$rt pull -q '{reference}'"))
                && script.contains(&format!(
                    "$rt tag '{reference}' 'localhost/manent/shop-api-prod:1.4'"
                ))
                && script.starts_with(
                    "if ! $rt image inspect 'localhost/manent/shop-api-prod:1.4' >/dev/null 2>&1"
                ),
            "the target pulls the pinned reference only when the version's image is absent, \
             and tags it so start, rollback and prune work as for an archive: {script}"
        );
    }

    #[test]
    fn a_container_gets_its_variables_by_name_never_their_values_on_the_command_line() {
        let names = Names::new("app", "2");
        let script = start(&Start {
            names: &names,
            port: 8080,
            env: vec!["DB_PASSWORD".into()],
            args: &["--serve".into()],
            volumes: &[],
            archive: "/root/.manent/images/x.tar",
            remove_on_failure: true,
            image_id: None,
        });
        assert!(
            script.contains("-e 'DB_PASSWORD'")
                && !script.contains("DB_PASSWORD=")
                && script.contains("-p 127.0.0.1::8080"),
            "the variable is passed by name and the port on loopback only: {script}"
        );
    }
}
