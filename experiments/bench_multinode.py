"""`make bench-multinode`: what spanning machines costs, measured on one machine's cores.

Each simulated machine is a torchrun agent of its own (c10d rendezvous on 127.0.0.1, its own
HOGWILD_NODE_NAME), pinned to cores of its own with sched_setaffinity (what `taskset -c` does).
The single-machine trainer is pinned to the same cores, so both layouts get the same CPUs and the
scheduler cannot favour either. The layouts alternate, --repeats times, and the figures are
medians. With fewer cores than nodes x workers, nothing is pinned and the report says so.

- default: Pong with the default flags and no evaluator for --seconds; agent steps/s (from
  progress.csv after --warmup seconds) of 1 node x N*W workers against N nodes x W workers, and
  their ratio; and of N single-machine trainers pinned as the nodes are, syncing nothing (the
  nodes' ceiling: what the pinning costs, apart from what the sync costs). Writes
  experiments/results/multinode/pinned-throughput.{md,csv}.
- `--learning cartpole`: CartPole-v1 to a mean evaluation return of 195 under both layouts for
  seeds 0, 1, 2 (`--lr 1e-3 --lstm-size 64`, evaluation every 5 s); agent steps and seconds to
  the target. Writes pinned-cartpole.{md,csv}.
- `--learning pong`: the first 1M agent steps of Pong with the default flags, seed 0, under both
  layouts: the training mean and the latest evaluation at 250k, 500k, 750k and 1M agent steps
  (per agent step, not per second). Writes pinned-pong-1m.md.

The sync round's own time was measured by a script since retired (results README, "Several nodes").
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from benchlib import REPO, RUNS, header, load_config, markdown_table, results_dir
from hogwild_a3c.nodes.syncer import free_port

LAYOUTS = ("one node", "nodes")
# Throughput also runs N single-machine trainers at once, each pinned as a node is and syncing
# nothing: the most N nodes could reach, so nodes / independent is the sync's own cost and
# independent / one node what confining each node to its own cores costs.
THROUGHPUT_LAYOUTS = ("one node", "nodes", "independent")
PONG_CHECKPOINTS = (250_000, 500_000, 750_000, 1_000_000)
TRAIN_WINDOW = 20  # CartPole: training episodes in the mean that must reach 195


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def core_groups(nodes: int, workers: int) -> list[list[int]] | None:
    """Node i's cores: the i-th slice of `workers` cores of those this process may use; None
    when there are too few cores to give every worker one."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < nodes * workers:
        return None
    return [cores[i * workers:(i + 1) * workers] for i in range(nodes)]


def pinned_to(cores: list[int] | None):
    return None if cores is None else (lambda: os.sched_setaffinity(0, cores))


def run_layout(layout: str, args: argparse.Namespace, flags: list[str], run_dir: Path) -> list[Path]:
    """One run of a layout to its end; the progress directories it wrote (one per node)."""
    groups = core_groups(args.nodes, args.workers)
    env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
           "HOGWILD_RUN_TOKEN": os.environ.get("HOGWILD_RUN_TOKEN") or secrets.token_hex(16)}

    def logged(name: str) -> dict:  # beside the run dir: the trainer refuses a run dir that holds files
        return {"stdout": open(run_dir.with_name(f"{run_dir.name}.{name}.log"), "w"), "stderr": subprocess.STDOUT,
                "cwd": REPO}

    run_dir.parent.mkdir(parents=True, exist_ok=True)
    if layout == "one node":
        cores = None if groups is None else [c for group in groups for c in group]
        command = [sys.executable, "-m", "hogwild_a3c.train", "--num-workers", str(args.nodes * args.workers),
                   *flags, "--run-dir", str(run_dir)]
        code = subprocess.run(command, env=env, preexec_fn=pinned_to(cores), **logged("trainer")).returncode
        if code != 0:
            raise SystemExit(f"error: the one-node run ended with exit {code}: {' '.join(command)}")
        return [run_dir]
    if layout == "independent":
        solos = [subprocess.Popen([sys.executable, "-m", "hogwild_a3c.train", "--num-workers", str(args.workers),
                                   *flags, "--run-dir", str(run_dir / f"solo{i}")], env=env,
                                  preexec_fn=pinned_to(None if groups is None else groups[i]), **logged(f"solo{i}"))
                 for i in range(args.nodes)]
        codes = [solo.wait() for solo in solos]
        if any(codes):
            raise SystemExit(f"error: the independent trainers ended with exits {codes}; run dir {run_dir}")
        return sorted(run_dir.glob("solo*"))
    port = free_port()
    agents = []
    for node in range(args.nodes):
        command = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={args.nodes}", "--nproc-per-node=1",
                   "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--local-addr=127.0.0.1",
                   f"--rdzv-id=bench-{port}", "-m", "hogwild_a3c.train", "--num-workers", str(args.workers),
                   "--sync-interval", str(args.sync_interval), "--sync-mode", args.sync_mode, *flags,
                   "--run-dir", str(run_dir)]
        agents.append(subprocess.Popen(command, env={**env, "HOGWILD_NODE_NAME": f"node{node}"},
                                       preexec_fn=pinned_to(None if groups is None else groups[node]),
                                       **logged(f"agent{node}")))
        # The first agent hosts the rendezvous store; the others must find it up.
        deadline = time.monotonic() + 60
        while node == 0 and not listening(port) and agents[0].poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
    codes = [agent.wait() for agent in agents]
    if any(codes):
        raise SystemExit(f"error: the agents ended with exits {codes}; run dir {run_dir}")
    return sorted(run_dir.glob("nodes/*"))


def steps_per_s(node_dirs: list[Path], warmup: float, layout: str) -> float:
    """Agent steps/s after the warm-up: for nodes the mean over nodes (every node's global_step
    counts every node's steps, as of its last sync round), for independent trainers the sum."""
    rates = []
    for node_dir in node_dirs:
        rows = pd.read_csv(node_dir / "progress.csv").iloc[:-1]  # the last row is written after the workers stop
        rows = rows[rows["time_s"] >= warmup]
        if len(rows) >= 2:
            rates.append((rows["global_step"].iloc[-1] - rows["global_step"].iloc[0]) /
                         (rows["time_s"].iloc[-1] - rows["time_s"].iloc[0]))
    if len(rates) < len(node_dirs):
        return float("nan")
    return sum(rates) if layout == "independent" else statistics.mean(rates)


def describe_layouts(args: argparse.Namespace) -> dict:
    groups = core_groups(args.nodes, args.workers)
    pinning = ("not pinned: fewer cores than nodes x workers" if groups is None else
               f"1 node on cores {[c for g in groups for c in g]}; node i on cores "
               + ", ".join(f"{i}: {g}" for i, g in enumerate(groups)))
    return {"layouts": f"1 node x {args.nodes * args.workers} workers against {args.nodes} separate torchrun agents "
                       f"x {args.workers} worker(s) (loopback c10d, sync every {args.sync_interval:g} s, "
                       f"--sync-mode {args.sync_mode})",
            "pinning": pinning + " (sched_setaffinity, as taskset -c)",
            "seeds": "each node's workers are seeded apart (worker_seed mixes in the node's rank)"}


def finite_median(values: list[float]) -> float:
    """The median of the values that are numbers (a run that missed its target is NaN; the
    report counts those apart)."""
    finite = [v for v in values if not math.isnan(v)]
    return statistics.median(finite) if finite else float("nan")


def write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def command_line() -> str:
    return "make bench-multinode" + (" ARGS='" + " ".join(sys.argv[1:]) + "'" if sys.argv[1:] else "")


def throughput(args: argparse.Namespace) -> None:
    config = load_config("throughput")
    flags = ["--env", config["env"], "--env-kwargs", *config["env_kwargs"], "--eval-episodes", "0",
             "--max-seconds", str(args.seconds), "--progress-interval", "1", "--no-progress"]
    rows: list[dict] = []
    for repeat in range(args.repeats):
        for layout in THROUGHPUT_LAYOUTS:
            run_dir = RUNS / "multinode" / f"r{repeat}-{layout.replace(' ', '-')}-{time.time_ns()}"
            rate = steps_per_s(run_layout(layout, args, flags, run_dir), args.warmup, layout)
            print(f"repeat {repeat} {layout}: {rate:,.0f} steps/s", flush=True)
            rows.append({"repeat": repeat, "layout": layout, "steps_per_s": rate})
            shutil.rmtree(run_dir, ignore_errors=True)
    one, many, apart = (finite_median([float(r["steps_per_s"]) for r in rows if r["layout"] == layout])
                        for layout in THROUGHPUT_LAYOUTS)
    pairs = [float(n["steps_per_s"]) / float(o["steps_per_s"]) for o, n in zip(rows[0::3], rows[1::3])]
    out_dir = results_dir("multinode")
    write_csv(out_dir / "pinned-throughput.csv", rows)
    summary = [{"layout": f"1 node x {args.nodes * args.workers} workers", "median_steps_per_s": one, "ratio": 1.0},
               {"layout": f"{args.nodes} nodes x {args.workers} worker(s)", "median_steps_per_s": many,
                "ratio": many / one},
               {"layout": f"{args.nodes} independent trainers x {args.workers} worker(s), no sync",
                "median_steps_per_s": apart, "ratio": apart / one}]
    text = header("Multi-node backend on one machine, pinned cores", command_line(), {
        **describe_layouts(args),
        "env": f"{config['env']} {' '.join(config['env_kwargs'])}, default flags, no evaluator",
        "per cell": f"{args.repeats} runs of {args.seconds:g} s each, the layouts in turn; "
                    f"rate after {args.warmup:g} s"})
    text += "\n" + markdown_table(rows, ["repeat", "layout", "steps_per_s"]) + "\n"
    text += markdown_table(summary, ["layout", "median_steps_per_s", "ratio"])
    text += ("\nNodes over one node, each repeat's pair: " + ", ".join(f"{p:.2f}" for p in pairs)
             + f" (median {finite_median(pairs):.2f}); nodes over independent trainers {many / apart:.2f}.\n")
    (out_dir / "pinned-throughput.md").write_text(text)
    print(text)


def cartpole(args: argparse.Namespace) -> None:
    flags = ["--env", "CartPole-v1", "--lr", "1e-3", "--lstm-size", "64", "--target-return", "195",
             "--eval-episodes", "5", "--eval-interval", "5", "--max-seconds", "600", "--no-progress"]
    rows = []
    for seed in args.seeds:
        for layout in args.layouts:
            run_dir = RUNS / "multinode-cartpole" / f"s{seed}-{layout.replace(' ', '-')}-{time.time_ns()}"
            node_dirs = run_layout(layout, args, [*flags, "--seed", str(seed)], run_dir)
            evals = max((pd.read_csv(d / "eval.csv") for d in node_dirs if (d / "eval.csv").is_file()), key=len)
            means = evals.groupby(["global_step", "time_s"], sort=False)["episode_return"].mean().reset_index()
            reached = means[means["episode_return"] >= 195]
            # Every node's training episodes in global-step order: as fine-grained as the episodes,
            # where evaluations every 5 s round the step they reach 195 up by up to 5 s of steps.
            episodes = pd.concat([pd.read_csv(d / "episodes.csv") for d in node_dirs if (d / "episodes.csv").is_file()],
                                 ignore_index=True).sort_values("global_step")
            trained = episodes[episodes["episode_return"].rolling(TRAIN_WINDOW).mean() >= 195]
            row = {"seed": seed, "layout": layout,
                   f"train_mean_{TRAIN_WINDOW}_steps_to_195":
                       int(trained["global_step"].iloc[0]) if len(trained) else float("nan"),
                   "steps_to_195": int(reached["global_step"].iloc[0]) if len(reached) else float("nan"),
                   "seconds_to_195": float(reached["time_s"].iloc[0]) if len(reached) else float("nan")}
            print(row, flush=True)
            rows.append(row)
            shutil.rmtree(run_dir, ignore_errors=True)
    out_dir = results_dir("multinode")
    write_csv(out_dir / "pinned-cartpole.csv", rows)
    summary = []
    for layout in args.layouts:
        steps = [float(r["steps_to_195"]) for r in rows if r["layout"] == layout]
        seconds = [float(r["seconds_to_195"]) for r in rows if r["layout"] == layout]
        trained = [float(r[f"train_mean_{TRAIN_WINDOW}_steps_to_195"]) for r in rows if r["layout"] == layout]
        summary.append({"layout": layout, "seeds_reaching_195": sum(not math.isnan(v) for v in steps),
                        f"median_train_mean_{TRAIN_WINDOW}_steps_to_195": finite_median(trained),
                        "median_steps_to_195": finite_median(steps), "median_seconds_to_195": finite_median(seconds)})
    text = header("CartPole-v1 to 195 on pinned cores", command_line(), {
        **describe_layouts(args), "flags": " ".join(flags) + f", seeds {' '.join(map(str, args.seeds))}",
        f"train_mean_{TRAIN_WINDOW}": f"the first global step where the mean of the last {TRAIN_WINDOW} training "
                                      "episodes (every node's, in global-step order) reached 195",
        "steps_to_195": "the global step of the first evaluation (5 episodes, every 5 s) whose mean reached 195"})
    text += "\n" + markdown_table(rows, list(rows[0])) + "\n" + markdown_table(summary, list(summary[0]))
    (out_dir / "pinned-cartpole.md").write_text(text)
    print(text)


def at_checkpoints(node_dirs: list[Path]) -> dict:
    """The mean of the last 50 training episodes (every node's) and the latest evaluation mean,
    as of each checkpoint's global step."""
    episodes = pd.concat([pd.read_csv(d / "episodes.csv") for d in node_dirs]).sort_values("global_step")
    evals = [pd.read_csv(d / "eval.csv") for d in node_dirs if (d / "eval.csv").is_file()]
    evals_by_step = (pd.concat(evals).groupby("global_step")["episode_return"].mean() if evals
                     else pd.Series(dtype=float))
    row = {}
    for step in PONG_CHECKPOINTS:
        seen = episodes[episodes["global_step"] <= step]["episode_return"].tail(50)
        done = evals_by_step[evals_by_step.index <= step]
        row[f"train mean at {step // 1000}k"] = float(seen.mean()) if len(seen) else float("nan")
        row[f"eval at {step // 1000}k"] = float(done.iloc[-1]) if len(done) else float("nan")
    return row


def pong(args: argparse.Namespace) -> None:
    config = load_config("throughput")
    flags = ["--env", config["env"], "--env-kwargs", *config["env_kwargs"],
             "--max-steps", str(PONG_CHECKPOINTS[-1]), "--eval-interval", "120", "--eval-episodes", "3",
             "--no-progress"]
    rows = []
    for seed in args.seeds:
        for layout in args.layouts:
            run_dir = RUNS / "multinode-pong" / f"s{seed}-{layout.replace(' ', '-')}-{time.time_ns()}"
            started = time.monotonic()
            node_dirs = run_layout(layout, args, [*flags, "--seed", str(seed)], run_dir)
            rows.append({"seed": seed, "layout": layout, **at_checkpoints(node_dirs),
                         "minutes": (time.monotonic() - started) / 60})
            print(rows[-1], flush=True)
    text = header("Pong, the first 1M agent steps on pinned cores", command_line(), {
        **describe_layouts(args), "flags": " ".join(flags) + f" --seed S, seeds {' '.join(map(str, args.seeds))} "
                                                            "(the rank-0 node evaluates, on its own cores)",
        "train mean": "mean return of the last 50 training episodes up to that global step, every node's",
        "eval": "the latest evaluation mean (3 episodes, every 120 s) up to that global step: coarser than the "
                "training mean, and as stale as the evaluation interval"})
    text += "\n" + markdown_table(rows, list(rows[0]))
    (results_dir("multinode") / "pinned-pong-1m.md").write_text(text)
    print(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1, help="workers per node (the one node has nodes x workers)")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=15.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sync-interval", type=float, default=0.5)
    parser.add_argument("--sync-mode", choices=("sum", "avg"), default="sum")
    parser.add_argument("--seeds", type=int, nargs="+", help="with --learning (default: 0 1 2 cartpole, 0 pong)")
    parser.add_argument("--learning", choices=("cartpole", "pong"), help="learning per layout instead of throughput")
    parser.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS),
                        help="with --learning: the layouts to run (e.g. only nodes, to try a --sync-interval)")
    args = parser.parse_args()
    args.seeds = args.seeds or ([0] if args.learning == "pong" else [0, 1, 2])
    if args.nodes < 2 or args.workers < 1:
        parser.error("--nodes must be at least 2 and --workers at least 1")
    {"cartpole": cartpole, "pong": pong, None: throughput}[args.learning](args)


if __name__ == "__main__":
    main()
