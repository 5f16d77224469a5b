"""`make bench-classic`: wall time and agent steps for this trainer, run with no flags but --env
and --seed, and for SB3 A2C with rl-zoo's hyperparameters, to reach the same threshold of the
mean of the last 20 training episodes, on the same machine in the same run, seeds interleaved
(ours s1, SB3 s1, ours s2, ...), so load drift hits both alike.

Two clocks per run: `time_s` from the start of training (the trainer's own clock, which starts
before it spawns its workers; SB3's from just before it builds its envs), and `wall_s` from the
launch of the process (Python and torch imports included). The trainer is stopped with SIGINT
once its episodes.csv shows the threshold; SB3 stops itself (experiments/peers/sb3/a2c.py).
`load1` is the machine's 1-minute load average when the run started (the machine is shared).
Envs and settings: experiments/configs/classic.json. An env whose package is missing (Box2D
for LunarLander) is skipped with a note. Writes experiments/results/classic/classic.{md,csv}.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import statistics
import subprocess
import sys
import time

import numpy as np
import pandas as pd

from benchlib import EXPERIMENTS, RUNS, header, load_config, markdown_table, results_dir


def first_reach(episodes: pd.DataFrame, target: float, window: int):
    """(time_s, global_step) of the first training episode at which the mean of the last
    `window` episodes (across workers and envs, in the order they were logged) is >= target."""
    if len(episodes) < window:
        return None
    rolling = episodes["episode_return"].rolling(window).mean().to_numpy()
    hits = np.flatnonzero(rolling >= target)
    if not len(hits):
        return None
    row = episodes.iloc[hits[0]]
    return float(row["time_s"]), int(row["global_step"])


def run_ours(env: str, seed: int, target: float, window: int, budget_s: float, run_dir, extra: list[str]) -> dict:
    command = [sys.executable, "-m", "hogwild_a3c.train", "--env", env, "--seed", str(seed), *extra,
               "--max-seconds", str(budget_s), "--eval-episodes", "0", "--no-progress", "--run-dir", str(run_dir)]
    print("$", " ".join(command[1:]), flush=True)
    launched = time.time()
    proc = subprocess.Popen(command, cwd=EXPERIMENTS.parent, stderr=subprocess.DEVNULL)
    reached, wall = None, None
    while proc.poll() is None:
        time.sleep(0.1)
        path = run_dir / "episodes.csv"
        if reached is None and path.is_file():
            try:
                reached = first_reach(pd.read_csv(path), target, window)
            except (pd.errors.EmptyDataError, pd.errors.ParserError):
                continue
            if reached is not None:
                wall = time.time() - launched
                proc.send_signal(signal.SIGINT)
    proc.wait()
    episodes = pd.read_csv(run_dir / "episodes.csv")
    reached = reached or first_reach(episodes, target, window)
    final = float(episodes["episode_return"].tail(window).mean()) if len(episodes) else float("nan")
    if reached is None:
        return {"reached": False, "time_s": float("nan"), "wall_s": float("nan"), "steps": -1, "final_mean": final}
    time_s, steps = reached
    # The watcher sees a row up to ~0.35 s after it happened (0.25 s drain period + 0.1 s poll):
    # take the launch offset from its clock but the time to threshold from the trainer's.
    return {"reached": True, "time_s": time_s, "wall_s": wall if wall is not None else float("nan"), "steps": steps,
            "final_mean": final}


def run_sb3(env: str, seed: int, target: float, window: int, budget_s: float, settings: dict) -> dict:
    script = EXPERIMENTS / "peers" / "sb3" / "a2c.py"
    command = [sys.executable, str(script), env, str(seed), str(target), str(budget_s),
               repr(time.time()), json.dumps({**settings, "window": window})]
    print("$ peers/sb3/a2c.py", env, seed, target, flush=True)
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"peers/sb3/a2c.py failed:\n{out.stderr[-2000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if not result["reached"]:
        result.update(time_s=float("nan"), wall_s=float("nan"), steps=-1)
    return result


def env_available(env: str) -> str | None:
    import gymnasium as gym

    try:
        gym.make(env).close()
    except Exception as exc:  # noqa: BLE001 - e.g. Box2D not installed
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    return None


REFERENCE = "sb3_a2c"  # the reference's name in the tables (config "reference" overrides it)


def main(bench: str = "classic"):
    """`bench`: the config (experiments/configs/<bench>.json) and the results folder."""
    config = load_config(bench)
    reference = config.get("reference", REFERENCE)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="*", default=config["seeds"])
    parser.add_argument("--envs", nargs="*", default=[e["env"] for e in config["envs"]])
    parser.add_argument("--flags", default="",
                        help="extra trainer flags (default none: the point is that none are needed)")
    parser.add_argument("--out", default=bench, help=f"results file stem under experiments/results/{bench}/")
    args = parser.parse_args()
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        raise SystemExit(
            f"error: make bench-{bench} needs SB3: pip install -e '.[bench]' (make bench-{bench} does it)"
        ) from None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    window = int(config["window"])
    rows, notes = [], []
    for spec in config["envs"]:
        env = spec["env"]
        if env not in args.envs:
            continue
        missing = env_available(env)
        if missing:
            notes.append(f"{env} skipped: {missing} (install the `{spec.get('optional', '')}` extra)")
            print(notes[-1], flush=True)
            continue
        for seed in args.seeds:
            for agent in ("hogwild_a3c", reference):
                load1 = round(os.getloadavg()[0], 2)  # this machine is shared: how busy it was
                if agent == "hogwild_a3c":
                    run_dir = RUNS / bench / f"{stamp}-{env.replace(':', '_')}-s{seed}"
                    result = run_ours(env, seed, spec["target"], window, spec["budget_s"], run_dir, args.flags.split())
                    result["run_dir"] = str(run_dir.relative_to(EXPERIMENTS.parent))
                else:
                    result = run_sb3(env, seed, spec["target"], window, spec["budget_s"], spec["sb3"])
                    result["run_dir"] = ""
                row = {"env": env, "target": spec["target"], "agent": agent, "seed": seed, **result, "load1": load1}
                rows.append(row)
                print(json.dumps(row), flush=True)
                render(rows, notes, config, args.seeds, args.flags, args.out, bench)
    print(render(rows, notes, config, args.seeds, args.flags, args.out, bench))


def render(rows: list[dict], notes: list[str], config: dict, seeds: list[int], flags: str, out: str,
           bench: str = "classic") -> str:
    """Write experiments/results/<bench>/<out>.{csv,md} from the runs so far (called after every run, so
    an interrupted benchmark still leaves its table)."""
    window = int(config["window"])
    out_dir = results_dir(bench)
    columns = ["env", "target", "agent", "seed", "reached", "time_s", "wall_s", "steps", "final_mean", "load1",
               "run_dir"]
    with open(out_dir / f"{out}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows({c: r[c] for c in columns} for r in rows)
    summary = []
    for env in dict.fromkeys(r["env"] for r in rows):
        for agent in ("hogwild_a3c", config.get("reference", REFERENCE)):
            runs = [r for r in rows if r["env"] == env and r["agent"] == agent]
            if not runs:  # the table is written after every run, before each agent has one
                continue
            done = [r for r in runs if r["reached"]]
            # A seed that never reached the target counts as the budget (so the median is honest).
            budget = next(s["budget_s"] for s in config["envs"] if s["env"] == env)
            times = [r["time_s"] if r["reached"] else budget for r in runs]
            summary.append({
                "env": env, "agent": agent, "reached": f"{len(done)}/{len(runs)}",
                "median time_s": statistics.median(times), "min": min(times), "max": max(times),
                "median wall_s": statistics.median([r["wall_s"] if r["reached"] else budget for r in runs]),
                "median steps": statistics.median([r["steps"] for r in done]) if done else float("nan"),
            })
    import stable_baselines3

    extra = {
        "what": f"first time the mean of the last {window} training episodes reaches the target; "
                f"median of seeds {seeds}",
        "hogwild_a3c flags": f"--env ENV --seed S{(' ' + flags) if flags else ''} "
                             "(no tuning flags; --eval-episodes 0 --no-progress for the benchmark)",
        "SB3": f"stable-baselines3 {stable_baselines3.__version__}, " + config.get("reference_about", (
            "A2C MlpPolicy, rl-zoo settings per env in experiments/configs/classic.json (LunarLander: rl-zoo's lr "
            "8.3e-4 held constant, since rl-zoo decays it linearly over its own step budget), torch threads 1")),
    }
    title = config.get("title", "Classic control: this trainer with no flags against SB3 A2C (rl-zoo)")
    text = header(title, f"make bench-{bench}", extra)
    text += "\n" + markdown_table(summary, list(summary[0])) if summary else "\nno runs\n"
    text += "\n" + markdown_table(rows, columns) if rows else ""
    for note in notes:
        text += f"\n- {note}\n"
    (out_dir / f"{out}.md").write_text(text)
    return text


if __name__ == "__main__":
    # `make bench-minigrid` is this protocol with experiments/configs/minigrid.json.
    suite = argparse.ArgumentParser(add_help=False)
    suite.add_argument("--suite", choices=["classic", "minigrid"], default="classic")
    known, rest = suite.parse_known_args()
    sys.argv[1:] = rest
    main(known.suite)
