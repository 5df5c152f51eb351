#!/usr/bin/env bash
# Soak benchmark (issue 30, "a worker that runs for months"): SOAK_DEPLOYS deploys (default
# 20,000) through one `manent-server serve` on SQLite, and through one `manent-server api` and
# two `manent-server worker` processes on PostgreSQL, submitted in batches of 500 over 20
# environments, with retention on and sped up (what ended 10 s ago goes, a pass every 5 s).
# After the first tenth, then SOAK_SAMPLES more times at even steps to the end (default 2: at
# 55 % and at the end), once the deploys submitted so far have ended and retention has passed
# over them, it samples every manent process's RSS, open files, sockets (counted apart: a pool
# opens connections up to its bound under load) and threads, the database's size (SQLite: its
# files and pages; PostgreSQL: each table's size and dead rows) and the work directories left,
# and prints them with the ratio end / first and the highest after the first (goal: RSS within
# 1.1x, open files and threads flat, no work directory left, the database flat once retention
# applies). Every sample is taken in the same state (idle, history pruned to what `keep_last`
# keeps), so what grows between them is what the deploys between left behind. The machine's
# load is printed beside them. Informational: exits 0 unless something could not run.
#
# usage: bench/soak.sh [--bin DIR] [--backend sqlite|postgres|both]
#        DIR holds manent-server and manent; default target/release, built with
#        `cargo build --release --bin manent-server --bin manent`. PostgreSQL: a fresh
#        database through SOAK_POSTGRES (default postgres://postgres@127.0.0.1:5432/postgres),
#        dropped at the end. MALLOC_ARENA_MAX and other allocator settings pass through.
#        SOAK_DEPLOYS=60000 SOAK_SAMPLES=6 samples every 9,000 after the first 6,000.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin="$repo/target/release"
backends="sqlite postgres"
while (($#)); do
    case "$1" in
        --bin) bin=$2; shift 2 ;;
        --backend)
            case "$2" in
                both) backends="sqlite postgres" ;;
                sqlite | postgres) backends=$2 ;;
                *) echo "--backend is sqlite, postgres or both" >&2; exit 2 ;;
            esac
            shift 2
            ;;
        -h | --help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument $1 (--help)" >&2; exit 2 ;;
    esac
done
deploys=${SOAK_DEPLOYS:-20000}
extra_samples=${SOAK_SAMPLES:-2}
admin_url=${SOAK_POSTGRES:-postgres://postgres@127.0.0.1:5432/postgres}
batch=500
environments=20
[ -x "$bin/manent-server" ] && [ -x "$bin/manent" ] || {
    echo "no manent-server and manent in $bin: cargo build --release --bin manent-server --bin manent" >&2
    exit 2
}

dir=""
pids=()
database=""
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if [ -n "$database" ]; then psql -q "$admin_url" -c "DROP DATABASE IF EXISTS $database" >/dev/null 2>&1 || true; fi
    if [ -n "$dir" ]; then rm -rf "$dir"; fi
}
trap cleanup EXIT

metrics() { curl -sf "$MANENT_SERVER/metrics"; }
queued() {
    metrics | awk '/^manent_deploys\{status="(ENQUEUED|PENDING)"\}/ {s += $2} END {print s + 0}'
}
db_bytes() {
    if [ "$1" = sqlite ]; then
        du -cb "$dir"/manent.db* | tail -1 | cut -f1
    else
        psql -qtA "$admin_url" -c "SELECT pg_database_size('$database')"
    fi
}
# What each table holds, "table=rows" (so a growing database says which table grows).
rows() {
    local tables query
    if [ "$1" = sqlite ]; then
        tables=$(sqlite3 "$dir/manent.db" "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'manent%' ORDER BY name")
        query=$(for t in $tables; do printf "SELECT '%s=' || count(*) FROM %s;" "$t" "$t"; done)
        sqlite3 "$dir/manent.db" "$query" | tr '\n' ' '
    else
        tables=$(psql -qtA "${admin_url%/*}/$database" -c "SELECT tablename FROM pg_tables WHERE tablename LIKE 'manent%' ORDER BY 1")
        # PostgreSQL: rows, then the table's size with its indexes and TOAST, and dead rows.
        query=$(for t in $tables; do printf "SELECT '%s=' || count(*) || '/' || pg_size_pretty(pg_total_relation_size('%s')) || '/dead ' || coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = '%s'), 0) FROM %s;" "$t" "$t" "$t" "$t"; done)
        psql -qtA "${admin_url%/*}/$database" -c "$query" | tr '\n' ' '
    fi
}
# One line per process: label rss_kib fds threads, then one line: db bytes, work dirs, load,
# then the files' sizes (SQLite) and each table's rows.
sample() {
    local name pid
    for entry in "${procs[@]}"; do
        name=${entry%%=*} pid=${entry#*=}
        # Open files apart from sockets, then sockets: a connection pool opens connections
        # under load up to its bound, files should not grow at all.
        echo "proc $name $(awk '/^VmRSS/ {print $2}' "/proc/$pid/status") $(find "/proc/$pid/fd" -mindepth 1 -maxdepth 1 ! -lname 'socket:*' | wc -l) $(awk '/^Threads/ {print $2}' "/proc/$pid/status") $(find "/proc/$pid/fd" -mindepth 1 -maxdepth 1 -lname 'socket:*' | wc -l)"
    done
    echo "site $(db_bytes "$1") $(find "$dir"/work* -mindepth 2 -maxdepth 2 -type d 2>/dev/null | wc -l) $(cut -d' ' -f1-3 /proc/loadavg)"
    if [ "$1" = sqlite ]; then
        echo "files $(cd "$dir" && du -b manent.db* | awk '{printf "%s=%s ", $2, $1}')pages=$(sqlite3 "$dir/manent.db" 'PRAGMA page_count') free=$(sqlite3 "$dir/manent.db" 'PRAGMA freelist_count')"
    fi
    echo "rows $(rows "$1")"
}
body() { # a batch of $batch deploys, spread over the environments
    python3 - "$batch" "$environments" "$dir" "$sha" "$submitted" <<'PY'
import json, sys
n, envs, d, sha, base = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
deploys = []
for i in range(base, base + n):
    text = (f"application: soak/app{i % envs + 1}\nenvironment: dev\nartifacts:\n"
            f"  - {{name: soak.txt, type: file, version: \"{i}\", url: \"file://{d}/releases/soak.txt\", sha256: \"{sha}\"}}\n")
    deploys.append({"descriptor": text})
print(json.dumps({"deploys": deploys}))
PY
}
submit_until() { # submits batches until $1 deploys were submitted, then waits for them to end
    while [ "$submitted" -lt "$1" ]; do
        # Keep the queue short: the benchmark measures a long life, not a backlog.
        while [ "$(queued)" -gt 2000 ]; do sleep 1; done
        body | curl -sf -o /dev/null -X POST -H "Authorization: Bearer $MANENT_TOKEN" \
            -H 'Content-Type: application/json' --data-binary @- "$MANENT_SERVER/api/v1/deploys/batch"
        submitted=$((submitted + batch))
    done
    # Every deploy submitted (whole batches: past $1 at times) has ended: none queued or
    # running. (Not the ended counter: a deploy retention removed before any scrape read
    # it is not counted, and retention here removes what ended 10 s ago.)
    while [ "$(queued)" -gt 0 ]; do sleep 1; done
    # Retention removes what ended more than 10 s ago, every 5 s: two passes after the last.
    sleep 21
}
wait_for_http() {
    for _ in $(seq 1 300); do curl -sf "$1" >/dev/null && return 0; sleep 0.1; done
    echo "nothing answers $1" >&2
    return 1
}

soak() { # backend
    local backend=$1 url port
    dir=$(mktemp -d /tmp/manent-soak.XXXXXX)
    pids=()
    procs=()
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
    if [ "$backend" = sqlite ]; then
        url="sqlite://$dir/manent.db"
    else
        database="manent_soak_$$"
        psql -q "$admin_url" -c "CREATE DATABASE $database" >/dev/null
        url="${admin_url%/*}/$database"
    fi
    # Retention as a busy installation would set it, sped up: what ended 10 s ago goes.
    cat > "$dir/manent.yml" <<YAML
database: {url: "$url"}
environments: {source: "$dir/environments"}
artifacts: {sources: ["file://$dir/releases/"]}
api: {listen: "127.0.0.1:$port"}
dbos: {executor_id: soak, concurrency: 20}
worker: {workdir: "$dir/work"}
retention: {keep_last: 5, deploys: 10s, output: 10s, audit: 10s, every: 5s}
YAML
    export MANENT_SERVER="http://127.0.0.1:$port"
    if [ "$backend" = sqlite ]; then
        "$bin/manent-server" -c "$dir/manent.yml" serve >"$dir/serve.log" 2>&1 &
        pids+=($!) procs+=("serve=$!")
    else
        "$bin/manent-server" -c "$dir/manent.yml" admin migrate >/dev/null
        "$bin/manent-server" -c "$dir/manent.yml" api >"$dir/api.log" 2>&1 &
        pids+=($!) procs+=("api=$!")
        for w in 1 2; do
            DBOS__VMID="soak-w$w" MANENT_WORKDIR="$dir/work$w" \
                "$bin/manent-server" -c "$dir/manent.yml" worker >"$dir/worker$w.log" 2>&1 &
            pids+=($!) procs+=("worker-$w=$!")
        done
    fi
    wait_for_http "$MANENT_SERVER/healthz"
    MANENT_TOKEN=$("$bin/manent-server" -c "$dir/manent.yml" admin token create --name soak --role admin)
    export MANENT_TOKEN

    submitted=0
    local start elapsed at samples=() points=()
    start=$(date +%s)
    # The first sample after a tenth, then SOAK_SAMPLES more at even steps to the end (whole
    # batches): the ones between tell growth that levels off (caches filling) from growth
    # that does not.
    points=($((deploys / 10)))
    for k in $(seq 1 "$extra_samples"); do
        at=$((deploys / 10 + (deploys - deploys / 10) * k / extra_samples))
        [ "$k" -eq "$extra_samples" ] || at=$((at / batch * batch))
        points+=("$at")
    done
    for at in "${points[@]}"; do
        submit_until "$at"
        samples+=("$(printf 'at %s\n%s' "$at" "$(sample "$backend")")")
    done
    elapsed=$(($(date +%s) - start))

    echo
    echo "### $backend: $deploys deploys in $elapsed s (samples after retention's passes; load 1/5/15 min in the last column)"
    echo
    python3 - "$(printf '%s\n@@\n' "${samples[@]}")" <<'PY'
import sys
blocks = [b.strip().splitlines() for b in sys.argv[1].split("@@") if b.strip()]
at = [int(b[0].split()[1]) for b in blocks]
def verdict(ok): return "PASS" if ok else "FAIL"
def procs(b): return [l.split() for l in b if l.startswith("proc ")]
print("| process | " + " | ".join(f"RSS at {n:,} (KiB)" if i == 0 else f"at {n:,}" for i, n in enumerate(at))
      + " | end / first | open files | sockets | threads |")
print("| --- |" + " ---: |" * (len(at) + 1) + " --- | --- | --- |")
goals = []
for rows in zip(*map(procs, blocks)):
    name = rows[0][1]
    rss = [int(r[2]) for r in rows]
    (f0, t0, s0), (f1, t1, s1) = map(int, rows[0][3:6]), map(int, rows[-1][3:6])
    print(f"| {name} | " + " | ".join(f"{r:,}" for r in rss)
          + f" | {rss[-1] / rss[0]:.2f}x | {f0} -> {f1} | {s0} -> {s1} | {t0} -> {t1} |")
    goals.append(f"- {name}: RSS {rss[-1] / rss[0]:.2f}x ({verdict(rss[-1] <= 1.1 * rss[0])} <= 1.1x), "
                 f"highest after the first {max(rss[1:]) / rss[0]:.2f}x, open files "
                 f"{verdict(f1 <= f0 + 2)} flat, threads {verdict(t1 <= t0 + 2)} flat")
site = lambda b: next(l for l in b if l.startswith("site ")).split()
s0, s1 = site(blocks[0]), site(blocks[-1])
sizes = [int(site(b)[1]) for b in blocks]
db0, db1, work = sizes[0], sizes[-1], int(s1[2])
print()
print(f"database {' -> '.join(f'{x:,}' for x in sizes)} bytes ({db1 / db0:.2f}x, highest {max(sizes) / db0:.2f}x, "
      f"{verdict(db1 <= 1.25 * db0)} flat once retention applies); work directories left {work} "
      f"({verdict(work == 0)}); load {' '.join(s0[3:6])} -> {' '.join(s1[3:6])}")
for kind in ("files", "rows"):
    for n, b in zip(at, blocks):
        found = [l for l in b if l.startswith(kind + " ")]
        if found:
            print(f"{kind} at {n}: {found[0][len(kind) + 1:]}")
print()
print("\n".join(goals))
PY
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    pids=()
    if [ -n "$database" ]; then
        psql -q "$admin_url" -c "DROP DATABASE IF EXISTS $database" >/dev/null
        database=""
    fi
    rm -rf "$dir"
    dir=""
}

echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); commit $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown); $(nproc) cores; binaries $bin"
for backend in $backends; do
    soak "$backend"
done
