#!/usr/bin/env bash
# Queue benchmark runner (bench/README.md). Builds manent-engine-bench (bench/engine) and the two
# peers (bench/peers/dbos-peer, bench/peers/durare-peer) in release mode, then runs three parts:
#   peers   - the peers' workload (2,000 workflows of 3 trivial steps, 50 keys): manent and durare
#             on Postgres and SQLite, dbos on Postgres; throughput and start latency;
#   backlog - manent's throughput at backlogs of 1,000, 10,000 and 100,000 over 5,000 partitions,
#             Postgres and SQLite, each backlog kept constant through the timed window (or
#             drained, --backlog-method drain), with the claim's query plans (and
#             bench/explain-claim.sql at 1,000 and 100,000), in 3 rounds (--rounds): the goal
#             compares each backlog's median;
#   workers - 1, 2 and 4 manent worker processes on one Postgres, steps sleeping 50 ms.
# It prints tables with ratios and load averages and the goals' PASS/FAIL (informational: the
# exit status is 0 unless something could not be built).
#
# usage: bench/run-engine.sh [--quick] [--skip-slow] [--parts peers,backlog,workers]
#            [--workflows N] [--latency-samples N] [--timeout-secs S]      (peers part)
#            [--backlogs 1000,10000,100000] [--partitions 5000] [--window 10000]  (backlog part)
#            [--backlog-method constant|drain] [--rounds 3]                      (backlog part)
#            [--workers 1,2,4] [--workers-workflows 3000] [--step-sleep-ms 50]  (workers part)
#            [--database-url URL] [--out DIR] [--no-build]
#        bench/run-engine.sh --report DIR    (prints the tables of an earlier run again)
#
# --skip-slow leaves out the peers part (durare's default setting alone waits out its 300 s
# timeout on SQLite) and the 100,000 backlog. --quick is a smoke preset: peers 200 workflows and
# 10 latency samples (120 s timeout), backlogs 1,000 and 10,000 in one round, workers on 600
# workflows.
# Postgres must listen at the database URL (default postgres://postgres@127.0.0.1:5432/postgres)
# with the right to create and drop databases. Results go to DIR (default
# bench/target/results/<UTC timestamp>/): one .jsonl and one .log per program and part,
# explain-claim-<n>.txt, load.txt and table.md.
set -euo pipefail

bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export CARGO_TARGET_DIR="$bench/target"

pass=()
url=()
out=""
build=1
report=""
parts="peers,backlog,workers"
backlogs="1000,10000,100000"
partitions=5000
window=10000
backlog_method=constant
rounds=3
workers="1,2,4"
workers_workflows=3000
step_sleep_ms=50
quick=0
skip_slow=0
while (($#)); do
    case "$1" in
        --workflows | --latency-samples | --timeout-secs)
            (($# >= 2)) || { echo "$1 needs a value" >&2; exit 2; }
            pass+=("$1" "$2")
            shift 2
            ;;
        --database-url)
            (($# >= 2)) || { echo "$1 needs a value" >&2; exit 2; }
            url=("$1" "$2")
            shift 2
            ;;
        --parts | --backlogs | --partitions | --window | --backlog-method | --rounds | --workers | \
            --workers-workflows | --step-sleep-ms | --out | --report)
            (($# >= 2)) || { echo "$1 needs a value" >&2; exit 2; }
            v=$2
            case "$1" in
                --parts) parts=$v ;;
                --backlogs) backlogs=$v ;;
                --partitions) partitions=$v ;;
                --window) window=$v ;;
                --backlog-method) backlog_method=$v ;;
                --rounds) rounds=$v ;;
                --workers) workers=$v ;;
                --workers-workflows) workers_workflows=$v ;;
                --step-sleep-ms) step_sleep_ms=$v ;;
                --out) out=$v ;;
                --report) report=$v ;;
            esac
            shift 2
            ;;
        --quick) quick=1; shift ;;
        --skip-slow) skip_slow=1; shift ;;
        --no-build) build=0; shift ;;
        -h | --help) sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
if ((quick)); then
    # Flags given explicitly come later in pass and win.
    pass=(--workflows 200 --latency-samples 10 --timeout-secs 120 "${pass[@]}")
    [[ $backlogs == "1000,10000,100000" ]] && backlogs="1000,10000"
    [[ $rounds == 3 ]] && rounds=1
    [[ $workers_workflows == 3000 ]] && workers_workflows=600
fi
if ((skip_slow)); then
    parts=$(tr ',' '\n' <<<"$parts" | grep -vx peers | paste -sd, -)
    backlogs=$(tr ',' '\n' <<<"$backlogs" | awk '$1 < 100000' | paste -sd, -)
fi
# durare's default setting on SQLite nearly stalls (bench/peers/README.md): bound every run.
case " ${pass[*]-} " in
    *" --timeout-secs "*) ;;
    *) pass+=(--timeout-secs 300) ;;
esac
has_part() { [[ ",$parts," == *",$1,"* ]]; }

if [[ -n $report ]]; then
    out=$report
    build=0
else
    out=${out:-$bench/target/results/$(date -u +%Y%m%dT%H%M%SZ)}
    mkdir -p "$out"
fi

projects=(engine)
has_part peers && projects+=(peers/dbos-peer peers/durare-peer)
if ((build)); then
    for p in "${projects[@]}"; do
        echo "== building $p (release, nice -n 19, -j 1)" >&2
        (cd "$bench/$p" && nice -n 19 cargo build --release -j 1)
    done
fi

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

# name, binary, its flags
run() {
    local name=$1 bin=$2
    shift 2
    echo "== running $name $* (load $(loadavg))" >&2
    echo "$name start load: $(loadavg)" >> "$out/load.txt"
    local started=$SECONDS rc=0
    "$CARGO_TARGET_DIR/release/$bin" "$@" > "$out/$name.jsonl" 2> "$out/$name.log" || rc=$?
    echo "$name end load: $(loadavg) ($((SECONDS - started)) s, exit $rc)" >> "$out/load.txt"
    if ((rc != 0)); then
        echo "!! $name exited $rc; last lines of $out/$name.log:" >&2
        tail -n 5 "$out/$name.log" >&2
    fi
}

if [[ -z $report ]]; then
    engine_state=""
    git -C "$bench" diff --quiet HEAD -- ../crates/manent-engine 2>/dev/null ||
        engine_state=" (crates/manent-engine has uncommitted changes)"
    {
        echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
        echo "host: $(uname -srm), $(nproc) cores"
        echo "commit: $(git -C "$bench" rev-parse --short HEAD 2>/dev/null || echo unknown)$engine_state"
        echo "parts: $parts"
        has_part peers && echo "peers args: ${pass[*]}"
        has_part backlog && echo "backlog args: --backlogs $backlogs --partitions $partitions --window $window --backlog-method $backlog_method --rounds $rounds"
        has_part workers &&
            echo "workers args: --workers $workers --workflows $workers_workflows --step-sleep-ms $step_sleep_ms"
    } > "$out/load.txt"
    : > "$out/results.jsonl"
    if has_part backlog; then
        run manent-backlog manent-engine-bench --mode backlog --backend both --backlogs "$backlogs" \
            --partitions "$partitions" --window "$window" --backlog-method "$backlog_method" \
            --rounds "$rounds" --timeout-secs 600 "${url[@]}"
        # The claim's queries on a synthetic table of the same schema (bench/explain-claim.sql),
        # at the smallest and the largest backlog.
        if command -v psql > /dev/null; then
            pg=${url[1]:-postgres://postgres@127.0.0.1:5432/postgres}
            for n in $(tr ',' '\n' <<<"$backlogs" | sort -n | sed -n '1p;$p' | sort -un); do
                psql -X -q "$pg" -v n="$n" -f "$bench/explain-claim.sql" \
                    > "$out/explain-claim-$n.txt" 2>&1 || echo "!! explain-claim.sql n=$n failed" >&2
            done
        fi
    fi
    if has_part workers; then
        run manent-workers manent-engine-bench --mode workers --workers "$workers" \
            --workflows "$workers_workflows" --step-sleep-ms "$step_sleep_ms" \
            --partitions "$partitions" --timeout-secs 600 "${url[@]}"
    fi
    if has_part peers; then
        run manent manent-engine-bench --backend both --setting both "${pass[@]}" "${url[@]}"
        run dbos dbos-peer --setting both "${pass[@]}" "${url[@]}"
        run durare durare-peer --backend both --setting both "${pass[@]}" "${url[@]}"
        cat "$out"/manent.jsonl "$out"/dbos.jsonl "$out"/durare.jsonl > "$out/results.jsonl"
    fi
fi

python3 - "$out" <<'PY' | tee "$out/table.md"
import json, statistics, sys, pathlib

out = pathlib.Path(sys.argv[1])

def lines(name):
    f = out / name
    if not f.exists():
        return []
    return [json.loads(l) for l in f.read_text().splitlines() if l.strip().startswith("{")]

def fmt(x, places=1):
    return "n/a" if x is None else f"{x:.{places}f}"

def times(x):
    return "n/a" if x is None else f"{x:.2f}x"

def verdict(ok):
    return "PASS" if ok else "FAIL"

print("\n".join(l.rstrip() for l in (out / "load.txt").read_text().splitlines()))

# ---- backlog part
backlog = lines("manent-backlog.jsonl")
if backlog:
    print()
    method = backlog[0].get("method", "drain")
    if method == "constant":
        print("### Throughput at a constant backlog (manent, one executor, 5,000 partitions x 1; "
              "the queue topped up to about N through the timed window)")
    else:
        print("### Throughput against the backlog (manent, one executor, 5,000 partitions x 1; "
              "the backlog drained)")
    print()
    print("| backend | backlog | round | timed workflows | seconds | wf/s | vs smallest backlog, same round | "
          "queued at start / end (count) | queued during (counters) | load start | load end | |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |")
    # Lines written before --rounds existed are one round.
    key = lambda r: (r["backend"], r.get("round", 1))
    base = {}
    for r in backlog:
        if key(r) not in base or r["backlog"] < base[key(r)]["backlog"]:
            base[key(r)] = r
    for r in sorted(backlog, key=lambda r: (r["backend"] != "postgres", r["backlog"], r.get("round", 1))):
        ratio = r["wf_per_s"] / base[key(r)]["wf_per_s"] if base[key(r)]["wf_per_s"] else None
        counted = (f"{r['queued_start']} / {r['queued_end']}"
                   if "queued_start" in r and "queued_end" in r else "n/a")
        during = (f"{r['queued_min_counter']}..{r['queued_max_counter']}"
                  if "queued_min_counter" in r else "n/a")
        print(f"| {r['backend']} | {r['backlog']} | {r.get('round', 1)} | {r['workflows']} | "
              f"{fmt(r['seconds'], 3)} | {fmt(r['wf_per_s'])} | {times(ratio)} | {counted} | {during} | "
              f"{r['load_start']} | {r['load_end']} | {'timed out' if r.get('timed_out') else ''} |")
    print()
    print("Goals (informational; each backlog's median over the rounds, every round's ratio after it):")
    for b in sorted({r["backend"] for r in backlog}, key=lambda b: b != "postgres"):
        runs = [r for r in backlog if r["backend"] == b]
        sizes = sorted({r["backlog"] for r in runs})
        small, big = sizes[0], sizes[-1]
        if big == small:
            continue
        median = lambda n: statistics.median(r["wf_per_s"] for r in runs if r["backlog"] == n)
        ratio = median(big) / median(small) if median(small) else None
        per_round = []
        for rnd in sorted({r.get("round", 1) for r in runs}):
            pair = {r["backlog"]: r["wf_per_s"] for r in runs if r.get("round", 1) == rnd}
            if small in pair and big in pair and pair[small]:
                per_round.append(f"{times(pair[big] / pair[small])}")
        print(f"- {verdict(ratio is not None and ratio >= 0.8)}: {b} backlog {big} >= 0.8x the "
              f"throughput of backlog {small} (medians {fmt(median(big))} vs "
              f"{fmt(median(small))} wf/s = {times(ratio)}; rounds: {', '.join(per_round)})")

# ---- workers part
workers = lines("manent-workers.jsonl")
if workers:
    print()
    print("### Worker processes on one PostgreSQL (steps sleep; each worker_concurrency "
          f"{workers[0]['worker_concurrency']}, step sleep {workers[0]['step_sleep_ms']} ms)")
    print()
    print("| workers | workflows | seconds | wf/s | vs 1 worker | ceiling wf/s | db span s | per executor | load start | load end | |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- | --- |")
    one = next((r for r in workers if r["workers"] == 1), None)
    for r in sorted(workers, key=lambda r: r["workers"]):
        ratio = r["wf_per_s"] / one["wf_per_s"] if one and one["wf_per_s"] else None
        per = ", ".join(str(v) for v in r["per_executor"].values())
        print(f"| {r['workers']} | {r['workflows']} | {fmt(r['seconds'], 3)} | {fmt(r['wf_per_s'])} | "
              f"{times(ratio)} | {fmt(r['ideal_wf_per_s'])} | {fmt(r['db_span_seconds'], 3)} | {per} | "
              f"{r['load_start']} | {r['load_end']} | {'timed out' if r.get('timed_out') else ''} |")
    print()
    print("Goals (informational):")
    for k, need in ((2, 1.8), (4, 3.2)):
        r = next((r for r in workers if r["workers"] == k), None)
        if not one or not r:
            continue
        ratio = r["wf_per_s"] / one["wf_per_s"] if one["wf_per_s"] else None
        print(f"- {verdict(ratio is not None and ratio >= need)}: {k} workers >= {need}x the "
              f"throughput of 1 ({fmt(r['wf_per_s'])} vs {fmt(one['wf_per_s'])} wf/s = {times(ratio)})")

# ---- peers part
rows = lines("results.jsonl")
by = {(r["engine"], r["backend"], r["setting"]): r for r in rows}

def flags(r):
    note = r.get("note", "")
    marks = []
    if "TIMED OUT" in note:
        marks.append("timed out")
    if "latency probe aborted" in note:
        marks.append("latency aborted")
    return ", ".join(marks)

if rows:
    print()
    print("### The peers' workload (2,000 workflows of 3 trivial steps, 50 keys x 1)")
    print()
    print("| engine | backend | setting | workflows | seconds | wf/s | p50 ms | p99 ms | |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    order = {"manent": 0, "dbos": 1, "durare": 2}
    for key in sorted(by, key=lambda k: (order.get(k[0], 9), k[1], k[2])):
        r = by[key]
        print(f"| {r['engine']} | {r['backend']} | {r['setting']} | {r['workflows']} | "
              f"{fmt(r['seconds'], 3)} | {fmt(r['wf_per_s'])} | {fmt(r['latency_p50_ms'], 2)} | "
              f"{fmt(r['latency_p99_ms'], 2)} | {flags(r)} |")

    comparisons = []
    for setting in ("default", "tuned"):
        for peer, backends in (("dbos", ("postgres",)), ("durare", ("postgres", "sqlite"))):
            for backend in backends:
                comparisons.append((setting, peer, backend))

    print()
    print("Ratios: throughput = manent wf/s / peer wf/s; latency = peer p50 / manent p50 "
          "(above 1 = manent better).")
    print()
    print("| comparison | backend | throughput ratio | p50 latency ratio | |")
    print("| --- | --- | ---: | ---: | --- |")
    ratios = {}
    for setting, peer, backend in comparisons:
        m = by.get(("manent", backend, setting))
        p = by.get((peer, backend, setting))
        label = f"manent vs {peer} {setting}"
        if not m or not p:
            print(f"| {label} | {backend} | missing | missing | "
                  f"{'manent' if not m else peer} has no result |")
            ratios[(setting, peer, backend)] = None
            continue
        tp = m["wf_per_s"] / p["wf_per_s"] if m["wf_per_s"] and p["wf_per_s"] else None
        lat = (p["latency_p50_ms"] / m["latency_p50_ms"]
               if m["latency_p50_ms"] and p["latency_p50_ms"] is not None else None)
        ratios[(setting, peer, backend)] = (tp, lat)
        mark = ", ".join(f"{who}: {f}" for who, f in (("manent", flags(m)), (peer, flags(p))) if f)
        print(f"| {label} | {backend} | {times(tp)} | {times(lat)} | {mark} |")

    print()
    print("Goals (informational; every manent run counts, default and tuned alike):")
    mine = {k: r for k, r in by.items() if k[0] == "manent"}
    # 1. Throughput floors.
    for backend, floor in (("postgres", 1000), ("sqlite", 600)):
        runs = [r for k, r in mine.items() if k[1] == backend]
        ok = bool(runs) and all(r["wf_per_s"] is not None and r["wf_per_s"] >= floor for r in runs)
        details = "; ".join(f"{r['setting']} {fmt(r['wf_per_s'])}" for r in runs)
        print(f"- {verdict(ok)}: manent {backend} >= {floor} wf/s ({details})")
    # 2. >= 2x the throughput of both peers at their default settings.
    details, ok = [], True
    for (setting, peer, backend), v in ratios.items():
        if setting != "default":
            continue
        good = v is not None and v[0] is not None and v[0] >= 2.0
        ok &= good
        details.append(f"{peer}/{backend} {times(v[0] if v else None)}")
    print(f"- {verdict(ok)}: >= 2x the throughput of both peers at default ({'; '.join(details)})")
    # 3. p50 start latency ceilings.
    for backend, ceiling in (("postgres", 5.0), ("sqlite", 2.0)):
        runs = [r for k, r in mine.items() if k[1] == backend]
        ok = bool(runs) and all(r["latency_p50_ms"] is not None and r["latency_p50_ms"] <= ceiling
                                for r in runs)
        details = "; ".join(f"{r['setting']} {fmt(r['latency_p50_ms'], 2)} ms" for r in runs)
        print(f"- {verdict(ok)}: manent {backend} p50 start latency <= {ceiling:g} ms ({details})")

# ---- claim plans
if backlog:
    print()
    print("### The claim's query plans during the backlog runs (first round)")
    first = [r for r in backlog if r.get("round", 1) == 1]
    for r in sorted(first, key=lambda r: (r["backend"] != "postgres", r["backlog"])):
        print()
        print(f"{r['backend']}, backlog {r['backlog']}, explained when "
              f"{r.get('claim_plan_at_finished')} workflows had finished:")
        print()
        print("```")
        print(r.get("claim_plan", "none"))
        print("```")
    for f in sorted(out.glob("explain-claim-*.txt"), key=lambda f: int(f.stem.split("-")[-1])):
        print()
        print(f"bench/explain-claim.sql, n = {f.stem.split('-')[-1]} (synthetic table, 40 running):")
        print()
        print("```")
        print(f.read_text().rstrip())
        print("```")

print()
print(f"Raw lines: {out}/*.jsonl; logs: {out}/*.log")
PY
