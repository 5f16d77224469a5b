"""`make bench-minigrid`: wall time and agent steps for this trainer, run with no flags but --env
and --seed, and for SB3 PPO with rl-zoo's MiniGrid settings, to reach a mean of 0.9 over the last
20 training episodes, on MiniGrid-Empty-8x8-v0 and MiniGrid-DoorKey-5x5-v0, seeds interleaved,
each within the same wall-time budget; bench_classic.py's protocol, with
experiments/configs/minigrid.json. Writes experiments/results/minigrid/minigrid.{md,csv}.
"""
from bench_classic import main

if __name__ == "__main__":
    main("minigrid")
