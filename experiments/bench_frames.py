"""`make bench-frames`: what universe's frames (`frame="universe"`: RGB screen, mean of the channels)
cost against ALE's greyscale (`frame="luminance"`), per frame, on one thread like a worker, and how
far apart the two greys are on real Pong screens.

Writes experiments/results/frames/frames.md.
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"  # as in every worker: one thread per library

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from benchlib import header, markdown_table, results_dir  # noqa: E402
from hogwild_a3c.envs.atari import UniverseFrames, _linear_resize_matrix  # noqa: E402
from hogwild_a3c.envs.make import make_env  # noqa: E402

PONG = {"repeat_action_probability": 0.0}


def per_call_us(fn, arg, calls: int) -> float:
    fn(arg)
    start = time.perf_counter()
    for _ in range(calls):
        fn(arg)
    return (time.perf_counter() - start) / calls * 1e6


def step_us(frame: str, steps: int) -> float:
    env = make_env("ALE/Pong-v5", PONG, frame=frame)
    env.reset(seed=0)
    start = time.perf_counter()
    for t in range(steps):
        _, _, terminated, truncated, _ = env.step(t % 6)
        if terminated or truncated:
            env.reset()
    elapsed = time.perf_counter() - start
    env.close()
    return elapsed / steps * 1e6


def screens(count: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Real (RGB, ALE greyscale) screen pairs from random play."""
    env = make_env("ALE/Pong-v5", PONG, frame="universe")
    env.reset(seed=1)
    rng = np.random.default_rng(1)
    rgb, grey = [], []
    for _ in range(count):
        _, _, terminated, truncated, _ = env.step(int(rng.integers(6)))
        if terminated or truncated:
            env.reset()
        rgb.append(env.unwrapped.ale.getScreenRGB())
        grey.append(env.unwrapped.ale.getScreenGrayscale())
    env.close()
    return rgb, grey


def rounded_like_uint8(rgb: np.ndarray) -> np.ndarray:
    """The reference's frame with OpenCV's uint8 outputs imitated: each channel resized, rounded half up to a
    whole level after each of the two resizes, then the channel mean and 1/255."""
    halve, shrink = _linear_resize_matrix(160, 80).astype(np.float64), _linear_resize_matrix(80, 42).astype(np.float64)
    out = []
    for c in range(3):
        x = rgb[34:194, :, c].astype(np.float64)
        x = np.floor(halve @ x @ halve.T + 0.5)
        x = np.floor(shrink @ x @ shrink.T + 0.5)
        out.append(x)
    return np.mean(out, axis=0) / 255.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=3000, help="preprocessing calls per repeat")
    parser.add_argument("--steps", type=int, default=3000, help="env steps per repeat")
    args = parser.parse_args()

    rgb, grey = screens(500)
    wrapper = UniverseFrames(make_env("CartPole-v1"))  # only the preprocessing is timed
    old_rgb_path = lambda frame: wrapper.observation(frame.mean(axis=2))  # noqa: E731 - before this change
    old_rgb = "universe, channel mean in float64 (before)"
    timings = {"luminance (grey screen)": [], "universe (RGB screen)": [], old_rgb: [],
               "env step + luminance": [], "env step + universe": []}
    for _ in range(args.repeats):
        timings["luminance (grey screen)"].append(per_call_us(wrapper.observation, grey[100], args.calls))
        timings["universe (RGB screen)"].append(per_call_us(wrapper.observation, rgb[100], args.calls))
        timings[old_rgb].append(per_call_us(old_rgb_path, rgb[100], args.calls // 5))
        timings["env step + luminance"].append(step_us("luminance", args.steps))
        timings["env step + universe"].append(step_us("universe", args.steps))
    rows = [{"what": k, "us per frame (median)": statistics.median(v), "min": min(v), "max": max(v)}
            for k, v in timings.items()]

    seed_obs = np.stack([wrapper.observation(f)[0] for f in rgb])
    fast_obs = np.stack([wrapper.observation(f)[0] for f in grey])
    grey_gap = np.abs(seed_obs - fast_obs)
    rounding_gap = max(np.abs(rounded_like_uint8(f) - o).max() for f, o in zip(rgb[::10], seed_obs[::10]))

    command = "make bench-frames" + (f" ARGS='{' '.join(sys.argv[1:])}'" if sys.argv[1:] else "")
    title = "Frame preprocessing: universe (the reference's RGB mean) against luminance (ALE greyscale)"
    text = header(title, command, {
        "repeats": f"{args.repeats} x ({args.calls} preprocessing calls, {args.steps} env steps), one thread",
    })
    text += "\n" + markdown_table(rows, ["what", "us per frame (median)", "min", "max"])
    text += (
        f"\n- Over 500 random-play Pong screens, universe and luminance observations differ by up to "
        f"{grey_gap.max() * 255:.1f}/255 per pixel (mean {grey_gap.mean() * 255:.2f}/255).\n"
        f"- Rounding each resized channel to a whole level, as OpenCV's uint8 resize does, moves the universe "
        f"observation by at most {rounding_gap * 255:.2f}/255 (50 of the screens).\n"
    )
    (results_dir("frames") / "frames.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
