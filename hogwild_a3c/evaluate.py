"""`python -m hogwild_a3c.evaluate CHECKPOINT_OR_RUN_DIR`: play a saved policy and print returns.

Given a run directory it plays `checkpoints/best.pt` when there is one (the policy that scored
best in evaluation), else `checkpoints/latest.pt`. `--record DIR` writes each episode as a GIF
(needs the `video` extra: imageio and pillow).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

from .checkpoint import CheckpointError, load_checkpoint, load_latest
from .config import Config
from .envs import EnvSpecError, describe_env, make_env
from .evaluator import play_episode
from .model import build_model


def resolve_checkpoint(target: Path) -> tuple[dict, Path]:
    if target.is_dir():
        folder = target / "checkpoints" if (target / "checkpoints").is_dir() else target
        best = folder / "best.pt"
        if best.is_file():
            return load_checkpoint(best), best
        return load_latest(folder, warn=lambda m: print(m, file=sys.stderr))
    return load_checkpoint(target), target


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hogwild_a3c.evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("target", metavar="CHECKPOINT_OR_RUN_DIR", type=Path)
    parser.add_argument("--episodes", type=int, default=5, help="episodes to play (default: 5)")
    parser.add_argument("--greedy", action="store_true", help="take the most likely action instead of sampling")
    parser.add_argument("--seed", type=int, default=0, help="seed of the environment and the action sampling")
    parser.add_argument("--record", type=Path, metavar="DIR", help="write each episode as DIR/episode-N.gif")
    parser.add_argument("--fps", type=int, default=30, help="frames per second of recorded GIFs (default: 30)")
    return parser


def _gif_writer():
    try:
        import imageio.v2 as imageio
    except ImportError:
        return None
    return imageio


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Classic-control envs draw with pygame/SDL; no window or sound device is wanted, or present.
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    if args.episodes < 1:
        print(f"error: --episodes must be an integer >= 1 (got {args.episodes})", file=sys.stderr)
        return 2
    if not args.target.exists():
        print(f"error: {args.target}: no such checkpoint file or run directory", file=sys.stderr)
        return 2
    imageio = None
    if args.record is not None:
        imageio = _gif_writer()
        if imageio is None:
            print("error: --record needs imageio and pillow: pip install -e '.[video]'", file=sys.stderr)
            return 2
        if args.record.exists() and not args.record.is_dir():
            print(f"error: --record {args.record} exists and is not a folder", file=sys.stderr)
            return 2
    try:
        payload, path = resolve_checkpoint(args.target)
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    saved = payload.get("config", {})
    cfg = Config(**{k: v for k, v in saved.items() if k in Config.__dataclass_fields__})
    try:
        info = describe_env(cfg.env, cfg.env_kwargs)
    except EnvSpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    model = build_model(info.obs_shape, info.num_actions, cfg)
    model.load_state_dict(payload["model"])
    model.eval()
    step = payload.get("global_step", "?")
    print(f"playing {path} ({cfg.env}, global step {step}, {'greedy' if args.greedy else 'sampled'} actions)")

    env = make_env(cfg.env, cfg.env_kwargs, render_mode="rgb_array" if args.record else None)
    env.reset(seed=args.seed)
    if args.record:
        try:
            env.render()
        except Exception as exc:  # noqa: BLE001 - e.g. a renderer's package is missing
            env.close()
            print(f"error: --record: {cfg.env} cannot render frames ({str(exc).splitlines()[0]})", file=sys.stderr)
            return 2
    rng = np.random.default_rng(args.seed)
    if args.record:
        args.record.mkdir(parents=True, exist_ok=True)
    returns = []
    try:
        for episode in range(1, args.episodes + 1):
            frames: list[np.ndarray] = []
            on_frame = (lambda: frames.append(env.render())) if args.record else None
            episode_return, length = play_episode(model, env, rng, greedy=args.greedy, on_frame=on_frame)
            returns.append(episode_return)
            line = f"episode {episode}: return {episode_return:g}, length {length}"
            if args.record:
                out = args.record / f"episode-{episode}.gif"
                tmp = out.with_name(f".{out.name}.tmp.gif")
                imageio.mimsave(tmp, frames, duration=1000 / args.fps, loop=0)
                tmp.replace(out)
                line += f", recorded {out}"
            print(line, flush=True)
    finally:
        env.close()
    print(f"mean return over {len(returns)} episodes: {np.mean(returns):g} (min {np.min(returns):g}, max {np.max(returns):g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
