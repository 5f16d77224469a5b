"""Before a run: parse and check every setting, the env, the machine and the run directory, read
what a resume needs, and take the directory's lock; all before anything is written and before
any process starts. What runs next is `session.Session`.

Each job lives in a module of its own: `rundir` (where the run lives, the lock, the saved
config), `checkpoint` (the checkpoint format), `session` (the run, from these settings to its
result), `run_loop` (the session's loop), `recorder` (CSV files, meta.json, logs), `supervisor`
(children, restarts, stalls), `stop_rules` (when and why a run ends). Serial and parallel runs
go through the same loop; only the children differ (`supervisor.make_children`).
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..acting.actor import request_problem
from ..config import Config
from ..envs.make import EnvInfo, EnvSpecError, check_spawnable, describe_env, env_options, is_atari
from ..files.checkpoint import CheckpointError, NoCheckpointError, check_training_payload, load_latest
from ..files.rundir import (
    ConfigError,
    RunDirLock,
    check_new_location,
    check_same_experiment,
    default_run_dir,
    make_run_dir,
    read_meta,
    refuse_links,
    resolve_new,
    resolve_resume,
)
from ..learning.learner import trial_update_problem
from ..learning.model import model_for_env, model_size_problem
from ..nodes.node import RUN_TOKEN, Node
from .cli import build_parser

OVERSUBSCRIBED = 2  # workers per core beyond which a run is warned about


@dataclass
class Prepared:
    """Everything checked and read before anything is written or any process starts."""

    cfg: Config
    env_info: EnvInfo
    run_dir: Path
    lock: RunDirLock
    payload: dict | None = None
    meta: dict | None = None
    checkpoint: Path | None = None  # the file `payload` was read from
    node: Node | None = None  # multi-node (under torchrun): this node, placed among the admitted nodes
    admission_line: str = ""  # multi-node: the nodes left out of the run at its start, for train.log


def _describe(cfg: Config) -> EnvInfo:
    try:
        info = describe_env(cfg.env, cfg.env_kwargs, **env_options(cfg))
    except EnvSpecError as exc:
        raise ConfigError([str(exc)]) from None
    try:
        too_large = model_size_problem(info.obs_shape, info.distribution, cfg, info.layout)
    except ValueError as exc:  # an encoder that cannot read images this small
        hint = ("give a larger --image-size or another --encoder" if is_atari(cfg.env) else
                "give another --encoder (an image is never enlarged to --image-size)")
        raise ConfigError([f"--encoder {cfg.encoder}: {exc}; {hint}"]) from None
    if too_large:
        raise ConfigError([f"--lstm-size/--hidden-size: {too_large}"])
    problem = check_spawnable(cfg.env, cfg.start_method) if cfg.num_workers else None
    if problem:
        raise ConfigError([problem])
    with torch.device("meta"):  # its kind of encoder and core are all the check needs
        problem = request_problem(cfg.act_backend, model_for_env(info, cfg))
    problem = problem or trial_update_problem(model_for_env(info, cfg), cfg)
    if problem:
        raise ConfigError([problem])
    return info


# Open files a child costs the main process (pipes, and one descriptor per shared tensor it was
# handed): 28 measured with 8 CartPole workers; more here for larger models.
FILES_PER_CHILD = 48


def _check_machine(cfg: Config) -> None:
    """What the machine must allow for this many children, checked before any folder is made."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = (max(cfg.num_workers or 0, 1) + 1) * FILES_PER_CHILD
    if soft != resource.RLIM_INFINITY and needed > soft:
        raise ConfigError([f"--num-workers {cfg.num_workers} needs about {needed} open files and this process may "
                           f"open {soft} (ulimit -n): give at most {soft // FILES_PER_CHILD - 1} workers or raise the "
                           "limit"])
    if cfg.lr_decay_steps and cfg.max_steps is None:
        print(f"warning: --lr-decay-steps {cfg.lr_decay_steps} without --max-steps: past that step the run trains at "
              "lr 0; give --max-steps the same number", file=sys.stderr)
    if cfg.lr > 1.0:
        print(f"warning: --lr {cfg.lr:g} is far above what A3C trains with (1e-5 to 1e-2 here): each update would "
              "move every weight by about that much", file=sys.stderr)


def _check_extras(cfg: Config) -> None:
    if cfg.tensorboard:
        try:
            import torch.utils.tensorboard  # noqa: F401
        except ImportError:
            raise ConfigError(["--tensorboard needs the tensorboard package: pip install -e '.[tensorboard]'"]) \
                from None
    if cfg.wandb:
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise ConfigError(["--wandb needs the wandb package: pip install -e '.[wandb]'"]) from None


def _prepare_resume(resume_dir: str, args: dict[str, Any], rejoin: bool = False) -> Prepared:
    """`rejoin`: a node of a multi-node run that has no usable checkpoint yet (killed before its
    first) comes back without one; the start of the sync gives it the other nodes' weights."""
    run_dir = Path(resume_dir)
    if not run_dir.is_dir():
        raise ConfigError([f"--resume {resume_dir}: not a run directory (no such folder)"])
    refuse_links(run_dir, f"--resume {resume_dir}")
    lock = RunDirLock.acquire(run_dir, f"--resume {resume_dir}")
    try:
        cfg = resolve_resume(resume_dir, args)
        meta = read_meta(run_dir)
        _check_machine(cfg)
        _check_extras(cfg)
        env_info = _describe(cfg)
        try:
            payload, path = load_latest(run_dir / "checkpoints", warn=lambda m: print(m, file=sys.stderr))
            check_same_experiment(cfg, payload.get("config"), path)
            with torch.device("meta"):  # only the shapes are compared: nothing is allocated to refuse a file
                model = model_for_env(env_info, cfg)
            check_training_payload(payload, path, model, cfg.optimizer)
        except NoCheckpointError as exc:
            # A run killed before its first save: nothing trained was kept, so it starts again
            # from step 0 with its own config instead of leaving a folder nothing can use.
            then = ("this node rejoins with the weights of the node with the most progress" if rejoin
                    else "the run was stopped before its first save and starts again from step 0")
            print(f"warning: {exc}; {then}", file=sys.stderr)
            return Prepared(cfg, env_info, run_dir, lock, None, meta)
        except CheckpointError as exc:
            if not rejoin:
                raise ConfigError([f"--resume {resume_dir}: {exc}"]) from None
            print(f"warning: {exc}; this node rejoins with the weights of the node with the most progress",
                  file=sys.stderr)
            return Prepared(cfg, env_info, run_dir, lock, None, meta)
    except BaseException:
        lock.release()
        raise
    print(f"resuming from {path} at global step {payload['global_step']}", file=sys.stderr)
    return Prepared(cfg, env_info, run_dir, lock, payload, meta, path)


def _prepare_new(args: dict[str, Any]) -> Prepared:
    given_dir = args.get("run_dir")
    if given_dir is not None and Path(given_dir).is_dir():
        refuse_links(Path(given_dir), f"--run-dir {given_dir}")
    if given_dir is not None and (Path(given_dir) / RunDirLock.NAME).is_file():
        RunDirLock.acquire(Path(given_dir), f"--run-dir {given_dir}").release()  # says who holds it, if anyone
    cfg = resolve_new(args)
    _check_machine(cfg)
    _check_extras(cfg)
    env_info = _describe(cfg)
    run_dir = Path(cfg.run_dir) if cfg.run_dir else default_run_dir(cfg)
    cfg.run_dir = str(run_dir)
    check_new_location(run_dir)
    make_run_dir(run_dir)
    return Prepared(cfg, env_info, run_dir, RunDirLock.acquire(run_dir, f"--run-dir {run_dir}"))


def _prepare_node(node: Node, resume_dir: str | None, args: dict[str, Any], interrupted: Callable[[], bool]) \
        -> Prepared:
    """A node of a multi-node run writes `<run-dir>/nodes/<node>/`, once admitted (`admission`);
    a node that ran before (a restart by torchrun, or --resume) resumes its own directory."""
    if not os.environ.get(RUN_TOKEN) and not args.get("trust_network"):
        raise ConfigError([f"a multi-node run needs {RUN_TOKEN}: without it any machine that reaches the rendezvous "
                           "joins the run and can replace its weights; set the same secret on every node (e.g. export "
                           f"{RUN_TOKEN}=$(python -c 'import secrets; print(secrets.token_hex(16))')), or pass "
                           "--trust-network where only your machines can reach it"])
    if not os.environ.get(RUN_TOKEN):
        print(f"warning: --trust-network without {RUN_TOKEN}: any machine that reaches the rendezvous joins this run",
              file=sys.stderr)
    base = resume_dir if resume_dir is not None else args.pop("run_dir", None)
    if base is None:
        raise ConfigError(["a multi-node run (under torchrun) needs --run-dir DIR, the same on every node"])
    if args.get("num_workers") == 0:
        raise ConfigError(["--num-workers 0 (serial) cannot take part in a multi-node run; give 1 or more"])
    from ..nodes.admission import admit  # torch.distributed loads here, in multi-node runs only

    admission = admit(node, os.environ.get(RUN_TOKEN, "").encode(),
                      args.get("sync_timeout", Config.sync_timeout), interrupted)
    node_dir = node.run_dir(Path(base))
    if (node_dir / "config.json").is_file():
        prepared = _prepare_resume(str(node_dir), args, rejoin=True)
    else:
        prepared = _prepare_new({**args, "run_dir": str(node_dir)})
    prepared.node, prepared.admission_line = admission.node, admission.left_out
    return prepared


def prepare(argv: list[str], interrupted: Callable[[], bool] = lambda: False) -> Prepared:
    """Parse and check everything; raises ConfigError with one line per problem. On success the
    run directory exists and this process holds its lock. `interrupted`: whether Ctrl-C was
    pressed, for the waits of start-up that may be long (KeyboardInterrupt, nothing written)."""
    args = vars(build_parser().parse_args(argv))  # only the flags given: the parser suppresses defaults
    return prepare_given(args, args.pop("resume", None), interrupted)


def prepare_given(args: dict[str, Any], resume_dir: str | None = None,
                  interrupted: Callable[[], bool] = lambda: False) -> Prepared:
    """`prepare` for settings already typed as `Config`'s fields, the ones the user gave (from
    the command line or from Python); what is not given comes from the preset or the defaults."""
    try:
        node = Node.from_env()
    except ValueError as exc:
        raise ConfigError([str(exc)]) from None
    if node is not None:
        prepared = _prepare_node(node, resume_dir, args, interrupted)
    else:
        prepared = _prepare_resume(resume_dir, args) if resume_dir is not None else _prepare_new(args)
    cores = os.cpu_count() or 1
    if (prepared.cfg.num_workers or 0) > OVERSUBSCRIBED * cores:
        print(f"warning: --num-workers {prepared.cfg.num_workers} on {cores} cores: each worker holds an env and a "
              "model (~400 MiB on Atari) and more workers than cores add memory and start-up time, not speed",
              file=sys.stderr)
    return prepared
