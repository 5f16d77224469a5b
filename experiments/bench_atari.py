"""`make bench-atari`: Atari games beyond Pong with the default flags, each game for a budget of
agent steps (2.5M = 10M frames by default), then SB3 PPO with rl-zoo's Atari settings on the
same game for the same wall time (experiments/peers/sb3/ppo_atari.py), one run after another so each
has the whole machine.

The games are `ALE/<Game>-v5` as Gymnasium makes them: sticky actions 0.25, whole games,
evaluation under the same settings. Only `--env` and `--seed` reach the trainer besides the
harness (budget, run dir, no progress bar). Per game: the mean of the last 100 training episodes
(both agents), the best and last evaluation means (ours: 5 episodes a minute in its own
process, part of the wall time), minutes, steps/s, and the human-normalized score
`(score - random) / (human - random)` with the DQN Nature paper's random and human scores; at
the end the median of those over the games; then ours per game, the mean over seeds (2 by
default), beside Dopamine's DQN, Rainbow and IQN at 10M frames (configs/atari.json), with the
median human-normalized score of those means, the games at or above Rainbow and those below DQN;
and one figure with a panel per game, Dopamine's DQN and Rainbow drawn as lines.

`GAMES="Breakout Qbert"` and `SEEDS="0 1"` choose (a session can run a few games; the report
reads every finished run under experiments/runs/atari/ of the same name, and keeps the rows and
curves of games run elsewhere from experiments/results/atari/, whose runs are not committed); `--extra-flags` tries
a variant (`--out NAME` keeps its table apart); `--no-reference` skips PPO. Writes
experiments/results/atari/NAME.{md,csv,png}.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from benchlib import EXPERIMENTS, RUNS, glue_flag_values, header, load_config, markdown_table, results_dir, run_trainer

WINDOW = 100  # training episodes in the final mean, as the Atari literature reports
FAILED = "bench-failed"  # marks a run the report leaves out


def main():
    config = load_config("atari")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", nargs="+", default=os.environ.get("GAMES", "").split() or config["default_games"])
    parser.add_argument("--seeds", type=int, nargs="+",
                        default=[int(s) for s in os.environ.get("SEEDS", "").split()] or config["seeds"])
    parser.add_argument("--steps", type=int, default=config["steps"], help="agent steps per game (4 frames each)")
    parser.add_argument("--extra-flags", default="", help="trainer flags for every run (a variant, not the default)")
    parser.add_argument("--no-reference", action="store_true", help="do not run SB3 PPO")
    parser.add_argument("--report-only", action="store_true", help="only rewrite the result files from finished runs")
    parser.add_argument("--out", default=None, help="results file stem (default: atari, or atari-variant with "
                                                     "--extra-flags)")
    args = parser.parse_args(glue_flag_values(sys.argv[1:]))
    unknown = [g for g in args.games if g not in config["games"]]
    if unknown:
        parser.error(f"GAMES: no random/human scores for {', '.join(unknown)}; known: {', '.join(config['games'])}")
    name = args.out or ("atari-variant" if args.extra_flags else "atari")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        parser.error(f"--out {name!r}: a file name of letters, digits, '.', '_' or '-'")
    if not (args.no_reference or args.report_only):
        try:
            import cv2  # noqa: F401
            import stable_baselines3  # noqa: F401
        except ImportError:
            raise SystemExit("error: the reference needs SB3 and OpenCV: pip install -e '.[bench]' "
                             "(make bench-atari does it), or give --no-reference") from None
    root = RUNS / "atari" / name
    if not args.report_only:
        for game in args.games:
            for seed in args.seeds:
                run_game(game, seed, args, root)
    report(root, config, name, args)


def run_game(game: str, seed: int, args, root: Path) -> None:
    env_id = f"ALE/{game}-v5"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = root / f"{stamp}-{game}-s{seed}"
    code = run_trainer(["--env", env_id, *shlex.split(args.extra_flags), "--seed", seed, "--max-steps", args.steps,
                        "--no-progress", "--run-dir", run_dir])
    if code != 0 or not (run_dir / "progress.csv").is_file():
        if run_dir.is_dir():
            (run_dir / FAILED).write_text(f"the trainer ended with exit {code}\n")  # the report leaves it out
        print(f"{game} seed {seed}: the trainer failed (exit {code}); see {run_dir}", flush=True)
        return
    if args.no_reference:
        return
    budget = float(pd.read_csv(run_dir / "progress.csv")["time_s"].iloc[-1])
    out = root / f"{stamp}-{game}-s{seed}-ppo"
    out.mkdir(parents=True)
    command = [sys.executable, str(EXPERIMENTS / "peers" / "sb3" / "ppo_atari.py"), env_id, str(seed), str(budget),
               str(out / "episodes.csv")]
    print(f"$ peers/sb3/ppo_atari.py {env_id} {seed} {budget:.0f}", flush=True)
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"{game} seed {seed}: SB3 PPO failed:\n{proc.stderr[-2000:]}", flush=True)
        return
    (out / "result.json").write_text(proc.stdout.strip().splitlines()[-1] + "\n")


def normalized(score: float, game: str, config: dict) -> float:
    random, human = config["games"][game]["random"], config["games"][game]["human"]
    return (score - random) / (human - random)


def ours_row(run_dir: Path, game: str, config: dict) -> dict:
    episodes = pd.read_csv(run_dir / "episodes.csv")
    progress = pd.read_csv(run_dir / "progress.csv")
    evals = pd.read_csv(run_dir / "eval.csv") if (run_dir / "eval.csv").is_file() else pd.DataFrame()
    per_eval = (evals.groupby("global_step")["episode_return"].mean() if len(evals) else pd.Series(dtype=float))
    final = float(episodes["episode_return"].tail(WINDOW).mean())
    seconds = float(progress["time_s"].iloc[-1])
    steps = int(progress["global_step"].iloc[-1])
    return {"game": game, "agent": "hogwild_a3c", "seed": int(run_dir.name.rsplit("-s", 1)[1]), "steps": steps,
            "minutes": seconds / 60, "steps_per_s": steps / seconds, f"train_mean_{WINDOW}": final,
            "best_eval": float(per_eval.max()) if len(per_eval) else float("nan"),
            "last_eval": float(per_eval.iloc[-1]) if len(per_eval) else float("nan"),
            "human_normalized": normalized(final, game, config)}


def ppo_row(out: Path, game: str, config: dict) -> dict | None:
    if not (out / "result.json").is_file():
        return None
    result = json.loads((out / "result.json").read_text())
    episodes = pd.read_csv(out / "episodes.csv")
    final = float(episodes["episode_return"].tail(WINDOW).mean()) if len(episodes) else float("nan")
    return {"game": game, "agent": "SB3 PPO (rl-zoo)", "seed": int(out.name.rsplit("-s", 1)[1].split("-")[0]),
            "steps": result["steps"], "minutes": result["time_s"] / 60,
            "steps_per_s": result["steps"] / result["time_s"],
            f"train_mean_{WINDOW}": final, "best_eval": "-", "last_eval": "-",
            "human_normalized": normalized(final, game, config)}


def curve(episodes: pd.DataFrame, points: int = 400) -> pd.DataFrame:
    """The training curve kept with the results (the runs themselves are not committed), thinned
    to about `points` rows."""
    table = pd.DataFrame({"minutes": episodes["time_s"] / 60,
                          "train_mean": episodes["episode_return"].rolling(WINDOW, min_periods=10).mean()}).dropna()
    every = max(1, len(table) // points)
    return table.iloc[[*range(0, len(table) - 1, every), len(table) - 1]] if len(table) else table


def gather(root: Path, config: dict, curves: Path) -> list[dict]:
    """Rows of every finished run of this name, their curves written under `curves`."""
    rows = []
    curves.mkdir(parents=True, exist_ok=True)
    for run_dir in sorted(p for p in root.glob("*-s*") if (p / "progress.csv").is_file() and not (p / FAILED).exists()):
        game = run_dir.name.split("-")[2]
        rows.append(ours_row(run_dir, game, config))
        curve(pd.read_csv(run_dir / "episodes.csv")).to_csv(curves / f"{run_dir.name}.csv", index=False)
        ppo_dir = run_dir.with_name(run_dir.name + "-ppo")
        ppo = ppo_row(ppo_dir, game, config)
        if ppo is not None:
            rows.append(ppo)
            curve(pd.read_csv(ppo_dir / "episodes.csv")).to_csv(curves / f"{ppo_dir.name}.csv", index=False)
    return rows


def earlier_rows(table: Path, rows: list[dict]) -> list[dict]:
    """Rows of the committed table for games and seeds with no run on this machine: games run in
    other sessions stay in the table (and their committed curves in the figure). A game and seed
    run here replaces both of its committed rows, so a PPO row never sits beside another run's."""
    if not table.is_file():
        return []
    here = {(r["game"], r["seed"]) for r in rows}
    kept = [row for row in pd.read_csv(table).to_dict("records") if (row["game"], row["seed"]) not in here]
    for row in kept:
        for key in ("best_eval", "last_eval"):
            row[key] = "-" if row[key] in ("-", None) or pd.isna(row[key]) else float(row[key])
    return kept


def panels_from(curves: Path, rows: list[dict]) -> dict[str, list[tuple[str, pd.DataFrame, str]]]:
    """One panel per game of the table, the latest curve of each agent and seed."""
    wanted = {(r["game"], r["agent"] != "hogwild_a3c", int(r["seed"])) for r in rows}
    latest = {}
    for path in sorted(curves.glob("*.csv")):
        stem = path.stem.removesuffix("-ppo")
        game, seed = stem.split("-")[2], int(stem.rsplit("-s", 1)[1])
        key = (game, path.stem.endswith("-ppo"), seed)
        if key in wanted:
            latest[key] = path
    panels: dict[str, list] = {}
    for (game, is_ppo, seed), path in sorted(latest.items()):
        label = ("SB3 PPO" if is_ppo else "hogwild_a3c") + f" seed {seed}"
        colour = f"C{(2 * seed + int(is_ppo)) % 10}"  # one per agent and seed: two seeds' curves stay apart
        panels.setdefault(game, []).append((label, pd.read_csv(path), colour))
    return panels


def per_game(rows: list[dict], config: dict) -> list[dict]:
    """Ours per game, the mean over its seeds, beside Dopamine's agents at 10M frames."""
    table = []
    for game in dict.fromkeys(r["game"] for r in rows if r["agent"] == "hogwild_a3c"):
        ours = [r for r in rows if r["game"] == game and r["agent"] == "hogwild_a3c"]
        scores = [float(r[f"train_mean_{WINDOW}"]) for r in ours]
        mean = statistics.mean(scores)
        anchors = config["games"][game].get("dopamine_10M_frames")
        if anchors is None:  # a game Dopamine's baselines do not have: no row to compare
            continue
        table.append({"game": game, "seeds": len(ours), "per_seed": " / ".join(f"{v:,.1f}" for v in scores),
                      "ours_mean": mean, "human_normalized": normalized(mean, game, config),
                      **{f"{agent}_10M": value for agent, value in anchors.items()},
                      "of_Rainbow": mean / anchors["Rainbow"]})
    return table


def anchor_summary(by_game: list[dict]) -> dict:
    """Issue 37's yardsticks: the median human-normalized score over games, games at Rainbow's
    10M-frame score or above, and games below DQN's."""
    return {"games": len(by_game),
            "median_human_normalized": statistics.median(g["human_normalized"] for g in by_game),
            "at_or_above_Rainbow": sum(g["ours_mean"] >= g["Rainbow_10M"] for g in by_game),
            "below_DQN": sum(g["ours_mean"] < g["DQN_10M"] for g in by_game)}


def report(root: Path, config: dict, name: str, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = results_dir("atari")
    curves = out / "curves" / name
    rows = gather(root, config, curves)
    rows += earlier_rows(out / f"{name}.csv", rows)
    rows.sort(key=lambda r: (list(config["games"]).index(r["game"]), r["seed"], r["agent"] != "hogwild_a3c"))
    panels = panels_from(curves, rows)
    if not rows:
        raise SystemExit(f"error: no finished run under {root} and no {out / (name + '.csv')}")
    for row in rows:
        row["A3C paper (16 cores, 1 day)"] = config["games"][row["game"]]["a3c_ff_1_day"]
    by_game = per_game(rows, config)
    summary = []
    for agent in dict.fromkeys(r["agent"] for r in rows):
        scores = [r["human_normalized"] for r in rows if r["agent"] == agent]
        summary.append({"agent": agent, "games": len({r["game"] for r in rows if r["agent"] == agent}),
                        "median_human_normalized": statistics.median(scores),
                        "games_above_0.1": sum(s > 0.1 for s in scores)})
    figure, axes = plt.subplots(1, max(1, len(panels)), figsize=(4.2 * max(1, len(panels)), 3.4), squeeze=False)
    for axis, (game, lines) in zip(axes[0], panels.items()):
        for label, table, colour in lines:
            axis.plot(table["minutes"], table["train_mean"], color=colour, label=label, alpha=0.9)
        anchors = config["games"][game].get("dopamine_10M_frames", {})
        for anchor, style in (("DQN", ":"), ("Rainbow", "--")):
            if anchor not in anchors:
                continue
            axis.axhline(anchors[anchor], color="grey", linestyle=style, linewidth=1,
                         label=f"Dopamine {anchor}, 10M frames")
        axis.set_title(game)
        axis.set_xlabel("minutes")
        axis.grid(alpha=0.3)
    axes[0][0].set_ylabel(f"mean of the last {WINDOW} training episodes")
    axes[0][0].legend()
    figure.tight_layout()
    figure.savefig(out / f"{name}.png", dpi=110)
    # The header must rerun these rows as they were run: the seeds and the file name too, or a
    # variant's command would write over the default table.
    with_reference = any(r["agent"] != "hogwild_a3c" for r in rows)
    options = " ".join([*([f"--steps {args.steps}"] if args.steps != config["steps"] else []),
                        *([f'--extra-flags "{args.extra_flags}"'] if args.extra_flags else []),
                        *([f"--out {name}"] if args.out else []),
                        *([] if with_reference else ["--no-reference"])])
    games = " ".join(dict.fromkeys(r["game"] for r in rows))
    seeds = sorted({r["seed"] for r in rows})
    command = (f"make bench-atari GAMES=\"{games}\""
               + (f" SEEDS=\"{' '.join(map(str, seeds))}\"" if seeds != sorted(config["seeds"]) else "")
               + (f" ARGS='{options}'" if options else ""))
    title = (f"Atari, variant: {args.extra_flags}" if args.extra_flags
             else "Atari beyond Pong, default flags"
             + (", against SB3 PPO at equal wall time" if with_reference else ""))
    text = header(title, command, {
                      "games": "ALE/<Game>-v5: sticky actions 0.25, whole games, evaluation the same",
                      "trainer flags": f"--env ALE/<Game>-v5 --seed S {args.extra_flags}".strip()
                                       + f" (harness: --max-steps {args.steps} --no-progress --run-dir DIR)",
                      "reference": ("SB3 PPO with rl-zoo's Atari settings for our run's wall time "
                                    "(experiments/peers/sb3/ppo_atari.py), run after ours on the same machine"
                                    if with_reference else "none (--no-reference)"),
                      "human_normalized": "(train_mean - random) / (human - random), DQN Nature paper's scores",
                      "anchors": "Dopamine's DQN, Rainbow and IQN at 10M frames (2.5M agent steps; these runs: "
                                 f"{statistics.median(r['steps'] for r in rows):,.0f} steps, the median), "
                                 "sticky actions 0.25, mean training return of 5 runs "
                                 "(google/dopamine baselines/atari/data, iteration 9); per game below, ours is the "
                                 "mean over seeds of the last 100 training episodes",
                  })
    text += "\n" + markdown_table(rows, list(rows[0])) + "\n" + markdown_table(summary, list(summary[0]))
    if by_game:
        text += "\n" + markdown_table(by_game, list(by_game[0])) + "\n" + markdown_table(
            [anchor_summary(by_game)], list(anchor_summary(by_game)))
    text += f"\n![Atari curves]({name}.png)\n"
    (out / f"{name}.md").write_text(text)
    pd.DataFrame(rows).to_csv(out / f"{name}.csv", index=False)
    print(text)


if __name__ == "__main__":
    main()
