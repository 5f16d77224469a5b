"""`python -m hogwild_a3c.train`: the main process.

It validates the config, prepares the run directory, builds the shared model, starts the
evaluator and the workers, and then only supervises: drains their reports into CSV files,
shows progress, saves checkpoints, watches for dead or stalled children, and decides when the
run stops. Exit status: 0 when a budget or the target was reached, 1 on a failure, 2 on bad
input, 130 after SIGINT, 143 after SIGTERM.
"""
from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import queue as queue_lib
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .checkpoint import CheckpointError, load_latest, save_checkpoint
from .config import Config, build_parser
from .envs import EnvInfo, EnvSpecError, describe_env, register_atari
from .evaluator import Evaluator, evaluator_main
from .logs import EPISODES_COLUMNS, EVAL_COLUMNS, PROGRESS_COLUMNS, CsvLog, CsvSchemaError, write_json
from .model import build_model
from .process import one_thread_per_child, rss_mb
from .rundir import ConfigError, default_run_dir, new_meta, now_iso, resolve_new, resolve_resume, versions
from .shared import STAT, HogwildLink, SharedState, in_process_context
from .worker import Worker, worker_main, worker_seed

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_SIGINT, EXIT_SIGTERM = 0, 1, 2, 130, 143
SUPERVISE_PERIOD_S = 0.25
JOIN_GRACE_S = 10.0


def _all_finite(tensors: dict[str, torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tensors.values())


class Trainer:
    def __init__(self, cfg: Config, env_info: EnvInfo, run_dir: Path, resume: dict | None, argv: list[str], log=print):
        self.cfg = cfg
        self.env_info = env_info
        self.run_dir = run_dir
        self.resume = resume
        self.argv = argv
        self.log = log
        self.serial = cfg.num_workers == 0
        self.ctx = in_process_context() if self.serial else mp.get_context(cfg.start_method)
        self.stop_reason: str | None = None
        self.exit_code = EXIT_OK
        self.signals_seen = 0
        self.fast_exit = False
        self.processes: dict[str, Any] = {}
        self.worker_restarts = 0
        self.stalled: set[int] = set()
        self.latest_eval: float | None = None
        self.eval_window: list[float] = []

    # -- set-up -------------------------------------------------------------------------------

    def _build_shared(self) -> None:
        cfg = self.cfg
        torch.manual_seed(cfg.seed)
        model = build_model(self.env_info.obs_shape, self.env_info.num_actions, cfg)
        slots = max(1, cfg.num_workers)
        self.shared = SharedState.create(model, slots, cfg.optimizer, cfg.lr, self.ctx)
        self.session = 0
        self.elapsed_before = 0.0
        self.best_return = -math.inf
        self.counter_base = {"updates": 0, "skipped_updates": 0, "env_errors": 0, "worker_restarts": 0}
        if self.resume is not None:
            self._restore(self.resume)

    @torch.no_grad()
    def _restore(self, payload: dict) -> None:
        self.shared.model.load_state_dict(payload["model"])
        saved_states = payload["optimizer"]["states"]
        for i, state in enumerate(self.shared.optimizer_states):
            # More workers than before: the new ones start with the statistics of an old one.
            saved = saved_states[i % len(saved_states)]
            state["step"].copy_(saved["step"])
            for key in ("exp_avg", "exp_avg_sq"):
                for dst, src in zip(state[key], saved[key]):
                    dst.copy_(src)
        self.shared.base_step[0] = int(payload["global_step"])
        self.session = int(payload["session"]) + 1
        self.elapsed_before = float(payload["elapsed_s"])
        self.best_return = float(payload["best_eval_return"])
        self.counter_base = {k: int(v) for k, v in payload["counters"].items()}
        torch.set_rng_state(payload["rng"]["torch"])

    def _open_logs(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "checkpoints").mkdir(exist_ok=True)
        # The CSVs first: a file with a foreign header stops the run before anything is written.
        self.episodes_csv = CsvLog(self.run_dir / "episodes.csv", EPISODES_COLUMNS)
        self.eval_csv = CsvLog(self.run_dir / "eval.csv", EVAL_COLUMNS)
        self.progress_csv = CsvLog(self.run_dir / "progress.csv", PROGRESS_COLUMNS)
        write_json(self.run_dir / "config.json", self.cfg.to_dict())
        meta_path = self.run_dir / "meta.json"
        self.meta = json.loads(meta_path.read_text()) if meta_path.is_file() else new_meta(self.argv)
        self.meta_session = {
            "session": self.session, "start": now_iso(), "end": None, "ended": "running",
            "exit_code": None, "global_step_start": self.shared.global_step(), "argv": self.argv,
            "versions": versions(), "num_workers": self.cfg.num_workers,
        }
        self.meta["sessions"].append(self.meta_session)
        write_json(meta_path, self.meta)
        self.error_log_path = self.run_dir / "errors.log"
        self.tensorboard = None
        if self.cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(str(self.run_dir / "tensorboard"))

    # -- the clock ----------------------------------------------------------------------------

    def time_s(self) -> float:
        return self.elapsed_before + (time.time() - self.session_start)

    # -- child processes ----------------------------------------------------------------------

    def _start_worker(self, rank: int) -> None:
        proc = self.ctx.Process(
            target=worker_main,
            args=(rank, self.cfg, self.env_info, self.shared.for_child(rank), self.session, os.getpid()),
            name=f"worker-{rank}",
            daemon=True,
        )
        proc.start()
        self._register_child(f"worker {rank}", proc)
        self.shared.worker_stats[rank, STAT["heartbeat"]] = time.time()

    def _start_evaluator(self) -> None:
        proc = self.ctx.Process(
            target=evaluator_main,
            args=(
                self.cfg, self.env_info, self.shared.for_child(None), str(self.run_dir), self.best_return,
                self.clock_origin, self.session, os.getpid(),
            ),
            name="evaluator",
            daemon=True,
        )
        proc.start()
        self._register_child("evaluator", proc)

    def _register_child(self, name: str, proc: Any) -> None:
        """Track the child; its pid goes into meta.json (see `_publish_pids`) so a person, or a
        benchmark, can find it."""
        self.processes[name] = proc
        self.meta_session.setdefault("pids", {})[name] = proc.pid

    def _publish_pids(self) -> None:
        """One meta.json write for a batch of started children, not one fsynced write each."""
        write_json(self.run_dir / "meta.json", self.meta)

    def _check_children(self) -> None:
        for name, proc in list(self.processes.items()):
            if proc.exitcode is None or self.stop_reason is not None:
                continue
            self._drain()  # its traceback may be in the queue already
            how = f"was killed by signal {-proc.exitcode}" if proc.exitcode < 0 else f"exited with status {proc.exitcode}"
            if name.startswith("worker") and self.worker_restarts < self.cfg.max_worker_restarts:
                self.worker_restarts += 1
                self.log(f"{name} {how}; restarting it ({self.worker_restarts}/{self.cfg.max_worker_restarts})")
                self._start_worker(int(name.split()[1]))
                self._publish_pids()
            else:
                self._fail(f"{name} {how}")

    def _check_stalls(self) -> None:
        now = time.time()
        for rank in range(self.cfg.num_workers):
            silent = now - float(self.shared.worker_stats[rank, STAT["heartbeat"]])
            if silent > self.cfg.stall_timeout and rank not in self.stalled:
                self.stalled.add(rank)
                self._record_error(f"worker {rank} stalled: no progress for {silent:.0f} s (--stall-timeout {self.cfg.stall_timeout:g})")
            elif silent <= self.cfg.stall_timeout and rank in self.stalled:
                self.stalled.discard(rank)
                self.log(f"worker {rank} is making progress again")

    # -- reports from children ----------------------------------------------------------------

    def _drain(self) -> None:
        while True:
            try:
                record = self.shared.queue.get_nowait()
            except (queue_lib.Empty, EOFError, OSError):
                return
            kind = record[0]
            if kind == "episode":
                _, rank, step, episode_return, length = record
                self.episodes_csv.write(
                    time_s=self.time_s(), global_step=step, worker=rank, episode_return=episode_return, episode_length=length
                )
                if self.tensorboard:
                    self.tensorboard.add_scalar("train/episode_return", episode_return, step)
            elif kind == "eval":
                self._on_eval(record[1])
            elif kind == "error":
                _, role, rank, summary, text = record
                self._record_error(f"{role} {rank} raised {summary}\n{text}")

    def _on_eval(self, result: dict) -> None:
        for episode_return, length in result["episodes"]:
            self.eval_csv.write(
                time_s=result["time_s"], global_step=result["global_step"], episode_return=episode_return, episode_length=length
            )
            self.eval_window.append(episode_return)
        self.eval_window = self.eval_window[-self.cfg.eval_episodes :]
        self.latest_eval = result["mean_return"]
        self.best_return = max(self.best_return, result["mean_return"])
        if self.tensorboard:
            self.tensorboard.add_scalar("eval/mean_return", result["mean_return"], result["global_step"])
        target = self.cfg.target_return
        if target is not None and len(self.eval_window) >= self.cfg.eval_episodes and np.mean(self.eval_window) >= target:
            self._request_stop("target_return")

    def _record_error(self, text: str) -> None:
        stamped = f"[{now_iso()}] {text.rstrip()}\n"
        with open(self.error_log_path, "a") as f:
            f.write(stamped)
        self.log(stamped.rstrip())

    # -- periodic work ------------------------------------------------------------------------

    def _counters(self) -> dict[str, int]:
        stats = self.shared.worker_stats
        return {
            "updates": self.counter_base["updates"] + int(stats[:, STAT["updates"]].sum()),
            "skipped_updates": self.counter_base["skipped_updates"] + int(stats[:, STAT["skipped_updates"]].sum()),
            "env_errors": self.counter_base["env_errors"] + int(stats[:, STAT["env_errors"]].sum()),
            "worker_restarts": self.counter_base["worker_restarts"] + self.worker_restarts,
        }

    def _write_progress(self) -> None:
        now, step = time.time(), self.shared.global_step()
        rate = (step - self.last_progress_step) / max(now - self.last_progress_time, 1e-9)
        self.last_progress_step, self.last_progress_time = step, now
        active = self.shared.worker_stats[self.shared.worker_stats[:, STAT["updates"]] > 0]
        means = {name: float(active[:, STAT[name]].mean()) if len(active) else float("nan")
                 for name in ("policy_loss", "value_loss", "entropy", "grad_norm")}
        self.progress_csv.write(
            time_s=self.time_s(), global_step=step, steps_per_s=rate, **means, **self._counters(),
            worker_rss_mb=self._worker_rss_mb(),
        )
        self.steps_per_s = rate
        if self.tensorboard:
            for name, value in {"steps_per_s": rate, **means}.items():
                self.tensorboard.add_scalar(f"train/{name}", value, step)
        if not _all_finite(self._snapshot_weights()):
            self._fail("the shared weights became non-finite (NaN or inf); the run stops instead of training on garbage")

    def _worker_rss_mb(self) -> float:
        """Mean resident memory of the live workers (of this process in serial mode)."""
        pids = [p.pid for name, p in self.processes.items() if name.startswith("worker") and p.is_alive()]
        values = [rss_mb(pid) for pid in (pids if not self.serial else [os.getpid()])]
        return float(np.mean(values)) if values else float("nan")

    def _snapshot_weights(self) -> dict[str, torch.Tensor]:
        """A private copy of the shared weights, to inspect or save.

        Never test the live tensors: `torch.isfinite` reads an element more than once, and an
        element a worker rewrites in between looks non-finite. Measured here: a third process
        watching one Adam writer saw 16-33 false NaNs in 20 s on the live tensor and none on a
        copy; a Pong run was once stopped at 1.6M steps by exactly that.
        """
        return {k: v.detach().clone() for k, v in self.shared.model.state_dict().items()}

    def checkpoint(self) -> Path | None:
        """Save latest.pt; refuses (returns None) when the weights are non-finite, so latest.pt
        keeps pointing at the last good checkpoint."""
        weights = self._snapshot_weights()
        if not _all_finite(weights):
            self._record_error("not saving a checkpoint of non-finite weights; latest.pt stays the last good one")
            return None
        payload = {
            "kind": "latest",
            "model": weights,
            "optimizer": {
                "kind": self.cfg.optimizer,
                "states": [
                    {
                        "step": s["step"].clone(),
                        "exp_avg": [t.clone() for t in s["exp_avg"]],
                        "exp_avg_sq": [t.clone() for t in s["exp_avg_sq"]],
                    }
                    for s in self.shared.optimizer_states
                ],
            },
            "global_step": self.shared.global_step(),
            "elapsed_s": self.time_s(),
            "session": self.session,
            "best_eval_return": self.best_return,
            "counters": self._counters(),
            "rng": {"torch": torch.get_rng_state()},
            "config": self.cfg.to_dict(),
            "versions": versions(),
        }
        path = save_checkpoint(self.run_dir / "checkpoints", payload, payload["global_step"], self.cfg.keep_checkpoints)
        self.last_checkpoint_time = time.time()
        return path

    def _check_budgets(self) -> None:
        cfg = self.cfg
        if cfg.max_steps is not None and self.shared.global_step() >= cfg.max_steps:
            self._request_stop("max_steps")
        elif cfg.max_seconds is not None and self.time_s() >= cfg.max_seconds:
            self._request_stop("max_seconds")

    def supervise(self) -> None:
        """Everything the main process does between rollouts (serial) or sleeps (parallel)."""
        self._drain()
        if not self.serial:
            self._check_children()
            self._check_stalls()
        now = time.time()
        if now - self.last_progress_time >= self.cfg.progress_interval:
            self._write_progress()
        if now - self.last_checkpoint_time >= self.cfg.checkpoint_interval:
            self.checkpoint()
        self._check_budgets()
        self._update_bar()

    def _update_bar(self) -> None:
        if self.bar is None:
            return
        self.bar.n = self.shared.global_step()
        postfix = {"steps/s": f"{self.steps_per_s:.0f}"}
        if self.latest_eval is not None:
            postfix["eval"] = f"{self.latest_eval:.1f}"
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.refresh()

    # -- stopping -----------------------------------------------------------------------------

    def _request_stop(self, reason: str, exit_code: int = EXIT_OK) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
            self.exit_code = exit_code
        self.shared.stop_event.set()

    def _fail(self, message: str) -> None:
        self._record_error(f"run stopping: {message}")
        self._request_stop(f"failed: {message}", EXIT_FAILED)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.signals_seen += 1
        name = signal.Signals(signum).name
        if self.signals_seen == 1:
            self.log(f"\n{name} received: stopping workers, saving a final checkpoint (again to force)")
            self._request_stop(f"interrupted ({name})", EXIT_SIGINT if signum == signal.SIGINT else EXIT_SIGTERM)
        else:
            self.log(f"\n{name} received again: killing children now")
            self.fast_exit = True

    def _stop_children(self) -> None:
        self.shared.stop_event.set()
        deadline = time.time() + (0.0 if self.fast_exit else JOIN_GRACE_S)
        # Keep draining while joining: a child cannot exit while its queue buffer is unread.
        while any(p.is_alive() for p in self.processes.values()) and time.time() < deadline and not self.fast_exit:
            self._drain()
            for proc in self.processes.values():
                proc.join(timeout=0.05)
        for name, proc in self.processes.items():
            if proc.is_alive():
                if not self.fast_exit:
                    self.log(f"{name} did not stop within {JOIN_GRACE_S:g} s; terminating it")
                proc.terminate()
        for proc in self.processes.values():
            proc.join(timeout=2.0)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=2.0)
        self._drain()

    def _finish(self) -> None:
        """Stop the children, then save and flush; one failing step must not skip the others."""
        steps = [
            self._stop_children,
            self._write_progress,
            self._final_checkpoint,
            self._close_logs,
            self._write_meta_end,
            self._release_children,
        ]
        for step in steps:
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - report, then carry on shutting down
                self.exit_code = self.exit_code or EXIT_FAILED
                try:
                    self._record_error(f"during shutdown: {type(exc).__name__}: {exc}")
                except OSError:
                    self.log(f"during shutdown: {type(exc).__name__}: {exc}")

    def _final_checkpoint(self) -> None:
        path = self.checkpoint()
        if path is not None:
            self.log(f"saved {path}")

    def _close_logs(self) -> None:
        for csv_log in (self.episodes_csv, self.eval_csv, self.progress_csv):
            csv_log.close()
        if self.tensorboard:
            self.tensorboard.close()

    def _write_meta_end(self) -> None:
        self.meta_session.update(
            end=now_iso(), ended=self.stop_reason, exit_code=self.exit_code,
            global_step_end=self.shared.global_step(), time_s_end=round(self.time_s(), 3),
        )
        write_json(self.run_dir / "meta.json", self.meta)

    def _release_children(self) -> None:
        for proc in self.processes.values():
            close = getattr(proc, "close", None)
            if close is not None:
                close()
        if hasattr(self.shared.queue, "close"):
            self.shared.queue.close()
            self.shared.queue.join_thread()

    # -- the run ------------------------------------------------------------------------------

    def run(self) -> int:
        self._build_shared()
        self._open_logs()
        self.session_start = time.time()
        self.clock_origin = self.session_start - self.elapsed_before
        self.last_progress_time = self.last_checkpoint_time = self.session_start
        self.last_progress_step = self.shared.global_step()
        self.steps_per_s = 0.0
        self.bar = None
        if not self.cfg.no_progress:
            from tqdm import tqdm

            self.bar = tqdm(total=self.cfg.max_steps, initial=self.last_progress_step, unit="step", unit_scale=True, dynamic_ncols=True)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        self.log(f"run directory: {self.run_dir}")
        try:
            self._check_budgets()
            if self.stop_reason is None:
                if self.serial:
                    self._run_serial()
                else:
                    self._run_parallel()
        except Exception as exc:
            import traceback

            self._fail(f"main process raised {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        finally:
            if self.stop_reason is None:
                self._request_stop("stopped")
            self._finish()
            if self.bar is not None:
                self.bar.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        self.log(f"run ended: {self.stop_reason} (global step {self.shared.global_step()}, exit {self.exit_code})")
        return self.exit_code

    def _run_parallel(self) -> None:
        one_thread_per_child()
        if self.cfg.eval_episodes > 0:
            self._start_evaluator()
        for rank in range(self.cfg.num_workers):
            self._start_worker(rank)
        self._publish_pids()
        while self.stop_reason is None:
            self.supervise()
            time.sleep(SUPERVISE_PERIOD_S)

    def _run_serial(self) -> None:
        """One worker and the evaluator in this process: slower, but exactly repeatable for a
        seed, and debuggable with pdb."""
        register_atari()
        link = HogwildLink(self.shared, 0)
        worker = Worker(0, self.cfg, self.env_info, link, worker_seed(self.cfg.seed, 0, self.session))
        evaluator = None
        if self.cfg.eval_episodes > 0:
            evaluator = Evaluator(self.cfg, self.env_info, self.shared.model, self.run_dir, self.best_return, self.cfg.seed + 7 + 1000 * self.session)
        next_eval = time.time() + self.cfg.eval_interval
        try:
            while self.stop_reason is None:
                worker.run_rollout()
                if evaluator is not None and time.time() >= next_eval:
                    result = evaluator.evaluate(self.shared.global_step(), self.time_s(), lambda: self.stop_reason is not None)
                    if result is not None:
                        self._on_eval(result)
                    next_eval = time.time() + self.cfg.eval_interval
                self.supervise()
        finally:
            worker.close()
            if evaluator is not None:
                evaluator.close()


def prepare(argv: list[str]) -> tuple[Config, EnvInfo, Path, dict | None]:
    """Parse and check everything; raises ConfigError with one line per problem."""
    args = vars(build_parser().parse_args(argv))
    resume_dir = args.pop("resume", None)
    payload = None
    if resume_dir is not None:
        cfg = resolve_resume(resume_dir, args)
        try:
            payload, path = load_latest(Path(resume_dir) / "checkpoints", warn=lambda m: print(m, file=sys.stderr))
        except CheckpointError as exc:
            raise ConfigError([f"--resume {resume_dir}: {exc}"]) from None
        print(f"resuming from {path} at global step {payload['global_step']}", file=sys.stderr)
    else:
        cfg = resolve_new(args)
    try:
        env_info = describe_env(cfg.env, cfg.env_kwargs)
    except EnvSpecError as exc:
        raise ConfigError([str(exc)]) from None
    run_dir = Path(cfg.run_dir) if cfg.run_dir else default_run_dir(cfg)
    cfg.run_dir = str(run_dir)
    return cfg, env_info, run_dir, payload


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        cfg, env_info, run_dir, payload = prepare(argv)
    except ConfigError as exc:
        for line in exc.errors:
            print(f"error: {line}", file=sys.stderr)
        return EXIT_USAGE
    if cfg.tensorboard:
        try:
            import torch.utils.tensorboard  # noqa: F401
        except ImportError:
            print("error: --tensorboard needs the tensorboard package: pip install -e '.[tensorboard]'", file=sys.stderr)
            return EXIT_USAGE
    log = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    try:
        return Trainer(cfg, env_info, run_dir, payload, argv, log=log).run()
    except CsvSchemaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
