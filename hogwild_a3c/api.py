"""Training and playing from Python: `train`, `load_policy`, `evaluate`.

    import hogwild_a3c
    result = hogwild_a3c.train(env="CartPole-v1", max_steps=200_000)
    policy = hogwild_a3c.load_policy(result.run_dir)
    returns = hogwild_a3c.evaluate(result.run_dir, episodes=3)

`train` runs exactly what `python -m hogwild_a3c.train` runs (the same checks, processes, files
and exit statuses); Ctrl-C (or the notebook's interrupt) stops it as cleanly as in a shell and
the result says so. Bad settings raise `ValueError` with one line per problem.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .config import OLD_FIELD_NAMES, Config, config_from_dict, flag_name, typed_values, with_current_names
from .envs.atari import AtariFrame, is_atari
from .envs.make import EnvInfo, EnvSpecError, describe_env, env_options, make_env, unconsented_module
from .files.checkpoint import CheckpointError, check_model_fits, resolve_checkpoint, step_problem
from .files.plain_data import shown
from .learning.distributions import choose
from .learning.model import ActorCritic, State, model_for_env, model_size_problem
from .run.session import TrainResult

__all__ = ["Policy", "PolicyError", "TrainResult", "evaluate", "load_policy", "resolve_config", "train"]


def _given(config: Config | str | Path | None, progress: bool | None, settings: dict[str, Any]) -> dict[str, Any]:
    """The settings the caller gave, typed as `Config`'s fields, as the command line's parser
    hands them on: a `Config` gives every one of its fields, keywords override it."""
    names = {f.name for f in dataclasses.fields(Config)}
    unknown = sorted(set(settings) - names - set(OLD_FIELD_NAMES))
    if unknown:
        raise ValueError(
            f"unknown setting(s) {', '.join(unknown)}; the settings are Config's fields: {', '.join(sorted(names))}"
        )
    given: dict[str, Any] = {}
    if isinstance(config, Config):
        given = config.to_dict()
        if given["preset"] == "auto":
            # Every field is given, so no preset fills anything: the values started from Config's
            # defaults, which are the universe preset's.
            given["preset"] = "universe"
    elif isinstance(config, (str, Path)):
        given["config"] = str(config)  # a JSON file of settings, as --config
    elif config is not None:
        raise ValueError(
            f"config must be a Config or the path of a JSON file of settings (got {type(config).__name__})"
        )
    if progress is not None and "no_progress" in settings:
        raise ValueError("give progress= or no_progress=, not both")
    settings = with_current_names(settings)  # no_progress=True, the earlier name, still works
    if progress is not None:
        given["progress"] = progress
    given.update(settings)
    # What argparse would have turned into strings: paths, and env_kwargs as a mapping.
    for name in ("run_dir", "config"):
        if isinstance(given.get(name), Path):
            given[name] = str(given[name])
    typed, errors = typed_values(given, "hogwild_a3c.train")
    if errors:
        raise ValueError("\n".join(errors))
    return typed


def _as_argv(given: dict[str, Any]) -> list[str]:
    """The given settings as command-line flags, for meta.json's record of how the run started."""
    negatable = {f.name for f in dataclasses.fields(Config) if f.metadata.get("negatable")}
    argv: list[str] = []
    for name, value in given.items():
        if value is None or (value is False and name not in negatable):  # a plain switch's False is its default
            continue
        if isinstance(value, bool):
            argv.append(flag_name(name) if value else "--no-" + flag_name(name)[2:])
        elif name == "env_kwargs":
            argv += [flag_name(name), *(f"{key}={item!r}" for key, item in dict(value).items())]
        else:
            argv += [flag_name(name), str(value)]
    return argv


def train(config: Config | str | Path | None = None, *, resume: str | Path | None = None,
          progress: bool | None = None, callbacks: list[Any] | None = None, **settings: Any) -> TrainResult:
    """Train as the command line does, with `Config` fields as keywords, e.g.
    `train(env="CartPole-v1", max_steps=100_000, progress=False)`. What is not given comes from
    the env's preset, as on the command line. `config` may be a `Config`, run as it is, every
    field of it (start from `resolve_config(...)` to keep a preset's values), or a JSON file of
    settings (`--config`); keywords override it. `resume=RUN_DIR` continues a run (then give
    only what may change). `callbacks`: objects with any of `hogwild_a3c.Callback`'s methods,
    called in this process (see callbacks.py). Bad settings raise `ValueError`, one line per problem."""
    from .files.rundir import ConfigError
    from .run.callbacks import check_callbacks
    from .run.prepare import prepare_given
    from .run.session import Session

    _refuse_in_a_spawned_child()
    hooked = check_callbacks(callbacks)
    if resume is not None and not isinstance(resume, (str, os.PathLike)):
        raise ValueError(f"resume must be a run directory, as a str or a Path (got {type(resume).__name__})")
    given = _given(config, progress, settings)
    try:
        prepared = prepare_given(dict(given), None if resume is None else str(resume))
    except ConfigError as exc:
        raise ValueError("\n".join(exc.errors)) from None
    argv = _as_argv(given) + (["--resume", str(resume)] if resume is not None else [])
    return Session(prepared, argv, hooked).run()


def resolve_config(config: Config | str | Path | None = None, *, progress: bool | None = None,
                   **settings: Any) -> Config:
    """The `Config` that `train` with these arguments would run (the preset applied), without
    running anything: look at it, change a field, and pass it to `train`."""
    from .files.rundir import ConfigError, resolve_new

    given = _given(config, progress, settings)
    try:
        return resolve_new(given)
    except ConfigError as exc:
        raise ValueError("\n".join(exc.errors)) from None


def _refuse_in_a_spawned_child() -> None:
    """Worker processes start by importing the main script again (the spawn start method); a
    script that calls `train()` at its top level, without `if __name__ == "__main__":`, would
    start a whole new run inside every child. Stop that child at once, before any folder is made."""
    import multiprocessing

    if getattr(multiprocessing.current_process(), "_inheriting", False):
        # SystemExit, not an exception: the child has nothing to clean up, and the user needs this
        # one line, not a traceback through multiprocessing's bootstrap.
        raise SystemExit(
            "error: hogwild_a3c.train() was called while a worker process imported your script; put the call under "
            "`if __name__ == \"__main__\":` (worker processes import the main script again when they start)"
        )


class PolicyError(ValueError):
    """A checkpoint that cannot be played; the message is one line naming the file."""


class Policy:
    """A trained policy for an env loop of your own: `initial_state()`, then `act(obs, state)`
    for each observation. Observations are what `make_env()` returns, or the env's own: raw Atari
    frames (210x160 grey or 210x160x3 RGB) are preprocessed as in training (not where training
    stacked frames, `--frame-stack`: one frame is not a stack), and an env whose
    observations training packed (a dict, an image, a discrete value) is packed the same way."""

    def __init__(self, model: ActorCritic, cfg: Config, env_info: EnvInfo, checkpoint: Path,
                 global_step: int | None = None):
        self.model = model.eval()
        self.global_step = global_step  # when the checkpoint was saved
        self.cfg = cfg
        self.env_info = env_info
        self.checkpoint = checkpoint
        # A raw frame is one frame: a policy that sees stacked frames takes make_env()'s observations.
        self._atari_frame = (AtariFrame(cfg.image_size) if len(env_info.obs_shape) == 3 and is_atari(cfg.env)
                             and cfg.frame_stack == 1 else None)

    def make_env(self, render_mode: str | None = None) -> Any:
        """The env as the trainer made it (id, keyword arguments, preprocessing)."""
        return make_env(self.cfg.env, self.cfg.env_kwargs, render_mode=render_mode, **env_options(self.cfg))

    def initial_state(self) -> State:
        return self.model.initial_state(1)

    def _prepare(self, obs: Any) -> torch.Tensor:
        layout = self.env_info.layout
        if layout is not None and not (isinstance(obs, np.ndarray) and obs.shape == self.env_info.obs_shape):
            try:
                obs = layout.pack(obs)  # the env's own observation (make_env's is packed already)
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                raise ValueError(f"observation {shown(obs)} does not fit this policy's observation space: "
                                 f"{layout.describe()} ({type(exc).__name__}: {exc})") from None
        obs = np.asarray(obs)
        if obs.shape != self.env_info.obs_shape and self._atari_frame is not None and obs.shape[:2] == (210, 160):
            obs = self._atari_frame(obs)
        if obs.shape != self.env_info.obs_shape:
            raise ValueError(f"observation of shape {obs.shape}; this policy takes {self.env_info.obs_shape} "
                             "(use the env from make_env())")
        obs = obs.astype(np.float32, copy=False)
        if not np.isfinite(obs).all():
            # A NaN reaches the action parameters as NaN, and a Categorical draw from NaN logits
            # quietly returns action 0.
            raise ValueError(f"observation holds {'NaN' if np.isnan(obs).any() else 'inf'} at index "
                             f"{tuple(int(i) for i in np.argwhere(~np.isfinite(obs))[0])}; a policy acts only on "
                             "finite observations")
        return torch.from_numpy(obs[None])

    @torch.no_grad()
    def act(self, obs: Any, state: State, greedy: bool = False,
            rng: np.random.Generator | None = None) -> tuple[Any, State]:
        """The action for `obs` as the env's `step` takes it (an int for a Discrete space), and the
        next LSTM state: the most likely action when `greedy`, else one drawn with `rng`."""
        action_params, _, state = self.model.step(self._prepare(obs), state)
        action = choose(self.model.distribution, action_params, rng if rng is not None else np.random.default_rng(),
                        greedy)[0]
        return self.model.distribution.env_action(action), state


def load_policy(path: str | Path, env: str | None = None) -> Policy:
    """The policy in a checkpoint file or a run directory (its best.pt, else its latest).

    A checkpoint whose env names a module to import (`module:EnvId-v0`) is refused unless `env`
    names the same id: a file from elsewhere must never make this process run its code."""
    if not isinstance(path, (str, os.PathLike)):
        raise PolicyError(f"load_policy: path must be a checkpoint file or a run directory, as a str or a Path "
                          f"(got {type(path).__name__})")
    if env is not None and not isinstance(env, str):
        raise PolicyError(f"load_policy: env must be an env id string or None (got {type(env).__name__})")
    target = Path(path)
    if not target.exists():
        raise PolicyError(f"{target}: no such checkpoint file or run directory")
    try:
        payload, found = resolve_checkpoint(target, warn=lambda message: print(message, file=sys.stderr))
        step_problem(payload, found)
        cfg = config_from_dict(payload.get("config"), f"{found} (its saved config)")
    except (CheckpointError, ValueError) as exc:
        raise PolicyError(str(exc).splitlines()[0]) from None
    module = unconsented_module(cfg.env, env)
    if module:
        raise PolicyError(f"{found}: its env '{cfg.env}' would import the module '{module}'; a checkpoint never "
                          f"imports code by itself: pass --env {cfg.env} to allow it")
    try:
        info = describe_env(cfg.env, cfg.env_kwargs, **env_options(cfg))
        too_large = model_size_problem(info.obs_shape, info.distribution, cfg, info.layout)
        if too_large:
            raise PolicyError(f"{found}: its saved config's {too_large}")
        with torch.device("meta"):  # the shapes alone: a crafted config allocates nothing before it is refused
            check_model_fits(payload, found, model_for_env(info, cfg))
        model = model_for_env(info, cfg)
    except (EnvSpecError, CheckpointError) as exc:
        raise PolicyError(str(exc)) from None
    model.load_state_dict(payload["model"])
    return Policy(model, cfg, info, found, payload.get("global_step"))


def evaluate(path: str | Path, episodes: int = 5, greedy: bool = False, seed: int = 0,
             env: str | None = None) -> list[float]:
    """Play `episodes` episodes of a saved policy; their returns."""
    from .children.evaluator import play_episode

    if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 1:
        raise ValueError(f"episodes must be an integer >= 1 (got {episodes!r})")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0 (got {seed!r})")
    policy = load_policy(path, env=env)
    game = policy.make_env()
    game.reset(seed=seed)
    rng = np.random.default_rng(seed)
    try:
        returns = []
        for _ in range(episodes):
            played = play_episode(policy.model, game, rng, greedy=greedy)
            assert played is not None  # with no should_stop, every episode is played to its end
            returns.append(played[0])
        return returns
    finally:
        game.close()
