#!/usr/bin/env bash
# Soak benchmark (issue 30, "a worker that runs for months"): SOAK_DEPLOYS deploys (default
# 20,000) through one `manent-server serve` on SQLite, submitted in batches of 500 over 20
# environments, with retention on. After the first 10% and at the end it samples the serve
# process's RSS, open files and threads, the database's size and the work directories left,
# and prints them with the ratio end / first (goal: RSS within 1.1x, open files and threads
# flat, no work directory left, the database flat once retention applies). The machine's
# load is printed beside them. Informational: exits 0 unless something could not run.
#
# usage: bench/soak.sh [--bin DIR]   (DIR holds manent-server and manent; default:
#        target/release, built with `cargo build --release --bin manent-server --bin manent`)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin="$repo/target/release"
if [ "${1:-}" = "--bin" ]; then bin=$2; fi
deploys=${SOAK_DEPLOYS:-20000}
batch=500
environments=20
[ -x "$bin/manent-server" ] && [ -x "$bin/manent" ] || {
    echo "no manent-server and manent in $bin: cargo build --release --bin manent-server --bin manent" >&2
    exit 2
}

dir=$(mktemp -d /tmp/manent-soak.XXXXXX)
trap 'kill "$server" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"' EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mkdir -p "$dir/releases" "$dir/environments/soak"
echo "soak" > "$dir/releases/soak.txt"
sha=$(sha256sum "$dir/releases/soak.txt" | cut -d' ' -f1)
for e in $(seq 1 "$environments"); do
    mkdir -p "$dir/environments/soak/app$e"
    cat > "$dir/environments/soak/app$e/dev.yml" <<YAML
targets: [{name: local-1, host: local}]
deploy: {plugin: command, commands: ["test -s \"\$MANENT_ARTIFACT_SOAK_TXT\""]}
YAML
done
# Retention as a busy installation would set it, sped up: what ended a minute ago goes.
cat > "$dir/manent.yml" <<YAML
database: {url: "sqlite://$dir/manent.db"}
environments: {source: "$dir/environments"}
artifacts: {sources: ["file://$dir/releases/"]}
api: {listen: "127.0.0.1:$port"}
dbos: {executor_id: soak, concurrency: 20}
worker: {workdir: "$dir/work"}
retention: {keep_last: 5, deploys: 1m, output: 1m, audit: 1m, every: 30s}
YAML
export MANENT_SERVER="http://127.0.0.1:$port"
"$bin/manent-server" -c "$dir/manent.yml" serve >"$dir/serve.log" 2>&1 &
server=$!
for _ in $(seq 1 200); do curl -sf "$MANENT_SERVER/healthz" >/dev/null && break; sleep 0.1; done
MANENT_TOKEN=$("$bin/manent-server" -c "$dir/manent.yml" admin token create --name soak --role admin)
export MANENT_TOKEN

body() { # a batch of $batch deploys, spread over the environments
    python3 - "$batch" "$environments" "$dir" "$sha" <<'PY'
import json, sys
n, envs, d, sha = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
deploys = []
for i in range(n):
    text = (f"application: soak/app{i % envs + 1}\nenvironment: dev\nartifacts:\n"
            f"  - {{name: soak.txt, type: file, version: \"{i}\", url: \"file://{d}/releases/soak.txt\", sha256: \"{sha}\"}}\n")
    deploys.append({"descriptor": text})
print(json.dumps({"deploys": deploys}))
PY
}
ended() { # deploys ended since the start (a counter: retention does not lower it)
    curl -sf "$MANENT_SERVER/metrics" | awk '/^manent_deploys_ended_total/ {s += $2} END {print s + 0}'
}
queued() {
    curl -sf "$MANENT_SERVER/metrics" | awk '/^manent_deploys\{status="(ENQUEUED|PENDING)"\}/ {s += $2} END {print s + 0}'
}
sample() { # label: rss_kb fds threads db_bytes workdirs load
    local rss fds threads db work load
    rss=$(awk '/^VmRSS/ {print $2}' "/proc/$server/status")
    threads=$(awk '/^Threads/ {print $2}' "/proc/$server/status")
    fds=$(ls "/proc/$server/fd" | wc -l)
    db=$(du -cb "$dir"/manent.db* | tail -1 | cut -f1)
    work=$(find "$dir/work" -mindepth 2 -maxdepth 2 -type d 2>/dev/null | wc -l)
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    echo "$1 $rss $fds $threads $db $work $load"
}
submit_until() { # submits batches until $1 deploys were submitted, then waits for them to end
    while [ "$submitted" -lt "$1" ]; do
        # Keep the queue short: the benchmark measures a long life, not a backlog.
        while [ "$(queued)" -gt 2000 ]; do sleep 1; done
        body | curl -sf -o /dev/null -X POST -H "Authorization: Bearer $MANENT_TOKEN" \
            -H 'Content-Type: application/json' --data-binary @- "$MANENT_SERVER/api/v1/deploys/batch"
        submitted=$((submitted + batch))
    done
    # The metrics count what ended up to 5 s ago.
    while [ "$(ended)" -lt "$1" ]; do sleep 1; done
}

submitted=0
start=$(date +%s)
submit_until $((deploys / 10))
first=$(sample "at-$((deploys / 10))")
submit_until "$deploys"
# Retention's next pass (every 30 s) runs over what ended a minute ago.
sleep 95
last=$(sample "at-$deploys")
elapsed=$(( $(date +%s) - start ))

echo "| sample | RSS (KiB) | open files | threads | database (bytes) | work dirs left | load (1/5/15 min) |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for s in "$first" "$last"; do
    set -- $s
    echo "| $1 | $2 | $3 | $4 | $5 | $6 | $7 $8 $9 |"
done
set -- $first; f_rss=$2 f_fds=$3 f_thr=$4 f_db=$5
set -- $last; l_rss=$2 l_fds=$3 l_thr=$4 l_db=$5 l_work=$6
python3 - "$f_rss" "$l_rss" "$f_fds" "$l_fds" "$f_thr" "$l_thr" "$f_db" "$l_db" "$l_work" "$deploys" "$elapsed" <<'PY'
import sys
f_rss, l_rss, f_fds, l_fds, f_thr, l_thr, f_db, l_db, l_work, n, secs = map(int, sys.argv[1:])
def verdict(ok): return "PASS" if ok else "FAIL"
print(f"\n{n} deploys in {secs} s ({n / max(secs, 1):.0f}/s)")
print(f"- RSS end / first: {l_rss / f_rss:.2f}x ({verdict(l_rss <= 1.1 * f_rss)} <= 1.1x)")
print(f"- open files: {f_fds} -> {l_fds} ({verdict(l_fds <= f_fds + 2)} flat)")
print(f"- threads: {f_thr} -> {l_thr} ({verdict(l_thr <= f_thr + 2)} flat)")
print(f"- database end / first: {l_db / f_db:.2f}x ({verdict(l_db <= 1.25 * f_db)} flat once retention applies)")
print(f"- work directories left: {l_work} ({verdict(l_work == 0)})")
PY
