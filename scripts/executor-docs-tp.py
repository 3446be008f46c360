"""The tensor-parallel section of docs/executor.md, from the `exec --json` runs that
scripts/executor-docs.sh writes (tp2.json, tp2sp.json in the folder given): measured iteration
time against the simulator's prediction fed with the measured action times, tensor-parallel
collectives included."""
import json
import os
import sys

runs = sys.argv[1]
print("## Tensor parallelism: measured vs predicted, tp 2 · pp 2")
print()
print("`autopp exec tiny-gpt --pp 2 --tp 2 [--sequence-parallel] --microbatches 8 --mbs 2 "
      "--schedule 1f1b --steps 12`: four ranks (threads), each pipeline stage split Megatron-style "
      "over two tensor-parallel ranks (column-parallel `qkv`/`fc1`, row-parallel `proj`/`fc2`, "
      "vocabulary-parallel embedding and cross-entropy; with sequence parallelism, reduce-scatters "
      "and all-gathers in place of the all-reduces and the norms on half of each sequence). Every "
      "collective is timed inside the action it runs in, so the medians fed to the simulator "
      "include them; the table also gives their share. Acceptance: within 15%.")
print()
print("| run | measured median | predicted | error | tp collectives, share of action time | "
      "F / B per stage (ms) | check |")
print("|---|---:|---:|---:|---:|---|---|")
for label, f in [("tp 2 · pp 2, 1f1b", "tp2.json"),
                 ("tp 2 · pp 2, 1f1b, sequence parallel", "tp2sp.json")]:
    d = json.load(open(os.path.join(runs, f)))
    m, p = d["iteration_time_s"], d["predicted_iteration_time_s"]
    t = d["measured_action_times_s"]
    comm = sum(sum(s) for s in t["tp_comm_s"])
    work = sum(sum(s) for s in t["stage_s"])
    fb = ", ".join(f"{s[0]*1e3:.1f} / {s[1]*1e3:.1f}" for s in t["stage_s"])
    c = d.get("check")
    check = "—" if c is None else f"max_rel_err {c['max_rel_err']:.1e}"
    print(f"| {label} | {m*1e3:.0f} ms | {p*1e3:.0f} ms | {(p/m-1):+.1%} | {comm/work:.0%} | "
          f"{fb} | {check} |")
print()
print("Four ranks share the machine's cores here, so a tensor-parallel rank computes at most as "
      "fast as a whole stage did on two ranks: this measures the runtime and the prediction, not "
      "a speed-up.")
print()
