"""One session of a run, from checked settings to its result: `Session(prepared).run()`.

`prepare.prepare` checks everything and takes the run directory's lock; a `Session` builds the
shared state, the recorder, the stop rules, the children and the user's callbacks, runs the
loop (`run_loop.RunLoop`) until the stop rules end it, and returns the `TrainResult`. The
command line and the Python API both run it, and only it releases the lock.
"""
from __future__ import annotations

import dataclasses
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..acting.actor import resolve as resolve_acting
from ..children.process import flush_denormals
from ..children.shared import SharedState
from ..children.supervisor import make_children
from ..config import Config
from ..files.atomic import WriteError, remove_stale_temp_files
from ..files.checkpoint import Progress, restore_training
from ..files.logs import last_time_s
from ..files.meta import KILLED, close_dead_sessions
from ..files.plain_data import shown
from ..learning.learner import replay_memory_line
from ..learning.model import model_for_env
from ..learning.optim import LrSchedule
from ..learning.precision import resolve as resolve_precision
from .callbacks import ENDED, Callbacks
from .prepare import Prepared
from .presets import preset_line
from .recorder import Recorder
from .run_loop import RunLoop
from .stop_rules import EXIT_FAILED, StopRules


@dataclass(frozen=True)
class TrainResult:
    run_dir: Path
    exit_code: int  # as the command's: 0 budget or target, 1 failure, 130/143 interrupted
    ended: str  # meta.json's reason: "max_steps", "target_return", "callback", "interrupted (SIGINT)", "failed: ..."
    global_step: int

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class Session:
    def __init__(self, prepared: Prepared, argv: list[str], callbacks: list[Any] | None = None):
        self.prepared, self.argv, self.user_callbacks = prepared, argv, list(callbacks or [])

    def abandon(self) -> None:
        """Give the run directory back without training (Ctrl-C before the run began)."""
        self.prepared.lock.release()

    def run(self) -> TrainResult:
        """Train until the stop rules end the run; the lock is released on every way out."""
        # One thread, like every child: serial mode's worker runs here (under load a multi-thread
        # pool made a serial Acrobot run many times slower), and otherwise this process only supervises,
        # where an idle pool spinning after each weight check takes CPU from the workers. Restored
        # at the end: from Python (a notebook) this process is the user's.
        threads_before = torch.get_num_threads()
        torch.set_num_threads(1)
        denormals_flushed_before = flush_denormals()  # as in every child: serial mode learns here
        try:
            result = self._train()
        finally:
            torch.set_num_threads(threads_before)
            flush_denormals(denormals_flushed_before)
            self.prepared.lock.release()
        callbacks = Callbacks(self.user_callbacks, stop=lambda line: None,
                              failed=lambda line: print(f"error: {line}", file=sys.stderr))
        callbacks.call("on_end", result)  # too late to stop anything: a raising one is only named
        return result

    # -- the parts ----------------------------------------------------------------------------

    def _shared_state(self) -> tuple[SharedState, Progress, int]:
        prepared, cfg = self.prepared, self.prepared.cfg
        torch.manual_seed(cfg.seed)
        model = model_for_env(prepared.env_info, cfg)
        shared = SharedState.create(model, max(1, cfg.num_workers or 0), cfg.optimizer, lr_schedule(cfg))
        if prepared.payload is not None:
            before = restore_training(shared, prepared.payload)
            session = before.session + 1
        else:  # a new run, or a node rejoining without a checkpoint: its sessions so far still count
            before, session = Progress(counters={}), len((prepared.meta or {}).get("sessions", []))
        if prepared.node is not None:
            from ..nodes.syncer import SyncStatus  # torch.distributed loads here, in multi-node runs only

            # A node's global step never goes back (the sync takes the most progress), so neither
            # does its clock: a node that comes back goes on from its last progress row, not from 0
            # or from an older checkpoint.
            before.elapsed_s = max(before.elapsed_s, last_time_s(prepared.run_dir / "progress.csv"))
            shared.sync = SyncStatus.create()
        # The children are not started yet: the run time their learning rate follows goes on from here.
        shared.lr_schedule = dataclasses.replace(shared.lr_schedule, time_origin=time.time() - before.elapsed_s)
        return shared, before, session

    def _train(self) -> TrainResult:
        prepared, cfg, run_dir, node = self.prepared, self.prepared.cfg, self.prepared.run_dir, self.prepared.node
        shared, before, session = self._shared_state()
        restored_from = None if prepared.checkpoint is None else (before.global_step, prepared.checkpoint)
        dead_sessions = [] if prepared.meta is None else close_dead_sessions(prepared.meta, run_dir, restored_from)
        try:
            recorder = Recorder(run_dir, cfg, prepared.meta, self.argv, session, shared.global_step(),
                                node=None if node is None else dataclasses.asdict(node))
        except WriteError as exc:  # nothing started yet: nothing to stop or save
            print(f"run ended: failed: {exc} (nothing trained, exit {EXIT_FAILED})", file=sys.stderr)
            return TrainResult(run_dir, EXIT_FAILED, f"failed: {exc}", shared.global_step())
        rules = StopRules(cfg, on_stop=shared.request_stop, record_error=recorder.error, log=recorder.log,
                            under_torchrun=node is not None)
        callbacks = Callbacks(self.user_callbacks, stop=lambda line: rules.stop_by_callback(line, ENDED),
                              failed=recorder.error)
        model = model_for_env(prepared.env_info, cfg)
        act_backend, acting_line = resolve_acting(cfg.act_backend, model)
        learn_precision, precision_line = resolve_precision(cfg.learn_precision, model)
        # The children get what was chosen here for this machine; config.json keeps what was asked for.
        chosen = dataclasses.replace(cfg, act_backend=act_backend, learn_precision=learn_precision)
        children = make_children(chosen, prepared.env_info, shared, str(run_dir), session, node=node,
                                 progress=shared.global_step())
        loop = RunLoop(cfg, run_dir, shared, recorder, rules, before, session, children, callbacks)
        recorder.log(preset_line(cfg))
        recorder.log(acting_line)
        recorder.log(precision_line)
        if cfg.anneal_lr == "budget":
            recorder.log(annealing_line(cfg))
        if prepared.admission_line:
            recorder.log(prepared.admission_line)
        replay_line = replay_memory_line(model, cfg, prepared.env_info.unit_interval)
        if replay_line:
            recorder.log(replay_line)
        self._say_what_was_found(recorder, dead_sessions)
        previous = _catch_signals(rules, recorder, callbacks)
        try:
            callbacks.call("on_start", {"run_dir": run_dir, "config": cfg, "session": session,
                                        "global_step": shared.global_step()})
            loop.run()
        except Exception as exc:  # noqa: BLE001 - the run must still stop cleanly and save
            rules.fail(f"main process raised {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        finally:
            loop.shut_down()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        ended = rules.reason or "stopped"
        print(f"run ended: {ended} (global step {shared.global_step()}, exit {rules.exit_code})", file=sys.stderr)
        return TrainResult(run_dir, rules.exit_code, ended, shared.global_step())

    def _say_what_was_found(self, recorder: Recorder, dead_sessions: list[dict[str, Any]]) -> None:
        run_dir, layout = self.prepared.run_dir, self.prepared.env_info.layout
        if layout is not None:
            recorder.log(f"observation packed into {layout.size} numbers: {layout.describe()}"
                         + (" (no encoder takes those kinds: text, or other spaces that are not arrays)"
                            if layout.dropped else ""))
        for dead in dead_sessions:
            # Its fields were read from a file: shown, so a crafted one cannot write a line of its own.
            recorder.log(f"session {shown(dead.get('session'))} (pid {shown(dead.get('pid'))}) has no clean end in "
                         f"meta.json: recorded it as {KILLED}, last known at global step {dead['global_step_end']} "
                         f"({dead['global_step_end_from']})")
        removed, kept = remove_stale_temp_files([run_dir, run_dir / "checkpoints"])
        if removed:
            recorder.log(f"removed {len(removed)} temp file(s) of saves cut short by a kill: "
                         + ", ".join(path.name for path in removed))
        for path in kept:
            recorder.log(f"left {path}: its writer is still running, or it could not be removed")


def _catch_signals(rules: StopRules, recorder: Recorder, callbacks: Callbacks) -> dict[int, Any]:
    """Ctrl-C and SIGTERM stop the run saved; the second one also cuts short a callback that keeps
    the main process waiting. The handlers they replace, to put back at the end.
    Python delivers signals to the main thread only, so a run started from another thread (the
    API from a GUI's or a server's thread) cannot catch them: it trains without, and says so."""
    if threading.current_thread() is not threading.main_thread():
        recorder.log("this run was started outside the main thread, where Python cannot catch Ctrl-C or SIGTERM: "
                     "it ends at its budget or target, or when its process is stopped (then --resume continues it)")
        return {}
    def on_signal(signum: int, _frame: Any) -> None:
        rules.on_signal(signum)
        if rules.fast:
            callbacks.cut_short()

    return {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}


def lr_schedule(cfg: Config) -> LrSchedule:
    """The rate's line: --lr-decay-steps, or with --anneal-lr budget the run's own budgets."""
    to_budget = cfg.anneal_lr == "budget"
    decay_steps = cfg.lr_decay_steps or (cfg.max_steps or 0 if to_budget else 0)
    decay_seconds = (cfg.max_seconds or 0.0) if to_budget else 0.0
    return LrSchedule(cfg.lr, cfg.lr_warmup_updates, decay_steps, decay_seconds)


def annealing_line(cfg: Config) -> str:
    budgets = [f"--{name} {shown(value)}" for name, value in (("max-steps", cfg.max_steps),
                                                              ("max-seconds", cfg.max_seconds)) if value]
    if not budgets:
        return f"learning rate {cfg.lr:g} throughout: --anneal-lr budget, and the run has no budget to anneal over"
    return f"learning rate {cfg.lr:g}, falling linearly to 0 at the end of {' or '.join(budgets)} (the first reached)"
