"""`make bench-throughput`: agent steps/s of the trainer on Pong at 1..N workers, next to two
references measured in the same run with the same number of processes:

- raw env: each process steps its environments (with the 42x42 preprocessing) on random actions;
- acting only: each process runs the worker's own acting loop (env + one batched forward per
  step, `Worker.collect`), without learning;
- trainer: the real `python -m hogwild_a3c.train`, from progress.csv after a warm-up.

Each cell is the median of --repeats measurements. Also reported: worker resident memory and the
evaluator's CPU use while it waits between evaluations. Writes
experiments/results/throughput/<date>-throughput[-TAG].{csv,md}.

`--eval-nice N...` measures instead the trainer beside an evaluator that plays without pause, at each
of those priorities (the first --envs-per-worker and --rollout-steps values), interleaved: the
workers' steps/s against the evaluator's episodes and CPU share. Writes <date>-throughput-eval-nice[-TAG].md.

`--variants FLAGS...` prices model levers instead: the trainer with each set of flags (e.g.
`'' '--image-size 84' '--encoder impala'`), interleaved, as a ratio to the first. Writes <date>-variants[-TAG].md.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import statistics
import sys
import time

import pandas as pd

from benchlib import RUNS, header, load_config, markdown_table, results_dir, run_trainer
from hogwild_a3c.children.process import cpu_seconds  # benchlib put the repository on the path
from raw_env import measure_processes, raw_env_steps_per_s


def _acting_process(env_id, env_kwargs, envs, preset, rollout_steps, seconds, warmup, barrier, out, rank):
    import torch

    torch.set_num_threads(1)
    from hogwild_a3c.children.reports import InProcessReports
    from hogwild_a3c.children.shared import HogwildLink, SharedState
    from hogwild_a3c.children.worker import Worker
    from hogwild_a3c.config import Config
    from hogwild_a3c.envs.make import describe_env, register_atari
    from hogwild_a3c.learning.model import build_model
    from hogwild_a3c.learning.optim import LrSchedule
    from hogwild_a3c.run.presets import load_preset

    register_atari()
    cfg = Config(**{**load_preset(preset)[0], "env": env_id, "env_kwargs": env_kwargs, "envs_per_worker": envs,
                    "rollout_steps": rollout_steps})
    info = describe_env(env_id, env_kwargs)
    shared = SharedState.create(build_model(info.obs_shape, info.distribution, cfg), 1, "adam", LrSchedule(1e-4))
    reports = InProcessReports()
    worker = Worker(0, cfg, info, HogwildLink(shared, 0, reports), seed=rank)
    barrier.wait()

    def run_for(duration):
        steps, start = 0, time.time()
        while time.time() - start < duration:
            worker.collect()  # acting only: the worker's own loop without the update
            steps += cfg.rollout_steps * envs
            reports.read()
        return steps / (time.time() - start)

    run_for(warmup)
    out.put(run_for(seconds))


def measure_trainer(env_id, env_kwargs, workers, envs, seconds, warmup, tag, with_idle_evaluator=False,
                    preset="universe", rollout_steps=None, busy_evaluator_nice=None, eval_episodes=1, extra=()):
    """The trainer's steps/s after the warm-up; with `busy_evaluator_nice` an evaluator plays one
    episode after another at that priority (the end of a long run, where episodes are long),
    and the window's evaluations per minute and the evaluator's CPU share come back too."""
    run_dir = RUNS / "throughput" / f"{tag}-w{workers}-k{envs}-{int(time.time() * 1000)}"
    args = ["--env", env_id, "--preset", preset, "--num-workers", workers, "--envs-per-worker", envs, "--no-progress",
            "--progress-interval", 1, "--max-seconds", seconds + warmup + 15, "--run-dir", run_dir]
    if rollout_steps is not None:
        args += ["--rollout-steps", rollout_steps]
    args += list(extra)
    if env_kwargs:
        args += ["--env-kwargs", *env_kwargs]
    if with_idle_evaluator:
        args += ["--eval-episodes", 1, "--eval-interval", 100000]
    elif busy_evaluator_nice is not None:
        args += ["--eval-episodes", eval_episodes, "--eval-interval", 0.01, "--eval-nice", busy_evaluator_nice]
    else:
        args += ["--eval-episodes", 0]
    evaluator_cpu = None
    if with_idle_evaluator:
        import subprocess

        command = [sys.executable, "-m", "hogwild_a3c.train", *map(str, args)]
        proc = subprocess.Popen(command, cwd=RUNS.parent.parent)
        time.sleep(15)  # children started and imported
        pid = json.loads((run_dir / "meta.json").read_text())["sessions"][-1]["pids"]["evaluator"]
        before, t0 = cpu_seconds(pid), time.time()
        time.sleep(10)
        evaluator_cpu = (cpu_seconds(pid) - before) / (time.time() - t0)
        proc.wait()
    else:
        run_trainer(args)
    progress = pd.read_csv(run_dir / "progress.csv")
    started = progress[progress["global_step"] > 0]
    start_time = started["time_s"].iloc[0] + warmup
    window = progress[progress["time_s"] >= start_time]
    steps = window["global_step"].iloc[-1] - window["global_step"].iloc[0]
    span = window["time_s"].iloc[-1] - window["time_s"].iloc[0]
    rate = steps / span
    if busy_evaluator_nice is not None:
        evals = pd.read_csv(run_dir / "eval.csv")
        played = evals[evals["time_s"].between(window["time_s"].iloc[0], window["time_s"].iloc[-1])]
        return rate, float(window["worker_rss_mb"].median()), None, {
            "evaluations_per_min": 60 * played["time_s"].nunique() / span,
            "eval_steps_per_s": played["episode_length"].sum() / span,
            "eval_cpu_share": float(window["eval_cpu_share"].mean())}
    return rate, float(window["worker_rss_mb"].median()), evaluator_cpu


def main():
    config = load_config("throughput")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="*", help="worker counts (default: 1..cores)")
    parser.add_argument("--envs-per-worker", type=int, nargs="*", help="default: the preset's (seed: 1)")
    parser.add_argument("--rollout-steps", type=int, nargs="*",
                        help="rollout lengths T to measure (default: the preset's); "
                             "fewer steps per update cost throughput")
    parser.add_argument("--seconds", type=float, default=config["seconds_per_measurement"])
    parser.add_argument("--warmup", type=float, default=config["warmup_seconds"])
    parser.add_argument("--repeats", type=int, default=config["repeats"])
    parser.add_argument("--tag", default="", help="suffix of the result files, e.g. 'before'")
    parser.add_argument("--variants", nargs="+", metavar="FLAGS",
                        help="trainer flags to price, each a row ('' is the preset as it is), measured interleaved "
                             "(every repeat runs each once) at the first --workers, --envs-per-worker and "
                             "--rollout-steps; e.g. '' '--image-size 84' '--encoder impala'")
    parser.add_argument("--preset", default="universe",
                        help="the trainer's preset (default: the reference's algorithm, 20-step rollouts, as in older "
                             "results; `atari` is the Atari default, 10-step rollouts)")
    parser.add_argument("--trainer-only", action="store_true",
                        help="skip the raw-env and acting references (e.g. for an older commit)")
    parser.add_argument("--no-evaluator-check", action="store_true",
                        help="skip the 25 s measurement of the idle evaluator's CPU")
    parser.add_argument("--eval-nice", type=int, nargs="+", metavar="N",
                        help="instead: the trainer beside an evaluator that plays non-stop, at each of these "
                             "--eval-nice levels, interleaved over the repeats")
    parser.add_argument("--eval-episodes", type=int, default=1, help="with --eval-nice: episodes per evaluation")
    args = parser.parse_args()
    workers_list = args.workers or list(range(1, (os.cpu_count() or 1) + 1))
    from hogwild_a3c.run.presets import load_preset

    preset_values = load_preset(args.preset)[0]
    args.envs_per_worker = args.envs_per_worker or [preset_values.get("envs_per_worker", 1)]
    args.rollout_steps = args.rollout_steps or [preset_values["rollout_steps"]]
    bad = [value for value in args.envs_per_worker + args.rollout_steps if value < 1]
    if bad:
        parser.error(f"--envs-per-worker and --rollout-steps take integers >= 1 (got {bad[0]})")
    env_id, env_kwargs = config["env"], config["env_kwargs"]
    from hogwild_a3c.config import Config
    from hogwild_a3c.envs.make import env_options, parse_env_kwargs

    kwargs = parse_env_kwargs(env_kwargs)
    options = env_options(Config(**preset_values))  # the raw env made as the preset's workers make theirs
    if args.eval_nice:
        return measure_eval_priority(args, env_id, env_kwargs, workers_list)
    if args.variants:
        return measure_variants(args, env_id, env_kwargs, workers_list[0])
    rows = []
    cells = [(steps, envs, workers)
             for steps in args.rollout_steps for envs in args.envs_per_worker for workers in workers_list]
    for steps, envs, workers in cells:
        raw, acting, trainer, rss = [], [], [], []
        for repeat in range(args.repeats):
            if not args.trainer_only:
                raw.append(raw_env_steps_per_s(env_id, kwargs, options, workers, envs, args.seconds, args.warmup))
                acting.append(measure_processes(_acting_process, workers,
                                                (env_id, kwargs, envs, args.preset, steps, args.seconds, args.warmup)))
            rate, mem, *_ = measure_trainer(env_id, env_kwargs, workers, envs, args.seconds, args.warmup, f"r{repeat}",
                                           preset=args.preset, rollout_steps=steps)
            trainer.append(rate)
            rss.append(mem)
            print(f"workers {workers} envs/worker {envs} rollout steps {steps} repeat {repeat}: "
                  f"trainer {trainer[-1]:.0f} steps/s", flush=True)
        references = {} if args.trainer_only else {
            "raw_env_steps_per_s": statistics.median(raw), "acting_steps_per_s": statistics.median(acting)}
        ratios = {} if args.trainer_only else {
            "trainer_over_acting": statistics.median(t / a for t, a in zip(trainer, acting)),
            "trainer_over_raw": statistics.median(t / r for t, r in zip(trainer, raw))}
        row = {
            "workers": workers, "preset": args.preset, "envs_per_worker": envs, "rollout_steps": steps, **references,
            "trainer_steps_per_s": statistics.median(trainer), **ratios,
            "worker_rss_mb": statistics.median(rss), "repeats": args.repeats,
        }
        rows.append(row)
    evaluator_cpu = None
    if not args.no_evaluator_check:
        _, _, evaluator_cpu, *_ = measure_trainer(env_id, env_kwargs, 1, 1, 10, 2, "evaluator",
                                                  with_idle_evaluator=True)
    out_dir = results_dir("throughput")
    suffix = f"-{args.tag}" if args.tag else ""
    columns = list(rows[0])
    with open(out_dir / f"{time.strftime('%Y-%m-%d')}-throughput{suffix}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    command = "make bench-throughput" + (f" ARGS='{' '.join(sys.argv[1:])}'" if sys.argv[1:] else "")
    text = header(
        f"Throughput on {env_id}{' (' + args.tag + ')' if args.tag else ''}", command,
        {"env kwargs": " ".join(env_kwargs) or "none",
         "per cell": f"median of {args.repeats} runs of {args.seconds:g} s after {args.warmup:g} s warm-up",
         "evaluator CPU while idle": "not measured (--no-evaluator-check)" if evaluator_cpu is None
         else f"{100 * evaluator_cpu:.2f}% of one core (10 s sample, eval interval far away)"},
    )
    text += "\n" + markdown_table(rows, columns)
    (out_dir / f"{time.strftime('%Y-%m-%d')}-throughput{suffix}.md").write_text(text)
    print(text)


def measure_variants(args, env_id, env_kwargs, workers):
    """What each model lever costs in agent steps/s: the trainer with each variant's flags, one
    after another within every repeat, so the machine's drift hits all alike."""
    found: dict[str, list[float]] = {variant: [] for variant in args.variants}
    for repeat in range(args.repeats):
        for number, variant in enumerate(args.variants):
            rate, *_ = measure_trainer(env_id, env_kwargs, workers, args.envs_per_worker[0], args.seconds, args.warmup,
                                       f"variant{number}-r{repeat}", preset=args.preset,
                                       rollout_steps=args.rollout_steps[0], extra=shlex.split(variant))
            found[variant].append(rate)
            print(f"variant {variant or '(preset)'!s} repeat {repeat}: trainer {rate:.0f} steps/s", flush=True)
    base = statistics.median(found[args.variants[0]])
    rows = [{"flags": variant or "(the preset)", "trainer_steps_per_s": statistics.median(rates),
             "runs": " / ".join(f"{r:.0f}" for r in rates),
             f"over_{(args.variants[0] or 'preset').replace(' ', '_')}": statistics.median(rates) / base}
            for variant, rates in found.items()]
    command = "make bench-throughput ARGS=" + shlex.quote(shlex.join(sys.argv[1:]))
    text = header(f"The price of model levers in agent steps/s on {env_id}", command, {
        "layout": f"{workers} workers x {args.envs_per_worker[0]} envs, {args.rollout_steps[0]}-step rollouts, "
                  f"--preset {args.preset}, no evaluator",
        "per cell": f"median of {args.repeats} runs of {args.seconds:g} s after {args.warmup:g} s warm-up, "
                    "the variants interleaved"})
    text += "\n" + markdown_table(rows, list(rows[0]))
    suffix = f"-{args.tag}" if args.tag else ""
    (results_dir("throughput") / f"{time.strftime('%Y-%m-%d')}-variants{suffix}.md").write_text(text)
    print(text)


def measure_eval_priority(args, env_id, env_kwargs, workers_list):
    """What the evaluator's priority buys the workers, and what it costs the evaluations."""
    levels = sorted(set(args.eval_nice))
    if any(not 0 <= level <= 19 for level in levels):
        raise SystemExit(f"--eval-nice takes levels from 0 to 19 (got {levels})")
    rows = []
    for workers in workers_list:
        found = {level: [] for level in levels}
        for repeat in range(args.repeats):
            for level in levels:  # interleaved: a drift of the machine's speed hits every level alike
                rate, _, _, stats = measure_trainer(
                    env_id, env_kwargs, workers, args.envs_per_worker[0], args.seconds, args.warmup,
                    f"nice{level}-r{repeat}", preset=args.preset, rollout_steps=args.rollout_steps[0],
                    busy_evaluator_nice=level, eval_episodes=args.eval_episodes)
                found[level].append({"trainer_steps_per_s": rate, **stats})
                print(f"workers {workers} eval-nice {level} repeat {repeat}: trainer {rate:.0f} steps/s, "
                      f"{stats['evaluations_per_min']:.1f} evaluations/min, eval CPU share "
                      f"{stats['eval_cpu_share']:.2f}", flush=True)
        base = statistics.median(m["trainer_steps_per_s"] for m in found[levels[0]])
        for level in levels:
            medians = {key: statistics.median(m[key] for m in found[level]) for key in found[level][0]}
            rows.append({"workers": workers, "eval_nice": level, **medians,
                         f"trainer_over_nice_{levels[0]}": medians["trainer_steps_per_s"] / base,
                         "repeats": args.repeats})
    suffix = f"-{args.tag}" if args.tag else ""
    command = "make bench-throughput" + (f" ARGS='{' '.join(sys.argv[1:])}'" if sys.argv[1:] else "")
    text = header(f"The evaluator's priority on {env_id}", command, {
        "env kwargs": " ".join(env_kwargs) or "none",
        "preset": f"{args.preset}, {args.envs_per_worker[0]} envs per worker, {args.rollout_steps[0]}-step rollouts",
        "evaluator": f"{args.eval_episodes} episode(s) per evaluation, the next evaluation at once (--eval-interval "
                     "0.01): busy all the time, as late in a run whose episodes are long",
        "per cell": f"median of {args.repeats} runs of {args.seconds:g} s after {args.warmup:g} s warm-up; "
                    "eval_cpu_share is the mean of progress.csv's column over the window"})
    text += "\n" + markdown_table(rows, list(rows[0]))
    (results_dir("throughput") / f"{time.strftime('%Y-%m-%d')}-throughput-eval-nice{suffix}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
