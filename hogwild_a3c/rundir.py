"""The run directory: where it is, what config.json and meta.json say, and the resolved config
(new run or resume) with every problem found before any process starts."""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import platform
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from . import __version__
from .config import RESUMABLE_OVERRIDES, Config, validate
from .envs import EnvSpecError, parse_env_kwargs


class ConfigError(ValueError):
    def __init__(self, errors: list[str]):
        super().__init__("\n".join(errors))
        self.errors = errors


def default_run_dir(cfg: Config, now: dt.datetime | None = None) -> Path:
    now = now or dt.datetime.now()
    env_name = re.sub(r"[^A-Za-z0-9_.-]+", "_", cfg.env)
    base = Path("runs") / env_name / f"{now:%Y%m%d-%H%M%S}-s{cfg.seed}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def _coerce_env_kwargs(value: Any, errors: list[str]) -> dict:
    if isinstance(value, dict):
        return value
    try:
        return parse_env_kwargs(value or [])
    except EnvSpecError as exc:
        errors.append(str(exc))
        return {}


def resolve_new(given: dict[str, Any]) -> Config:
    """Flags -> the run's Config: dataclass defaults < preset < --config file < flags (presets.py)."""
    from .presets import resolve

    given, errors = resolve(given)
    if errors:
        raise ConfigError(errors)
    given["env_kwargs"] = _coerce_env_kwargs(given.get("env_kwargs"), errors)
    cfg = Config(**given)
    if cfg.num_workers is None:
        cfg.num_workers = os.cpu_count() or 1
    errors += validate(cfg)
    if errors:
        raise ConfigError(errors)
    return cfg


def resolve_resume(run_dir: str, given: dict[str, Any]) -> Config:
    """The saved config with the allowed overrides applied; changed algorithm flags are refused."""
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise ConfigError([f"--resume {run_dir}: not a run directory (no config.json there)"])
    try:
        saved = json.loads(path.read_text())
        cfg = Config(**{f.name: saved[f.name] for f in dataclasses.fields(Config) if f.name in saved})
    except (ValueError, TypeError) as exc:
        raise ConfigError([f"{path}: unreadable config ({exc})"]) from None
    errors: list[str] = []
    if "env_kwargs" in given:
        given = {**given, "env_kwargs": _coerce_env_kwargs(given["env_kwargs"], errors)}
    for name, value in given.items():
        if name == "run_dir":
            if Path(value).resolve() != Path(run_dir).resolve():
                errors.append(f"--run-dir {value} conflicts with --resume {run_dir}; give only --resume")
            continue
        current = getattr(cfg, name)
        if name in RESUMABLE_OVERRIDES:
            setattr(cfg, name, value)
        elif value != current:
            flag = "--" + name.replace("_", "-")
            errors.append(
                f"{flag} {value!r} would change the algorithm of the run being resumed (it has {current!r}); "
                "drop the flag or start a new run"
            )
    cfg.run_dir = str(run_dir)
    if cfg.num_workers is None:
        cfg.num_workers = os.cpu_count() or 1
    errors += validate(cfg, resuming=True)
    if errors:
        raise ConfigError(errors)
    return cfg


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def versions() -> dict[str, str]:
    import gymnasium
    import numpy
    import scipy
    import torch

    found = {
        "hogwild_a3c": __version__, "python": platform.python_version(), "torch": str(torch.__version__),
        "gymnasium": gymnasium.__version__, "numpy": numpy.__version__, "scipy": scipy.__version__,
    }
    try:
        import ale_py

        found["ale_py"] = ale_py.__version__
    except ImportError:
        pass
    return found


def new_meta(argv: list[str]) -> dict[str, Any]:
    return {
        "versions": versions(),
        "git_commit": _git_commit(),
        "cores": os.cpu_count(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "created": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "sessions": [],
        "argv": [sys.executable, "-m", "hogwild_a3c.train", *argv],
    }


def now_iso() -> str:
    return dt.datetime.now().astimezone().isoformat(timespec="seconds")
