"""Environment construction: any Gymnasium env whose action space has a distribution
(`learning.distributions`), or Atari with the
universe's frame preprocessing (the frames and the Atari protocol are in `atari.py`). Observations
other than a flat vector and the Atari frame (images, Dict, Tuple, Discrete) are packed into one
vector by `observations.FlatObservation`.

`describe_env` is called once in the main process, before any child starts, so that an unknown
id, an action space no distribution takes or an observation the model cannot take is reported as one clear
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
import warnings
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from ..config import RENAMED
from ..files.plain_data import shown
from ..learning.distributions import ActionDistribution, UnsupportedActions, distribution_for
from .atari import (
    ATARI_CROP_ROWS,
    FRAME_MODES,
    FRAME_SIZE,
    AtariFrame,
    AtariSteps,
    StackedFrames,
    UniverseFrames,
    ale_default_frameskip,
    is_atari,
    register_atari,
)
from .contract import contract_problem
from .observations import FlatObservation, ObservationError, ObsLayout, layout_of

# What other modules and the benchmarks import from here: the Atari pieces live in atari.py.
__all__ = ["ATARI_CROP_ROWS", "FRAME_MODES", "FRAME_SIZE", "AtariFrame", "AtariSteps", "EnvInfo", "EnvSpecError",
           "UniverseFrames", "check_spawnable", "describe_env", "env_options", "is_atari", "make_env",
           "parse_env_kwargs", "register_atari", "unconsented_module"]

class EnvSpecError(ValueError):
    """The requested environment cannot be trained by this model."""


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


def unconsented_module(saved_env: str, named_env: str | None) -> str | None:
    """The module that `saved_env` (read from a file: a config.json, a checkpoint) would import
    when the user did not name that same id (`named_env`, from the command line or the API);
    None when it imports nothing, or the user consented. A file never makes this process run code."""
    module, sep, _ = saved_env.partition(":")
    return module if sep and named_env != saved_env else None


def _import_env_module(env_id: str) -> str:
    """Gymnasium's `module:EnvId-v0` form: import the module so it can register the id."""
    module, sep, name = env_id.partition(":")
    if sep:
        importlib.import_module(module)
        return name
    return env_id


def _mujoco_warning(text: str) -> None:
    # Gymnasium's own MuJoCo models use attributes MuJoCo 4 calls deprecated: nothing a user can
    # act on. Anything else is a Python warning, shown once.
    if "deprecated" not in text:
        warnings.warn(f"MuJoCo: {text.strip()}", stacklevel=2)


def _route_mujoco_warnings(env_id: str) -> None:
    """MuJoCo's own warning handler prints to stderr and appends to MUJOCO_LOG.TXT in the working
    directory of every process that makes the env: a file left in the user's folder by each
    worker. Its warnings go through Python's instead, before the env builds its model."""
    try:
        entry_point = str(gym.spec(env_id).entry_point)
    except gym.error.Error:
        return
    if "mujoco" in entry_point:
        import mujoco

        mujoco.set_mju_user_warning(_mujoco_warning)


def make_env(
    env_id: str,
    env_kwargs: dict[str, Any] | None = None,
    render_mode: str | None = None,
    frame: str = "luminance",
    max_pool: bool = False,
    fire_reset: bool = False,
    image_size: int = FRAME_SIZE,
    frame_stack: int = 1,
) -> gym.Env:
    """Build one training environment; safe to call in any process.

    `frame` ("luminance" or "universe", see FRAME_MODES; the old name "fast" is taken too) chooses
    how Atari frames become grey; other envs ignore it. `env_kwargs={"obs_type": "rgb"}` also
    gives universe's frames. `max_pool` and `fire_reset` are the Atari protocol of `AtariSteps`;
    other envs ignore them too. `image_size`: the side Atari frames and images larger than it are
    resized to (atari.py, observations.py). `frame_stack`: Atari frames seen as the last this many
    stacked as channels; other envs must leave it at 1.
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
            raise EnvSpecError(f"--env-kwargs obs_type={given!r}: the frame preprocessing needs 'grayscale' or 'rgb'")
        # The time limit goes outside AtariSteps, whose repeats bypass the wrappers of gym.make.
        max_episode_steps = kwargs.pop("max_episode_steps", None)
        skip = kwargs.get("frameskip", (gym.spec(env_id).kwargs or {}).get("frameskip", ale_default_frameskip()))
        if max_pool:
            if not isinstance(skip, int) or skip < 2:
                raise EnvSpecError(f"--max-pool needs a fixed frameskip of 2 or more, but '{env_id}' repeats each "
                                   f"action {skip!r} times; give --env-kwargs frameskip=4 or --no-max-pool")
            kwargs["frameskip"] = 1
        # Greyscale straight from ALE (`luminance`) saves the RGB->grey conversion on every frame.
        env: gym.Env = UniverseFrames(AtariSteps(gym.make(env_id, **kwargs), skip, max_pool, fire_reset), image_size)
        if frame_stack > 1:
            env = StackedFrames(env, frame_stack)
        return gym.wrappers.TimeLimit(env, max_episode_steps) if max_episode_steps is not None else env
    if frame_stack != 1:
        raise EnvSpecError(f"--frame-stack {frame_stack}: only Atari frames are stacked; '{env_id}' is not an "
                           "Atari env, so give --frame-stack 1")
    _route_mujoco_warnings(env_id)
    env = gym.make(env_id, **kwargs)
    layout = layout_of(env.observation_space, image_size)
    if layout is not None:
        env = FlatObservation(env, layout)
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
        assert isinstance(space, gym.spaces.Discrete)  # make_env wraps Discrete spaces only
        self._start = int(space.start)
        self.action_space = gym.spaces.Discrete(int(space.n))

    def action(self, action: int) -> int:
        return self._start + int(action)


def _namespace_hint(env_id: str) -> str:
    """For a bare id that exists under a namespace (`Pong-v5` -> `ALE/Pong-v5`): a suggestion."""
    if "/" in env_id or ":" in env_id:
        return ""
    matches = sorted(name for name in gym.registry if name.endswith("/" + env_id))
    if matches:
        return f"; did you mean {' or '.join(repr(m) for m in matches[:3])}?"
    package = _registering_package(env_id)
    return f"; {package} registers its envs when imported: give --env {package}:{env_id}" if package else ""


def _registering_package(env_id: str) -> str | None:
    """An installed package named like the id's first word (MiniGrid-Empty-5x5-v0 -> minigrid),
    which would register it when imported; found without importing anything."""
    import importlib.util

    word = re.split(r"[-/_]", env_id, maxsplit=1)[0].lower()
    if not word.isidentifier() or word in ("gymnasium", "gym", "ale_py", "ale"):
        return None
    try:
        return word if importlib.util.find_spec(word) is not None else None
    except (ImportError, ValueError):
        return None


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
    distribution: ActionDistribution  # of the env's actions: what the model's action head parametrizes
    layout: ObsLayout | None = None  # how observations are packed, when they are (observations.py)
    # Every observation value lies in [0, 1] (Atari frames, images of uint8 scaled by 1/255): a
    # replay memory may keep them as uint8 levels.
    unit_interval: bool = False


def _in_unit_interval(space: gym.Space, layout: ObsLayout | None) -> bool:
    if layout is not None:
        return all(part.kind == "image" and part.scale == 1.0 / 255.0 for part in layout.parts)
    return (isinstance(space, gym.spaces.Box) and bool(np.all(space.low >= 0.0)) and bool(np.all(space.high <= 1.0)))


def env_options(cfg: Any) -> dict[str, Any]:
    """The settings of a run's `Config` that `make_env` takes besides the id and its kwargs."""
    return {"frame": cfg.frame, "max_pool": cfg.max_pool, "fire_reset": cfg.fire_reset, "image_size": cfg.image_size,
            "frame_stack": cfg.frame_stack}


def _has_layout(env: gym.Env) -> bool:
    try:
        env.get_wrapper_attr("layout")
    except AttributeError:
        return False
    return True


def describe_env(env_id: str, env_kwargs: dict[str, Any] | None = None, frame: str = "luminance",
                 max_pool: bool = False, fire_reset: bool = False, image_size: int = FRAME_SIZE,
                 frame_stack: int = 1) -> EnvInfo:
    """Make the env once, check the model can train on it, and return what the model needs."""
    steps = (env_kwargs or {}).get("max_episode_steps")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise EnvSpecError(f"--env-kwargs max_episode_steps must be an integer >= 1 (got {steps!r})")
    try:
        env = make_env(env_id, env_kwargs, frame=frame, max_pool=max_pool, fire_reset=fire_reset,
                       image_size=image_size, frame_stack=frame_stack)
    except ObservationError as exc:
        raise EnvSpecError(f"--env '{env_id}': {exc}") from None
    except ModuleNotFoundError as exc:
        raise EnvSpecError(f"--env '{env_id}': cannot import module '{exc.name}'") from None
    except gym.error.Error as exc:
        message, hint = str(exc).splitlines()[0], _namespace_hint(env_id)
        raise EnvSpecError(f"--env '{env_id}': {message.rstrip('.') + hint if hint else message}") from None
    except TypeError as exc:
        if env_kwargs:  # what the constructor refused; with none given, the env's own fault below
            raise EnvSpecError(_kwargs_error(env_id, env_kwargs, exc)) from None
        message = str(exc).split(" was raised from the environment creator")[0].splitlines()[0][:200]
        raise EnvSpecError(f"--env '{env_id}': making the env raised TypeError: {message}") from None
    except Exception as exc:  # noqa: BLE001 - an env's own check of its arguments (ValueError), or any of its failures
        given = " ".join(f"{key}={shown(value)}" for key, value in (env_kwargs or {}).items())
        reason = (str(exc).splitlines() or [""])[0][:200]
        if not isinstance(exc, ValueError):
            reason = f"making the env raised {type(exc).__name__}" + (f": {reason}" if reason else "")
        raise EnvSpecError(f"--env '{env_id}'{' --env-kwargs ' + given if given else ''}: {reason}") from None
    try:
        try:
            distribution = distribution_for(env.action_space)
        except UnsupportedActions as exc:
            raise EnvSpecError(f"--env '{env_id}': {exc}") from None
        packed = env.get_wrapper_attr("layout") if _has_layout(env) else None
        broken = contract_problem(env, distribution)
        if broken:
            raise EnvSpecError(f"--env '{env_id}': {broken}")
        return EnvInfo(obs_shape=tuple(env.observation_space.shape or ()), distribution=distribution, layout=packed,
                       unit_interval=_in_unit_interval(env.observation_space, packed))
    finally:
        env.close()
