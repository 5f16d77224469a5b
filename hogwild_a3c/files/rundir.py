"""The run directory: where it is, who holds it, what config.json and meta.json say, and the
resolved config (new run or resume) with every problem found before anything is written and
before any process starts."""
from __future__ import annotations

import datetime as dt
import errno
import fcntl
import os
import re
from pathlib import Path
from typing import Any

from ..config import RENAMED, Config, config_from_dict, experiment_fields, flag_name, resumable_fields, validate
from ..envs.make import EnvSpecError, parse_env_kwargs, unconsented_module
from .atomic import link_problem, open_no_follow, read_json_data
from .plain_data import shown


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


def _default_workers(cfg: Config) -> None:
    if cfg.num_workers is None:
        cfg.num_workers = os.cpu_count() or 1


def resolve_new(given: dict[str, Any]) -> Config:
    """Flags -> the run's Config: dataclass defaults < preset < --config file < flags (presets.py)."""
    from ..run.presets import resolve

    given, errors = resolve(given)
    if errors:
        raise ConfigError(errors)
    given["env_kwargs"] = _coerce_env_kwargs(given.get("env_kwargs"), errors)
    cfg = Config(**given)
    _default_workers(cfg)
    errors += validate(cfg)
    if cfg.run_dir is not None and _holds_a_run(cfg.run_dir):
        errors.append(
            f"--run-dir {cfg.run_dir} already holds files; continue it with --resume {cfg.run_dir} or name a new folder"
        )
    if errors:
        raise ConfigError(errors)
    return cfg


def _holds_a_run(run_dir: str) -> bool:
    """A lock file and an empty checkpoints/ are what a start-up that failed leaves: nothing of a
    run to protect, so the same command may use the folder again."""
    if not os.path.isdir(run_dir):
        return False
    left = set(os.listdir(run_dir)) - {".lock"}
    checkpoints = os.path.join(run_dir, "checkpoints")
    if "checkpoints" in left and not os.path.islink(checkpoints) and os.path.isdir(checkpoints) \
            and not os.listdir(checkpoints):
        left.discard("checkpoints")
    return bool(left)


def check_new_location(run_dir: Path) -> None:
    """A folder can be made at `run_dir`: nothing there but folders, and the nearest existing
    one writable. Checked before anything is created; making it can still fail (/proc)."""
    flag = f"--run-dir {run_dir}"
    path = Path(os.path.abspath(run_dir))
    if path.exists() and not path.is_dir():
        raise ConfigError([f"{flag}: is a file, not a folder; name a new folder"])
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError([f"{flag}: {parent} is a file, so no folder can be made under it"])
            if not os.access(parent, os.W_OK | os.X_OK):
                raise ConfigError([f"{flag}: {parent} is not writable; name a folder you can write to"])
            return


def refuse_links(run_dir: Path, flag: str) -> None:
    problem = link_problem(run_dir)
    if problem:
        raise ConfigError([f"{flag}: {problem}"])


def make_run_dir(run_dir: Path) -> None:
    try:
        (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError([f"--run-dir {run_dir}: cannot make the folder there ({exc.strerror or exc})"]) from None


class RunDirLock:
    """An exclusive lock on a run directory for the whole session, so two trainers never write
    one run. `flock` is dropped by the kernel when its holder dies, even by `kill -9`: a lock
    left by a dead process never blocks the next resume. The file also names the holder's pid,
    for the message a second trainer gets."""

    NAME = ".lock"

    def __init__(self, fd: int, path: Path):
        self._fd = fd
        self.path = path

    @classmethod
    def acquire(cls, run_dir: Path, flag: str) -> RunDirLock:
        path = run_dir / cls.NAME
        try:
            fd = open_no_follow(path, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ConfigError([f"{flag}: {link_problem(run_dir) or f'{path} is a symbolic link'}"]) from None
            raise ConfigError([f"{flag}: cannot open {path} ({exc.strerror or exc})"]) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                two_nodes = run_dir.parent.name == "nodes"
                raise ConfigError([
                    f"{flag}: {run_dir} is in use by another trainer (pid {holder}); "
                    + ("two nodes of the run have one name: give each machine its own host name, or each agent "
                       "on one host its own HOGWILD_NODE_NAME" if two_nodes else "wait for it to end or stop it first")
                ]) from None
            raise ConfigError([f"{flag}: cannot lock {path} ({exc.strerror or exc})"]) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(fd, path)

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing drops the flock
            self._fd = -1


def _reason(exc: BaseException) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).splitlines()[0]


def read_saved_config(run_dir: Path) -> Config:
    path = run_dir / "config.json"
    if not path.is_file():
        raise ConfigError([f"--resume {run_dir}: not a run directory (no config.json there)"])
    try:
        data = read_json_data(path)
    except (OSError, ValueError) as exc:
        raise ConfigError([f"{path}: not readable JSON ({_reason(exc)})"]) from None
    try:
        return config_from_dict(data, str(path))
    except ValueError as exc:
        raise ConfigError(str(exc).splitlines()) from None


def read_meta(run_dir: Path) -> dict[str, Any] | None:
    """meta.json as it is, or None when there is none; a damaged one is refused, never rewritten."""
    path = run_dir / "meta.json"
    if not path.exists():
        return None
    try:
        meta = read_json_data(path)
    except (OSError, ValueError) as exc:
        raise ConfigError([f"{path}: not readable JSON ({_reason(exc)}); move it aside to resume with a new one"]) \
            from None
    if not isinstance(meta, dict) or not isinstance(meta.get("sessions"), list):
        raise ConfigError([
            f"{path}: has no list of sessions; it is not this trainer's meta.json (move it aside to resume)"
        ])
    return meta


def resolve_resume(run_dir: str, given: dict[str, Any]) -> Config:
    """The saved config with the allowed overrides applied; changed algorithm flags are refused."""
    cfg = read_saved_config(Path(run_dir))
    module = unconsented_module(cfg.env, given.get("env"))
    if module:
        raise ConfigError([f"--resume {run_dir}: its config.json names the env {shown(cfg.env)}, which imports the "
                           f"module {shown(module)}; a resume imports only what the command line names: add --env "
                           f"{cfg.env} to allow it"])
    errors: list[str] = []
    if "env_kwargs" in given:
        given = {**given, "env_kwargs": _coerce_env_kwargs(given["env_kwargs"], errors)}
    resumable = resumable_fields()
    for name, value in given.items():
        if name == "run_dir":
            if Path(value).resolve() != Path(run_dir).resolve():
                errors.append(f"--run-dir {value} conflicts with --resume {run_dir}; give only --resume")
            continue
        current = getattr(cfg, name)
        if name in ("preset", "frame"):  # an old name ("seed") compares as the new one
            value = RENAMED.get(value, value)
        if name in resumable:
            setattr(cfg, name, value)
        elif value != current:
            errors.append(
                f"{flag_name(name)} {shown(value)} would change the algorithm of the run being resumed "
                f"(it has {shown(current)}); drop the flag or start a new run"
            )
    cfg.run_dir = str(run_dir)
    _default_workers(cfg)
    errors += validate(cfg, resuming=True)
    if errors:
        raise ConfigError(errors)
    return cfg


def check_same_experiment(cfg: Config, checkpoint_config: Any, checkpoint: Path) -> None:
    """config.json and the checkpoint must describe the same experiment: a hand-edited or
    swapped config.json would otherwise load weights into the wrong model or algorithm."""
    if not isinstance(checkpoint_config, dict):
        raise ConfigError([f"{checkpoint}: holds no config to check config.json against"])
    fixed = experiment_fields() - resumable_fields()
    for name in sorted(fixed):
        saved = checkpoint_config.get(name)
        if name in ("preset", "frame") and isinstance(saved, str):  # saved under an old name ("seed")
            saved = RENAMED.get(saved, saved)
        if name in checkpoint_config and saved != getattr(cfg, name):
            assert cfg.run_dir is not None  # a resumed run's directory is known
            raise ConfigError([
                f"{Path(cfg.run_dir) / 'config.json'}: '{name}' is {shown(getattr(cfg, name))} but {checkpoint} was "
                f"trained with {shown(checkpoint_config[name])}; config.json was edited or belongs to another run"
            ])
