#!/usr/bin/env bash
# tiny-gpt trained by PyTorch's own pipelining runtime (torch.distributed.pipelining, gloo, one
# process per rank: scripts/torch_pipeline.py) and by `autopp exec` (one thread per rank), the
# same model, batch, layer split and schedule, back to back; prints each iteration time (the
# median over the steps after the first, then the median over the repeats) and the ratio
# torch / autopp (above 1: autopp is faster).
#
# Cases: gpipe, 1f1b and interleaved-1f1b (v = 2) at p = 2 and p = 4, m = 8, mbs = 2.
# PyTorch comes from PyPI into a virtual environment outside the clone,
# ${AUTOPP_VENV:-$HOME/.cache/autopp/venv}, created on first use (a few GB, several minutes).
#
# Usage: scripts/bench-vs-torch.sh [--repeats N] [--steps N] [--cases "1f1b:2 gpipe:4 ..."]
#                                  [--out FILE]
#   --repeats  alternate autopp and torch runs this many times per case (default 3)
#   --steps    training steps per run (default 6; the first is warm-up)
#   --cases    SCHEDULE:P items (default: all six)
#   --out      also write the results as JSON (scripts/executor-docs.sh reads it)
set -euo pipefail
cd "$(dirname "$0")/.."

repeats=3
steps=6
cases="gpipe:2 1f1b:2 interleaved-1f1b:2 gpipe:4 1f1b:4 interleaved-1f1b:4"
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --repeats) repeats=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --cases) cases=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--repeats N] [--steps N] [--cases \"1f1b:2 ...\"] [--out FILE]" >&2; exit 2 ;;
  esac
done

venv=${AUTOPP_VENV:-$HOME/.cache/autopp/venv}
if ! "$venv/bin/python" -c "import torch.distributed.pipelining" 2>/dev/null; then
  echo "installing PyTorch from PyPI into $venv (once)" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip
  "$venv/bin/pip" install --quiet torch numpy
fi
py="$venv/bin/python"

cargo build --release --quiet
bin=target/release/autopp
runs=$(mktemp -d)
trap 'rm -rf "$runs"' EXIT

for case in $cases; do
  kind=${case%%:*}
  p=${case##*:}
  extra=()
  [ "$kind" = interleaved-1f1b ] && extra=(--virtual 2)
  for r in $(seq "$repeats"); do
    "$bin" exec tiny-gpt --pp "$p" --microbatches 8 --mbs 2 --schedule "$kind" "${extra[@]}" \
      --steps "$steps" --json > "$runs/autopp-$kind-$p-$r.json"
    split=$("$py" -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["split"])))' \
      "$runs/autopp-$kind-$p-$r.json")
    "$py" scripts/torch_pipeline.py --pp "$p" --microbatches 8 --mbs 2 --schedule "$kind" \
      "${extra[@]}" --split "$split" --steps "$steps" 2> "$runs/torch-$kind-$p-$r.err" \
      | tail -n 1 > "$runs/torch-$kind-$p-$r.json" \
      || { cat "$runs/torch-$kind-$p-$r.err" >&2; exit 1; }
  done
done

"$py" - "$runs" "$repeats" "$out" $cases <<'PY'
import json, os, statistics, sys
runs, repeats, out, cases = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
cpu = "unknown CPU"
for line in open("/proc/cpuinfo"):
    if line.startswith("model name"):
        cpu = line.split(":", 1)[1].strip()
        break
rows = []
for case in cases:
    kind, p = case.split(":")
    a = [json.load(open(f"{runs}/autopp-{kind}-{p}-{r}.json")) for r in range(1, repeats + 1)]
    t = [json.load(open(f"{runs}/torch-{kind}-{p}-{r}.json")) for r in range(1, repeats + 1)]
    at = statistics.median(x["iteration_time_s"] for x in a)
    tt = statistics.median(x["iteration_time_s"] for x in t)
    rows.append({
        "schedule": kind, "pp": int(p), "virtual": 2 if kind == "interleaved-1f1b" else 1,
        "microbatches": 8, "mbs": 2,
        "autopp_s": at, "torch_s": tt, "ratio": tt / at,
        "autopp_runs_s": [x["iteration_time_s"] for x in a],
        "torch_runs_s": [x["iteration_time_s"] for x in t],
        "autopp_predicted_s": statistics.median(x["predicted_iteration_time_s"] for x in a),
        "torch_threads_per_rank": t[0]["threads_per_rank"], "torch_version": t[0]["torch"],
    })
print(f"tiny-gpt, m = 8, mbs = 2 · {cpu}, {os.cpu_count()} cores · torch {rows[0]['torch_version']} "
      f"(gloo, {rows[0]['torch_threads_per_rank']} thread(s) per rank process at p = 2) · "
      f"median of {repeats} alternating runs")
print()
print("| schedule | p | torch | autopp | torch / autopp |")
print("|---|---:|---:|---:|---:|")
for r in rows:
    v = ", v = 2" if r["virtual"] == 2 else ""
    print(f"| {r['schedule']}{v} | {r['pp']} | {r['torch_s']*1e3:.0f} ms | {r['autopp_s']*1e3:.0f} ms | {r['ratio']:.2f}× |")
if out:
    with open(out, "w") as f:
        json.dump({"cpu": cpu, "cores": os.cpu_count(), "repeats": repeats, "cases": rows}, f, indent=1)
PY
