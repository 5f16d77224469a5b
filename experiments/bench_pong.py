"""`make bench-pong`: one Pong run (no sticky actions, the anchors' setting) until a mean
evaluation return of +18 or the time budget; writes its curve and the time to +18.
Long: a target to run, not part of `make test`. `ARGS='--resume RUN_DIR'` continues a run."""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd

from benchlib import RESULTS, RUNS, header, load_config, markdown_table, run_trainer


def main():
    config = load_config("pong")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-seconds", type=float, default=config["max_seconds"])
    parser.add_argument("--num-workers", type=int, help="default: one per core")
    parser.add_argument("--resume", type=Path, help="continue this run directory instead of starting one")
    parser.add_argument("--report-only", type=Path, metavar="RUN_DIR", help="only write the result files for RUN_DIR")
    args = parser.parse_args()
    if args.report_only:
        run_dir = args.report_only.resolve()
    elif args.resume:
        run_dir = args.resume.resolve()
        run_trainer(["--resume", run_dir, "--max-seconds", args.max_seconds, "--no-progress"])
    else:
        run_dir = RUNS / "pong" / f"{time.strftime('%Y%m%d-%H%M%S')}-s{config['seed']}"
        extra = ["--num-workers", args.num_workers] if args.num_workers else []
        run_trainer(["--env", config["env"], *config["flags"], *extra, "--seed", config["seed"], "--target-return",
                     config["target_return"], "--max-seconds", args.max_seconds, "--no-progress", "--run-dir", run_dir])
    report(Path(run_dir), config, args.max_seconds)


def report(run_dir: Path, config: dict, max_seconds: float) -> None:
    from hogwild_a3c.plot import plot_runs

    meta = json.loads((run_dir / "meta.json").read_text())
    evals = pd.read_csv(run_dir / "eval.csv")
    per_eval = evals.groupby(["global_step", "time_s"], as_index=False)["episode_return"].mean()
    reached = per_eval[per_eval["episode_return"] >= config["target_return"]]
    progress = pd.read_csv(run_dir / "progress.csv")
    row = {
        "run": run_dir.name,
        "workers": json.loads((run_dir / "config.json").read_text())["num_workers"],
        "hours_run": progress["time_s"].iloc[-1] / 3600,
        "steps": int(progress["global_step"].iloc[-1]),
        "median_steps_per_s": float(progress["steps_per_s"].median()),
        "best_eval_mean": float(per_eval["episode_return"].max()) if len(per_eval) else float("nan"),
        "last_eval_mean": float(per_eval["episode_return"].iloc[-1]) if len(per_eval) else float("nan"),
        "hours_to_+18": float(reached["time_s"].iloc[0] / 3600) if len(reached) else "not reached",
        "steps_to_+18": int(reached["global_step"].iloc[0]) if len(reached) else "not reached",
        "ended": meta["sessions"][-1]["ended"],
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    plot_runs([run_dir], RESULTS / "pong.png", "Pong (no sticky actions): evaluation return")
    text = header("Pong to a mean evaluation return of +18", "make bench-pong",
                  {"flags": " ".join(config["flags"]), "budget": f"{max_seconds:g} s of run time in all",
                   "sessions": "; ".join(f"{s['start']} -> {s['end']}: {s['ended']}" for s in meta["sessions"])})
    text += "\n" + markdown_table([row], list(row)) + "\n![Pong curve](pong.png)\n"
    (RESULTS / "pong.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
