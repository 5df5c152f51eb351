#!/usr/bin/env bash
# "Time to safe" (issue 42, item 7; bench/README.md, "Time to safe"): how long a canary that
# goes bad keeps running its bad version. 20 `host: local` targets in waves of 1, 4 and 15,
# `rollout.analysis` judging the canary against the baseline (the 19 others) on a real
# Prometheus (scripts/prometheus, 1 s scrape) every --interval; each target serves
# `app_error_ratio` from a small HTTP server, 0.5 once the target has run the version `bad`
# for --fail-after seconds, 0.01 otherwise. Per run: deploy `good` everywhere (untimed), then
# `bad`; measured from the first scrape that returned the bad value (the metrics server
# notes it) to the moment every switched target was back on `good` (the rollback's activate
# writes the time), against the floor interval x (failure_limit + 1) + scrape interval + one
# activate (the activate command timed alone). Prints each run, the median, the ratio to the
# floor and `uptime`. Bounded: each deploy waits at most --run-timeout seconds (120). Not run
# by CI.
#
# usage: bench/run-analysis.sh [--runs N] [--interval S] [--fail-after S] [--failure-limit N]
#          [--bin-dir DIR] [--run-timeout S]
#   --runs 5, --interval 1 (seconds), --fail-after 3 (seconds into the canary's bake),
#   --failure-limit 0 (the metric's failure_limit),
#   --bin-dir: where manent-server and manent are (default: $CARGO_TARGET_DIR/release if
#   both are there, else $CARGO_TARGET_DIR/debug; CARGO_TARGET_DIR defaults to target).
# Needs python3 and Prometheus (scripts/prometheus installs and starts it, shared: left
# running). Results: bench/target/results/analysis-<UTC timestamp>/ (table.md, run.log).
set -euo pipefail

bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/.." && pwd)
runs=5
interval=1
fail_after=3
failure_limit=0
bin_dir=""
run_timeout=120
while (($#)); do
    case "$1" in
        --runs) runs=$2; shift 2 ;;
        --interval) interval=$2; shift 2 ;;
        --fail-after) fail_after=$2; shift 2 ;;
        --failure-limit) failure_limit=$2; shift 2 ;;
        --bin-dir) bin_dir=$2; shift 2 ;;
        --run-timeout) run_timeout=$2; shift 2 ;;
        -h | --help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
target_dir=${CARGO_TARGET_DIR:-$root/target}
if [[ -z $bin_dir ]]; then
    bin_dir=$target_dir/debug
    [[ -x $target_dir/release/manent-server && -x $target_dir/release/manent ]] && bin_dir=$target_dir/release
fi
server=$bin_dir/manent-server
cli=$bin_dir/manent
[[ -x $server && -x $cli ]] || { echo "no manent-server and manent in $bin_dir: cargo build -p manent-server -p manent-cli" >&2; exit 2; }

eval "export $("$root/scripts/prometheus" | tr '\n' ' ')"
out=$bench/target/results/analysis-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out"
site=$(mktemp -d /tmp/manent-bench-analysis.XXXXXX)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    rm -f "$MANENT_TEST_PROMETHEUS_SD/bench-$$.json"
    rm -rf "$site"
}
trap cleanup EXIT
now_ms() { date +%s%3N; }
targets=()
for i in $(seq 1 20); do targets+=("$(printf 't%02d' "$i")"); done

# The targets' metrics: 0.5 once a target has run `bad` for fail_after seconds; the first
# such answer's time is written to first-bad (the first bad scrape).
cat > "$site/metrics.py" <<'PY'
import http.server, os, sys, time
site, fail_after = sys.argv[1], float(sys.argv[2])
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        target = self.path.rsplit('/', 1)[-1]
        try:
            version, since = open(os.path.join(site, 'deployed-' + target)).read().split()
        except (OSError, ValueError):
            version, since = '', '0'
        bad = version == 'bad' and time.time() * 1000 - int(since) >= fail_after * 1000
        if bad and not os.path.exists(os.path.join(site, 'first-bad')):
            with open(os.path.join(site, 'first-bad'), 'w') as f:
                f.write(str(int(time.time() * 1000)))
        body = ('# TYPE app_error_ratio gauge\napp_error_ratio %s\n' % (0.5 if bad else 0.01)).encode()
        self.send_response(200)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
PY
python3 "$site/metrics.py" "$site" "$fail_after" > "$site/metrics.port" &
pids+=($!)
for _ in $(seq 1 50); do [[ -s $site/metrics.port ]] && break; sleep 0.1; done
metrics_port=$(cat "$site/metrics.port")
run_label="bench$$"
{
    printf '['
    sep=""
    for t in "${targets[@]}"; do
        printf '%s{"targets":["127.0.0.1:%s"],"labels":{"__metrics_path__":"/metrics/%s","instance":"%s","run":"%s"}}' \
            "$sep" "$metrics_port" "$t" "$t" "$run_label"
        sep=","
    done
    printf ']'
} > "$MANENT_TEST_PROMETHEUS_SD/bench-$$.part"
mv "$MANENT_TEST_PROMETHEUS_SD/bench-$$.part" "$MANENT_TEST_PROMETHEUS_SD/bench-$$.json"

# The site: one `serve` process on SQLite, acme/web's prod of 20 local targets.
api_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir -p "$site/environments/acme/web"
echo payload > "$site/artifact.txt"
cat > "$site/manent.yml" <<YAML
database: {url: "sqlite://$site/manent.db"}
api: {listen: "127.0.0.1:$api_port"}
environments: {source: environments}
artifacts: {sources: ["file://$site/"]}
YAML
# What a deploy and a rollback run on a target: its version and the time, in its state file
# and the ledger.
cat > "$site/activate.sh" <<SH
now=\$(date +%s%3N)
printf '%s %s\\n' "\$MANENT_VERSION" "\$now" > $site/deployed-\$MANENT_TARGET
echo "\$now \$MANENT_TARGET \$MANENT_VERSION" >> $site/ledger
SH
activate="sh $site/activate.sh"
environment() { # $1: the analysis block (or nothing)
    {
        echo "targets:"
        for t in "${targets[@]}"; do echo "  - {name: $t, host: local}"; done
        echo "deploy:"
        echo "  plugin: command"
        echo "  commands: [\"$activate\"]"
        echo "  activate: \"$activate\""
        echo "rollout:"
        echo "  max_parallel: 20"
        echo "  waves: [[t01], [t02, t03, t04, t05], [$(IFS=,; echo "${targets[*]:5}" | sed 's/,/, /g')]]"
        printf '%s' "$1"
    } > "$site/environments/acme/web/prod.yml"
}
analysis="  analysis:
    bake: 60s
    interval: ${interval}s
    metrics:
      - name: errors
        success: \"result <= baseline * 1.2 + 0.01\"
        failure_limit: $failure_limit
        prometheus:
          address: \"$MANENT_TEST_PROMETHEUS\"
          query: 'max(app_error_ratio{run=\"$run_label\",instance=~\"{targets}\"})'
"
sha=$(sha256sum "$site/artifact.txt" | cut -d' ' -f1)
descriptor() { # $1: version
    printf 'application: acme/web\nenvironment: prod\nartifacts:\n  - {name: artifact.txt, type: file, version: "%s", url: "file://%s/artifact.txt", sha256: "%s"}\n' \
        "$1" "$site" "$sha" > "$site/deploy-$1.yml"
    echo "$site/deploy-$1.yml"
}
export DBOS__VMID=bench MANENT_WORKDIR=$site/work RUST_LOG=warn
"$server" -c "$site/manent.yml" serve 2> "$out/server.log" &
pids+=($!)
token=$("$server" -c "$site/manent.yml" admin token create --name bench --role admin)
mnt() { "$cli" --server "http://127.0.0.1:$api_port" --token "$token" "$@"; }
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$api_port/readyz" >/dev/null && break; sleep 0.1; done
# Prometheus scrapes every target before the first run.
for _ in $(seq 1 100); do
    n=$(curl -sf "$MANENT_TEST_PROMETHEUS/api/v1/query" --data-urlencode "query=count(app_error_ratio{run=\"$run_label\"})" \
        | python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else 0)')
    [[ $n == 20 ]] && break
    sleep 0.2
done
wait_for() { # $1: deploy id, $2: status; prints nothing, fails after run_timeout
    local deadline=$(($(date +%s) + run_timeout))
    while (($(date +%s) < deadline)); do
        mnt --output json status "$1" | python3 -c "import json,sys; sys.exit(0 if json.load(sys.stdin)['status']=='$2' else 1)" && return 0
        sleep 0.2
    done
    echo "deploy $1 did not reach $2 within ${run_timeout}s" >&2
    return 1
}
# One activate alone, as the rollback runs it (the floor's last term).
start=$(now_ms)
MANENT_VERSION=good MANENT_TARGET=probe sh "$site/activate.sh"
activate_ms=$(($(now_ms) - start))
rm -f "$site/deployed-probe"

{
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git -C "$root" rev-parse --short HEAD), binaries $bin_dir"
    echo "load: $(uptime)"
    echo "20 targets (host: local), waves 1/4/15, interval ${interval}s, failure_limit $failure_limit, scrape 1s, the canary bad ${fail_after}s into its bake"
    echo "floor = interval x (failure_limit + 1) + scrape + one activate = ${interval} s x $((failure_limit + 1)) + 1 s + ${activate_ms} ms"
    echo "from the first bad scrape (the brief's measure) and from the failure's onset (the bad value served at the next scrape, up to 1 s later)"
    echo
    echo "| run | first bad scrape -> safe (ms) | ratio | onset -> safe (ms) | ratio | floor (ms) | load (1 min) |"
    echo "|---|---|---|---|---|---|---|"
} | tee "$out/table.md"
floor_ms=$((interval * 1000 * (failure_limit + 1) + 1000 + activate_ms))
times=()
onsets=()
ratio() { python3 -c "print(f'{$1 / $2:.2f}')"; }
median() { printf '%s\n' "$@" | sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : int((a[NR / 2] + a[NR / 2 + 1]) / 2) }'; }
for run in $(seq 1 "$runs"); do
    environment ""
    id=$(mnt --output json deploy -f "$(descriptor good)" | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
    wait_for "$id" SUCCESS
    rm -f "$site/first-bad"
    : > "$site/ledger"
    # The good values are scraped before the bad deploy starts.
    sleep 2
    environment "$analysis"
    id=$(mnt --output json deploy -f "$(descriptor bad)" | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
    wait_for "$id" ERROR
    first_bad=$(cat "$site/first-bad")
    # Every target runs `good`; the last `good` written after the first bad scrape is the
    # moment the fleet was safe again.
    for t in "${targets[@]}"; do
        [[ $(cut -d' ' -f1 "$site/deployed-$t") == good ]] || { echo "run $run: $t is not back on good" >&2; exit 1; }
    done
    safe=$(awk -v t0="$first_bad" '$3 == "good" && $1 >= t0 { if ($1 > m) m = $1 } END { print m + 0 }' "$site/ledger")
    ms=$((safe - first_bad))
    # The canary's bad version was activated at its ledger line; it fails fail_after later.
    onset=$(awk -v f="$fail_after" '$2 == "t01" && $3 == "bad" { print $1 + f * 1000; exit }' "$site/ledger")
    from_onset=$((safe - onset))
    times+=("$ms")
    onsets+=("$from_onset")
    echo "| $run | $ms | $(ratio "$ms" "$floor_ms") | $from_onset | $(ratio "$from_onset" "$floor_ms") | $floor_ms | $(cut -d' ' -f1 /proc/loadavg) |" | tee -a "$out/table.md"
done
m=$(median "${times[@]}")
o=$(median "${onsets[@]}")
{
    echo
    echo "median from the first bad scrape: $m ms, ratio $(ratio "$m" "$floor_ms"); from the onset: $o ms, ratio $(ratio "$o" "$floor_ms"); floor $floor_ms ms (goal: within 1.5)"
    echo "load at the end: $(uptime)"
} | tee -a "$out/table.md"
echo "results: $out" >&2
