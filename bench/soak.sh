#!/usr/bin/env bash
# Soak benchmark (issue 30, "a worker that runs for months"): SOAK_DEPLOYS deploys (default
# 20,000) through one `manent-server serve` on SQLite, and through one `manent-server api` and
# two `manent-server worker` processes on PostgreSQL, submitted in batches of 500 over 20
# environments, with retention on and sped up (what ended 10 s ago goes, a pass every 5 s).
# After the first tenth, at 55 % and at the end, once the deploys submitted so far have ended
# and retention has passed over them, it samples every manent process's RSS, open files and
# threads, the database's size (SQLite: its files and pages; PostgreSQL: each table's size and
# dead rows) and the work directories left, and prints them with the ratio end / first (goal: RSS within 1.1x, open files and threads flat, no work directory left, the
# database flat once retention applies). Both samples are taken in the same state (idle,
# history pruned to what `keep_last` keeps), so what grows between them is what 18,000 more
# deploys left behind. The machine's load is printed beside them. Informational: exits 0
# unless something could not run.
#
# usage: bench/soak.sh [--bin DIR] [--backend sqlite|postgres|both]
#        DIR holds manent-server and manent; default target/release, built with
#        `cargo build --release --bin manent-server --bin manent`. PostgreSQL: a fresh
#        database through SOAK_POSTGRES (default postgres://postgres@127.0.0.1:5432/postgres),
#        dropped at the end. MALLOC_ARENA_MAX and other allocator settings pass through.
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
        -h | --help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument $1 (--help)" >&2; exit 2 ;;
    esac
done
deploys=${SOAK_DEPLOYS:-20000}
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
        echo "proc $name $(awk '/^VmRSS/ {print $2}' "/proc/$pid/status") $(ls "/proc/$pid/fd" | wc -l) $(awk '/^Threads/ {print $2}' "/proc/$pid/status")"
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
    local start first middle last elapsed
    start=$(date +%s)
    submit_until $((deploys / 10))
    first=$(sample "$backend")
    # A middle sample tells growth that levels off (caches filling) from growth that does not.
    submit_until $((deploys * 11 / 20 / batch * batch))
    middle=$(sample "$backend")
    submit_until "$deploys"
    last=$(sample "$backend")
    elapsed=$(($(date +%s) - start))

    echo
    echo "### $backend: $deploys deploys in $elapsed s (samples after retention's passes; load 1/5/15 min in the last column)"
    echo
    python3 - "$deploys" <<PY
import sys
first = """$first""".splitlines()
middle = """$middle""".splitlines()
last = """$last""".splitlines()
n = int(sys.argv[1])
m = n * 11 // 20 // $batch * $batch
def verdict(ok): return "PASS" if ok else "FAIL"
print("| process | RSS at %d (KiB) | at %d | at %d | end / first | open files | threads |" % (n // 10, m, n))
print("| --- | ---: | ---: | ---: | ---: | --- | --- |")
goals = []
for a, c, b in zip(first, middle, last):
    a, c, b = a.split(), c.split(), b.split()
    if a[0] != "proc":
        continue
    name, (r0, f0, t0), (r1, f1, t1) = a[1], map(int, a[2:5]), map(int, b[2:5])
    rm = int(c[2])
    print(f"| {name} | {r0:,} | {rm:,} | {r1:,} | {r1 / r0:.2f}x | {f0} -> {f1} | {t0} -> {t1} |")
    goals.append(f"- {name}: RSS {r1 / r0:.2f}x ({verdict(r1 <= 1.1 * r0)} <= 1.1x), open files "
                 f"{verdict(f1 <= f0 + 2)} flat, threads {verdict(t1 <= t0 + 2)} flat")
site = lambda lines: next(l for l in lines if l.startswith("site ")).split()
s0, s1 = site(first), site(last)
db0, db1, work = int(s0[1]), int(s1[1]), int(s1[2])
print()
print(f"database {db0:,} -> {db1:,} bytes ({db1 / db0:.2f}x, {verdict(db1 <= 1.25 * db0)} flat once "
      f"retention applies); work directories left {work} ({verdict(work == 0)}); "
      f"load {' '.join(s0[3:6])} -> {' '.join(s1[3:6])}")
for kind in ("files", "rows"):
    for label, lines in ((n // 10, first), (m, middle), (n, last)):
        found = [l for l in lines if l.startswith(kind + " ")]
        if found:
            print(f"{kind} at {label}: {found[0][len(kind) + 1:]}")
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
