#!/bin/bash
# host_costs.sh: what the host takes of each step when the device is modelled (--device sim:GPU),
# at several concurrencies under `bench serve` (docs/PERFORMANCE.md, "Host costs at scale").
#
#   dev/sim/host_costs.sh MODEL_DIR "SERVE OPTIONS" "BENCH OPTIONS" C [C ...]
#
# For each concurrency C: `moeserve serve MODEL_DIR SERVE OPTIONS --max-running-requests C`, then
# `moeserve bench serve --max-concurrency C --num-prompts ROUNDS*C BENCH OPTIONS` (ROUNDS: 2), the server's CPU time
# by thread (the engine thread, libmicrohttpd's workers: parsing, detokenization, streaming) and the
# client's, the engine's step count (/metrics), and the diagnosis of the last window (the modelled
# device's categories, the host gap: the device idle waiting for the host, scheduling), and how long
# the modelled device was busy in all (the sim's last log line): device_share is that over the run's
# duration, the rest the device waited for the host or had nothing to do. One line of JSON per C on
# stdout; the logs under $OUT (default /tmp/moeserve-host-costs).
set -euo pipefail
BIN=${MOESERVE_BIN:-build/moeserve}
DIR=$1; SERVE=$2; BENCH=$3; shift 3
OUT=${OUT:-/tmp/moeserve-host-costs}
mkdir -p "$OUT"
cpu_by_thread() { # PID -> "engine http other" CPU seconds
    python3 - "$1" <<'PY'
import os, sys
pid = sys.argv[1]
acc = {"engine": 0, "http": 0, "other": 0}
for t in os.listdir(f"/proc/{pid}/task"):
    try:  # schedstat: nanoseconds on a CPU (stat's ticks are 10 ms)
        comm = open(f"/proc/{pid}/task/{t}/comm").read().strip()
        ns = int(open(f"/proc/{pid}/task/{t}/schedstat").read().split()[0])
    except OSError:
        continue
    k = "engine" if comm == "engine" else "http" if comm.startswith("MHD") else "other"
    acc[k] += ns / 1e9
print(acc["engine"], acc["http"], acc["other"])
PY
}
steps() { curl -s "http://127.0.0.1:$1/metrics" | awk '/^moeserve_engine_steps_total/ {print $2}'; }
for C in "$@"; do
    port=$((18600 + C % 1000))
    $BIN serve "$DIR" $SERVE --max-running-requests "$C" --port "$port" >"$OUT/serve-$C.log" 2>&1 &
    spid=$!
    for _ in $(seq 600); do grep -q "^listening" "$OUT/serve-$C.log" && break; sleep 0.5; done
    read -r e0 h0 o0 < <(cpu_by_thread $spid)
    s0=$(steps $port)
    /usr/bin/time -f "%U %S" -o "$OUT/client-$C.time" $BIN bench serve --base-url "http://127.0.0.1:$port" \
        --max-concurrency "$C" --num-prompts $((${ROUNDS:-2} * C)) $BENCH --output-file "$OUT/bench-$C.jsonl" --quiet \
        >"$OUT/bench-$C.txt" 2>&1
    s1=$(steps $port)
    read -r e1 h1 o1 < <(cpu_by_thread $spid)
    $BIN diagnose --url "http://127.0.0.1:$port" --json >"$OUT/diag-$C.json"
    kill $spid; wait $spid || true
    python3 - "$C" "$s0" "$s1" "$e0" "$e1" "$h0" "$h1" "$o0" "$o1" "$OUT" <<'PY'
import json, sys
C, s0, s1, e0, e1, h0, h1, o0, o1, out = sys.argv[1:]
steps = int(float(s1)) - int(float(s0))
b = json.loads(open(f"{out}/bench-{C}.jsonl").read().splitlines()[-1])
d = json.load(open(f"{out}/diag-{C}.json"))["breakdown"]
u, s = map(float, open(f"{out}/client-{C}.time").read().split()[-2:])
busy = [l for l in open(f"{out}/serve-{C}.log") if "the device was busy" in l][-1].split("busy ")[1].split(" s")[0]
per = lambda a, b: round((float(b) - float(a)) * 1e3 / steps, 3)
print(json.dumps({"concurrency": int(C), "completed": b["completed"], "failed": b["failed"], "steps": steps,
    "wall_ms_per_step": round(b["duration"] * 1e3 / steps, 3), "device_ms_per_step": round(float(busy) * 1e3 / steps, 3),
    "device_share": round(float(busy) / b["duration"], 3),
    "host_gap_ms": round(d["host_gap"]["ms"], 3), "scheduling_ms": round(d["scheduling"]["ms"], 3),
    "engine_cpu_ms_per_step": per(e0, e1), "http_cpu_ms_per_step": per(h0, h1), "other_cpu_ms_per_step": per(o0, o1),
    "client_cpu_ms_per_step": round((u + s) * 1e3 / steps, 3), "output_tok_s": round(b["output_throughput"], 1),
    "median_tpot_ms": round(b["median_tpot_ms"], 2), "median_ttft_ms": round(b["median_ttft_ms"], 1)}))
PY
done
