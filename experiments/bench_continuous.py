"""`make bench-continuous`: this trainer with no flags against SB3 PPO and A2C (rl-zoo) at equal wall time.

This trainer, run with no flags but --env and --seed, against SB3 PPO and SB3 A2C with rl-zoo's
hyperparameters for each env (SB3 SAC beside them as an informational row), each for the same wall
time; then each final policy is played for 10 deterministic episodes on a fresh env. Seeds
interleaved per env (ours s0, PPO s0, A2C s0, SAC s0, ours s1, ...), so load drift hits all alike.

The budget is training time on each agent's own clock: the trainer's `--max-seconds` (its clock
starts before it spawns its workers) and, for SB3, from just before it builds its envs
(experiments/peers/sb3/continuous.py stops it between env steps and inside an update). Python and
torch imports and the final evaluation are outside it. The trainer runs as it would by default:
one worker per core and its evaluator process (5 episodes every 60 s) on the same cores; SB3 runs
in one process, DummyVecEnv, one torch thread, as `make bench-classic` runs it.

Per run: `eval_mean`/`eval_std` of the final policy (10 episodes, greedy: the Gaussian's mean;
SB3 with its VecNormalize statistics frozen and raw rewards), whether that meets the env's goal,
`best_eval` (ours: the best mean its own evaluator logged during the run, eval.csv), `train_last20`
(the mean raw return of the last 20 training episodes), `steps` (agent steps, all envs) and
`time_s` (training time). `load1` is the machine's 1-minute load average when the run started.
Envs, budgets, goals and the rl-zoo settings: experiments/configs/continuous.json. An env whose
package is missing (Box2D, MuJoCo) is skipped with a note. Writes
experiments/results/continuous/<date>-continuous.{md,csv} (or --out), rewritten after every run.
"""
from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from benchlib import EXPERIMENTS, REPO, RUNS, header, markdown_table, results_dir

BENCH = "continuous"
OURS = "hogwild_a3c"
AGENTS = (OURS, "sb3_ppo", "sb3_a2c", "sb3_sac")
ALIASES = {"ours": OURS, "ppo": "sb3_ppo", "a2c": "sb3_a2c", "sac": "sb3_sac"}
INFORMATIONAL = {"sb3_sac"}  # shown, not raced: an off-policy method, outside A3C's family
COLUMNS = ["env", "goal", "agent", "seed", "status", "eval_mean", "eval_std", "goal_met", "best_eval",
           "train_last20", "steps", "time_s", "load1", "run_dir"]
EPISODE_LINE = re.compile(r"^episode \d+: return (\S+),")
NAN = float("nan")


def config_path(name: str) -> Path:
    """experiments/configs/<name>.json, or `name` itself when it is a path to a .json file."""
    return Path(name) if name.endswith(".json") else EXPERIMENTS / "configs" / f"{name}.json"


def shown_path(path: Path) -> str:
    """`path` relative to the repository where it lies inside it."""
    path = path.resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def load_config(name: str) -> dict:
    return json.loads(config_path(name).read_text())


def child_env() -> dict:
    """The environment of the runs: this checkout's `hogwild_a3c` first on the path, so the runs can
    start in a scratch folder (MuJoCo writes MUJOCO_LOG.TXT into the working directory)."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(REPO) + (os.pathsep + path if path else "")}


def last_line(text: str) -> str:
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1][:200].replace("|", "/") if lines else ""  # a `|` would split the markdown table's cell


def run_process(command: list[str], timeout_s: float, cwd: Path) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `command`; past `timeout_s` it gets SIGINT (the trainer saves
    and stops), then SIGKILL a minute later."""
    proc = subprocess.Popen(command, cwd=cwd, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        err = (err or "") + f"\n(stopped after {timeout_s:.0f} s)"
    return proc.returncode, out or "", err or ""


def empty_result(status: str) -> dict:
    return {"status": status, "eval_mean": NAN, "eval_std": NAN, "best_eval": NAN, "train_last20": NAN,
            "steps": -1, "time_s": NAN}


def read_csv(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path)
    except (FileNotFoundError, pd.errors.EmptyDataError, pd.errors.ParserError):
        return pd.DataFrame()


def best_evaluation(run_dir: Path) -> float:
    """The best mean of one evaluation in eval.csv (a row per episode; an evaluation's episodes
    share its time_s and global_step)."""
    evals = read_csv(run_dir / "eval.csv")
    if evals.empty:
        return NAN
    return float(evals.groupby(["time_s", "global_step"])["episode_return"].mean().max())


def run_ours(env: str, seed: int, budget_s: float, run_dir: Path, flags: list[str], episodes: int,
             eval_seed: int) -> dict:
    command = [sys.executable, "-m", "hogwild_a3c.train", "--env", env, "--seed", str(seed), *flags,
               "--max-seconds", f"{budget_s:g}", "--no-progress", "--run-dir", str(run_dir)]
    print("$", " ".join(command[1:]), flush=True)
    code, _out, err = run_process(command, budget_s * 1.5 + 300, run_dir.parent)
    checkpoint = run_dir / "checkpoints" / "latest.pt"
    if code != 0 or not checkpoint.exists():
        return empty_result(f"failed: exit {code}: {last_line(err)}")
    result = empty_result("ok")
    episodes_log = read_csv(run_dir / "episodes.csv")
    if not episodes_log.empty:
        result["train_last20"] = float(episodes_log["episode_return"].tail(20).mean())
    session = json.loads((run_dir / "meta.json").read_text())["sessions"][-1]
    # The trainer's own clock at its end: its shutdown (workers joined, the last checkpoint saved) included.
    result["steps"], result["time_s"] = int(session["global_step_end"]), float(session["time_s_end"])
    result["best_eval"] = best_evaluation(run_dir)
    # The final policy (latest.pt: the evaluate command alone would pick best.pt), greedy.
    command = [sys.executable, "-m", "hogwild_a3c.evaluate", str(checkpoint), "--episodes", str(episodes),
               "--greedy", "--seed", str(eval_seed)]
    print("$", " ".join(command[1:]), flush=True)
    code, out, err = run_process(command, 1800, run_dir.parent)
    returns = [float(m.group(1)) for m in map(EPISODE_LINE.match, out.splitlines()) if m]
    if code != 0 or len(returns) != episodes:
        result["status"] = f"evaluation failed: exit {code}: {last_line(err)}"
        return result
    result["eval_mean"], result["eval_std"] = statistics.fmean(returns), statistics.pstdev(returns)
    return result


def run_sb3(agent: str, env: str, seed: int, budget_s: float, settings: dict, episodes: int, eval_seed: int,
            cwd: Path) -> dict:
    script = EXPERIMENTS / "peers" / "sb3" / "continuous.py"
    algo = agent.removeprefix("sb3_").upper()
    command = [sys.executable, str(script), algo, env, str(seed), f"{budget_s:g}", json.dumps(settings),
               str(episodes), str(eval_seed)]
    print("$ peers/sb3/continuous.py", algo, env, seed, f"{budget_s:g}", flush=True)
    code, out, err = run_process(command, budget_s * 1.5 + 1800, cwd)
    try:
        found = json.loads(out.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return empty_result(f"failed: exit {code}: {last_line(err)}")
    result = empty_result("ok" if code == 0 else f"exit {code}")
    result.update({k: found[k] for k in ("eval_mean", "eval_std", "train_last20", "steps", "time_s")})
    return result


def env_problem(env: str) -> tuple[str | None, object]:
    """(why `env` cannot be made here, or None; its action space)."""
    import gymnasium as gym

    try:
        made = gym.make(env)
    except Exception as exc:  # noqa: BLE001 - e.g. Box2D or MuJoCo not installed
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}", None
    space = made.action_space
    made.close()
    return None, space


def free_stem(out_dir: Path, stem: str) -> str:
    """`stem`, or stem-2, -3, ...: an earlier result is never overwritten."""
    name, number = stem, 1
    while (out_dir / f"{name}.md").exists() or (out_dir / f"{name}.csv").exists():
        number += 1
        name = f"{stem}-{number}"
    return name


def parse_args(config: dict, argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=BENCH,
                        help="experiments/configs/<NAME>.json, or a path to a .json of the same form "
                             "(default: continuous)")
    parser.add_argument("--envs", nargs="*", help="env ids of the config to run (default: all)")
    parser.add_argument("--seeds", type=int, nargs="*", help=f"default: the config's ({config['seeds']})")
    parser.add_argument("--algos", nargs="*", default=list(AGENTS), metavar="AGENT",
                        help=f"agents to run, in this order per seed: {', '.join(AGENTS)} "
                             f"(or ours, ppo, a2c, sac) (default: all)")
    parser.add_argument("--budget-scale", type=float, default=1.0,
                        help="multiply every env's budget (0.1 for a quick check of the plumbing)")
    parser.add_argument("--flags", default="",
                        help="extra trainer flags (default none: the point is that none are needed)")
    parser.add_argument("--out", help=f"results file stem under experiments/results/{BENCH}/ "
                                      "(default: <date>-continuous; -2, -3 ... added rather than overwrite)")
    args = parser.parse_args(argv)
    algos = [ALIASES.get(a, a) for a in args.algos]
    unknown = [a for a in algos if a not in AGENTS]
    if unknown:
        parser.error(f"--algos: unknown {', '.join(unknown)} (choose from {', '.join(AGENTS)})")
    args.algos = [a for a in AGENTS if a in algos]  # the interleaving order, whatever order was given
    if args.budget_scale <= 0:
        parser.error("--budget-scale must be > 0")
    return args


def main(argv: list[str] | None = None):
    argv = sys.argv[1:] if argv is None else argv
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", default=BENCH)
    config = load_config(pre.parse_known_args(argv)[0].config)
    args = parse_args(config, argv)
    seeds = config["seeds"] if args.seeds is None else args.seeds
    known = [spec["env"] for spec in config["envs"]]
    envs = args.env_list = known if args.envs is None else args.envs
    missing_envs = [e for e in envs if e not in known]
    if missing_envs:
        raise SystemExit(f"error: --envs {' '.join(missing_envs)}: not in the config (it has {', '.join(known)})")
    if any(a != OURS for a in args.algos):
        try:
            import stable_baselines3  # noqa: F401
        except ImportError:
            raise SystemExit("error: make bench-continuous needs SB3: pip install -e '.[bench,box2d,mujoco]' "
                             "(make bench-continuous does it)") from None
    import gymnasium as gym

    episodes = int(config.get("eval_episodes", 10))
    offset = int(config.get("eval_seed_offset", 10_000))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir = results_dir(BENCH)
    out = free_stem(out_dir, args.out or f"{dt.date.today().isoformat()}-{BENCH}")
    scratch = RUNS / BENCH
    scratch.mkdir(parents=True, exist_ok=True)
    command = "make bench-continuous" + (f" ARGS='{' '.join(argv)}'" if argv else "")
    rows: list[dict] = []
    notes: list[str] = []

    def note(text: str) -> None:
        notes.append(text)
        print(text, flush=True)

    for spec in config["envs"]:
        env = spec["env"]
        if env not in envs:
            continue
        problem, space = env_problem(env)
        if problem:
            note(f"{env} skipped: {problem} (install the `{spec.get('optional', '')}` extra)")
            continue
        budget = float(spec["budget_s"]) * args.budget_scale
        for seed in seeds:
            for agent in args.algos:
                if agent != OURS and agent not in spec:
                    if seed == seeds[0]:
                        note(f"{env}: no {agent} settings in the config; not run")
                    continue
                if agent == "sb3_sac" and not isinstance(space, gym.spaces.Box):
                    if seed == seeds[0]:
                        note(f"{env}: SB3 SAC needs a Box action space ({space}); not run")
                    continue
                load1 = round(os.getloadavg()[0], 2)  # the machine may be shared: how busy it was
                if agent == OURS:
                    run_dir = scratch / f"{stamp}-{env.replace(':', '_').replace('/', '_')}-s{seed}"
                    result = run_ours(env, seed, budget, run_dir, args.flags.split(), episodes, offset + seed)
                    result["run_dir"] = str(run_dir.relative_to(REPO))
                else:
                    result = run_sb3(agent, env, seed, budget, spec[agent], episodes, offset + seed, scratch)
                    result["run_dir"] = ""
                met = "" if result["eval_mean"] != result["eval_mean"] else (
                    "yes" if result["eval_mean"] >= spec["goal"] else "no")
                row = {"env": env, "goal": spec["goal"], "agent": agent, "seed": seed, **result, "goal_met": met,
                       "load1": load1}
                if result["status"] != "ok":
                    note(f"{env} {agent} seed {seed}: {result['status']}")
                rows.append(row)
                print(json.dumps(row), flush=True)
                render(rows, notes, config, args, seeds, command, out)
    print(render(rows, notes, config, args, seeds, command, out))
    print(f"wrote {out_dir / out}.md and .csv")


def summarize(rows: list[dict]) -> list[dict]:
    """Per env and agent: medians over seeds (a failed run counts as missing, and is named in `runs`)."""
    summary = []
    for env in dict.fromkeys(r["env"] for r in rows):
        for agent in AGENTS:
            runs = [r for r in rows if r["env"] == env and r["agent"] == agent]
            if not runs:
                continue
            done = [r for r in runs if r["eval_mean"] == r["eval_mean"]]

            def median(key, among=done):
                values = [r[key] for r in among if r[key] == r[key] and r[key] != -1]
                return statistics.median(values) if values else NAN

            scores = [r["eval_mean"] for r in done]
            summary.append({
                "env": env, "goal": runs[0]["goal"], "agent": agent + (" (info)" if agent in INFORMATIONAL else ""),
                "runs": f"{len(done)}/{len(runs)}",
                "median eval_mean": median("eval_mean"), "min": min(scores) if scores else NAN,
                "max": max(scores) if scores else NAN,
                "goal met": f"{sum(r['goal_met'] == 'yes' for r in runs)}/{len(runs)}",
                "median best_eval": median("best_eval", runs) if agent == OURS else "-",
                "median train_last20": median("train_last20", runs),
                "median steps": median("steps", runs),
            })
    return summary


def render(rows: list[dict], notes: list[str], config: dict, args: argparse.Namespace, seeds: list[int],
           command: str, out: str) -> str:
    """Write experiments/results/continuous/<out>.{csv,md} from the runs so far (called after every
    run, so an interrupted benchmark still leaves its table)."""
    out_dir = results_dir(BENCH)
    with open(out_dir / f"{out}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({c: r[c] for c in COLUMNS} for r in rows)
    try:
        import stable_baselines3

        sb3_version = f"stable-baselines3 {stable_baselines3.__version__}"
    except ImportError:
        sb3_version = "stable-baselines3 not installed"
    budgets = ", ".join(f"{s['env']} {s['budget_s'] * args.budget_scale:g} s" for s in config["envs"]
                        if s["env"] in args.env_list)
    extra = {
        "what": "each agent trains for the same wall time, then its final policy plays "
                f"{config.get('eval_episodes', 10)} deterministic episodes on a fresh env (seed 10000 + seed); "
                f"medians over seeds {seeds}; agents in this order per seed: {', '.join(args.algos)}",
        "budgets": budgets + (f" (the config's times {args.budget_scale:g})" if args.budget_scale != 1 else ""),
        "hogwild_a3c": f"--env ENV --seed S{(' ' + args.flags) if args.flags else ''} "
                       f"({'screened flags' if args.flags else 'no tuning flags'}; --max-seconds BUDGET "
                       "--no-progress for the benchmark): its defaults, one worker per core and its evaluator "
                       "(5 episodes every 60 s) on the same cores, inside the budget; final policy from "
                       "checkpoints/latest.pt, `python -m hogwild_a3c.evaluate --greedy`",
        "SB3": f"{sb3_version}, MlpPolicy, rl-zoo settings per env in {shown_path(config_path(args.config))} "
               "(each entry's `source`); one process, DummyVecEnv, 1 torch thread; rl-zoo's `lin_X` schedules "
               "decay linearly to 0 over the wall-time budget; VecNormalize statistics frozen and raw rewards "
               "for the evaluation; SAC is informational",
        "columns": "eval_mean/eval_std: the final policy's evaluation; goal_met: eval_mean >= goal; best_eval: the "
                   "best mean of the trainer's own evaluations during the run; train_last20: mean raw return of the "
                   "last 20 training episodes; steps: agent steps (all envs); time_s: training time on the "
                   "agent's own clock; load1: the 1-minute load average at the run's start",
    }
    ours = f"this trainer with {args.flags}" if args.flags else "this trainer with no flags"
    title = f"Continuous control at equal wall time: {ours} against SB3 PPO and A2C (rl-zoo)"
    text = header(title, command, extra)
    summary = summarize(rows)
    text += "\n" + markdown_table(summary, list(summary[0])) if summary else "\nno runs\n"
    shown = [{**r, "best_eval": r["best_eval"] if r["agent"] == OURS else "-"} for r in rows]
    text += "\n" + markdown_table(shown, COLUMNS) if rows else ""
    for line in notes:
        text += f"\n- {line}\n"
    (out_dir / f"{out}.md").write_text(text)
    return text


if __name__ == "__main__":
    main()
