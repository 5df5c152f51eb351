#!/usr/bin/env bash
# Fan-out benchmark runner (issues 4, 30 and 44): builds manent-fanout-bench (bench/fanout) in
# release mode, sets up the Python peers from PyPI in a virtualenv (bench/target/peers-venv:
# ansible-core, Mitogen, pyinfra) when missing, then deploys a 50 MB and a 1 MB artifact to
# 20, 100 and 300 loopback sshd targets (a workload runs at a target count while size x
# targets stays within --max-total-mb, 1000: so 50 MB at 20 only) with manent, parallel
# scp + ssh, ansible-playbook, ansible under Mitogen, pyinfra and the floor (the same bytes
# over open OpenSSH connections, `cat > file && sync`), and prints wall times, each engine's
# ratio to the fastest tool of its row, the machine's load at each run's start, the worker's
# memory per target and the goals' PASS/FAIL (informational: the exit status is 0 unless
# something could not be built or set up). Bounded: each engine's run gives up after
# --run-timeout seconds (300), the whole run after --max-minutes (60). See bench/README.md,
# "Fan-out over SSH". Not run by CI.
#
# usage: bench/run-fanout.sh [--no-build] [--out DIR] [--max-minutes M] [manent-fanout-bench flags...]
#   flags: --targets 20,100,300  --sizes-mb 50,1  --max-total-mb 1000  --run-timeout 300
#          --engines manent,manent-pg,manent-warm,scp,ansible,mitogen,pyinfra,floor,transport
#          --postgres-url ADMIN_URL (manent-pg: fresh database per run; default
#          $MANENT_TEST_POSTGRES, else postgres://postgres@127.0.0.1:5432/postgres)
#          --login-user ACCOUNT: the account every engine logs in as. Run as root without it,
#          the script creates (once) and uses `manent-bench`, a deploy account whose login
#          shell is /bin/sh: root's start-up files on these machines run `pyenv init` in
#          every SSH session (0.2 s of CPU each), which would measure root's ~/.bashrc, not
#          the tools. `--login-user root` measures that way anyway.
#
# Needs OpenSSH's sshd (/usr/sbin/sshd), ssh, scp, ssh-keygen, sha256sum, sha1sum, and
# python3 with venv (pip reaches PyPI once, to install the peers), and a reachable
# PostgreSQL for manent-pg. 300 targets take about 4 GB of memory at the peak (ansible with
# 300 forks, 300 sshd sessions). Results go to DIR
# (default bench/target/results/fanout-<UTC timestamp>/): table.md, results.jsonl, run.log.
set -euo pipefail

bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export CARGO_TARGET_DIR="$bench/target"

build=1
out=""
minutes=60
login=""
pass=()
while (($#)); do
    case "$1" in
        --no-build) build=0; shift ;;
        --login-user)
            (($# >= 2)) || { echo "--login-user needs a value" >&2; exit 2; }
            login=$2
            shift 2
            ;;
        --max-minutes)
            (($# >= 2)) || { echo "--max-minutes needs a value" >&2; exit 2; }
            minutes=$2
            shift 2
            ;;
        --out)
            (($# >= 2)) || { echo "--out needs a value" >&2; exit 2; }
            out=$2
            shift 2
            ;;
        -h | --help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) pass+=("$1"); shift ;;
    esac
done
out=${out:-$bench/target/results/fanout-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"

if ((build)); then
    echo "== building bench/fanout (release, nice -n 19, -j 1)" >&2
    (cd "$bench/fanout" && nice -n 19 cargo build --release -j 1)
fi

# The Python peers, one virtualenv for the three: ansible-core below 2.19 (the newest line
# Mitogen 0.3 is known to run here), Mitogen, pyinfra.
venv="$bench/target/peers-venv"
if [[ ! -x $venv/bin/pyinfra || ! -x $venv/bin/ansible-playbook ]]; then
    echo "== installing ansible-core, mitogen and pyinfra from PyPI into $venv" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet 'ansible-core<2.19' mitogen pyinfra
fi
strategy=$("$venv/bin/python" -c 'import ansible_mitogen, os; print(os.path.join(os.path.dirname(ansible_mitogen.__file__), "plugins", "strategy"))')

if [[ -z $login && $(id -u) == 0 ]]; then
    login=manent-bench
    if ! id "$login" >/dev/null 2>&1; then
        echo "== creating the deploy account $login (login shell /bin/sh, no password)" >&2
        useradd --create-home --shell /bin/sh "$login"
        # '*' rather than useradd's locked '!': sshd without PAM refuses a locked account.
        usermod -p '*' "$login"
    fi
fi
if [[ -n $login ]]; then
    pass+=(--login-user "$login")
fi

{
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "login: ${login:-$(id -un)} (shell $(getent passwd "${login:-$(id -un)}" | cut -d: -f7))"
    echo "host: $(uname -srm), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "commit: $(git -C "$bench" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "openssh: $(ssh -V 2>&1)"
    echo "ansible: $("$venv/bin/ansible-playbook" --version 2>/dev/null | head -n 1)"
    echo "mitogen: $("$venv/bin/pip" show mitogen 2>/dev/null | sed -n 's/^Version: //p')"
    echo "pyinfra: $("$venv/bin/pyinfra" --version 2>/dev/null | head -n 1)"
} | tee "$out/table.md"

# The Python peers find their python and tools in the venv. The whole run is bounded.
PATH="$venv/bin:$PATH" timeout --signal=INT --kill-after=30 "$((minutes * 60))" \
    "$CARGO_TARGET_DIR/release/manent-fanout-bench" \
    --ansible-playbook "$venv/bin/ansible-playbook" --mitogen-strategy "$strategy" \
    --pyinfra "$venv/bin/pyinfra" --json "$out/results.jsonl" "${pass[@]}" \
    2> >(tee "$out/run.log" >&2) | tee -a "$out/table.md"
echo "results: $out" >&2
