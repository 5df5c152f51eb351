#!/usr/bin/env bash
# Queue benchmark runner: builds manent-engine-bench (bench/engine) and the two peers
# (bench/peers/dbos-peer, bench/peers/durare-peer) in release mode, runs manent and durare on
# Postgres and SQLite and dbos on Postgres, then prints a table of throughput and start latency,
# the manent-vs-peer ratios and the goals' PASS/FAIL (informational: the exit status is 0 unless
# something could not be built). See bench/README.md.
#
# usage: bench/run-engine.sh [--workflows N] [--latency-samples N] [--timeout-secs S]
#                            [--database-url URL] [--out DIR] [--no-build]
#        bench/run-engine.sh --report DIR    (prints the table of an earlier run again)
#
# Postgres must listen at the database URL (default postgres://postgres@127.0.0.1:5432/postgres)
# with the right to create and drop databases. Results go to DIR (default
# bench/target/results/<UTC timestamp>/): one .jsonl and one .log per program, load.txt and
# table.md.
set -euo pipefail

bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export CARGO_TARGET_DIR="$bench/target"

pass=()
out=""
build=1
report=""
while (($#)); do
    case "$1" in
        --workflows | --latency-samples | --timeout-secs | --database-url)
            (($# >= 2)) || { echo "$1 needs a value" >&2; exit 2; }
            pass+=("$1" "$2")
            shift 2
            ;;
        --out)
            (($# >= 2)) || { echo "--out needs a value" >&2; exit 2; }
            out=$2
            shift 2
            ;;
        --no-build) build=0; shift ;;
        --report)
            (($# >= 2)) || { echo "--report needs a value" >&2; exit 2; }
            report=$2
            shift 2
            ;;
        -h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
# durare's default setting on SQLite nearly stalls (bench/peers/README.md): bound every run.
case " ${pass[*]-} " in
    *" --timeout-secs "*) ;;
    *) pass+=(--timeout-secs 300) ;;
esac

if [[ -n $report ]]; then
    out=$report
    build=0
else
    out=${out:-$bench/target/results/$(date -u +%Y%m%dT%H%M%SZ)}
    mkdir -p "$out"
fi

projects=(engine peers/dbos-peer peers/durare-peer)
if ((build)); then
    for p in "${projects[@]}"; do
        echo "== building $p (release, nice -n 19, -j 1)" >&2
        (cd "$bench/$p" && nice -n 19 cargo build --release -j 1)
    done
fi

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

# name, binary, extra flags
run() {
    local name=$1 bin=$2
    shift 2
    echo "== running $name $* ${pass[*]} (load $(loadavg))" >&2
    echo "$name start load: $(loadavg)" >> "$out/load.txt"
    local started=$SECONDS rc=0
    "$CARGO_TARGET_DIR/release/$bin" "$@" "${pass[@]}" > "$out/$name.jsonl" 2> "$out/$name.log" || rc=$?
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
        echo "args: ${pass[*]}"
    } > "$out/load.txt"

    run manent manent-engine-bench --backend both --setting both
    run dbos dbos-peer --setting both
    run durare durare-peer --backend both --setting both

    cat "$out"/manent.jsonl "$out"/dbos.jsonl "$out"/durare.jsonl > "$out/results.jsonl"
fi

python3 - "$out" <<'PY' | tee "$out/table.md"
import json, sys, pathlib

out = pathlib.Path(sys.argv[1])
rows = []
for line in (out / "results.jsonl").read_text().splitlines():
    line = line.strip()
    if line.startswith("{"):
        rows.append(json.loads(line))
by = {(r["engine"], r["backend"], r["setting"]): r for r in rows}

def fmt(x, places=1):
    return "n/a" if x is None else f"{x:.{places}f}"

def times(x):
    return "n/a" if x is None else f"{x:.2f}x"

def flags(r):
    note = r.get("note", "")
    marks = []
    if "TIMED OUT" in note:
        marks.append("timed out")
    if "latency probe aborted" in note:
        marks.append("latency aborted")
    return ", ".join(marks)

print("\n".join(l.rstrip() for l in (out / "load.txt").read_text().splitlines()))
print()
print("| engine | backend | setting | workflows | seconds | wf/s | p50 ms | p99 ms | |")
print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |")
order = {"manent": 0, "dbos": 1, "durare": 2}
for key in sorted(by, key=lambda k: (order.get(k[0], 9), k[1], k[2])):
    r = by[key]
    print(f"| {r['engine']} | {r['backend']} | {r['setting']} | {r['workflows']} | "
          f"{fmt(r['seconds'], 3)} | {fmt(r['wf_per_s'])} | {fmt(r['latency_p50_ms'], 2)} | "
          f"{fmt(r['latency_p99_ms'], 2)} | {flags(r)} |")

# (label, manent key, peer key)
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

def verdict(ok):
    return "PASS" if ok else "FAIL"

print()
print("Goals (informational):")
# 1. >= 2x the throughput of both peers at their default settings.
details, ok = [], True
for (setting, peer, backend), v in ratios.items():
    if setting != "default":
        continue
    good = v is not None and v[0] is not None and v[0] >= 2.0
    ok &= good
    details.append(f"{peer}/{backend} {times(v[0] if v else None)}")
print(f"- {verdict(ok)}: >= 2x the throughput of both peers at default ({'; '.join(details)})")
# 2. No slower than either peer tuned: throughput and p50 start latency both at least the peer's.
details, ok = [], True
for (setting, peer, backend), v in ratios.items():
    if setting != "tuned":
        continue
    tp, lat = v if v else (None, None)
    good = tp is not None and tp >= 1.0 and lat is not None and lat >= 1.0
    ok &= good
    details.append(f"{peer}/{backend} throughput {times(tp)}, p50 {times(lat)}")
print(f"- {verdict(ok)}: no slower than either peer tuned, in throughput and p50 latency "
      f"({'; '.join(details)})")
# 3. p50 start latency < 10 ms, every manent run.
mine = [r for k, r in by.items() if k[0] == "manent"]
ok = bool(mine) and all(r["latency_p50_ms"] is not None and r["latency_p50_ms"] < 10 for r in mine)
details = [f"{r['backend']}/{r['setting']} {fmt(r['latency_p50_ms'], 2)} ms" for r in mine]
print(f"- {verdict(ok)}: manent p50 start latency < 10 ms ({'; '.join(details)})")
print()
print(f"Raw lines: {out / 'results.jsonl'}; logs: {out}/*.log")
PY
