"""The raw environment's speed on this machine: the ceiling the trainer's steps/s is measured against.

Each process steps its environments (made as the run makes them: its frame, frame max and FIRE at
reset, `envs.env_options`) on random actions, one thread each, started together behind a barrier;
the figure is the sum of the processes' rates.
"""
from __future__ import annotations

import multiprocessing as mp
import time
from typing import Any

SECONDS, WARMUP = 20.0, 5.0


def raw_env_process(env_id, env_kwargs, options, envs, seconds, warmup, barrier, out, rank):
    import torch

    torch.set_num_threads(1)
    from hogwild_a3c.envs.make import make_env, register_atari

    register_atari()
    pool = [make_env(env_id, env_kwargs, **options) for _ in range(envs)]
    for i, env in enumerate(pool):
        env.reset(seed=rank * envs + i)
        env.action_space.seed(rank * envs + i)
    barrier.wait(timeout=600)

    def run_for(duration):
        steps, start = 0, time.time()
        while time.time() - start < duration:
            for env in pool:
                *_, terminated, truncated, _ = env.step(env.action_space.sample())
                if terminated or truncated:
                    env.reset()
            steps += envs
        return steps / (time.time() - start)

    run_for(warmup)
    out.put(run_for(seconds))


def measure_processes(target, workers: int, args: tuple) -> float:
    """The summed rate of `workers` processes running `target(*args, barrier, out, rank)`; a
    process that dies or stalls raises here instead of leaving the others waiting."""
    from hogwild_a3c.children.process import one_thread_per_child

    one_thread_per_child()  # the same thread settings the trainer gives its workers
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(workers), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, barrier, out, rank), daemon=True) for rank in range(workers)]
    for p in procs:
        p.start()
    try:
        rates = [out.get(timeout=900) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return sum(rates)


def raw_env_steps_per_s(env_id: str, env_kwargs: dict, options: dict[str, Any], workers: int, envs: int,
                        seconds: float = SECONDS, warmup: float = WARMUP) -> float:
    """`options`: make_env's settings besides the id (`envs.env_options` of the run's config)."""
    return measure_processes(raw_env_process, workers, (env_id, env_kwargs, options, envs, seconds, warmup))
