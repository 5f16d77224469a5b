"""Time the syncer's collective and a whole sync round between 2 processes on loopback.

    nice -n 10 .venv/bin/python experiments/bench_syncer.py [--iters 200]

Each of 2 "node" processes holds the universe model (`build_model((1, 42, 42), 6, 256)`) in
shared memory and runs: (1) N all-reduces (SUM) of a buffer the size of the syncer's (params + 4
control values); (2) N whole rounds (`ParamSync.round`: snapshot, all-reduce, apply) with nothing
else running; (3) N rounds while a Hogwild writer process on node 0 applies fused-Adam steps to
node 0's shared model non-stop (the writer is the thing a round races; its rate is printed too).
Rank 0 prints medians and 90th percentiles. Only 127.0.0.1 is used.
"""
from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from hogwild_a3c.learning.model import build_model
from hogwild_a3c.nodes.syncer import ParamSync, free_port, start_sync


def _writer(params, stop, counter):
    torch.set_num_threads(1)
    opt = torch.optim.Adam(params, lr=1e-4, fused=True)
    grads = [torch.randn_like(p) * 1e-3 for p in params]
    while not stop[0]:
        for p, g in zip(params, grads):
            p.grad = g
        opt.step()
        counter[0] += 1


def _stats(xs):
    xs = sorted(xs)
    return f"median {1e3 * statistics.median(xs):.2f} ms, p90 {1e3 * xs[int(0.9 * (len(xs) - 1))]:.2f} ms"


def _node(rank, port, iters, gap):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model((1, 42, 42), 6, 256)
    model.share_memory()
    params = [p for p in model.parameters()]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    sync = ParamSync(params)
    start_sync(sync, 0)
    out = {}
    buf = torch.randn(sync.numel + 4)
    for _ in range(10):
        dist.all_reduce(buf)
    times = []
    for _ in range(iters):
        dist.barrier()
        t = time.perf_counter()
        dist.all_reduce(buf)
        times.append(time.perf_counter() - t)
    out["all-reduce"] = times
    rounds, reduces = [], []
    for _ in range(iters):
        dist.barrier()
        r = sync.round()
        rounds.append(r.seconds)
        reduces.append(r.reduce_seconds)
    out["round, idle"] = rounds
    out["  its all-reduce (idle)"] = reduces
    ctx = multiprocessing.get_context("spawn")
    stop = torch.zeros(1, dtype=torch.int64).share_memory_()
    counter = torch.zeros(1, dtype=torch.int64).share_memory_()
    writer = None
    if rank == 0:
        writer = ctx.Process(target=_writer, args=(params, stop, counter))
        writer.start()
        while counter[0] < 10:
            time.sleep(0.01)
    dist.barrier()
    rounds, reduces = [], []
    c0, t0 = int(counter[0]), time.perf_counter()
    for _ in range(iters):
        time.sleep(gap)
        r = sync.round()
        rounds.append(r.seconds)
        reduces.append(r.reduce_seconds)
    rate = (int(counter[0]) - c0) / (time.perf_counter() - t0)
    out["round, writer active on node 0"] = rounds
    out["  its all-reduce (writer)"] = reduces
    if writer is not None:
        stop[0] = 1
        writer.join()
    if rank == 0:
        print(f"universe model: {sync.numel:,} float32 params ({4 * sync.numel / 1e6:.2f} MB), {iters} iterations")
        for name, xs in out.items():
            print(f"{name:32s} {_stats(xs)}")
        print(f"writer: {rate:.0f} Adam steps/s on node 0 during the rounds (gap {1e3 * gap:.0f} ms between rounds)")
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--gap", type=float, default=0.01, help="seconds between rounds while the writer runs")
    args = parser.parse_args()
    port = free_port()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_node, args=(r, port, args.iters, args.gap)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(600)
    if any(p.exitcode != 0 for p in procs):
        raise SystemExit(f"a node failed: exit codes {[p.exitcode for p in procs]}")


if __name__ == "__main__":
    main()
