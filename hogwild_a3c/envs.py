"""Environment construction: Atari with the universe 42x42 preprocessing, or any Gymnasium env
with a Discrete action space and a flat vector observation.

`describe_env` is called once in the main process, before any child starts, so that an unknown
id, a continuous action space or an observation the model cannot take is reported as one clear
line instead of a traceback from every worker.
"""
from __future__ import annotations

import ast
import functools
import importlib
import inspect
import json
import multiprocessing as mp
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from .config import RENAMED
from .files import shown

ATARI_CROP_ROWS = slice(34, 194)  # the universe crop: drop the score bar and the bottom edge
FRAME_SIZE = 42


class EnvSpecError(ValueError):
    """The requested environment cannot be trained by this model."""


def _linear_resize_matrix(src: int, dst: int) -> np.ndarray:
    """Rows that resample a length-`src` signal to `dst` samples by linear interpolation with
    pixel-centre alignment (the convention of OpenCV's INTER_LINEAR), as a [dst, src] matrix."""
    matrix = np.zeros((dst, src), dtype=np.float32)
    for i in range(dst):
        pos = min(max((i + 0.5) * src / dst - 0.5, 0.0), src - 1)
        lo = int(np.floor(pos))
        hi = min(lo + 1, src - 1)
        frac = pos - lo
        matrix[i, lo] += 1.0 - frac
        matrix[i, hi] += frac
    return matrix


def _universe_resize_matrix(channels: int = 1) -> np.ndarray:
    """160 -> 80 -> 42 as one [42, 160] matrix, folded with the 1/255 scale (and, for a frame
    whose `channels` were summed, the 1/channels of their mean).

    Universe shrinks in two linear steps; both are linear maps, so their product applied on
    each side (M @ frame @ M.T) gives the same pixels with two small matmuls per frame.
    """
    halve = _linear_resize_matrix(160, 80)
    shrink = _linear_resize_matrix(80, FRAME_SIZE)
    return (shrink @ halve) / np.sqrt(255.0 * channels, dtype=np.float32)


# How an Atari frame becomes grey. `fast`: ALE's own greyscale (luminance-weighted, computed
# inside the emulator), one channel to resize. `seed`: the RGB screen and the plain mean of its
# channels, as universe-starter-agent's `_process_frame42` does; the two differ by up to about
# 24/255 per pixel on Pong. `seed` costs about 35 us more per frame here (70 against 35 us on
# one core, `make bench-frames`); `fast` is the default, and every Pong result in this repo used it.
FRAME_MODES = ("fast", "universe")


class Universe42(gym.ObservationWrapper):
    """Atari frame -> 1x42x42 float32 in [0, 1]: universe-starter-agent's `_process_frame42`.

    `_process_frame42` crops rows 34..194, resizes the RGB frame 160x160 -> 80x80 -> 42x42,
    averages the three channels and scales by 1/255. Resizing and averaging are both linear, so
    averaging first gives the same pixels with a third of the resizing. Given an RGB frame
    (ALE's `obs_type="rgb"`, `frame="universe"`) this is that computation; given ALE's greyscale frame
    (`frame="fast"`, the default) the channel mean is replaced by ALE's luminance weighting.
    One difference from universe remains in both: OpenCV resizes uint8 images and rounds each
    resized image to whole levels; here the resize stays in float32 (measured: under 0.7/255).
    """

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self._frame42 = Frame42()
        self.observation_space = gym.spaces.Box(0.0, 1.0, (1, FRAME_SIZE, FRAME_SIZE), np.float32)

    def observation(self, frame: np.ndarray) -> np.ndarray:
        return self._frame42(frame)


class AtariSteps(gym.Wrapper):
    """The Atari protocol around a raw ALE env: what happens inside one agent step.

    - `max_pool`: the env is made with frameskip 1 and this wrapper repeats the action `skip`
      times itself, returning the pixelwise max of the last two frames. ALE v5 repeats inside
      the emulator and returns only the last frame, so objects drawn on alternate frames
      (SpaceInvaders' shots) can vanish. The repeats call ALE directly (about 10 us per agent
      step more than v5's own repeat, against 55 us through four gym steps); sticky actions are
      ALE's, applied per frame either way.
    - `fire_reset`: in games whose second action is FIRE, press it after a reset and after each
      lost life, as baselines' FireResetEnv does (Breakout's ball waits for it).
    - Every step's info says `life_lost`, so a learner can end a bootstrap stretch there
      (`--life-loss`) without the game being reset.
    """

    def __init__(self, env: gym.Env, skip: int, max_pool: bool, fire_reset: bool):
        super().__init__(env)
        atari: Any = env.unwrapped  # ale_py's AtariEnv
        self._ale = atari.ale
        self._skip = skip
        self._max_pool = max_pool
        meanings = atari.get_action_meanings()
        self._fire = fire_reset and len(meanings) >= 3 and meanings[1] == "FIRE"
        minimal = self._ale.getMinimalActionSet()
        n = int(env.action_space.n)  # type: ignore[attr-defined]
        self._action_set = minimal if len(minimal) == n else self._ale.getLegalActionSet()
        shape = env.observation_space.shape or ()
        self._grey = len(shape) == 2
        self._frames = np.zeros((2, *shape), dtype=np.uint8)
        self._lives = 0

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        if self._fire:
            obs, _, terminated, truncated, info = self._step(1)
            if terminated or truncated:
                obs, info = self.env.reset()
        self._lives = self._ale.lives()
        info["life_lost"] = False
        return obs, info

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self._step(action)
        lives = self._ale.lives()
        life_lost = lives < self._lives and not terminated  # a game's end is its own boundary
        self._lives = lives
        if life_lost and self._fire and not truncated:
            obs, more, terminated, truncated, info = self._step(1)
            reward += more
        info["life_lost"] = life_lost  # each step's info is a dict of its own: no copy needed
        return obs, reward, terminated, truncated, info

    def _step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if not self._max_pool:
            obs, reward, terminated, truncated, info = self.env.step(action)
            return obs, float(reward), terminated, truncated, info
        ale, frames, reward = self._ale, self._frames, 0.0
        ale_action = self._action_set[action]
        for repeat in range(self._skip):
            reward += ale.act(ale_action)
            if ale.game_over():  # the episode ended inside the repeat: its last frame, twice
                self._screen(frames[1])
                frames[0] = frames[1]
                break
            if repeat >= self._skip - 2:
                self._screen(frames[repeat - self._skip + 2])
        obs = np.maximum(frames[0], frames[1])
        return obs, reward, ale.game_over(with_truncation=False), ale.game_truncated(), {"lives": ale.lives()}

    def _screen(self, out: np.ndarray) -> None:
        if self._grey:
            self._ale.getScreenGrayscale(out)
        else:
            self._ale.getScreenRGB(out)


class Frame42:
    """The computation of `Universe42` on one raw Atari frame (210x160 grey or 210x160x3 RGB),
    also usable on frames from an env loop of the user's own (`hogwild_a3c.load_policy`)."""

    def __init__(self) -> None:
        self._resize = _universe_resize_matrix()
        self._resize_t = np.ascontiguousarray(self._resize.T)
        # For RGB frames: the channel sum goes through, and 1/3 is folded into the matrix.
        self._resize_rgb = _universe_resize_matrix(channels=3)
        self._resize_rgb_t = np.ascontiguousarray(self._resize_rgb.T)

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        cropped = frame[ATARI_CROP_ROWS]
        if frame.ndim == 3:  # an RGB frame: universe averages the channels
            # The channel sum in uint16 (exact, at most 765), then one conversion to float32:
            # about 8x faster than `frame.mean(axis=2)`, which goes through float64.
            summed = np.add(cropped[..., 0], cropped[..., 1], dtype=np.uint16)
            summed += cropped[..., 2]
            small = self._resize_rgb @ summed.astype(np.float32) @ self._resize_rgb_t
        else:
            small = self._resize @ cropped.astype(np.float32) @ self._resize_t
        return np.clip(small, 0.0, 1.0, out=small)[None]

    def grey_batch(self, frames: np.ndarray) -> np.ndarray:
        """Many grey frames at once ([K, 210, 160] -> [K, 1, 42, 42]), e.g. from a vector env:
        one pair of matrix products for the batch, the same numbers as one call per frame."""
        small = self._resize @ frames[:, ATARI_CROP_ROWS].astype(np.float32) @ self._resize_t
        return np.clip(small, 0.0, 1.0, out=small)[:, None]


def parse_env_kwargs(items: list[str]) -> dict[str, Any]:
    """KEY=VALUE strings -> dict; values are Python literals, anything else stays a string."""
    kwargs: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.isidentifier():
            raise EnvSpecError(f"--env-kwargs: '{item}' is not KEY=VALUE with KEY a Python name")
        try:
            kwargs[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError, RecursionError, MemoryError):  # the last two: a deeply nested literal
            kwargs[key] = raw
    return kwargs


def _import_env_module(env_id: str) -> str:
    """Gymnasium's `module:EnvId-v0` form: import the module so it can register the id."""
    module, sep, name = env_id.partition(":")
    if sep:
        importlib.import_module(module)
        return name
    return env_id


def register_atari() -> None:
    """ALE ids must be registered in every process: spawned children do not inherit it."""
    import ale_py

    gym.register_envs(ale_py)


def is_atari(env_id: str) -> bool:
    # ale_py is imported only when the id is not registered yet (0.3 s of a child's start).
    if env_id not in gym.registry:
        register_atari()
    spec = gym.spec(env_id)
    return isinstance(spec.entry_point, str) and spec.entry_point.startswith("ale_py")


def _ale_default_frameskip() -> Any:
    """AtariEnv's own default, for an ALE id registered without a frameskip of its own."""
    from ale_py.env import AtariEnv

    return inspect.signature(AtariEnv).parameters["frameskip"].default


def make_env(
    env_id: str,
    env_kwargs: dict[str, Any] | None = None,
    render_mode: str | None = None,
    frame: str = "fast",
    max_pool: bool = False,
    fire_reset: bool = False,
) -> gym.Env:
    """Build one training environment; safe to call in any process.

    `frame` ("fast" or "universe", see FRAME_MODES) chooses how Atari frames become grey; other
    envs ignore it. `env_kwargs={"obs_type": "rgb"}` also gives universe's frames. `max_pool`
    and `fire_reset` are the Atari protocol of `AtariSteps`; other envs ignore them too.
    """
    frame = RENAMED.get(frame, frame)
    if frame not in FRAME_MODES:
        raise EnvSpecError(f"--frame must be one of {', '.join(FRAME_MODES)} (got {frame!r})")
    kwargs = dict(env_kwargs or {})
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    env_id = _import_env_module(env_id)
    if is_atari(env_id):
        wanted = "rgb" if frame == "universe" else "grayscale"
        given = kwargs.setdefault("obs_type", wanted)
        if frame == "universe" and given != "rgb":
            raise EnvSpecError(f"--frame universe needs RGB frames from ALE, but --env-kwargs sets obs_type={given!r}")
        if given not in ("rgb", "grayscale"):
            raise EnvSpecError(f"--env-kwargs obs_type={given!r}: the 42x42 preprocessing needs 'grayscale' or 'rgb'")
        # The time limit goes outside AtariSteps, whose repeats bypass the wrappers of gym.make.
        max_episode_steps = kwargs.pop("max_episode_steps", None)
        skip = kwargs.get("frameskip", (gym.spec(env_id).kwargs or {}).get("frameskip", _ale_default_frameskip()))
        if max_pool:
            if not isinstance(skip, int) or skip < 2:
                raise EnvSpecError(f"--max-pool needs a fixed frameskip of 2 or more, but '{env_id}' repeats each "
                                   f"action {skip!r} times; give --env-kwargs frameskip=4 or --no-max-pool")
            kwargs["frameskip"] = 1
        # Greyscale straight from ALE (`fast`) saves the RGB->grey conversion on every frame.
        env: gym.Env = Universe42(AtariSteps(gym.make(env_id, **kwargs), skip, max_pool, fire_reset))
        return gym.wrappers.TimeLimit(env, max_episode_steps) if max_episode_steps is not None else env
    env = gym.make(env_id, **kwargs)
    space = env.action_space
    if isinstance(space, gym.spaces.Discrete) and int(space.start) != 0:
        return ActionsFromZero(env)
    return env


class ActionsFromZero(gym.ActionWrapper):
    """A `Discrete(n, start=s)` action space seen as `Discrete(n)`: the policy's index i is the
    env's action s + i."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        space = env.action_space
        assert isinstance(space, gym.spaces.Discrete)  # wrap_actions wraps Discrete spaces only
        self._start = int(space.start)
        self.action_space = gym.spaces.Discrete(int(space.n))

    def action(self, action: int) -> int:
        return self._start + int(action)


def _namespace_hint(env_id: str) -> str:
    """For a bare id that exists under a namespace (`Pong-v5` -> `ALE/Pong-v5`): a suggestion."""
    if "/" in env_id or ":" in env_id:
        return ""
    matches = sorted(name for name in gym.registry if name.endswith("/" + env_id))
    return f"; did you mean {' or '.join(repr(m) for m in matches[:3])}?" if matches else ""


def _kwargs_error(env_id: str, env_kwargs: dict[str, Any], exc: TypeError) -> str:
    """One line for keyword arguments the env's constructor refused. Gymnasium's own message
    repeats every keyword argument the env got (its defaults too); name the bad one instead."""
    given = " ".join(f"{k}={v!r}" for k, v in env_kwargs.items())
    message = str(exc).split(" was raised from the environment creator")[0]
    bad = re.search(r"unexpected keyword argument '(\w+)'", message)
    if bad is None:
        return f"--env-kwargs {given}: rejected by '{env_id}' ({message})"
    key = bad.group(1)
    valid = _constructor_keywords(env_id)
    hint = f" (its constructor takes: {', '.join(valid)})" if valid else ""
    return f"--env-kwargs {key}={env_kwargs.get(key, '?')!r}: '{env_id}' has no keyword argument '{key}'{hint}"


def _constructor_keywords(env_id: str) -> list[str]:
    """The keyword arguments the env's class accepts, when it says so plainly (no **kwargs)."""
    try:
        entry_point = gym.spec(_import_env_module(env_id)).entry_point
        if entry_point is None:
            return []
        creator = (gym.envs.registration.load_env_creator(entry_point) if isinstance(entry_point, str)
                   else entry_point)
        params = inspect.signature(creator).parameters.values()
    except Exception:  # noqa: BLE001 - only a hint: leave it out when it cannot be had
        return []
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"]


@functools.lru_cache(maxsize=1)
def _fresh_process_env_ids() -> frozenset[str] | None:
    """The ids a new interpreter knows after importing only gymnasium and ale_py (asked once per
    process, about 0.5 s); None if that interpreter could not say."""
    code = ("import json, gymnasium, ale_py; gymnasium.register_envs(ale_py); "
            "print(json.dumps(list(gymnasium.registry)))")
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        return frozenset(json.loads(proc.stdout.strip().splitlines()[-1])) if proc.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def _report_registered(env_id: str, conn) -> None:
    """Runs in a probe child: does a child started like a worker know `env_id`?"""
    register_atari()
    conn.send(env_id in gym.registry)


def _child_knows(env_id: str, start_method: str, timeout: float = 60.0) -> bool | None:
    """Start one child the way workers start (which re-runs the main script, if there is one, as
    `__mp_main__`) and ask it; None if it did not answer."""
    ctx = mp.get_context(start_method)
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_report_registered, args=(env_id, send), daemon=True)  # type: ignore[attr-defined]
    try:
        child.start()
        send.close()
        return bool(receive.recv()) if receive.poll(timeout) else None
    except (OSError, EOFError, RuntimeError):
        return None
    finally:
        child.join(5)
        if child.is_alive():
            child.kill()
            child.join()
        receive.close()


def _entry_point_module(spec: Any) -> str | None:
    entry = spec.entry_point
    if isinstance(entry, str):
        return entry.partition(":")[0] or None
    return getattr(entry, "__module__", None)


def check_spawnable(env_id: str, start_method: str = "spawn") -> str | None:
    """Why worker processes could not make `env_id` although this process can, as one line; None
    when they can (or when this process cannot make it either: `describe_env` reports that).

    Children start fresh: they know the ids that gymnasium and ale_py register, the ids of a
    `module:EnvId-v0` (they import the module), and what the main script registers when they
    re-run it. An env registered in a notebook, or by a module imported only in this process,
    is unknown to them, and every worker would fail with Gymnasium's traceback.
    """
    if ":" in env_id:
        return None
    register_atari()
    spec = gym.registry.get(env_id)
    if spec is None:
        return None
    if (_entry_point_module(spec) or "").split(".")[0] in ("gymnasium", "ale_py"):
        return None  # registered by importing gymnasium or ale_py, as every child does: no probe needed
    fresh = _fresh_process_env_ids()
    if fresh is None or env_id in fresh:
        return None
    main = sys.modules.get("__main__")
    reruns_main = getattr(main, "__file__", None) is not None  # spawn/forkserver re-run a main script
    if reruns_main and _child_knows(env_id, start_method) is not False:
        return None
    module = _entry_point_module(spec)
    where = ("in __main__ (a notebook or the interactive prompt)" if module in (None, "__main__", "__mp_main__")
             else "in this process only")
    if module in (None, "__main__", "__mp_main__"):
        fix = f"move the env class and its gymnasium.register call into a module and give --env MODULE:{env_id}"
    else:
        fix = f"give --env MODULE:{env_id} with the module that registers it (perhaps --env {module}:{env_id})"
    return (
        f"--env '{env_id}' is registered {where}; worker processes start fresh and cannot make it: "
        f"{fix}, or train in this process with --num-workers 0"
    )


@dataclass(frozen=True)
class EnvInfo:
    obs_shape: tuple[int, ...]
    num_actions: int


def env_options(cfg: Any) -> dict[str, Any]:
    """The settings of a run's `Config` that `make_env` takes besides the id and its kwargs."""
    return {"frame": cfg.frame, "max_pool": cfg.max_pool, "fire_reset": cfg.fire_reset}


def describe_env(env_id: str, env_kwargs: dict[str, Any] | None = None, frame: str = "fast",
                 max_pool: bool = False, fire_reset: bool = False) -> EnvInfo:
    """Make the env once, check the model can train on it, and return what the model needs."""
    steps = (env_kwargs or {}).get("max_episode_steps")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise EnvSpecError(f"--env-kwargs max_episode_steps must be an integer >= 1 (got {steps!r})")
    try:
        env = make_env(env_id, env_kwargs, frame=frame, max_pool=max_pool, fire_reset=fire_reset)
    except ModuleNotFoundError as exc:
        raise EnvSpecError(f"--env '{env_id}': cannot import module '{exc.name}'") from None
    except gym.error.Error as exc:
        message, hint = str(exc).splitlines()[0], _namespace_hint(env_id)
        raise EnvSpecError(f"--env '{env_id}': {message.rstrip('.') + hint if hint else message}") from None
    except TypeError as exc:
        raise EnvSpecError(_kwargs_error(env_id, env_kwargs or {}, exc)) from None
    except Exception as exc:  # noqa: BLE001 - an env's own check of its arguments (ValueError), or any of its failures
        given = " ".join(f"{key}={shown(value)}" for key, value in (env_kwargs or {}).items())
        reason = (str(exc).splitlines() or [""])[0][:200]
        if not isinstance(exc, ValueError):
            reason = f"making the env raised {type(exc).__name__}" + (f": {reason}" if reason else "")
        raise EnvSpecError(f"--env '{env_id}'{' --env-kwargs ' + given if given else ''}: {reason}") from None
    try:
        if not isinstance(env.action_space, gym.spaces.Discrete):
            raise EnvSpecError(
                f"--env '{env_id}': action space {env.action_space} is not Discrete; "
                "A3C here samples from a categorical policy"
            )
        space = env.observation_space
        shape = tuple(space.shape or ())
        usable = isinstance(space, gym.spaces.Box) and (len(shape) == 1 or shape == (1, FRAME_SIZE, FRAME_SIZE))
        if not usable:
            raise EnvSpecError(
                f"--env '{env_id}': observation space {space} is neither a flat vector nor an Atari "
                "frame; wrap the env so it returns a 1-D Box"
            )
        return EnvInfo(obs_shape=shape, num_actions=int(env.action_space.n))
    finally:
        env.close()
