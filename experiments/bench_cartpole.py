"""`make bench-cartpole`: time and agent steps to a mean evaluation return of 475 on CartPole-v1,
over the seeds in experiments/configs/cartpole.json; median, min and max.
Writes experiments/results/cartpole/cartpole.{csv,md} and a curve PNG."""
from __future__ import annotations

import argparse
import csv
import json
import statistics
import time

import pandas as pd

from benchlib import RUNS, header, load_config, markdown_table, results_dir, run_trainer


def main():
    config = load_config("cartpole")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="*", default=config["seeds"])
    parser.add_argument("--max-seconds", type=float, default=config["max_seconds"])
    args = parser.parse_args()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    rows, run_dirs = [], []
    for seed in args.seeds:
        run_dir = RUNS / "cartpole" / f"{stamp}-s{seed}"
        run_dirs.append(run_dir)
        code = run_trainer(["--env", config["env"], *config["flags"], "--seed", seed, "--target-return",
                            config["target_return"], "--max-seconds", args.max_seconds, "--no-progress",
                            "--run-dir", run_dir])
        session = json.loads((run_dir / "meta.json").read_text())["sessions"][-1]
        evals = pd.read_csv(run_dir / "eval.csv")
        reached = session["ended"] == "target_return"
        rows.append({
            "seed": seed, "reached_475": reached, "exit_code": code,
            "time_s": float(evals["time_s"].iloc[-1]) if reached else float("nan"),
            "global_step": int(evals["global_step"].iloc[-1]) if reached else -1,
            "final_eval_mean": (float(evals.groupby("global_step")["episode_return"].mean().iloc[-1])
                                if len(evals) else float("nan")),
            "run_dir": run_dir.relative_to(RUNS.parent.parent),
        })
    out_dir = results_dir("cartpole")
    with open(out_dir / "cartpole.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    done = [r for r in rows if r["reached_475"]]
    summary = []
    if done:
        for key in ("time_s", "global_step"):
            values = [float(r[key]) for r in done]
            summary.append({"measure": key, "median": statistics.median(values), "min": min(values),
                            "max": max(values)})
    from hogwild_a3c.plot import plot_runs

    plot_runs(run_dirs, out_dir / "cartpole.png", "CartPole-v1, 3 seeds: evaluation return")
    text = header("CartPole-v1 to a mean evaluation return of 475", "make bench-cartpole",
                  {"flags": " ".join(config["flags"]), "seeds": args.seeds,
                   "budget": f"{args.max_seconds:g} s per seed",
                   "reached": f"{len(done)} of {len(rows)} seeds"})
    text += "\n" + markdown_table(rows, list(rows[0]))
    if summary:
        text += "\n" + markdown_table(summary, ["measure", "median", "min", "max"])
    text += "\n![curves](cartpole.png)\n"
    (out_dir / "cartpole.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
