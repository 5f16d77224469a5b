"""Environment construction: Atari with the universe 42x42 preprocessing, or any Gymnasium env
with a Discrete action space and a flat vector observation.

`describe_env` is called once in the main process, before any child starts, so that an unknown
id, a continuous action space or an observation the model cannot take is reported as one clear
line instead of a traceback from every worker.
"""
from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

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


def _universe_resize_matrix() -> np.ndarray:
    """160 -> 80 -> 42 as one [42, 160] matrix, folded with the 1/255 scale.

    Universe shrinks in two linear steps; both are linear maps, so their product applied on
    each side (M @ frame @ M.T) gives the same pixels with two small matmuls per frame.
    """
    halve = _linear_resize_matrix(160, 80)
    shrink = _linear_resize_matrix(80, FRAME_SIZE)
    return (shrink @ halve) / np.sqrt(255.0, dtype=np.float32)


class Universe42(gym.ObservationWrapper):
    """Greyscale Atari frame -> 1x42x42 float32 in [0, 1] (universe-starter-agent's `_process_frame42`)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self._resize = _universe_resize_matrix()
        self._resize_t = np.ascontiguousarray(self._resize.T)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (1, FRAME_SIZE, FRAME_SIZE), np.float32)

    def observation(self, frame: np.ndarray) -> np.ndarray:
        if frame.ndim == 3:  # an RGB frame: universe averages the channels
            frame = frame.mean(axis=2)
        cropped = frame[ATARI_CROP_ROWS].astype(np.float32)
        small = self._resize @ cropped @ self._resize_t
        return np.clip(small, 0.0, 1.0, out=small)[None]


def parse_env_kwargs(items: list[str]) -> dict[str, Any]:
    """KEY=VALUE strings -> dict; values are Python literals, anything else stays a string."""
    kwargs: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.isidentifier():
            raise EnvSpecError(f"--env-kwargs: '{item}' is not KEY=VALUE with KEY a Python name")
        try:
            kwargs[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
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


def make_env(env_id: str, env_kwargs: dict[str, Any] | None = None, render_mode: str | None = None) -> gym.Env:
    """Build one training environment; safe to call in any process."""
    kwargs = dict(env_kwargs or {})
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    env_id = _import_env_module(env_id)
    if is_atari(env_id):
        # Greyscale straight from ALE saves the RGB->grey conversion on every frame.
        kwargs.setdefault("obs_type", "grayscale")
        return Universe42(gym.make(env_id, **kwargs))
    return gym.make(env_id, **kwargs)


@dataclass(frozen=True)
class EnvInfo:
    obs_shape: tuple[int, ...]
    num_actions: int


def describe_env(env_id: str, env_kwargs: dict[str, Any] | None = None) -> EnvInfo:
    """Make the env once, check the model can train on it, and return what the model needs."""
    try:
        env = make_env(env_id, env_kwargs)
    except ModuleNotFoundError as exc:
        raise EnvSpecError(f"--env '{env_id}': cannot import module '{exc.name}'") from None
    except gym.error.Error as exc:
        raise EnvSpecError(f"--env '{env_id}': {str(exc).splitlines()[0]}") from None
    except TypeError as exc:
        raise EnvSpecError(f"--env-kwargs {env_kwargs}: rejected by '{env_id}' ({exc})") from None
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
