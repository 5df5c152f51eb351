//! What ansible starts on a target ends before the step may run there again
//! (docs/scaling-and-recovery.md, "Ansible on the targets"): ansible's `ssh` is a wrapper
//! (`manent-plugin-ansible ssh-guard`) that runs each remote command under [`REMOTE_GUARD`],
//! a POSIX-shell guard on the target that kills the command's process group when its SSH
//! connection is gone, and that first stops, and waits out, whatever an earlier run of the
//! same deploy on the same target left running.

use std::{
    ffi::OsString,
    os::unix::{ffi::OsStrExt, process::CommandExt},
    path::{Path, PathBuf},
    process::Command,
};

use crate::inventory::sh_quote;

/// The plugin's subcommand that stands in for `ssh`: `ssh-guard <real ssh> <run key>
/// <ssh's arguments>…`.
pub const SUBCOMMAND: &str = "ssh-guard";

/// The guard on the target (`sh -c` with `$1` the record's name, `$2` the command as ansible
/// gave it). sshd starts a session's command as a session leader, so the guard leads the
/// process group of everything the command starts, and is its sshd session's child.
///
/// - **Takeover.** `~/.manent/ansible/<key>` (0700) records the process group of the run
///   of this deploy on this target (its leader's pid and start time, so a reused pid is
///   never taken for it). If that group still lives, it gets SIGTERM, SIGKILL 5 s later,
///   and the guard waits until no process of it is left (zombies aside) before the command
///   starts: a run
///   of the step that restarts while the old one's task is still running (a worker killed
///   and started again, a frozen worker's successor) never runs beside it. A group that
///   outlives SIGKILL for 30 s (a process stuck in the kernel) fails the task.
/// - **Connection.** A watcher reads the guard's parent once a second; when the sshd
///   session is gone (the SSH client died with its worker or plugin, the connection was
///   cut) the guard is reparented and the watcher sends SIGTERM to the group, then SIGKILL
///   2 s later. Without a tty (ansible's pipelining) nothing else would: sshd sends no
///   SIGHUP.
/// - **End.** When the command ends, the watcher is stopped, the record removed, and the
///   command's status returned; what the command left running on purpose in the
///   background is left alone, as the `command` plugin does.
///
/// Where `/proc` cannot be read or the guard does not lead its group, it says so on stderr
/// and runs the command unguarded.
pub const REMOTE_GUARD: &str = r#"k=$1 c=$2
st() { { read -r s <"/proc/$1/stat"; } 2>/dev/null || return 1; s=${s##*)}; set -- $s; echo "$2 $3 ${20}"; }
alive() { kill -s 0 -- "-$1" 2>/dev/null || return 1
for x in /proc/[0-9]*/stat; do { read -r s <"$x"; } 2>/dev/null || continue; s=${s##*)}; set -- "$1" $s; [ "$4" = "$1" ] && [ "$2" != Z ] && return 0; done; return 1; }
unguarded() { echo "manent: $1: this task is not stopped when its connection drops (docs/scaling-and-recovery.md)" >&2; exec sh -c "$c"; }
me=$(st $$) || unguarded "/proc/$$/stat cannot be read"
set -- $me
[ "$2" = $$ ] || unguarded "the command does not lead its process group"
d=$HOME/.manent/ansible f=$HOME/.manent/ansible/$k
(umask 077 && mkdir -p "$d") || unguarded "cannot create $d"
if [ -f "$f" ] && { read -r p s <"$f"; } 2>/dev/null && [ -n "$p" ]; then
if now=$(st "$p"); then set -- $now; [ "$3" = "$s" ] || p=; fi
i=0
while [ -n "$p" ] && alive "$p"; do
i=$((i+1))
[ $i -eq 1 ] && kill -s TERM -- "-$p" 2>/dev/null
[ $i -eq 50 ] && kill -s KILL -- "-$p" 2>/dev/null
if [ $i -ge 350 ]; then echo "manent: an earlier run of this deploy on this host (process group $p, record $f) outlived SIGKILL for 30 s; not starting this task" >&2; exit 125; fi
sleep 0.1 2>/dev/null || sleep 1
done
fi
set -- $me
echo "$$ $3" >"$f.$$" && mv -f "$f.$$" "$f" || unguarded "cannot write $f"
( trap '' TERM
while [ "$(st $$)" = "$me" ]; do sleep 1; done
kill -s TERM 0; sleep 2; kill -s KILL 0 ) </dev/null >/dev/null 2>&1 &
w=$!
sh -c "$c"
rc=$?
kill -s KILL $w 2>/dev/null
{ read -r p s <"$f"; } 2>/dev/null && [ "$p" = $$ ] && rm -f "$f"
exit $rc"#;

/// Who a run of the step is, on one target, as a file name: the run's key (the deploy) and
/// the SSH destination, user and port, each character outside `[A-Za-z0-9._@:-]` a `_`.
pub fn record_name(run_key: &str, destination: &Destination) -> String {
    format!(
        "{run_key}.{}@{}:{}",
        destination.user, destination.host, destination.port
    )
    .chars()
    .map(|c| {
        if c.is_ascii_alphanumeric() || "._@:-".contains(c) {
            c
        } else {
            '_'
        }
    })
    .collect()
}

/// Where an `ssh` invocation goes, as far as its arguments say (empty when they do not).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Destination {
    pub host: String,
    pub user: String,
    pub port: String,
}

/// An `ssh` invocation read from its arguments.
#[derive(Debug, PartialEq, Eq)]
enum Invocation {
    /// A remote command: where, and the index of its first word.
    Command {
        destination: Destination,
        first_word: usize,
    },
    /// Anything else (a subsystem such as sftp, `-O` control, `-N`, `-W`, a login): passed
    /// through as it is.
    Other,
}

/// ssh(1)'s options that take an argument (OpenSSH's option letters).
const WITH_ARGUMENT: &str = "BbcDEeFIiJLlmOoPpQRSWw";

fn parse(args: &[OsString]) -> Invocation {
    let mut user = None;
    let mut port = None;
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].to_string_lossy().into_owned();
        if arg == "--" {
            i += 1;
            break;
        }
        let Some(letters) = arg.strip_prefix('-').filter(|l| !l.is_empty()) else {
            break;
        };
        for (at, letter) in letters.char_indices() {
            if matches!(letter, 'N' | 's') {
                return Invocation::Other;
            }
            if !WITH_ARGUMENT.contains(letter) {
                continue;
            }
            let attached = &letters[at + letter.len_utf8()..];
            let value = if attached.is_empty() {
                i += 1;
                args.get(i).map(|v| v.to_string_lossy().into_owned())
            } else {
                Some(attached.to_string())
            };
            let value = value.unwrap_or_default();
            match letter {
                'O' | 'W' => return Invocation::Other,
                'l' => {
                    user.get_or_insert(value);
                }
                'p' => {
                    port.get_or_insert(value);
                }
                'o' => {
                    let (key, setting) =
                        value.split_once(['=', ' ']).unwrap_or((value.as_str(), ""));
                    let setting = setting.trim().trim_matches('"').to_string();
                    if key.eq_ignore_ascii_case("user") {
                        user.get_or_insert(setting);
                    } else if key.eq_ignore_ascii_case("port") {
                        port.get_or_insert(setting);
                    }
                }
                _ => {}
            }
            break;
        }
        i += 1;
    }
    if i + 1 >= args.len() {
        return Invocation::Other;
    }
    let target = args[i].to_string_lossy();
    let (login, host) = match target.rsplit_once('@') {
        Some((login, host)) => (Some(login.to_string()), host.to_string()),
        None => (None, target.into_owned()),
    };
    Invocation::Command {
        destination: Destination {
            host,
            user: user.or(login).unwrap_or_default(),
            port: port.unwrap_or_default(),
        },
        first_word: i + 1,
    }
}

/// `args` with the remote command, if any, run under [`REMOTE_GUARD`] keyed by `run_key`
/// and the destination; anything else as it is. The command's words are joined with
/// spaces, as ssh joins them, and the login shell on the target runs the guard in its
/// place (`exec`), so that the guard is the sshd session's child.
pub fn guarded_args(run_key: &str, args: Vec<OsString>) -> Vec<OsString> {
    let Invocation::Command {
        destination,
        first_word,
    } = parse(&args)
    else {
        return args;
    };
    let command = args[first_word..]
        .iter()
        .map(|w| w.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    let guarded = format!(
        "exec sh -c {} manent-ansible-guard {} {}",
        sh_quote(REMOTE_GUARD),
        sh_quote(&record_name(run_key, &destination)),
        sh_quote(&command)
    );
    let mut out: Vec<OsString> = args.into_iter().take(first_word).collect();
    out.push(guarded.into());
    out
}

/// The `ssh-guard` subcommand: `args` are the real ssh, the run's key, then ssh's own
/// arguments; replaces this process with the real ssh. Returns only on failure.
pub fn ssh_main(mut args: impl Iterator<Item = OsString>) -> String {
    let (Some(ssh), Some(run_key)) = (args.next(), args.next()) else {
        return format!(
            "usage: manent-plugin-ansible {SUBCOMMAND} <ssh> <run key> <ssh arguments>…: \
             the ansible plugin writes this call itself"
        );
    };
    let run_key = run_key.to_string_lossy().into_owned();
    let error = Command::new(&ssh)
        .args(guarded_args(&run_key, args.collect()))
        .exec();
    format!("cannot run {}: {error}", Path::new(&ssh).display())
}

/// Writes `<work>/ssh`, the executable ansible runs as its `ssh` (`ANSIBLE_SSH_EXECUTABLE`):
/// this plugin's `ssh-guard` with `real_ssh` and `run_key`.
pub fn write_wrapper(work: &Path, real_ssh: &Path, run_key: &str) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let exe = std::env::current_exe()?;
    let path = work.join("ssh");
    let word = |p: &Path| sh_quote(&String::from_utf8_lossy(p.as_os_str().as_bytes()));
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\nexec {} {SUBCOMMAND} {} {} \"$@\"\n",
            word(&exe),
            word(real_ssh),
            sh_quote(run_key)
        ),
    )?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    Ok(path)
}

#[cfg(test)]
mod tests;
