"""The env's side of Gymnasium's contract, checked once in the main process at start-up: `reset()`
and one `step()` of the env as training makes it, their results held against the spaces it declares.
A broken env is then one line naming what it returned, before any process starts, instead of a
traceback in every worker.

An env that raises is not judged here: the workers' rules for env errors (`--max-env-errors`)
apply to it, as they would to a failure later in the run. What is judged: an observation that
packing cannot read (`ObservationMismatch`), and a result of the wrong kind, which Gymnasium's own
checker (wrapped around every env by `gymnasium.make`) refuses with an AssertionError.
"""
from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from ..files.plain_data import shown
from ..learning.distributions import ActionDistribution
from .observations import ObservationMismatch

STEP_RESULT = "(observation, reward, terminated, truncated, info)"


def contract_problem(env: gym.Env, distribution: ActionDistribution) -> str | None:
    """What the env returned that breaks its contract, in words, or None."""
    declared = tuple(env.observation_space.shape or ())
    if int(np.prod(declared)) == 0:
        return f"its observation space {shown(env.observation_space)} holds no numbers"
    result: Any
    try:
        result = env.reset(seed=0)
    except (AssertionError, ObservationMismatch) as exc:
        return f"reset(): {_first_line(exc)}"
    except Exception:  # noqa: BLE001 - an env that raises: the workers' rules for env errors apply
        return None
    if not (isinstance(result, tuple) and len(result) == 2):
        return f"reset() returned {shown(result)}, not (observation, info)"
    problem = _shape_problem("reset()", result[0], declared)
    if problem:
        return problem
    action = distribution.env_action(distribution.mode(torch.zeros(1, distribution.param_size))[0])
    try:
        result = env.step(action)
    except (AssertionError, ObservationMismatch) as exc:
        return f"step({shown(action)}): {_first_line(exc)}"
    except Exception:  # noqa: BLE001 - as for reset
        return None
    if not (isinstance(result, tuple) and len(result) == 5):
        return f"step() returned {shown(result)}, not {STEP_RESULT}"
    try:
        float(result[1])
    except (TypeError, ValueError):
        return f"step() returned the reward {shown(result[1])}, not a number"
    return _shape_problem("step()", result[0], declared)


def _shape_problem(call: str, obs: Any, declared: tuple[int, ...]) -> str | None:
    try:
        shape = np.asarray(obs, dtype=np.float32).shape
    except (TypeError, ValueError) as exc:
        return f"{call} returned an observation that is not an array of numbers ({_first_line(exc)}): {shown(obs)}"
    if shape != declared:
        return f"{call} returned an observation of shape {shape}; its observation space declares {declared}"
    return None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
