"""Checkpoints that survive a kill at any instant.

Each save writes `ckpt-<step>.pt` through a temp file (flush, fsync, `os.replace`), then points
`latest.pt` at it the same way, and prunes old numbered files. A checkpoint holds only tensors
and plain types, so it loads with `torch.load(weights_only=True)`: no code runs on load.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

FORMAT = "hogwild_a3c/checkpoint-v1"
NUMBERED = re.compile(r"^ckpt-(\d+)\.pt$")


class CheckpointError(RuntimeError):
    """A checkpoint file that cannot be used; the message names the file."""


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_save(payload: dict[str, Any], path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A dot-prefixed name never matches NUMBERED or latest.pt, so a temp file left by a kill
    # is never taken for a checkpoint.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    _fsync_dir(path.parent)
    return path


def _point_latest(target: Path) -> None:
    """latest.pt becomes a hard link to `target` (a copy where links are unsupported), atomically."""
    latest = target.with_name("latest.pt")
    tmp = target.with_name(f".latest.pt.{os.getpid()}.tmp")
    if tmp.exists():
        tmp.unlink()
    try:
        os.link(target, tmp)
    except OSError:
        import shutil

        shutil.copyfile(target, tmp)
    os.replace(tmp, latest)
    _fsync_dir(target.parent)


def save_checkpoint(folder: str | os.PathLike, payload: dict[str, Any], step: int, keep: int = 3) -> Path:
    folder = Path(folder)
    payload = {"format": FORMAT, **payload}
    target = atomic_save(payload, folder / f"ckpt-{step:012d}.pt")
    _point_latest(target)
    for old in numbered_checkpoints(folder)[keep:]:
        old.unlink(missing_ok=True)
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
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means "not usable"
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        # torch's weights-only refusal is a long lecture; its one informative line starts "Unsupported".
        reason = next((line for line in lines if line.startswith(("Unsupported", "WeightsUnpickler error: Unsupported"))),
                      lines[0] if lines else type(exc).__name__)
        raise CheckpointError(f"{path}: not a readable checkpoint (corrupt or truncated: {reason[:160]})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a hogwild_a3c checkpoint (expected format {FORMAT!r})")
    return payload


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
    raise CheckpointError(f"{folder}: no checkpoint found (expected latest.pt or ckpt-*.pt)")
