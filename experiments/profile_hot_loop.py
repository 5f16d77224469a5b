"""`make profile-hot-loop`: where one worker's time goes, phase by phase, on Pong.

Runs one real Worker in this process (one thread, as the trainer gives each worker) and times
each phase of a rollout separately: pull the shared weights, act for T steps, compute targets,
replay forward, loss, backward, clip, push (gradient hand-off and Adam). Then lists the kernels
that the replay and backward spend their time in (torch.profiler). Medians over --rollouts.
Measure on a quiet machine: other processes inflate every phase. Prints; writes nothing.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

from benchlib import load_config


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=200)
    parser.add_argument("--preset", default="universe",
                        help="the settings to profile (default: the reference's; `atari` is the Atari default)")
    parser.add_argument("--envs-per-worker", type=int, help="default: the preset's")
    args = parser.parse_args()

    from hogwild_a3c.children.process import one_thread_per_child

    one_thread_per_child()
    import torch

    torch.set_num_threads(1)
    from hogwild_a3c.acting.actor import resolve as resolve_acting
    from hogwild_a3c.children.reports import InProcessReports
    from hogwild_a3c.children.shared import HogwildLink, SharedState
    from hogwild_a3c.children.worker import Worker
    from hogwild_a3c.config import Config
    from hogwild_a3c.envs.make import describe_env, parse_env_kwargs, register_atari
    from hogwild_a3c.learning.model import build_model
    from hogwild_a3c.learning.optim import LrSchedule
    from hogwild_a3c.learning.precision import resolve as resolve_precision

    register_atari()
    config = load_config("throughput")
    from hogwild_a3c.run.presets import load_preset

    preset = load_preset(args.preset)[0]
    cfg = Config(**{**preset, "env": config["env"], "env_kwargs": parse_env_kwargs(config["env_kwargs"]),
                    "envs_per_worker": args.envs_per_worker or preset.get("envs_per_worker", 1)})
    info = describe_env(cfg.env, cfg.env_kwargs)
    model = build_model(info.obs_shape, info.distribution, cfg)
    # As a run's main process does: the worker gets the backend and precision this machine resolved,
    # not "auto", which the learn step would read as float32.
    act_backend, acting_line = resolve_acting(cfg.act_backend, model)
    learn_precision, precision_line = resolve_precision(cfg.learn_precision, model)
    cfg = dataclasses.replace(cfg, act_backend=act_backend, learn_precision=learn_precision)
    print(acting_line, precision_line, sep="\n")
    shared = SharedState.create(model, 1, "adam", LrSchedule(cfg.lr))
    reports = InProcessReports()
    worker = Worker(0, cfg, info, HogwildLink(shared, 0, reports), seed=0)

    times: dict[str, list[float]] = {}
    for index in range(args.rollouts + 20):
        marks = [("start", time.perf_counter())]
        worker.link.pull(worker.model)
        marks.append(("pull", time.perf_counter()))
        rollout = worker.collect()
        marks.append((f"act ({cfg.rollout_steps} steps x {cfg.envs_per_worker} envs)", time.perf_counter()))
        worker.learner.learn(rollout, phase_done=lambda phase, marks=marks: marks.append((phase, time.perf_counter())))
        reports.read()
        if index >= 20:  # warm-up rollouts are not counted
            for (_, before), (name, after) in zip(marks, marks[1:]):
                times.setdefault(name, []).append((after - before) * 1e3)
    medians = {name: statistics.median(values) for name, values in times.items()}
    total = sum(medians.values())
    print(f"median ms per rollout over {args.rollouts} rollouts, K={cfg.envs_per_worker}, T={cfg.rollout_steps} "
          f"({args.preset}):")
    for name, ms in medians.items():
        print(f"  {name:32s} {ms:7.2f} ms  {100 * ms / total:5.1f}%")
    act = next(ms for name, ms in medians.items() if name.startswith("act"))
    print(f"  {'total':32s} {total:7.2f} ms; acting share {act / total:.2f} (the trainer/acting ratio this predicts)")

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(50):
            worker.learner.learn(rollout)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main()
