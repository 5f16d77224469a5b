"""`make bench-pong-compare`: one Pong configuration and seed run under several variants, each to
the same number of agent steps, and their learning curves drawn side by side against steps.

The variants live in experiments/configs/pong_compare.json: universe-starter-agent's exact algorithm
(`--preset universe`: K=1, 20-step rollouts, Adam 1e-4) and the default (`atari` preset); a variant
may name a `commit`, run from a temporary git worktree of that commit. Each figure has the curves
against agent steps (sample efficiency) and against wall time (what a user waits). Hogwild runs
are not repeatable step for step even with one seed (the workers' interleaving differs), so the
comparison is of curves, not of numbers.

A variant whose run directory already holds a finished run is not run again (`--rerun` forces it),
so the variants can be run one at a time: `ARGS='--variants default'`.
Writes experiments/results/pong-compare/pong_compare.{md,csv,png}.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
from pathlib import Path

from benchlib import REPO, RUNS, header, load_config, markdown_table, results_dir, run_trainer
from hogwild_a3c.files.logs import load_run
from hogwild_a3c.plot import eval_curve, plot_runs

# A commit variant runs its own code; every thread pool is held to one thread from outside
# because commits before 04e9cd1 did not do it for their children.
ONE_THREAD = {name: "1" for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}


def worktree_for(commit: str) -> Path:
    path = RUNS / "worktrees" / commit
    if not (path / "hogwild_a3c").is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "worktree", "add", "--force", "--detach", str(path), commit], cwd=REPO, check=True)
    return path


def finished(run_dir: Path) -> bool:
    meta = run_dir / "meta.json"
    if not meta.is_file():
        return False
    sessions = json.loads(meta.read_text()).get("sessions", [])
    return bool(sessions) and sessions[-1].get("ended") == "max_steps"


def run_variant(variant: dict, config: dict, run_dir: Path, max_steps: int) -> None:
    args = ["--env", config["env"], *config["flags"], *variant["flags"], "--seed", config["seed"],
            "--max-steps", max_steps, "--no-progress", "--run-dir", run_dir]
    if "commit" in variant:
        run_trainer(args, cwd=worktree_for(variant["commit"]), env={**os.environ, **ONE_THREAD})
    else:
        run_trainer(args)


def summarise(name: str, variant: dict, run_dir: Path, report_at: list[int]) -> dict:
    run = load_run(run_dir)
    episodes = run["episodes"].sort_values("global_step")
    eval_steps, eval_means = eval_curve(run, "global_step")
    last = episodes.iloc[-1]
    # Rate after the first tenth of the steps, so start-up does not count.
    settled = episodes[episodes["global_step"] >= 0.1 * last["global_step"]].iloc[0]
    row = {
        "variant": name,
        "commit": str(run["meta"].get("git_commit") or "")[:7],
        "flags": " ".join(variant["flags"]) or "-",
        "steps": int(last["global_step"]),
        "steps_per_s": float((last["global_step"] - settled["global_step"])
                             / max(last["time_s"] - settled["time_s"], 1e-9)),
    }
    for step in report_at:
        # Training return: the last 50 finished episodes (all workers) before this step.
        before = episodes[episodes["global_step"] <= step].tail(50)
        row[f"train_{step // 1000}k"] = float(before["episode_return"].mean()) if len(before) else float("nan")
    for step in report_at:
        made = eval_means[eval_steps <= step]
        row[f"eval_{step // 1000}k"] = float(made[-1]) if len(made) else float("nan")
    return row


def main():
    config = load_config("pong_compare")
    names = [v["name"] for v in config["variants"]]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="*", default=names, choices=names, help="variants to run (default: all)")
    parser.add_argument("--max-steps", type=int, default=config["max_steps"])
    parser.add_argument("--rerun", action="store_true", help="run a variant again even if a finished run exists")
    parser.add_argument("--report-only", action="store_true", help="only write the result files from existing runs")
    args = parser.parse_args()
    variants = {v["name"]: v for v in config["variants"]}
    base = RUNS / "pong_compare" / f"s{config['seed']}-{args.max_steps}"
    if not args.report_only:
        for name in args.variants:
            run_dir = base / name
            if finished(run_dir) and not args.rerun:
                print(f"{name}: finished run in {run_dir}, not run again (--rerun to force)")
                continue
            if run_dir.exists():
                run_dir.rename(run_dir.with_name(f"{name}.old-{int(run_dir.stat().st_mtime)}"))
            run_variant(variants[name], config, run_dir, args.max_steps)
    done = [(name, base / name) for name in names if (base / name / "episodes.csv").is_file()]
    if not done:
        print(f"no runs under {base} yet")
        return
    rows = [summarise(name, variants[name], run_dir, config["report_at_steps"]) for name, run_dir in done]

    out_dir = results_dir("pong-compare")
    plot_runs([d for _, d in done], out_dir / "pong_compare.png",
              f"Pong, seed {config['seed']}, first {args.max_steps:,} steps: evaluation return (lines), "
              "training episodes (light)",
              labels=[name for name, _ in done])
    with open(out_dir / "pong_compare.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    text = header("Pong learning curves side by side: " + ", ".join(names), "make bench-pong-compare",
                  {"flags (all variants)": " ".join(config["flags"]), "seed": config["seed"],
                   "steps": f"{args.max_steps:,} agent steps each",
                   "variants": "; ".join(
                       f"{v['name']}: {v.get('commit', 'this checkout')} {' '.join(v['flags'])}".strip()
                       for v in config["variants"]),
                   **{f"why {v['name']}": v["why"] for v in config["variants"] if "why" in v},
                   "train_Nk": "mean return of the last 50 training episodes (all workers) finished by step N",
                   "eval_Nk": "mean of the last evaluation (5 episodes) made by step N"})
    text += "\n" + markdown_table(rows, list(rows[0])) + "\n![side by side](pong_compare.png)\n"
    (out_dir / "pong_compare.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
