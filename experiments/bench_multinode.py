"""`make bench-multinode`: the multi-node backend's cost on one machine.

Runs Pong for --seconds as 1 node x N workers (the single-machine trainer) and as N simulated
nodes x 1 worker (torchrun on 127.0.0.1, one syncer per node), alternating, --repeats times, and
reports agent steps/s of each (from progress.csv after --warmup seconds) and their ratio, both
measured in the same run on the same machine. The sync round's own time is measured by
`experiments/bench_syncer.py`.
Writes experiments/results/multinode/multinode.{md,csv}.

`--learning`: instead, CartPole-v1 to a mean evaluation return of 195 under both layouts for
seeds 0, 1, 2 (`--lr 1e-3 --lstm-size 64`, evaluation every 5 s), agent steps and seconds to
the target per seed, written to experiments/results/multinode/multinode-cartpole.{md,csv}.
"""
from __future__ import annotations

import argparse
import csv
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from benchlib import REPO, RUNS, header, load_config, markdown_table, results_dir


def steps_per_s(progress_files: list[Path], warmup: float) -> float:
    """Global steps/s over the rows after the warm-up, read from one node (every node's
    global_step counts all nodes)."""
    rates = []
    for path in progress_files:
        rows = pd.read_csv(path)
        rows = rows[rows["time_s"] >= warmup]
        if len(rows) >= 2:
            rates.append((rows["global_step"].iloc[-1] - rows["global_step"].iloc[0]) /
                         (rows["time_s"].iloc[-1] - rows["time_s"].iloc[0]))
    return max(rates) if rates else float("nan")


def layout_command(layout: str, nodes: int, sync_interval: float) -> list[str]:
    if layout == "one node":
        return [sys.executable, "-m", "hogwild_a3c.train", "--num-workers", str(nodes)]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", f"--nproc-per-node={nodes}",
            "-m", "hogwild_a3c.train", "--num-workers", "1", "--sync-interval", str(sync_interval)]


def learning(args: argparse.Namespace, env: dict) -> None:
    rows = []
    for seed in (0, 1, 2):
        for layout in ("one node", "nodes"):
            run_dir = RUNS / "multinode-cartpole" / f"s{seed}-{layout.replace(' ', '-')}-{time.time_ns()}"
            subprocess.run([*layout_command(layout, args.nodes, args.sync_interval), "--env", "CartPole-v1",
                            "--lr", "1e-3", "--lstm-size", "64", "--seed", str(seed), "--target-return", "195",
                            "--eval-episodes", "5", "--eval-interval", "5", "--max-seconds", "600", "--no-progress",
                            "--run-dir", str(run_dir)], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            evals = [pd.read_csv(path) for path in [run_dir / "eval.csv", *run_dir.glob("nodes/*/eval.csv")]
                     if path.is_file()]
            evals = max(evals, key=len)
            means = evals.groupby(["global_step", "time_s"], sort=False)["episode_return"].mean().reset_index()
            reached = means[means["episode_return"] >= 195]
            row = {"seed": seed, "layout": layout,
                   "steps_to_195": int(reached["global_step"].iloc[0]) if len(reached) else float("nan"),
                   "seconds_to_195": float(reached["time_s"].iloc[0]) if len(reached) else float("nan")}
            print(row, flush=True)
            rows.append(row)
            shutil.rmtree(run_dir, ignore_errors=True)
    out_dir = results_dir("multinode")
    with open(out_dir / "multinode-cartpole.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    summary = [{"layout": layout,
                "median_steps_to_195": statistics.median(r["steps_to_195"] for r in rows if r["layout"] == layout),
                "median_seconds_to_195": statistics.median(r["seconds_to_195"] for r in rows if r["layout"] == layout)}
               for layout in ("one node", "nodes")]
    text = header(f"CartPole-v1 to 195: 1 node x {args.nodes} workers against {args.nodes} nodes x 1 worker",
                  "make bench-multinode ARGS='" + " ".join(sys.argv[1:]) + "'",
                  {"flags": "--lr 1e-3 --lstm-size 64 --eval-episodes 5 --eval-interval 5, seeds 0 1 2"})
    text += "\n" + markdown_table(rows, list(rows[0])) + "\n" + markdown_table(summary, list(summary[0]))
    (out_dir / "multinode-cartpole.md").write_text(text)
    print(text)


def main() -> None:
    config = load_config("throughput")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sync-interval", type=float, default=0.5)
    parser.add_argument("--learning", action="store_true", help="CartPole to 195 per seed instead of throughput")
    args = parser.parse_args()
    if args.learning:
        return learning(args, {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})
    # --preset universe (K=1): the layout comparison recorded in
    # experiments/results/multinode/2026-11-30-pong-throughput.md was made with it.
    common = ["--env", config["env"], "--preset", "universe", "--env-kwargs", *config["env_kwargs"],
              "--eval-episodes", "0", "--max-seconds", str(args.seconds), "--progress-interval", "1", "--no-progress"]
    env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    rows = []
    for repeat in range(args.repeats):
        for layout in ("one node", "nodes"):
            run_dir = RUNS / "multinode" / f"r{repeat}-{layout.replace(' ', '-')}-{time.time_ns()}"
            command = [*layout_command(layout, args.nodes, args.sync_interval), *common]
            subprocess.run([*command, "--run-dir", str(run_dir)], cwd=REPO, env=env, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            files = [run_dir / "progress.csv"] if layout == "one node" else sorted(run_dir.glob("nodes/*/progress.csv"))
            rate = steps_per_s(files, args.warmup)
            print(f"repeat {repeat} {layout}: {rate:,.0f} steps/s", flush=True)
            rows.append({"repeat": repeat, "layout": layout, "steps_per_s": rate})
            shutil.rmtree(run_dir, ignore_errors=True)
    one = statistics.median(r["steps_per_s"] for r in rows if r["layout"] == "one node")
    many = statistics.median(r["steps_per_s"] for r in rows if r["layout"] == "nodes")
    out_dir = results_dir("multinode")
    with open(out_dir / "multinode.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["repeat", "layout", "steps_per_s"])
        writer.writeheader()
        writer.writerows(rows)
    summary = [{"layout": f"1 node x {args.nodes} workers", "steps_per_s": one, "ratio": 1.0},
               {"layout": f"{args.nodes} nodes x 1 worker (loopback, sync every {args.sync_interval:g} s)",
                "steps_per_s": many, "ratio": many / one}]
    text = header("Multi-node backend on one machine", "make bench-multinode ARGS='" + " ".join(sys.argv[1:]) + "'",
                  {"env": f"{config['env']} {' '.join(config['env_kwargs'])}, no evaluator",
                   "per cell": f"median of {args.repeats} runs of {args.seconds:g} s, rate after {args.warmup:g} s"})
    text += "\n" + markdown_table(summary, ["layout", "steps_per_s", "ratio"])
    (out_dir / "multinode.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
