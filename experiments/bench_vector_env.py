"""`make bench-vector-env`: acting's environment side, two ways, on one thread: the per-env Python
loop a worker runs today (K `make_env` Pong envs, each ALE v5 + the 42x42 frame in numpy) against
ale-py's `AtariVectorEnv` (C++ stepping of the K envs, batched raw 210x160 grey frames) with the
reference's crop and resize done once per batch in numpy (`AtariFrame`'s matrices over the whole batch).

Both run ALE v5's protocol as the Pong benchmark does: frameskip 4, ALE's last frame (no max
pooling), no no-op starts, no FIRE, unclipped rewards, repeat_action_probability 0.0, random
actions. The vector env is given one thread (`num_threads=1`), as each worker has one core; a
second row gives it every core, for what a worker could get alone on a machine. Env steps per
second (one env step = 4 frames), the median of --repeats interleaved measurements of
--seconds each. The frames of both must be the reference's 42x42: the first frames after reset are
compared. Writes experiments/results/vector-env/<date>-<name>.md.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from benchlib import header, load_config, write_dated_result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=8, help="envs per worker (the atari preset's 8)")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--name", default="atari-vector-env")
    args = parser.parse_args()

    from hogwild_a3c.children.process import one_thread_per_child

    one_thread_per_child()
    import ale_py
    import gymnasium as gym

    from hogwild_a3c.envs.make import AtariFrame, make_env, parse_env_kwargs, register_atari

    register_atari()
    config = load_config("throughput")
    env_id, env_kwargs = config["env"], parse_env_kwargs(config["env_kwargs"])
    game = env_id.split("/")[1].split("-")[0].lower()
    batch42 = AtariFrame().grey_batch

    def python_loop():
        envs = [make_env(env_id, env_kwargs) for _ in range(args.envs)]
        first = np.stack([env.reset(seed=k)[0] for k, env in enumerate(envs)])
        rng = np.random.default_rng(0)
        n = envs[0].action_space.n

        def step() -> None:
            actions = rng.integers(n, size=args.envs)
            for k, env in enumerate(envs):
                _, _, terminated, truncated, _ = env.step(int(actions[k]))
                if terminated or truncated:
                    env.reset()
        return first, step, lambda: [env.close() for env in envs]

    def vector(threads: int):
        def make():
            envs = ale_py.AtariVectorEnv(
                game, args.envs, num_threads=threads, img_height=210, img_width=160, grayscale=True, stack_num=1,
                frameskip=4, maxpool=False, noop_max=0, reward_clipping=False, use_fire_reset=False,
                repeat_action_probability=float(env_kwargs.get("repeat_action_probability", 0.25)),
            )
            obs, _ = envs.reset(seed=np.arange(args.envs))
            first = batch42(obs[:, 0])
            rng = np.random.default_rng(0)
            n = envs.single_action_space.n

            def step() -> None:
                obs, _, _, _, _ = envs.step(rng.integers(n, size=args.envs))
                batch42(obs[:, 0])  # autoreset: the vector env resets finished envs itself
            return first, step, envs.close
        return make

    ways = {"per-env Python loop (today)": python_loop, "AtariVectorEnv, 1 thread": vector(1),
            f"AtariVectorEnv, {os.cpu_count()} threads": vector(os.cpu_count() or 1)}
    rates: dict[str, list[float]] = {name: [] for name in ways}
    firsts = {}
    for _ in range(args.repeats):
        for name, make in ways.items():
            first, step, close = make()
            firsts[name] = first
            for _ in range(20):
                step()
            steps, start = 0, time.perf_counter()
            while time.perf_counter() - start < args.seconds:
                step()
                steps += args.envs
            rates[name].append(steps / (time.perf_counter() - start))
            close()
    reference = next(iter(firsts.values()))
    lines = [header("ale-py's AtariVectorEnv against the per-env Python loop: env steps per second, one worker",
                    f"python experiments/bench_vector_env.py --envs {args.envs} --seconds {args.seconds} "
                    f"--repeats {args.repeats}",
                    {"env": f"{env_id} {env_kwargs}, ale-py {ale_py.__version__}, gymnasium {gym.__version__}"})]
    lines += ["| stepping | env steps/s (median) | all repeats | against the Python loop | first frames' max |diff| |",
              "|---|---|---|---|---|"]
    base = statistics.median(next(iter(rates.values())))
    for name, values in rates.items():
        diff = float(np.abs(firsts[name] - reference).max()) if firsts[name].shape == reference.shape else float("nan")
        lines.append(f"| {name} | {statistics.median(values):,.0f} | {', '.join(f'{v:,.0f}' for v in values)} "
                     f"| {statistics.median(values) / base:.2f}x | {diff:.4f} |")
    write_dated_result("vector-env", args.name, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
