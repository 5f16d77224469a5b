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


def results_dir(benchmark: str) -> Path:
    """experiments/results/<benchmark>/, made if missing: each benchmark writes into its own folder."""
    path = RESULTS / benchmark
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_dated_result(benchmark: str, name: str, text: str) -> Path:
    """Print a result and write it to experiments/results/<benchmark>/<today>-<name>.md."""
    print(text)
    out = results_dir(benchmark) / f"{dt.date.today().isoformat()}-{name}.md"
    out.write_text(text)
    print(f"wrote {out}")
    return out


def load_config(name: str) -> dict:
    return json.loads((EXPERIMENTS / "configs" / f"{name}.json").read_text())


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def header(title: str, command: str, extra: dict | None = None) -> str:
    from hogwild_a3c.rundir import versions

    lines = [
        f"# {title}",
        "",
        f"- command: `{command}`",
        f"- date: {dt.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- hardware: {os.cpu_count()} cores, {cpu_model()}, {platform.platform()}",
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
