"""`make bench-pong`: Pong (no sticky actions, the anchors' setting) with the default flags until a
mean evaluation return of +18 or the time budget (`--sticky`: ALE/Pong-v5 as it comes, sticky
actions 0.25, as `make train` runs it; results pong-sticky.md), once per seed (`SEEDS="0 1 2"`, the default),
one run after another so each has the whole machine; writes the time and steps to +18 of each
run, their median, the throughput, the evaluator's share of env steps and of CPU, and the curves.
After each run the raw env (the run's processes and envs on random actions, no model) is stepped
for 20 s (`raw_env.SECONDS`), so the trainer's steps/s is also given as a ratio to the machine's speed of that hour.

Only `--env` and `--env-kwargs repeat_action_probability=0.0` (none with `--sticky`) choose the algorithm: the rest of
the command line is the harness (seed, target, budget, run dir). Evaluation runs as in any run
(5 episodes every 60 s, in its own process) and its time is part of the wall time measured.
Long: a target to run, not part of `make test`. `--report-only RUN_DIR...` rewrites the result
files from finished runs. Results go to experiments/results/pong/: pong.md, or with `--extra-flags`
(a variant) pong-variant.md, or `--out NAME`.md so that one variant's table does not replace another's.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd

from benchlib import RUNS, glue_flag_values, header, load_config, markdown_table, results_dir, run_trainer
from raw_env import SECONDS, WARMUP, raw_env_steps_per_s

RAW_ENV_FILE = "raw_env.json"


def main():
    config = load_config("pong")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+",
                        default=[int(s) for s in os.environ.get("SEEDS", "").split()] or config["seeds"])
    parser.add_argument("--max-seconds", type=float, default=config["max_seconds"], help="budget of each run")
    parser.add_argument("--num-workers", type=int, help="default: one per core")
    parser.add_argument("--extra-flags", default="", help="flags added to every run (a variant, not the default)")
    parser.add_argument("--sticky", action="store_true",
                        help="ALE/Pong-v5 with its sticky actions (0.25), as `make train` runs it")
    parser.add_argument("--report-only", type=Path, nargs="+", metavar="RUN_DIR",
                        help="only write the result files for these runs")
    parser.add_argument("--out", help="name of the result files under experiments/results/pong/ "
                                      "(default: pong, or pong-variant with --extra-flags)")
    args = parser.parse_args(glue_flag_values(sys.argv[1:]))
    if args.out is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", args.out):
        parser.error(f"--out {args.out!r}: a file name of letters, digits, '.', '_' or '-' "
                     "(it becomes NAME.md and NAME.png)")
    stem = "pong-sticky" if args.sticky else "pong"
    name = args.out or (f"{stem}-variant" if args.extra_flags else stem)
    env_flags = [] if args.sticky else config["flags"]
    extra = shlex.split(args.extra_flags) + (["--num-workers", args.num_workers] if args.num_workers else [])
    if args.report_only:
        run_dirs, walls = [d.resolve() for d in args.report_only], {}
        kinds = {sticky_run(d) for d in run_dirs}
        if len(kinds) > 1 or kinds != {args.sticky}:
            parser.error("--report-only: the runs must all be sticky (give --sticky) or all without sticky actions "
                         f"(found {', '.join('sticky' if k else 'not sticky' for k in sorted(kinds))})")
    else:
        run_dirs, walls = [], {}
        for seed in args.seeds:
            run_dir = RUNS / stem / f"{time.strftime('%Y%m%d-%H%M%S')}-s{seed}"
            started = time.monotonic()
            code = run_trainer(["--env", config["env"], *env_flags, *extra, "--seed", seed,
                         "--target-return", config["target_return"], "--max-seconds", args.max_seconds,
                         "--no-progress", "--run-dir", run_dir])
            walls[run_dir] = time.monotonic() - started
            if code != 0 or not (run_dir / "progress.csv").is_file():
                # A failed run is reported, not counted as a miss: its time says nothing about learning.
                print(f"run for seed {seed} failed (exit {code}); see {run_dir}", flush=True)
                continue
            measure_raw_env(run_dir)
            run_dirs.append(run_dir)
    if not run_dirs:
        raise SystemExit("error: no run finished; nothing to report")
    report(run_dirs, walls, config, args.extra_flags, name, env_flags)


def sticky_run(run_dir: Path) -> bool:
    """Did the run keep ALE/Pong-v5's sticky actions (its config.json's env kwargs)?"""
    cfg = json.loads((run_dir / "config.json").read_text())
    return float((cfg.get("env_kwargs") or {}).get("repeat_action_probability", 0.25)) > 0


def measure_raw_env(run_dir: Path) -> None:
    """The raw env's steps/s with the run's processes and envs, measured right after the run on the
    same machine (whose speed drifts by hours), kept in the run dir for `--report-only`. A failure
    here is printed and leaves the run's row without the ratio: the runs still to come matter more."""
    from hogwild_a3c.envs.make import env_options

    cfg = json.loads((run_dir / "config.json").read_text())
    try:
        rate = raw_env_steps_per_s(cfg["env"], cfg["env_kwargs"], env_options(SimpleNamespace(**cfg)),
                                   max(1, cfg["num_workers"]), cfg["envs_per_worker"])
    except Exception as exc:  # noqa: BLE001 - any failure of the reference is reported, not fatal
        print(f"raw env after {run_dir.name}: not measured ({type(exc).__name__}: {exc})", flush=True)
        return
    (run_dir / RAW_ENV_FILE).write_text(json.dumps({"raw_env_steps_per_s": rate, "seconds": SECONDS,
                                                    "warmup": WARMUP}))
    print(f"raw env after {run_dir.name}: {rate:,.0f} steps/s", flush=True)


def run_row(run_dir: Path, wall_s: float | None, target: float) -> dict:
    meta = json.loads((run_dir / "meta.json").read_text())
    cfg = json.loads((run_dir / "config.json").read_text())
    evals = pd.read_csv(run_dir / "eval.csv")
    per_eval = evals.groupby(["global_step", "time_s"], as_index=False).agg(
        mean=("episode_return", "mean"), eval_steps=("episode_length", "sum"))
    reached = per_eval[per_eval["mean"] >= target]
    progress = pd.read_csv(run_dir / "progress.csv")
    at = reached.iloc[0] if len(reached) else None
    # Env steps the evaluator took up to the first +18 (or the end), against the workers' steps.
    upto = per_eval[per_eval["time_s"] <= at["time_s"]] if at is not None else per_eval
    train_steps = int(at["global_step"]) if at is not None else int(progress["global_step"].iloc[-1])
    eval_steps = int(upto["eval_steps"].sum())
    median_rate = float(progress["steps_per_s"].median())
    raw_file = run_dir / RAW_ENV_FILE
    raw = json.loads(raw_file.read_text())["raw_env_steps_per_s"] if raw_file.is_file() else None
    return {
        "run": run_dir.name,
        "preset": cfg.get("preset", "-"),
        "K": cfg["envs_per_worker"], "T": cfg["rollout_steps"], "lr": cfg["lr"],
        "workers": cfg["num_workers"],
        "minutes_to_+18": float(at["time_s"] / 60) if at is not None else "not reached",
        "steps_to_+18": int(at["global_step"]) if at is not None else "not reached",
        "median_steps_per_s": median_rate,
        "raw_env_steps_per_s": raw if raw else "-",
        "trainer_over_raw": median_rate / raw if raw else "-",
        "eval_share_of_env_steps": eval_steps / max(1, eval_steps + train_steps),
        # progress rows are evenly spaced in time, so their mean is the share over the run
        "eval_cpu_share": float(progress["eval_cpu_share"].mean()) if "eval_cpu_share" in progress else "-",
        "evaluations": len(upto),
        "best_eval_mean": float(per_eval["mean"].max()) if len(per_eval) else float("nan"),
        "minutes_run": float(progress["time_s"].iloc[-1] / 60),
        "budget_min": float(cfg["max_seconds"] / 60) if cfg.get("max_seconds") else "-",
        "start_and_stop_s": wall_s - float(progress["time_s"].iloc[-1]) if wall_s else "-",
        "ended": meta["sessions"][-1]["ended"],
    }


def report(run_dirs: list[Path], walls: dict, config: dict, extra_flags: str, name: str, env_flags: list) -> None:
    from hogwild_a3c.plot import plot_runs

    rows = [run_row(d, walls.get(d), config["target_return"]) for d in run_dirs]
    reached = [r for r in rows if isinstance(r["minutes_to_+18"], float)]
    summary = {
        "runs": len(rows),
        "reached_+18": len(reached),
        # A run that missed counts as slower than every run that reached it.
        "median_minutes_to_+18": _median_with_misses([r["minutes_to_+18"] for r in rows]),
        "median_steps_to_+18": _median_with_misses([r["steps_to_+18"] for r in rows]),
        "median_steps_per_s": statistics.median(r["median_steps_per_s"] for r in rows),
        "median_trainer_over_raw": _median_of_measured([r["trainer_over_raw"] for r in rows]),
        "median_eval_cpu_share": _median_of_measured([r["eval_cpu_share"] for r in rows]),
        "median_eval_share": statistics.median(r["eval_share_of_env_steps"] for r in rows),
    }
    out_dir = results_dir("pong")
    setting = "no sticky actions" if env_flags else "sticky actions 0.25"
    plot_runs(run_dirs, out_dir / f"{name}.png", f"Pong ({setting}): evaluation return",
              labels=[r["run"] for r in rows])
    given = shlex.join(sys.argv[1:])
    command = ("make bench-pong" + (f" ARGS={shlex.quote(given)}" if given else "")
               + (f" SEEDS={shlex.quote(os.environ['SEEDS'])}" if os.environ.get("SEEDS") else ""))
    text = header(f"Pong ({setting}) to a mean evaluation return of +18, default flags" if not extra_flags else
                  f"Pong ({setting}) to +18, variant: {extra_flags}", command,
                  {"algorithm flags": " ".join(["--env", config["env"], *env_flags, extra_flags]).strip(),
                   "harness flags": "--seed S --target-return 18 --max-seconds B --no-progress --run-dir DIR",
                   "budget": "budget_min per run (the run's --max-seconds)",
                   "wall time": "minutes_to_+18 is the trainer's clock at the first evaluation whose 5-episode mean "
                                "reached +18 (evaluation in its own process, sharing the cores); start_and_stop_s is "
                                "the rest of the command's wall time (imports, start-up, final checkpoint)",
                   "raw env": "raw_env_steps_per_s: the run's processes and envs (made as the run made them) stepping "
                              f"on random actions, no model, for {SECONDS:g} s right after the run; trainer_over_raw "
                              "is median_steps_per_s (progress.csv, evaluator running) over it",
                   "evaluator CPU": "eval_cpu_share: the evaluator's share of the CPU time of workers and evaluator "
                                    "(progress.csv's mean)"})
    text += "\n" + markdown_table(rows, list(rows[0])) + "\n" + markdown_table([summary], list(summary))
    text += f"\n![Pong curves]({name}.png)\n"
    (out_dir / f"{name}.md").write_text(text)
    print(text)


def _median_of_measured(values: list) -> float | str:
    """The median of the runs that have the figure ("-" or NaN where a run has not)."""
    measured = [v for v in values if not isinstance(v, str) and not math.isnan(v)]
    return statistics.median(measured) if measured else "-"


def _median_with_misses(values: list) -> float | str:
    ranked = sorted(values, key=lambda v: (isinstance(v, str), v if not isinstance(v, str) else 0))
    middle = ranked[(len(ranked) - 1) // 2] if len(ranked) % 2 else None
    if middle is not None:
        return middle
    a, b = ranked[len(ranked) // 2 - 1], ranked[len(ranked) // 2]
    return (a + b) / 2 if not isinstance(a, str) and not isinstance(b, str) else "not reached"


if __name__ == "__main__":
    main()
