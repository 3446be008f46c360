"""tiny-gpt trained by PyTorch's own pipelining runtime (`torch.distributed.pipelining`), for
`scripts/bench-vs-torch.sh`: the same model, batch, split and schedule as
`autopp exec tiny-gpt --pp P --microbatches M --mbs B --schedule KIND [--virtual V]`.

One process per pipeline rank (gloo, localhost), each with `max(1, cores // P)` intra-op threads
(the cores shared out as autopp shares them out among its rank threads). The model is
autopp's tiny-gpt: 8 pre-norm blocks (LayerNorm, causal multi-head attention through
`scaled_dot_product_attention`, GeLU (tanh) MLP 4h, biases everywhere), h 128, 4 heads,
seq 128, vocabulary 1024, no position embedding, untied head without bias; the mean token
cross-entropy; AdamW (lr 3e-3, betas (0.9, 0.95), eps 1e-8, weight decay 0.01), fp32.

Prints one JSON line on rank 0: {"iteration_time_s": median over the steps after the first,
"step_time_s": [...], "losses": [...]} (losses from the last rank's micro-batches, mean).

Usage: python torch_pipeline.py --pp 2 --microbatches 8 --mbs 2 --schedule 1f1b \
           [--virtual 2] --split 5,5 --steps 6
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)

HIDDEN, HEADS, FFN, VOCAB, SEQ = 128, 4, 512, 1024, 128


class Block(nn.Module):
    """GPT-2's pre-norm block: x + Attn(LN1(x)), then + MLP(LN2(.))."""

    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(HIDDEN)
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.proj = nn.Linear(HIDDEN, HIDDEN)
        self.ln2 = nn.LayerNorm(HIDDEN)
        self.fc1 = nn.Linear(HIDDEN, FFN)
        self.fc2 = nn.Linear(FFN, HIDDEN)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=2)
        heads = lambda t: t.view(b, s, HEADS, h // HEADS).transpose(1, 2)  # noqa: E731
        o = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        x = x + self.proj(o.transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class Stage(nn.Module):
    """Layer-list entries [first, first + count): 0 is the embedding, 1..8 the blocks, 9 the
    final norm and LM head (as autopp numbers them)."""

    def __init__(self, first, count, layers):
        super().__init__()
        entries = range(first, first + count)
        self.embed = nn.Embedding(VOCAB, HIDDEN) if 0 in entries else None
        self.blocks = nn.ModuleList(Block() for i in entries if 1 <= i <= layers)
        last = layers + 1
        self.norm = nn.LayerNorm(HIDDEN) if last in entries else None
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False) if last in entries else None

    def forward(self, x):
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        if self.head is not None:
            x = self.head(self.norm(x))
        return x


def loss_fn(logits, target):
    return F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))


def run(rank, args, port, queue):
    world = args.pp
    threads = max(1, (os.cpu_count() or 1) // world)
    torch.set_num_threads(threads)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(args.seed)
    split = [int(x) for x in args.split.split(",")]
    firsts = [sum(split[:i]) for i in range(len(split))]
    stages_total = len(split)
    layers = sum(split) - 2
    # looped placement: rank r holds stages r, r + P, ...
    mine = list(range(rank, stages_total, world))
    mbs_tokens = torch.zeros(args.mbs, SEQ, dtype=torch.long)
    stages, params = [], []
    for s in mine:
        module = Stage(firsts[s], split[s], layers)
        params += list(module.parameters())
        example = mbs_tokens if s == 0 else torch.zeros(args.mbs, SEQ, HIDDEN)
        stages.append(PipelineStage(module, s, stages_total, torch.device("cpu"),
                                    input_args=(example,)))
    m = args.microbatches
    if args.schedule == "gpipe":
        schedule = ScheduleGPipe(stages[0], m, loss_fn=loss_fn)
    elif args.schedule == "1f1b":
        schedule = Schedule1F1B(stages[0], m, loss_fn=loss_fn)
    elif args.schedule == "interleaved-1f1b":
        schedule = ScheduleInterleaved1F1B(stages, m, loss_fn=loss_fn)
    else:
        raise SystemExit(f"unknown schedule {args.schedule}")
    optimizer = torch.optim.AdamW(params, lr=3e-3, betas=(0.9, 0.95), eps=1e-8,
                                  weight_decay=0.01)
    gen = torch.Generator().manual_seed(args.seed)
    batch = args.mbs * m
    times, losses = [], []
    for _ in range(args.steps):
        tokens = torch.randint(0, VOCAB, (batch, SEQ + 1), generator=gen)
        x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        dist.barrier()
        t0 = time.perf_counter()
        step_losses = []
        kwargs = {}
        if 0 in mine:
            kwargs_args = (x,)
        else:
            kwargs_args = ()
        if stages_total - 1 in mine:
            kwargs = {"target": y, "losses": step_losses}
        schedule.step(*kwargs_args, **kwargs)
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        dist.barrier()
        times.append(time.perf_counter() - t0)
        if step_losses:
            losses.append(float(torch.stack(step_losses).detach().mean()))
    # the last rank's losses to rank 0
    out = [None] * world
    dist.all_gather_object(out, losses)
    if rank == 0:
        queue.put({
            "iteration_time_s": statistics.median(times[1:] if len(times) > 1 else times),
            "step_time_s": times,
            "losses": next((l for l in out if l), []),
            "threads_per_rank": threads,
            "torch": torch.__version__,
        })
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pp", type=int, required=True)
    p.add_argument("--microbatches", type=int, required=True)
    p.add_argument("--mbs", type=int, required=True)
    p.add_argument("--schedule", required=True,
                   choices=["gpipe", "1f1b", "interleaved-1f1b"])
    p.add_argument("--virtual", type=int, default=1)
    p.add_argument("--split", required=True,
                   help="layer-list entries per stage, comma-separated (autopp's split)")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    stages = len(args.split.split(","))
    if stages != args.pp * args.virtual:
        sys.exit(f"--split has {stages} stages, expected pp x virtual = {args.pp * args.virtual}")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=run, args=(r, args, port, queue)) for r in range(args.pp)]
    for proc in procs:
        proc.start()
    result = queue.get()
    for proc in procs:
        proc.join()
        if proc.exitcode != 0:
            sys.exit(f"rank process exited with {proc.exitcode}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
