#!/usr/bin/env bash
# Container deploy benchmark (issue 40, item 7): a container deploy with manent's `container`
# plugin to 1 and 10 loopback sshd targets, against the floor: the same steps as one shell
# script per target over an OpenSSH connection opened first (archive copied with `cat`,
# `podman load` and `tag` under a host lock, skipped for an image already held, as manent
# does; `podman run`, health polled, HAProxy switched through its runtime API, the
# old server retired once idle and its container stopped), no checkpoints, no verification.
# During each timed deploy `hey` sends requests to every target's proxy, --rate a second
# (100; 0: as fast as it can, which on a 2-core machine running 10 targets leaves the
# deploys the cores the load generators do not take); the requests served and failed are
# counted. The floor prunes nothing; after each floor run, untimed, what manent's prune
# (keep 1) would have removed is removed, so each of manent's timed deploys prunes one
# version, as it would deploying alone. Prints wall times, the ratio manent/floor, the
# failed requests and `uptime`. Bounded: each deploy gives up after --run-timeout seconds
# (300). Not run by CI. See bench/README.md, "Container deploys".
#
# usage: bench/run-containers.sh [--bin DIR] [--targets 1,10] [--rounds 1] [--rate 100] [--out DIR]
#   --bin DIR: where manent-server and manent are (default $CARGO_TARGET_DIR/release, else
#              target/release; build them with `cargo build --release -p manent-server -p
#              manent-cli`). Debug binaries work and say so in the table.
#
# Needs podman (and catatonit), haproxy, socat, curl, hey, OpenSSH's sshd, ssh, ssh-keygen,
# and busybox (static, /bin/busybox or $MANENT_TEST_BUSYBOX) for the images. The targets are
# this machine's loopback addresses 127.0.0.2… logged in to as the current user, so every
# target shares one podman storage (as the floor does). sshd runs every command through the
# login shell, which reads its start-up files first (root's ~/.bashrc runs `pyenv init` on
# these machines: 0.23 s a session); run as root, the bench logs in as `manent-root-sh`, the
# same uid 0 and home with /bin/sh as its shell, added to /etc/passwd for the run and removed
# at its end (--login-as-self: log in as the current user and its shell instead).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=""
counts="1,10"
rounds=1
out=""
timeout=300
rate=100
login_as_self=""
while (($#)); do
    case "$1" in
        --bin) bin=$2; shift 2 ;;
        --targets) counts=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --run-timeout) timeout=$2; shift 2 ;;
        --rate) rate=$2; shift 2 ;;
        --login-as-self) login_as_self=1; shift ;;
        -h | --help) sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
if [[ -z $bin ]]; then
    bin=${CARGO_TARGET_DIR:-$root/target}/release
fi
for tool in "$bin/manent-server" "$bin/manent"; do
    [[ -x $tool ]] || { echo "$tool is missing: cargo build --release -p manent-server -p manent-cli, or --bin DIR" >&2; exit 2; }
done
for tool in podman haproxy socat curl hey sshd ssh ssh-keygen; do
    command -v "$tool" >/dev/null || [[ -x /usr/sbin/$tool ]] || { echo "$tool is not installed" >&2; exit 2; }
done
busybox=${MANENT_TEST_BUSYBOX:-/bin/busybox}
USER=${USER:-$(id -un)}
out=${out:-$root/bench/target/results/containers-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
work=$(mktemp -d /tmp/manent-containers-bench.XXXXXX)
log=$out/run.log
: >"$log"
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for c in $(podman ps -a --format '{{.Names}}' | grep '^mbench-' || true); do podman rm -f "$c" >/dev/null 2>&1 || true; done
    for i in $(podman images --format '{{.Repository}}:{{.Tag}}' | grep 'mbench' || true); do podman rmi -f "$i" >/dev/null 2>&1 || true; done
    for d in "$HOME"/.manent/proxy/mbench-*; do
        [[ -f $d/haproxy.pid ]] && kill "$(cat "$d/haproxy.pid")" 2>/dev/null || true
        rm -rf "$d"
    done
    for s in "$work"/floor-*.sock; do [[ -S $s ]] && ssh -S "$s" -O exit x 2>/dev/null || true; done
    rm -f "$HOME"/.manent/floor-n*.tar "$HOME"/.manent/images/mbench-*.tar
    [[ -f $work/server.log ]] && cp "$work/server.log" "$out/server.log" 2>/dev/null
    rm -rf "$work"
    [[ -z $alias_added ]] || sed -i '/^manent-root-sh:/d' /etc/passwd /etc/shadow
}
alias_added=""
trap cleanup EXIT
# The login: a uid-0 alias whose shell reads no start-up file (see the top).
if [[ -z $login_as_self && $(id -u) = 0 && $(getent passwd "$USER" | cut -d: -f7) != /bin/sh ]]; then
    if ! getent passwd manent-root-sh >/dev/null; then
        # `*`, not useradd's `!`: sshd refuses a locked account even its keys.
        useradd -o -u 0 -g 0 -M -d "$HOME" -s /bin/sh -p '*' manent-root-sh
        alias_added=1
    fi
    USER=manent-root-sh
fi
login_shell=$(getent passwd "$USER" | cut -d: -f7)
max=$(tr ',' '\n' <<<"$counts" | sort -n | tail -n 1)

# sshd on 127.0.0.2 … (max+1), one server, one port.
ssh-keygen -q -t ed25519 -N '' -f "$work/host_key"
ssh-keygen -q -t ed25519 -N '' -f "$work/client_key"
cp "$work/client_key.pub" "$work/authorized_keys"
sshd_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
{
    for i in $(seq 1 "$max"); do echo "ListenAddress 127.0.0.$((i + 1)):$sshd_port"; done
    cat <<EOF
HostKey $work/host_key
PidFile $work/sshd.pid
AuthorizedKeysFile $work/authorized_keys
StrictModes no
UsePAM no
PubkeyAuthentication yes
PasswordAuthentication no
PermitRootLogin prohibit-password
UseDNS no
MaxStartups 100
MaxSessions 100
Subsystem sftp internal-sftp
EOF
} >"$work/sshd_config"
mkdir -p /run/sshd
/usr/sbin/sshd -D -f "$work/sshd_config" -E "$work/sshd.log" &
pids+=($!)
for i in $(seq 1 "$max"); do
    echo "[127.0.0.$((i + 1))]:$sshd_port $(cut -d' ' -f1,2 "$work/host_key.pub")"
done >"$work/known_hosts"
ssh_opts=(-i "$work/client_key" -o "UserKnownHostsFile=$work/known_hosts" -o StrictHostKeyChecking=yes -o BatchMode=yes -p "$sshd_port")
for _ in $(seq 1 50); do ssh "${ssh_opts[@]}" "$USER@127.0.0.2" true 2>/dev/null && break; sleep 0.1; done

# Images: busybox httpd on 8080 serving its version, /health answering once started.
image() {
    local v=$1 rootfs=$work/rootfs-$1
    mkdir -p "$rootfs/bin" "$rootfs/www"
    [[ -x $busybox ]] || { echo "busybox (static) is needed at $busybox or \$MANENT_TEST_BUSYBOX" >&2; exit 2; }
    cp "$busybox" "$rootfs/bin/busybox"
    ln -sf busybox "$rootfs/bin/sh"
    ln -sf busybox "$rootfs/bin/httpd"
    echo "v$v" >"$rootfs/www/index.html"
    echo ok >"$rootfs/www/health"
    tar -C "$rootfs" -cf "$work/rootfs-$v.tar" .
    podman import -q --change 'CMD ["/bin/httpd","-f","-p","8080","-h","/www"]' "$work/rootfs-$v.tar" "localhost/mbench-build:$v" >/dev/null
    podman save -q -o "$work/image-$v.tar" "localhost/mbench-build:$v"
    podman rmi -f "localhost/mbench-build:$v" >/dev/null
    sha256sum "$work/image-$v.tar" | cut -d' ' -f1
}

# manent: one `serve` on SQLite.
api_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mkdir -p "$work/site/environments"
cat >"$work/site/manent.yml" <<EOF
database: {url: "sqlite://$work/site/manent.db"}
api: {listen: "127.0.0.1:$api_port"}
environments: {source: environments}
artifacts: {sources: ["file://$work/"]}
EOF
server() { DBOS__VMID=w1 MANENT_WORKDIR=$work/site/work exec "$bin/manent-server" -c "$work/site/manent.yml" "$@"; }
token=$(server admin token create --name bench --role admin)
(server serve 2>>"$work/server.log") &
pids+=($!)
# The server's own CPU time (user + system, in clock ticks): its share of a deploy's work.
server_pid=$!
ticks=$(getconf CLK_TCK)
server_cpu() { awk '{ print $14 + $15 }' "/proc/$server_pid/stat"; }
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$api_port/healthz" >/dev/null && break; sleep 0.1; done
cli() { "$bin/manent" --server "http://127.0.0.1:$api_port" --token "$token" "$@"; }

environment() { # application n listen-port
    local app=$1 n=$2 port=$3
    mkdir -p "$work/site/environments/bench/$app"
    {
        echo "targets:"
        for i in $(seq 1 "$n"); do echo "  - {name: t$i, host: 127.0.0.$((i + 1)), port: $sshd_port}"; done
        echo "ssh: {user: \"$USER\", key: \"$work/client_key\", known_hosts: \"$work/known_hosts\"}"
        echo "rollout: {max_parallel: $n}"
        echo "deploy:"
        echo "  plugin: container"
        echo "  container: {name: \"mbench-$app-{target}\", port: 8080, health: {path: /health, interval: 100ms, timeout: 60s}, stop_timeout: 5s, keep: 1}"
        echo "  proxy: {listen: \"{host}:$port\"}"
    } >"$work/site/environments/bench/$app/prod.yml"
}

descriptor() { # application version sha
    cat >"$work/deploy-$1-$2.yml" <<EOF
application: bench/$1
environment: prod
artifacts:
  - {name: app.tar, type: image, version: "$2", url: "file://$work/image-$2.tar", sha256: "$3"}
EOF
    echo "$work/deploy-$1-$2.yml"
}

# The floor's script on one target: the steps of a container deploy, nothing else.
floor_script() { # base version archive
    cat <<EOF
set -e
rt=podman base=$1 name=$1-$2 tag=localhost/manent/$1:$2
# Loads and tags of one host take turns, as manent's do: without it, targets loading and
# tagging one image at once lose tags and fail ("image not known").
# An image the runtime holds already (another target loaded it: the id its manifest names)
# is only tagged, as manent does.
ref=\$(tar -xOf $3 manifest.json | sed -n 's/.*"Config": *"\\([^"]*\\)".*/\\1/p' | head -n 1)
ref=\${ref#blobs/sha256/}; ref=\${ref%.json}
exec 9>/tmp/manent-floor-load.lock && flock 9
if [ -z "\$ref" ] || ! \$rt image inspect "\$ref" >/dev/null 2>&1; then
  ref=\$(\$rt load -i $3 | sed -n 's/^Loaded image[^:]*: *//p' | tail -n 1)
fi
\$rt tag "\$ref" "\$tag"
exec 9>&-
\$rt run -d --init --name "\$name" --label manent.owner=\$base -p 127.0.0.1::8080 "\$tag" >/dev/null
addr=\$(\$rt port "\$name" 8080/tcp | head -n 1)
tries=0
until [ "\$(curl -s -o /dev/null -m 5 -w '%{http_code}' "http://\$addr/health")" = 200 ]; do
  tries=\$((tries + 1)); [ \$tries -lt 600 ] || { echo "\$name never became healthy" >&2; exit 5; }
  sleep 0.1
done
sock=\$HOME/.manent/proxy/\$base/admin.sock
api() { printf '%s\n' "\$1" | socat -t 5 stdio "unix-connect:\$sock"; }
api "add server live/\$name \$addr" >/dev/null
api "set server live/\$name state ready" >/dev/null
others=\$(api 'show servers state live' | awk 'NR > 2 && NF > 3 { print \$4 }' | grep -vx "\$name" || true)
for s in \$others; do api "set server live/\$s state drain" >/dev/null; done
for s in \$others; do
  while [ "\$(api 'show stat' | awk -F, -v s="\$s" '\$1 == "live" && \$2 == s { print \$5 }')" != 0 ]; do sleep 0.2; done
  api "set server live/\$s state maint" >/dev/null
  api "del server live/\$s" >/dev/null
done
for c in \$(\$rt ps --filter label=manent.owner=\$base --format '{{.Names}}'); do
  [ "\$c" = "\$name" ] || \$rt stop -t 5 "\$c" >/dev/null
done
EOF
}

floor() { # application n version
    local app=$1 n=$2 v=$3 i
    for i in $(seq 1 "$n"); do
        ssh "${ssh_opts[@]}" -M -N -f -S "$work/floor-$app-$i.sock" -o ControlPersist=300 "$USER@127.0.0.$((i + 1))"
    done
    local start end
    rm -f "$work/floor-failed"
    start=$(date +%s.%N)
    for i in $(seq 1 "$n"); do
        (
            s=$work/floor-$app-$i.sock
            ssh -S "$s" "${ssh_opts[@]}" "$USER@127.0.0.$((i + 1))" "mkdir -p ~/.manent && cat > ~/.manent/floor-$app-$i-$v.tar" <"$work/image-$v.tar"
            floor_script "mbench-$app-t$i" "$v" "\$HOME/.manent/floor-$app-$i-$v.tar" | ssh -S "$s" "${ssh_opts[@]}" "$USER@127.0.0.$((i + 1))" sh 2>>"$log" ||
                echo "the floor failed on t$i (version $v): see $log" | tee -a "$work/floor-failed" >&2
        ) &
    done
    wait
    end=$(date +%s.%N)
    for i in $(seq 1 "$n"); do ssh -S "$work/floor-$app-$i.sock" -O exit x 2>/dev/null || true; done
    awk -v a="$start" -v b="$end" 'BEGIN { printf "%.3f", b - a }'
}

floor_tidy() { # application n kept-version live-version: removes the other stopped ones
    local app=$1 n=$2 kept=$3 live=$4 i c base img
    for i in $(seq 1 "$n"); do
        base=mbench-$app-t$i
        for c in $(podman ps -a --filter "label=manent.owner=$base" --filter status=exited --format '{{.Names}}'); do
            [[ $c = "$base-$kept" || $c = "$base-$live" ]] && continue
            img=$(podman container inspect --format '{{.Config.Image}}' "$c" 2>/dev/null || true)
            podman rm "$c" >/dev/null 2>&1 || true
            [[ -z $img ]] || podman rmi "$img" >/dev/null 2>&1 || true
        done
    done
}

# Waits (untimed) until deploy $1's prunes, which run after its result, have ended on its $2
# targets, so that they never overlap the floor's timed run; prints when they ended (epoch s).
wait_pruned() { # deploy-id n
    local i
    for i in $(seq 1 $((timeout * 10))); do
        if cli status "$1" -o json 2>>"$log" | python3 -c '
import json, sys, datetime
s = json.load(sys.stdin)
p = [x for x in s["steps"] if x["name"].endswith(": prune containers")]
if len(p) < int(sys.argv[1]) or any(x["status"] == "RUNNING" for x in p):
    sys.exit(1)
print(max(datetime.datetime.fromisoformat(x["finished_at"].replace("Z", "+00:00")).timestamp() for x in p))
' "$2"; then return 0; fi
        sleep 0.1
    done
    echo "the prunes of $1 did not end within ${timeout}s" >&2
    return 1
}

# hey against every target's proxy while a deploy runs; prints "served failed".
load_start() { # n listen-port
    local i
    loads=()
    for i in $(seq 1 "$1"); do
        # hey's -q is per worker: two workers, half the rate each (0: no limit).
        hey -z "${timeout}s" -c 2 -q "$(((rate + 1) / 2))" "http://127.0.0.$((i + 1)):$2/" >"$work/hey-$i.txt" 2>&1 &
        loads+=($!)
    done
}
load_stop() { # in this shell (it waits for hey); "served failed" into $work/load.txt
    local pid served=0 failed=0 f ok all errors
    for pid in "${loads[@]}"; do kill -INT "$pid" 2>/dev/null || true; done
    for pid in "${loads[@]}"; do wait "$pid" 2>/dev/null || true; done
    for f in "$work"/hey-*.txt; do
        ok=$(awk '/\[200\]/ { print $2 }' "$f" | head -n 1)
        all=$(awk '/\[[0-9]+\]/ { n += $2 } END { print n + 0 }' "$f")
        errors=$(awk '/Error distribution:/ { on = 1; next } on && /\[[0-9]+\]/ { n += substr($1, 2, length($1) - 2) } END { print n + 0 }' "$f")
        served=$((served + ${ok:-0}))
        failed=$((failed + all - ${ok:-0} + errors))
        cat "$f" >>"$log"
        rm -f "$f"
    done
    echo "$served $failed" >"$work/load.txt"
}

build=$(basename "$(dirname "$bin")")
table=$out/table.md
{
    echo "| targets | round | manent s | floor s | manent/floor | manent served/failed | floor served/failed | load at start | manent's prunes ended at s | manent-server CPU s |"
    echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
} >"$table"
version=0
port=8100
for n in ${counts//,/ }; do
    app=n$n
    port=$((port + 1))
    environment "$app" "$n" "$port"
    version=$((version + 1))
    sha=$(image $version 2>>"$log")
    echo "== $n target(s): first deploy (untimed, starts the proxies)" >&2
    cli deploy --wait -f "$(descriptor "$app" "$version" "$sha")" >"$work/deploy.out" 2>&1
    cat "$work/deploy.out" >>"$log"
    id=$(grep -m 1 -o '[0-9a-f]\{8\}-[0-9a-f-]\{27\}' "$work/deploy.out" || true)
    [[ -z $id ]] || wait_pruned "$id" "$n" >/dev/null || true
    for round in $(seq 1 "$rounds"); do
        version=$((version + 1)); sha=$(image $version 2>>"$log")
        d=$(descriptor "$app" "$version" "$sha")
        load=$(cut -d' ' -f1-3 /proc/loadavg)
        load_start "$n" "$port"
        cpu_before=$(server_cpu)
        start=$(date +%s.%N)
        timeout "$timeout" "$bin/manent" --server "http://127.0.0.1:$api_port" --token "$token" deploy --wait -f "$d" >"$work/deploy.out" 2>&1 || echo "manent's deploy failed: see $log" >&2
        end=$(date +%s.%N)
        cpu=$(awk -v a="$cpu_before" -v b="$(server_cpu)" -v t="$ticks" 'BEGIN { printf "%.2f", (b - a) / t }')
        cat "$work/deploy.out" >>"$log"
        # Its steps with their times, to see where a deploy spends them.
        id=$(grep -m 1 -o '[0-9a-f]\{8\}-[0-9a-f-]\{27\}' "$work/deploy.out" || true)
        load_stop
        read -r m_served m_failed <"$work/load.txt"
        m=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.3f", b - a }')
        # Untimed: its prunes end before anything else runs (the prune's own time is shown).
        pruned_at=""
        [[ -z $id ]] || pruned_at=$(wait_pruned "$id" "$n" || true)
        p=$(awk -v a="$start" -v b="$pruned_at" 'BEGIN { if (b == "") print "-"; else printf "%.2f", b - a }')
        [[ -z $id ]] || cli status "$id" -o json >"$out/status-n$n-r$round.json" 2>>"$log" || true
        version=$((version + 1)); image $version >/dev/null 2>>"$log"
        load_start "$n" "$port"
        f=$(floor "$app" "$n" "$version")
        load_stop
        # Untimed: what manent's prune would have removed after the floor's deploy (the
        # floor prunes nothing), so that manent's next prune finds one version to remove,
        # as it would deploying alone, not every version the floor left.
        floor_tidy "$app" "$n" "$((version - 1))" "$version"
        read -r f_served f_failed <"$work/load.txt"
        ratio=$(awk -v m="$m" -v f="$f" 'BEGIN { printf "%.2f", m / f }')
        # A floor that failed on a target did less than a deploy: its row says so.
        [[ ! -f $work/floor-failed ]] || ratio="$ratio (floor failed on $(wc -l <"$work/floor-failed") target(s))"
        printf '| %s | %s | %.2f | %.2f | %s | %s/%s | %s/%s | %s | %s | %s |\n' "$n" "$round" "$m" "$f" "$ratio" \
            "$m_served" "$m_failed" "$f_served" "$f_failed" "$load" "$p" "$cpu" | tee -a "$table" >&2
    done
done
{
    echo
    echo "binaries: $bin ($build); login $USER with $login_shell; $(nproc) CPUs; uptime: $(uptime)"
    echo "load: $rate requests/s per target (0: unlimited); goal: manent/floor <= 1.2 and 0 failed requests"
} | tee -a "$table" >&2
cat "$table"
