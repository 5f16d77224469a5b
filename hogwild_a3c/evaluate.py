"""`python -m hogwild_a3c.evaluate CHECKPOINT_OR_RUN_DIR`: play a saved policy and print returns.

Given a run directory it plays `checkpoints/best.pt` when there is one (the policy that scored
best in evaluation), else `checkpoints/latest.pt`. `--record DIR` writes each episode as an MP4
(H.264, through the ffmpeg binary that the `imageio-ffmpeg` wheel ships) or, with
`--video-format gif`, as a GIF (through pillow); both need the `video` extra.
"""
from __future__ import annotations

import argparse
import os
import sys
import types
from pathlib import Path

import numpy as np

from .api import PolicyError, load_policy
from .children.evaluator import play_episode
from .run.exit_codes import EXIT_OK, EXIT_USAGE

VIDEO_FORMATS = ("mp4", "gif")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hogwild_a3c.evaluate", description=__doc__.splitlines()[0], allow_abbrev=False
    )
    parser.add_argument("target", metavar="CHECKPOINT_OR_RUN_DIR", type=Path)
    parser.add_argument("--episodes", type=int, default=5, help="episodes to play (default: 5)")
    parser.add_argument("--greedy", action="store_true", help="take the most likely action instead of sampling")
    parser.add_argument("--seed", type=int, default=0, help="seed of the environment and the action sampling")
    parser.add_argument("--record", type=Path, metavar="DIR", help="write each episode as DIR/episode-N.mp4 (or .gif)")
    parser.add_argument("--video-format", choices=VIDEO_FORMATS, default="mp4",
                        help="mp4: H.264, small, plays everywhere; gif: no ffmpeg needed (default: mp4)")
    parser.add_argument("--env", metavar="ID", help="the checkpoint's env id, needed to allow one that names a module "
                        "to import (module:EnvId-v0): a checkpoint never makes this process import code by itself")
    parser.add_argument("--fps", type=int, default=30, help="frames per second of recorded videos (default: 30)")
    return parser


def video_writer_problem(video_format: str) -> str | None:
    """Why `video_format` cannot be written here (a missing package), or None."""
    try:
        import imageio.v2  # noqa: F401
    except ImportError:
        return "--record needs imageio: pip install -e '.[video]'"
    if video_format == "mp4":
        try:
            import imageio_ffmpeg

            imageio_ffmpeg.get_ffmpeg_exe()
        except (ImportError, RuntimeError) as exc:
            return (f"--record in mp4 needs imageio-ffmpeg ({exc}): pip install -e '.[video]', "
                    "or give --video-format gif")
    else:
        try:
            import PIL  # noqa: F401
        except ImportError:
            return "--record in gif needs pillow: pip install -e '.[video]'"
    return None


def _even(frame: np.ndarray) -> np.ndarray:
    """H.264 in yuv420p needs an even width and height: repeat the last row/column if odd."""
    pad_h, pad_w = frame.shape[0] % 2, frame.shape[1] % 2
    if pad_h or pad_w:
        frame = np.pad(frame, ((0, pad_h), (0, pad_w), (0, 0)), mode="edge")
    return frame


def gif_frame_ms(fps: int) -> int:
    return max(1, round(100 / fps)) * 10


def write_video(path: Path, frames: list[np.ndarray], fps: int) -> None:
    """Write RGB `frames` to `path` (.mp4 or .gif) through a temp file, so that a file with the
    final name is always complete."""
    import imageio.v2 as imageio

    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    if path.suffix == ".gif":
        # GIF stores delays in whole centiseconds, and pillow merges a frame identical to the one
        # before it into a longer delay: whole centiseconds keep the total exact.
        imageio.mimsave(tmp, frames, duration=gif_frame_ms(fps), loop=0)  # type: ignore[arg-type]  # an invariant list in its stub
    else:
        with imageio.get_writer(tmp, format="FFMPEG", fps=fps, codec="libx264", pixelformat="yuv420p",
                                macro_block_size=2, ffmpeg_log_level="error") as writer:
            for frame in frames:
                writer.append_data(_even(np.asarray(frame)))  # type: ignore[attr-defined]  # the FFMPEG writer has it
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Classic-control envs draw with pygame/SDL; no window or sound device is wanted, or present.
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    if args.episodes < 1:
        print(f"error: --episodes must be an integer >= 1 (got {args.episodes})", file=sys.stderr)
        return EXIT_USAGE
    if not args.target.exists():
        print(f"error: {args.target}: no such checkpoint file or run directory", file=sys.stderr)
        return EXIT_USAGE
    if args.fps < 1:
        print(f"error: --fps must be an integer >= 1 (got {args.fps})", file=sys.stderr)
        return EXIT_USAGE
    if args.record is not None:
        problem = video_writer_problem(args.video_format)
        if problem is not None:
            print(f"error: {problem}", file=sys.stderr)
            return EXIT_USAGE
        if args.record.exists() and not args.record.is_dir():
            print(f"error: --record {args.record} exists and is not a folder", file=sys.stderr)
            return EXIT_USAGE
    try:
        policy = load_policy(args.target, env=args.env)
    except PolicyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    cfg, model, path = policy.cfg, policy.model, policy.checkpoint
    how = "greedy" if args.greedy else "sampled"
    print(f"playing {path} ({cfg.env}, global step {policy.global_step}, {how} actions)")

    env = policy.make_env(render_mode="rgb_array" if args.record else None)
    env.reset(seed=args.seed)
    if args.record:
        try:
            env.render()
        except Exception as exc:  # noqa: BLE001 - e.g. a renderer's package is missing
            env.close()
            print(f"error: --record: {cfg.env} cannot render frames ({str(exc).splitlines()[0]})", file=sys.stderr)
            return EXIT_USAGE
    rng = np.random.default_rng(args.seed)
    if args.record:
        args.record.mkdir(parents=True, exist_ok=True)
    returns = []
    try:
        for episode in range(1, args.episodes + 1):
            frames: list[np.ndarray] = []
            on_frame = (lambda frames=frames: frames.append(env.render())) if args.record else None
            played = play_episode(model, env, rng, greedy=args.greedy, on_frame=on_frame)
            assert played is not None  # with no should_stop, every episode is played to its end
            episode_return, length = played
            returns.append(episode_return)
            line = f"episode {episode}: return {episode_return:g}, length {length}"
            if args.record:
                out = args.record / f"episode-{episode}.{args.video_format}"
                write_video(out, frames, args.fps)
                line += f", recorded {out}"
            print(line, flush=True)
    finally:
        env.close()
    episodes = f"{len(returns)} episode{'s' if len(returns) != 1 else ''}"
    print(f"mean return over {episodes}: {np.mean(returns):g} (min {np.min(returns):g}, max {np.max(returns):g})")
    return EXIT_OK


class _CallableModule(types.ModuleType):
    """`hogwild_a3c.evaluate(path, episodes=...)` from Python plays a saved policy and returns
    its episode returns (`api.evaluate`); this module is also the command."""

    def __call__(self, *args, **kwargs):
        from .api import evaluate

        return evaluate(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    sys.exit(main())
