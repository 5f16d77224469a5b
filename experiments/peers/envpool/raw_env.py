"""EnvPool's Atari steps/s on random actions, run with experiments/peers/envpool/.venv's Python by
`bench_peers.py`: PROCESSES processes of ENVS envs each, EnvPool's synchronous step over the whole
batch, started together behind a barrier; prints the summed agent steps/s as JSON.

Usage: raw_env.py GAME PROCESSES ENVS THREADS SIZE STACK SECONDS WARMUP
(SIZE: the square frame EnvPool makes, 84 its default; STACK: frames stacked, 4 its default).
"""
import json
import multiprocessing as mp
import os
import sys
import time


def run(game, envs, threads, size, stack, seconds, warmup, seed, barrier, out):
    import envpool
    import numpy as np

    # The anchors' Pong: frameskip 4 (EnvPool's default), no sticky actions, no episode cap but ALE's.
    pool = envpool.make_gymnasium(game, num_envs=envs, batch_size=envs, num_threads=threads, seed=seed,
                                  img_height=size, img_width=size, stack_num=stack,
                                  repeat_action_probability=0.0, episodic_life=False, reward_clip=False)
    rng = np.random.default_rng(seed)
    actions = pool.action_space.n
    pool.reset()
    barrier.wait(timeout=600)

    def run_for(duration):
        steps, start = 0, time.time()
        while time.time() - start < duration:
            pool.step(rng.integers(0, actions, envs))  # EnvPool resets finished envs by itself
            steps += envs
        return steps / (time.time() - start)

    run_for(warmup)
    out.put(run_for(seconds))


def main():
    game, processes, envs, threads, size, stack, seconds, warmup = sys.argv[1:9]
    processes, envs, threads, size, stack = map(int, (processes, envs, threads, size, stack))
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = "1"
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(processes), ctx.Queue()
    procs = [ctx.Process(target=run, args=(game, envs, threads, size, stack, float(seconds), float(warmup), rank,
                                           barrier, out), daemon=True) for rank in range(processes)]
    for p in procs:
        p.start()
    rates = [out.get(timeout=900) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    import envpool

    print(json.dumps({"steps_per_s": sum(rates), "envpool": envpool.__version__}))


if __name__ == "__main__":
    main()
