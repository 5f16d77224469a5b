"""`make bench-peers`: the trainers built for speed, measured beside ours on this machine.

Each peer lives in a virtual environment of its own under experiments/peers/<peer>/.venv, made
here from experiments/peers/<peer>/requirements.txt (their pins never touch the project's).

Parts (`--part`):

- raw-env: the raw Atari environment's agent steps/s on random actions, `ALE/Pong-v5` without
  sticky actions, on the trainer's layout (2 processes x 8 envs, one thread each), started
  together: ale-py with our 42x42 frames (`raw_env.py`, what bench-pong divides by), against
  EnvPool's synchronous batch step with its own 84x84 pipeline (4 frames stacked) and at 42x42
  (one frame); and EnvPool as its users run it on 2 cores, one process of 16 envs on its own
  2 threads. Interleaved: each repeat runs every row once. Writes
  experiments/results/peers/<date>-raw-env.md.

The learning races of issue 36 (Sample Factory, rl_games on EnvPool, PufferLib: Pong to +18,
Breakout and SpaceInvaders at 30 minutes) are not built yet; the results file says so.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import venv

from benchlib import EXPERIMENTS, header, markdown_table, write_dated_result
from raw_env import SECONDS, WARMUP, raw_env_steps_per_s

PEERS = EXPERIMENTS / "peers"
NOT_RACED = ("Sample Factory (APPO), rl_games (PPO on EnvPool) and PufferLib: not run yet; the Pong, Breakout and "
             "SpaceInvaders races of issue 36 are still to be built")


def peer_python(peer: str) -> str:
    """The peer's own interpreter, its virtual environment made and its requirements installed
    first if missing (a stamp file records that the install finished)."""
    folder = PEERS / peer
    env_dir, stamp = folder / ".venv", folder / ".venv" / ".installed"
    python = env_dir / "bin" / "python"
    if not stamp.exists():
        print(f"making {env_dir} from {folder / 'requirements.txt'}", flush=True)
        venv.create(env_dir, with_pip=True, clear=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "-r", str(folder / "requirements.txt")], check=True)
        stamp.touch()
    return str(python)


def envpool_rate(python: str, processes: int, envs: int, threads: int, size: int, stack: int, seconds: float,
                 warmup: float) -> tuple[float, str]:
    out = subprocess.run([python, str(PEERS / "envpool" / "raw_env.py"), "Pong-v5", str(processes), str(envs),
                          str(threads), str(size), str(stack), str(seconds), str(warmup)],
                         check=True, capture_output=True, text=True, timeout=900)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return result["steps_per_s"], result["envpool"]


def raw_env_part(args) -> str:
    python = peer_python("envpool")
    versions: set[str] = set()

    def envpool(processes: int, envs: int, threads: int, size: int, stack: int) -> float:
        rate, version = envpool_rate(python, processes, envs, threads, size, stack, args.seconds, args.warmup)
        versions.add(version)
        return rate

    rows = {
        "ale-py, our 42x42 frames (2 processes x 8 envs, 1 thread each)":
            lambda: raw_env_steps_per_s("ALE/Pong-v5", {"repeat_action_probability": 0.0}, {}, 2, 8,
                                        args.seconds, args.warmup),
        "EnvPool, its 84x84 x 4 stack (2 processes x 8 envs, 1 thread each)":
            lambda: envpool(2, 8, 1, 84, 4),
        "EnvPool, 42x42, 1 frame (2 processes x 8 envs, 1 thread each)":
            lambda: envpool(2, 8, 1, 42, 1),
        "EnvPool, its 84x84 x 4 stack (1 process x 16 envs, 2 threads)":
            lambda: envpool(1, 16, 2, 84, 4),
    }
    samples: dict[str, list[float]] = {name: [] for name in rows}
    for repeat in range(args.repeats):
        for name, measure in rows.items():
            samples[name].append(measure())
            print(f"repeat {repeat + 1}: {name}: {samples[name][-1]:,.0f} steps/s", flush=True)
    reference = statistics.median(samples[next(iter(rows))])
    table = [{"environment": name, "agent steps/s": statistics.median(values),
              "against ale-py (ours)": statistics.median(values) / reference,
              "runs": ", ".join(f"{v:,.0f}" for v in values)} for name, values in samples.items()]
    command = "make bench-peers" + (f" ARGS='{' '.join(sys.argv[1:])}'" if sys.argv[1:] else "")
    text = header("The raw Atari environment: ale-py against EnvPool", command, {
                      "env": "ALE/Pong-v5 (EnvPool: Pong-v5), frameskip 4, repeat_action_probability 0, random actions",
                      "EnvPool": f"{', '.join(sorted(versions))} in experiments/peers/envpool/.venv "
                                 "(requirements.txt there); episodic_life and reward_clip off, "
                                 "its noop starts on (its default)",
                      "per cell": f"median of {args.repeats} interleaved runs of {args.seconds:g} s after a "
                                  f"{args.warmup:g} s warm-up",
                  })
    text += "\n" + markdown_table(table, ["environment", "agent steps/s", "against ale-py (ours)", "runs"])
    text += f"\nPeers not raced in this file: {NOT_RACED}.\n"
    return text


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["raw-env"], default="raw-env")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=SECONDS)
    parser.add_argument("--warmup", type=float, default=WARMUP)
    args = parser.parse_args()
    if args.repeats < 1 or args.seconds <= 0 or args.warmup < 0:
        parser.error("--repeats must be at least 1, --seconds above 0 and --warmup at least 0")
    write_dated_result("peers", args.part, raw_env_part(args))


if __name__ == "__main__":
    main()
