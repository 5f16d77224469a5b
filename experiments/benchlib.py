"""What every benchmark shares: the hardware line, the results header, running the trainer."""
from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parent
REPO = EXPERIMENTS.parent
RESULTS = EXPERIMENTS / "results"
RUNS = EXPERIMENTS / "runs"
sys.path.insert(0, str(REPO))


def glue_flag_values(argv: list[str], option: str = "--extra-flags") -> list[str]:
    """argv with `OPTION VALUE` written `OPTION=VALUE`: argparse takes `--extra-flags "--epochs 2"` (a
    space inside says it is a value) but reads `--extra-flags --normalize-advantages` as two options."""
    glued: list[str] = []
    args = iter(argv)
    for arg in args:
        glued.append(arg if arg != option else f"{option}={next(args, '')}")
    return glued


def results_dir(benchmark: str) -> Path:
    """experiments/results/<benchmark>/, made if missing: each benchmark writes into its own folder."""
    path = RESULTS / benchmark
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_dated_result(benchmark: str, name: str, text: str) -> Path:
    """Print a result and write it to experiments/results/<benchmark>/<today>-<name>.md."""
    print(text)
    stem = f"{dt.date.today().isoformat()}-{name}"
    out = results_dir(benchmark) / f"{stem}.md"
    number = 1
    while out.exists():  # a second run the same day gets its own file: an earlier result is never overwritten
        number += 1
        out = results_dir(benchmark) / f"{stem}-{number}.md"
    out.write_text(text)
    print(f"wrote {out}")
    return out


def load_config(name: str) -> dict:
    return json.loads((EXPERIMENTS / "configs" / f"{name}.json").read_text())


def describe_cpu(found: dict) -> str:
    """One line for a results header: the model, torch's kernel level and any bf16 instructions."""
    extras = [name for key, name in (("avx512_bf16", "AVX-512 BF16"), ("amx", "AMX")) if found[key]]
    return f"{found['model']} ({', '.join([found['torch_capability'], *extras])})"


def header(title: str, command: str, extra: dict | None = None) -> str:
    from hogwild_a3c.files.machine import cpu
    from hogwild_a3c.files.meta import versions

    lines = [
        f"# {title}",
        "",
        f"- command: `{command}`",
        f"- date: {dt.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- hardware: {os.cpu_count()} cores, {describe_cpu(cpu())}, {platform.platform()}",
        f"- versions: {', '.join(f'{k} {v}' for k, v in versions().items())}",
    ]
    for key, value in (extra or {}).items():
        lines.append(f"- {key}: {value}")
    return "\n".join(lines) + "\n"


def markdown_table(rows: list[dict], columns: list[str]) -> str:
    def fmt(v):
        if not isinstance(v, float):
            return str(v)
        return f"{v:.3g}" if abs(v) < 10 else f"{v:,.1f}" if abs(v) < 1000 else f"{v:,.0f}"

    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(fmt(row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(out) + "\n"


def run_trainer(args: list[str], timeout: float | None = None, cwd: Path = REPO, env: dict | None = None) -> int:
    """`python -m hogwild_a3c.train ARGS` from `cwd`, whose own `hogwild_a3c` is the one run
    (a worktree of another commit, say)."""
    command = [sys.executable, "-m", "hogwild_a3c.train", *map(str, args)]
    where = "" if cwd == REPO else f" (in {cwd.relative_to(REPO)})"
    print(f"${where}", " ".join(command[1:]), flush=True)
    return subprocess.run(command, cwd=cwd, timeout=timeout, env=env).returncode


def pong_worker(preset: str):
    """One real `Worker` on the throughput config's Pong with `preset`, in this process, one thread
    as the trainer gives each worker, its shared model of its own: (cfg, worker, reports)."""
    from hogwild_a3c.children.process import one_thread_per_child

    one_thread_per_child()
    import torch

    torch.set_num_threads(1)
    from hogwild_a3c.children.reports import InProcessReports
    from hogwild_a3c.children.shared import HogwildLink, SharedState
    from hogwild_a3c.children.worker import Worker
    from hogwild_a3c.config import Config
    from hogwild_a3c.envs.make import describe_env, parse_env_kwargs, register_atari
    from hogwild_a3c.learning.model import build_model
    from hogwild_a3c.learning.optim import LrSchedule
    from hogwild_a3c.run.presets import load_preset

    register_atari()
    config = load_config("throughput")
    cfg = Config(**{**load_preset(preset)[0], "env": config["env"],
                    "env_kwargs": parse_env_kwargs(config["env_kwargs"])})
    info = describe_env(cfg.env, cfg.env_kwargs)
    shared = SharedState.create(build_model(info.obs_shape, info.distribution, cfg), 1, cfg.optimizer,
                                LrSchedule(cfg.lr))
    reports = InProcessReports()
    return cfg, Worker(0, cfg, info, HogwildLink(shared, 0, reports), seed=0), reports


def worker_bench_args(description: str, name: str, rollouts: int = 60):
    """The command line of a one-worker bench (`pong_worker`): --rollouts, --preset, --name."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rollouts", type=int, default=rollouts)
    parser.add_argument("--preset", default="atari")
    parser.add_argument("--name", default=name, help="results file: <date>-<name>.md")
    args = parser.parse_args()
    if args.rollouts < 1:
        parser.error("--rollouts must be at least 1")
    return args
