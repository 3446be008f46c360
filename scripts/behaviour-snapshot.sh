#!/usr/bin/env bash
# Writes the JSON answers of `plan`, `estimate`, `schedule` and `validate` on a fixed set of cases
# into DIR, one file per case, so that a refactoring can be checked byte for byte:
#   scripts/behaviour-snapshot.sh /tmp/before   (on the old commit)
#   scripts/behaviour-snapshot.sh /tmp/after    (on the new one)
#   diff -r /tmp/before /tmp/after
# The 25 plan cases are the planner's speed-work comparison set: every preset on 32 H100 and on
# 64 A100 80GB, the two large A100 targets, llama3-70b on 64 H100, and the memory-bound GPT-3 case
# under two frameworks. Each plan found is read back by `estimate --plan`.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/behaviour-snapshot.sh DIR}
bin=${AUTOPP_BIN:-target/release/autopp}
mkdir -p "$out"
n=0
plan_case() {  # name, plan args...
  local name=$1; shift
  n=$((n + 1))
  "$bin" plan "$@" --json --out "$out/$name.planfile.json" > "$out/$name.plan.json" 2> "$out/$name.plan.err"
  echo "exit $?" >> "$out/$name.plan.err"
  if [ -s "$out/$name.planfile.json" ]; then
    "$bin" estimate --plan "$out/$name.planfile.json" --json > "$out/$name.estimate.json" 2>&1
  fi
  sed -i '/"elapsed_s"/d' "$out/$name.plan.json"
  rm -f "$out/$name.planfile.json"
}
for preset in $("$bin" models --json | python3 -c "import json,sys; print(' '.join(p['name'] for p in json.load(sys.stdin)))"); do
  plan_case "$preset-32-h100" "$preset" --gpus 32
  plan_case "$preset-64-a100" "$preset" --gpus 64 --gpu a100-80g
done
plan_case gpt3-1024 gpt3-175b --gpus 1024 --gpu a100-80g --global-batch 1536
plan_case mtnlg-2240 mt-nlg-530b --gpus 2240 --gpu a100-80g --global-batch 2240
plan_case llama3-70b-64-h100 llama3-70b --gpus 64
plan_case gpt3-64-any gpt3-175b --gpus 64 --gpu a100-80g --global-batch 512
plan_case gpt3-64-megatron gpt3-175b --gpus 64 --gpu a100-80g --global-batch 512 --framework megatron
echo "$n plan cases" >&2
# explicit estimates (the README's examples and a few other shapes)
est() { local name=$1; shift; "$bin" estimate "$@" --json > "$out/est-$name.json" 2>&1; echo "exit $?" >> "$out/est-$name.json"; }
est l70-v2 llama3-70b --gpus 64 --tp 8 --pp 4 --virtual 2 --mbs 1 --recompute selective --sequence-parallel --zero 1
est gpt3-1f1b gpt3-175b --gpus 1024 --gpu a100-80g --tp 8 --pp 16 --mbs 1 --global-batch 1536
est gpt3-zbv gpt3-175b --gpus 1024 --gpu a100-80g --tp 8 --pp 16 --mbs 1 --global-batch 1536 --schedule zb-v
est l8-dp llama3-8b --gpus 32 --tp 1 --pp 1 --mbs 1 --zero 1
est l405 llama3-405b --gpus 2048 --tp 8 --pp 16 --virtual 4 --mbs 1 --recompute full
# schedules
for k in gpipe 1f1b interleaved-1f1b looped-bfs zb-h1 zb-h2 zb-v dualpipe-v interleaved-zb; do
  "$bin" schedule "$k" --pp 4 --microbatches 8 > "$out/sched-$k.txt" 2>&1
done
"$bin" validate validation/published-runs.json --json > "$out/validate.json" 2>&1
echo "exit $?" >> "$out/validate.json"
