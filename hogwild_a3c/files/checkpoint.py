"""Checkpoints: the one owner of their format, and files that survive a kill at any instant.

Each save writes `ckpt-<step>.pt` through a temp file (`atomic.write_atomically`), then points
`latest.pt` at it the same way, and prunes old numbered files. `best.pt` (the best evaluated
policy, the trained agent) is written by `save_best`. A checkpoint holds only tensors and plain types, so it loads
with `torch.load(weights_only=True)`: no code runs on load.

A training checkpoint (`training_payload` / `restore_training`) holds the model, every worker's
optimizer statistics (or the one shared set), the step and fault counters, the elapsed time, the
session number, the best evaluation return and the config.
"""
from __future__ import annotations

import json
import math
import os
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

import torch

from ..config import MAX_STEPS
from ..learning.optim import OPTIMIZER_KINDS, moment_keys
from .atomic import WriteError, describe_failure, link_atomically, link_problem, write_atomically, writing
from .plain_data import shown

if TYPE_CHECKING:
    from ..children.shared import SharedState
    from ..config import Config

FORMAT = "hogwild_a3c/checkpoint-v1"
NUMBERED = re.compile(r"^ckpt-(\d+)\.pt$")


class CheckpointError(RuntimeError):
    """A checkpoint file that cannot be used; the message names the file."""


class NoCheckpointError(CheckpointError):
    """A folder with no checkpoint file at all (not one that is damaged): a run stopped before
    its first save."""


class CheckpointWriteError(CheckpointError, WriteError):
    """A checkpoint that could not be written (a full disk, a read-only folder); one line."""


def atomic_save(payload: dict[str, Any], path: str | os.PathLike) -> Path:
    path = Path(path)
    try:
        # Only the last folder is made: a run directory deleted during the run must not come
        # back as a shell of checkpoints/ that --resume refuses.
        with writing(path):
            path.parent.mkdir(exist_ok=True)
        write_atomically(path, lambda f: torch.save(payload, f))
    except WriteError as exc:
        raise CheckpointWriteError(str(exc)) from None
    return path


def save_checkpoint(folder: str | os.PathLike, payload: dict[str, Any], step: int, keep: int = 3) -> Path:
    folder = Path(folder)
    if not isinstance(step, int) or step < 0:
        raise ValueError(f"a checkpoint's step must be an integer >= 0 (got {step!r})")
    payload = {"format": FORMAT, **payload}
    target = atomic_save(payload, folder / f"ckpt-{step:012d}.pt")
    try:
        link_atomically(target, target.with_name("latest.pt"))
    except WriteError as exc:
        raise CheckpointWriteError(str(exc)) from None
    for old in numbered_checkpoints(folder)[keep:]:
        try:
            old.unlink(missing_ok=True)
        except OSError as exc:
            raise CheckpointWriteError(describe_failure(old, exc)) from None
    return target


def numbered_checkpoints(folder: str | os.PathLike) -> list[Path]:
    """Numbered checkpoints, newest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), folder / m.group(0)) for m in map(NUMBERED.match, os.listdir(folder)) if m]
    return [path for _, path in sorted(found, reverse=True)]


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    if _is_json(path):  # config.json or meta.json given by mistake: not a damaged checkpoint
        raise CheckpointError(f"{path}: not a checkpoint (a JSON file; checkpoints are the .pt files in checkpoints/)")
    _check_archive(path)
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means "not usable"
        text = str(exc)
        # A pickle naming a Python global (a class, a function) would run code on a full load.
        if re.search(r"unsupported global", text, re.IGNORECASE):
            raise CheckpointError(
                f"{path}: refused: not a weights-only checkpoint (it holds Python objects whose loading "
                "could run code); only files written by hogwild_a3c are accepted"
            ) from None
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        reason = lines[0] if lines else type(exc).__name__
        raise CheckpointError(f"{path}: not a readable checkpoint (corrupt or truncated: {reason[:160]})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a hogwild_a3c checkpoint (expected format {FORMAT!r})")
    if isinstance(payload.get("model"), dict):
        payload["model"] = with_current_weight_names(payload["model"])
    return payload


# Weights saved under an earlier name: the action head was called the policy head (`policy.*`)
# until "policy" came to mean the trained agent only.
OLD_WEIGHT_PREFIXES = {"policy.": "action_head."}


def with_current_weight_names(weights: dict[str, Any]) -> dict[str, Any]:
    """A model state dict with any weight of an earlier name under its name now, in the same order
    (the optimizer's saved statistics follow the parameters' order)."""
    renamed = {}
    for name, tensor in weights.items():
        old = next((prefix for prefix in OLD_WEIGHT_PREFIXES if isinstance(name, str) and name.startswith(prefix)),
                   None)
        renamed[OLD_WEIGHT_PREFIXES[old] + name[len(old):] if old else name] = tensor
    return renamed


def inflation_cap(file_size: int) -> int:
    """The most bytes a checkpoint's archive may declare its members to hold once unpacked.

    `torch.save` stores every member uncompressed, so a file it wrote declares at most its own
    size; twice that plus 1 MiB leaves room for a file that was re-zipped with compression, and
    bounds what `torch.load` allocates to about that. A crafted archive of compressed zeros (1 MB
    on disk, a GB unpacked) is refused before anything is unpacked."""
    return 2 * file_size + (1 << 20)


def _check_archive(path: Path) -> None:
    try:
        size = path.stat().st_size
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
    except (OSError, zipfile.BadZipFile, ValueError, EOFError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(f"{path}: not a readable checkpoint (corrupt or truncated: {reason[:160]})") from None
    declared = sum(member.file_size for member in members)
    if declared > inflation_cap(size):
        raise CheckpointError(
            f"{path}: refused: its archive declares {declared:,} bytes unpacked from {size:,} on disk (more than "
            f"{inflation_cap(size):,}: twice its size plus 1 MiB); torch writes checkpoints uncompressed, so this "
            "one was crafted or damaged"
        )


def _is_json(path: Path) -> bool:
    if path.stat().st_size > 1 << 20:
        return False
    try:
        json.loads(path.read_bytes())
    except ValueError:
        return False
    return True


def load_latest(folder: str | os.PathLike, warn=print) -> tuple[dict[str, Any], Path]:
    """latest.pt, or else the newest numbered checkpoint that loads, saying what was skipped."""
    folder = Path(folder)
    candidates = [folder / "latest.pt"] + numbered_checkpoints(folder)
    errors = []
    for path in candidates:
        if not path.exists():
            continue
        try:
            payload = load_checkpoint(path)
        except CheckpointError as exc:
            errors.append(str(exc))
            continue
        for message in errors:
            warn(f"warning: skipped {message}; using {path}")
        return payload, path
    if errors:
        raise CheckpointError("; ".join(errors))
    raise NoCheckpointError(f"{folder}: no checkpoint found (expected latest.pt or ckpt-*.pt)")


def resolve_checkpoint(target: str | os.PathLike, warn=print) -> tuple[dict[str, Any], Path]:
    """A checkpoint file, or for a run directory its best.pt (the policy that scored best in
    evaluation) when there is one, else its latest checkpoint."""
    target = Path(target)
    if target.is_dir():
        linked = link_problem(target)
        if linked:
            raise CheckpointError(linked)
        folder = target / "checkpoints" if (target / "checkpoints").is_dir() else target
        best = folder / "best.pt"
        if best.is_file():
            try:
                return load_checkpoint(best), best
            except CheckpointError as exc:  # the run's own latest policy is still there to play
                payload, found = load_latest(folder, warn=warn)
                warn(f"warning: skipped {exc}; using {found}")
                return payload, found
        return load_latest(folder, warn=warn)
    return load_checkpoint(target), target


# -- the payloads -----------------------------------------------------------------------------

def save_best(
    run_dir: str | os.PathLike, model: torch.nn.Module, global_step: int, mean_return: float, cfg: Config
) -> Path:
    """checkpoints/best.pt: the policy with the best mean evaluation return so far."""
    payload = {
        "format": FORMAT,
        "kind": "best",
        "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "global_step": int(global_step),
        "eval_mean_return": float(mean_return),
        "config": cfg.to_dict(),
    }
    return atomic_save(payload, Path(run_dir) / "checkpoints" / "best.pt")


def training_payload(
    weights: dict[str, torch.Tensor], shared: SharedState, cfg: Config, progress: Progress
) -> dict[str, Any]:
    """What `save_checkpoint` writes: `weights` is a snapshot already checked to be finite."""
    from .meta import versions

    return {
        "kind": "training",
        "model": weights,
        "optimizer": {
            "kind": cfg.optimizer,
            "states": [
                {key: value.clone() if key == "step" else [t.clone() for t in value] for key, value in s.items()}
                for s in shared.optimizer_states
            ],
        },
        "global_step": progress.global_step,
        "elapsed_s": progress.elapsed_s,
        "session": progress.session,
        "best_eval_return": progress.best_eval_return,
        "counters": dict(progress.counters),
        "config": cfg.to_dict(),
        "versions": versions(),
    }


@dataclass
class Progress:
    """Where a run stands: what a training checkpoint records besides tensors."""

    global_step: int = 0
    elapsed_s: float = 0.0
    session: int = 0
    best_eval_return: float = -math.inf
    counters: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> Progress:
        return cls(
            global_step=int(payload["global_step"]),
            elapsed_s=float(payload["elapsed_s"]),
            session=int(payload["session"]),
            best_eval_return=float(payload["best_eval_return"]),
            counters={k: int(v) for k, v in payload["counters"].items()},
        )


def check_training_payload(payload: dict[str, Any], path: Path, model: torch.nn.Module, optimizer: str) -> None:
    """One line naming the file when a checkpoint cannot restore `model`'s training state.

    Everything `restore_training` will use is checked here, before any of it is: a crafted or
    damaged file gets this line, never a traceback, a NaN clock that ignores --max-seconds or a
    negative step."""
    missing = [k for k in ("model", "optimizer", "global_step", "elapsed_s", "session", "best_eval_return", "counters")
               if k not in payload]
    if missing:
        raise CheckpointError(f"{path}: not a training checkpoint (no {', '.join(missing)})")
    check_model_fits(payload, path, model)
    problem = (_progress_problem(payload)
               or _optimizer_problem(payload["optimizer"], list(model.parameters()), optimizer))
    if problem:
        raise CheckpointError(f"{path}: damaged or crafted training checkpoint: {problem}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _count_problem(name: str, value: Any) -> str | None:
    # The step counters are int64 tensors: a larger count would overflow them when restored.
    if not _is_int(value) or not 0 <= value <= MAX_STEPS:
        return f"{name} is {shown(value)}, not an integer from 0 to 2**62"
    return None


def step_problem(payload: dict[str, Any], path: Path) -> None:
    """One line naming the file when its `global_step` is not a count (a policy file's too)."""
    problem = _count_problem("global_step", payload["global_step"]) if "global_step" in payload else None
    if problem:
        raise CheckpointError(f"{path}: damaged or crafted checkpoint: {problem}")


def _progress_problem(payload: dict[str, Any]) -> str | None:
    for key in ("global_step", "session"):
        problem = _count_problem(key, payload[key])
        if problem:
            return problem
    elapsed = payload["elapsed_s"]
    if not _is_number(elapsed) or not math.isfinite(elapsed) or elapsed < 0:
        return f"elapsed_s is {elapsed!r}, not a finite number of seconds >= 0"
    best = payload["best_eval_return"]
    # -inf is what a run that never evaluated saves.
    if not _is_number(best) or math.isnan(best) or best == math.inf:
        return f"best_eval_return is {best!r}, not a number (or -inf)"
    counters = payload["counters"]
    if not isinstance(counters, dict):
        return f"counters is {type(counters).__name__}, not a dict"
    for name, value in counters.items():
        if not isinstance(name, str) or _count_problem("", value):
            return f"counter {shown(name)} is {shown(value)}, not an integer from 0 to 2**62"
    return None


def _optimizer_problem(optimizer: Any, params: list[torch.Tensor], expected_kind: str) -> str | None:
    if not isinstance(optimizer, dict) or optimizer.get("kind") not in OPTIMIZER_KINDS:
        return f"its optimizer is not a record of one of the kinds {', '.join(OPTIMIZER_KINDS)}"
    keys = moment_keys(optimizer["kind"])
    if keys != moment_keys(expected_kind):
        return f"its optimizer is {optimizer['kind']}, whose statistics do not fit --optimizer {expected_kind}"
    states = optimizer.get("states")
    if not isinstance(states, list) or not states:
        return "it holds no optimizer statistics (an empty list)"
    for i, state in enumerate(states):
        if not isinstance(state, dict):
            return f"optimizer state {i} is not a record"
        step = state.get("step")
        if not _tensor_like(step, (len(params),), torch.float32) or not bool((step >= 0).all()):
            return f"optimizer state {i}: its step counters are not {len(params)} finite numbers >= 0"
        for key in keys:
            tensors = state.get(key)
            if not isinstance(tensors, list) or len(tensors) != len(params):
                return f"optimizer state {i}: {key} is not a list of {len(params)} tensors"
            for j, (tensor, param) in enumerate(zip(tensors, params)):
                if not _tensor_like(tensor, tuple(param.shape), param.dtype):
                    shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
                    return (f"optimizer state {i}: {key}[{j}] is {shape}, not a finite {param.dtype} tensor of "
                            f"shape {tuple(param.shape)}")
                if key == keys[-1] and not bool((tensor >= 0).all()):
                    return f"optimizer state {i}: {key}[{j}] has negative entries (a second moment cannot)"
    return None


def _tensor_like(value: Any, shape: tuple[int, ...], dtype: torch.dtype) -> TypeGuard[torch.Tensor]:
    return (isinstance(value, torch.Tensor) and tuple(value.shape) == shape and value.dtype == dtype
            and not value.is_sparse and bool(torch.isfinite(value).all()))


def check_model_fits(payload: dict[str, Any], path: Path, model: torch.nn.Module) -> None:
    """One line naming the file when the checkpoint's weights cannot load into `model`, or
    hold NaN or inf (a policy that would act on garbage)."""
    if "model" not in payload:
        raise CheckpointError(f"{path}: holds no model weights")
    expected = model.state_dict()
    saved = payload["model"]
    if (not isinstance(saved, dict) or set(saved) != set(expected)
            or any(not isinstance(v, torch.Tensor) or tuple(v.shape) != tuple(expected[k].shape)
                   for k, v in saved.items())):
        raise CheckpointError(f"{path}: its model does not fit this config "
                              "(another --lstm-size, --image-size, --frame-stack, --encoder, env or model?)")
    for name, tensor in saved.items():
        if tensor.dtype != expected[name].dtype:
            raise CheckpointError(f"{path}: its model's {name} is {tensor.dtype}, not {expected[name].dtype}")
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise CheckpointError(f"{path}: its model's {name} holds NaN or inf; refusing to use these weights")


@torch.no_grad()
def restore_training(shared: SharedState, payload: dict[str, Any]) -> Progress:
    """Load a training checkpoint into fresh shared state; returns where the run stood."""
    shared.model.load_state_dict(payload["model"])
    saved_states = payload["optimizer"]["states"]
    for i, state in enumerate(shared.optimizer_states):
        # More workers than before: the new ones start with the statistics of an old one.
        saved = saved_states[i % len(saved_states)]
        state["step"].copy_(saved["step"])
        for key in moment_keys(shared.optimizer):
            for dst, src in zip(state[key], saved[key]):
                dst.copy_(src)
    progress = Progress.from_payload(payload)
    shared.base_step[0] = progress.global_step
    return progress
