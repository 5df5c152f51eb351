#!/usr/bin/env bash
# bench/run-drift.sh: `manent drift` of N targets (100) each holding a release of F files
# (2,000), against the floor of one `find … | sha256sum` per target over open SSH
# connections (ControlMaster), in the same run; wall time and bytes on loopback, their
# ratio, and `uptime`. All targets share one sshd on 127.0.0.1 (distinct directories).
# Bounded: every wait has a deadline; nothing is left running (trap). Not run by CI.
#
#   bench/run-drift.sh                      # release build (nice, -j 1), then run
#   BIN=$CARGO_TARGET_DIR/debug bench/run-drift.sh   # binaries already built
#   N=10 F=200 RUNS=1 bench/run-drift.sh    # smoke
set -euo pipefail

N=${N:-100}
F=${F:-2000}
PAR=${PAR:-10}   # rollout.max_parallel, and the floor's parallelism
RUNS=${RUNS:-3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [[ -z "${BIN:-}" ]]; then
    (cd "$ROOT" && nice -n 19 cargo build --release -j 1 -p manent-server -p manent-cli)
    BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release
fi
W=$(mktemp -d /tmp/manent-drift-bench.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for s in "$W"/ctl-*; do [[ -S "$s" ]] && ssh -S "$s" -O exit x 2>/dev/null || true; done
    [[ -n "${KEEP:-}" ]] && echo "kept $W" || rm -rf "$W"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
lo_bytes() { awk '/^ *lo:/ {print $10}' /proc/net/dev; }   # bytes sent on loopback
now() { date +%s.%N; }

# One sshd for every target.
ssh-keygen -q -t ed25519 -N '' -f "$W/hostkey"
ssh-keygen -q -t ed25519 -N '' -f "$W/key"
cp "$W/key.pub" "$W/authorized_keys"
SSH_PORT=$(free_port)
cat > "$W/sshd_config" <<EOF
Port $SSH_PORT
ListenAddress 127.0.0.1
HostKey $W/hostkey
AuthorizedKeysFile $W/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
StrictModes no
UsePAM no
MaxStartups 500
MaxSessions 500
PidFile $W/sshd.pid
Subsystem sftp internal-sftp
EOF
/usr/sbin/sshd -D -f "$W/sshd_config" -E "$W/sshd.log" &
PIDS+=($!)
echo "[127.0.0.1]:$SSH_PORT $(cut -d' ' -f1,2 "$W/hostkey.pub")" > "$W/known_hosts"
USER_NAME=$(id -un)

# The release: F files of 1 KiB in a few directories, as one tar artifact.
python3 - "$W/release" "$F" <<'EOF'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    d = os.path.join(root, f"d{i % 20}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"f{i}.txt"), "wb") as f:
        f.write(os.urandom(1024))
EOF
tar cf "$W/app.tar" -C "$W/release" .
SUM=$(sha256sum "$W/app.tar" | cut -d' ' -f1)

# manent: SQLite, one `serve`, N targets on the one sshd.
API_PORT=$(free_port)
mkdir -p "$W/environments/acme/web" "$W/targets"
cat > "$W/manent.yml" <<EOF
database: {url: "sqlite://$W/manent.db"}
api: {listen: "127.0.0.1:$API_PORT"}
environments: {source: environments}
artifacts: {sources: ["file://$W/"]}
EOF
{
    echo "targets:"
    for i in $(seq 1 "$N"); do echo "  - {name: t$i, host: 127.0.0.1, port: $SSH_PORT}"; done
    echo "ssh: {user: $USER_NAME, key: $W/key, known_hosts: $W/known_hosts}"
    echo "deploy:"
    echo "  dest: $W/targets/{target}/releases/{version}"
    echo "  activate: \"cd $W/targets/{target}/releases/{version} && tar xf app.tar && ln -sfn $W/targets/{target}/releases/{version} $W/targets/{target}/current\""
    echo "rollout: {max_parallel: $PAR}"
} > "$W/environments/acme/web/prod.yml"
cat > "$W/deploy.yml" <<EOF
application: acme/web
environment: prod
artifacts:
  - {name: app.tar, type: tarball, version: "1", url: "file://$W/app.tar", sha256: "$SUM"}
EOF
server() { DBOS__VMID=bench MANENT_WORKDIR="$W/work" "$BIN/manent-server" -c "$W/manent.yml" "$@"; }
TOKEN=$(server admin token create --name bench --role admin)
server serve > "$W/serve.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$API_PORT/healthz" > /dev/null && break
    sleep 0.1
done
cli() { "$BIN/manent" --server "http://127.0.0.1:$API_PORT" --token "$TOKEN" "$@"; }
echo "deploying $F files to $N targets (untimed)…"
timeout 1800 "$BIN/manent" --server "http://127.0.0.1:$API_PORT" --token "$TOKEN" \
    deploy --wait -f "$W/deploy.yml" > "$W/deploy.out"

# The floor's connections, opened first (untimed).
ssh_opts=(-i "$W/key" -p "$SSH_PORT" -o "UserKnownHostsFile=$W/known_hosts" -o BatchMode=yes
    -o Ciphers=aes128-gcm@openssh.com)
for i in $(seq 1 "$N"); do
    ssh "${ssh_opts[@]}" -M -N -f -o ControlPersist=600 -S "$W/ctl-$i" "$USER_NAME@127.0.0.1"
done
floor() {
    seq 1 "$N" | xargs -P "$PAR" -I{} ssh "${ssh_opts[@]}" -S "$W/ctl-{}" "$USER_NAME@127.0.0.1" \
        "cd $W/targets/t{}/releases/1 && find . -type f -print0 | xargs -0r sha256sum --zero --" \
        > "$W/floor.out"
}

echo "load before: $(uptime)"
printf '%-6s %-4s %10s %14s\n' what run wall_s loopback_bytes
declare -a manent_s floor_s manent_b floor_b
for r in $(seq 1 "$RUNS"); do
    b0=$(lo_bytes); t0=$(now)
    timeout 600 "$BIN/manent" --server "http://127.0.0.1:$API_PORT" --token "$TOKEN" \
        --output json drift acme/web prod > "$W/drift.json" || {
        echo "the drift check did not find every target in sync:"; head -c 2000 "$W/drift.json"; exit 1; }
    t1=$(now); b1=$(lo_bytes)
    manent_s[r]=$(echo "$t1 - $t0" | bc); manent_b[r]=$((b1 - b0))
    printf '%-6s %-4s %10.2f %14d\n' manent "$r" "${manent_s[r]}" "${manent_b[r]}"
    b0=$(lo_bytes); t0=$(now)
    timeout 600 bash -c "$(declare -f floor); $(declare -p ssh_opts); N=$N PAR=$PAR W=$W USER_NAME=$USER_NAME; floor"
    t1=$(now); b1=$(lo_bytes)
    floor_s[r]=$(echo "$t1 - $t0" | bc); floor_b[r]=$((b1 - b0))
    printf '%-6s %-4s %10.2f %14d\n' floor "$r" "${floor_s[r]}" "${floor_b[r]}"
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
ms=$(median "${manent_s[@]}"); fs=$(median "${floor_s[@]}")
mb=$(median "${manent_b[@]}"); fb=$(median "${floor_b[@]}")
echo "targets $N, files per release $F, max_parallel $PAR, runs $RUNS (medians)"
echo "manent drift: ${ms} s, ${mb} bytes on loopback"
echo "floor:        ${fs} s, ${fb} bytes on loopback"
echo "ratio (manent / floor): wall $(echo "scale=2; $ms / $fs" | bc)x, bytes $(echo "scale=2; $mb / $fb" | bc)x (goal: wall within 1.5x)"
echo "load after: $(uptime)"
