"""`python -m hogwild_a3c.plot RUN_DIR [RUN_DIR ...] --out FILE.png`: learning curves.

Evaluation return (training episode returns lighter) against global steps and against wall
time. Runs whose configs differ only in the seed are drawn as their mean with a min-max band;
other runs are overlaid one line each. Needs the `plot` extra (pandas, matplotlib).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from .config import BEFORE_THE_FIELD_EXISTED, Config, experiment_fields
from .files.logs import RunReadError, load_run
from .run.exit_codes import EXIT_OK, EXIT_USAGE

# Config fields that do not change what is being compared: seeds, budgets, bookkeeping.
NOT_PART_OF_THE_EXPERIMENT = {f.name for f in dataclasses.fields(Config)} - experiment_fields()


def as_trained(config: dict[str, Any]) -> dict[str, Any]:
    """A saved config with every setting it predates filled in as runs were trained then, so that
    a run saved before a field existed and one saved after it, of the same settings, compare equal."""
    filled = {f.name: f.default for f in dataclasses.fields(Config) if f.default is not dataclasses.MISSING}
    filled.update(BEFORE_THE_FIELD_EXISTED)
    filled.update(config)
    return filled


def group_by_config(runs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Runs keyed by a label of their config without the seed; seeds of one config share a key."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        key = repr(sorted((k, repr(v)) for k, v in as_trained(run["config"]).items()
                          if k not in NOT_PART_OF_THE_EXPERIMENT))
        groups[key].append(run)
    return groups


def labelled_groups(runs: list[dict[str, Any]], labels: list[str]) -> dict[str, list[dict[str, Any]]]:
    """One group per run under the given name, for runs whose configs match but whose code
    differs (a comparison of commits, say), which `group_by_config` would merge as seeds."""
    if len(labels) != len(runs) or len(set(labels)) != len(labels):
        raise ValueError(f"need one distinct label per run: {len(labels)} labels for {len(runs)} runs")
    return {label: [run] for label, run in zip(labels, runs)}


def _label(group: list[dict[str, Any]], distinct: list[str]) -> str:
    config = as_trained(group[0]["config"])
    parts = [f"{k}={config.get(k)}" for k in distinct] or [config.get("env", "?")]
    label = ", ".join(parts)
    if len(group) > 1:
        label += f" ({len(group)} seeds)"
    elif not distinct:
        label = group[0]["name"]
    return label


def eval_curve(run: dict[str, Any], x: str):
    """Mean evaluation return per evaluation, against `x` (global_step or time_s)."""
    evals = run["eval"]
    if evals.empty:
        return np.array([]), np.array([])
    per_eval = evals.groupby(["global_step", "time_s"], as_index=False)["episode_return"].mean().sort_values(x)
    return per_eval[x].to_numpy(dtype=float), per_eval["episode_return"].to_numpy(dtype=float)


def train_curve(run: dict[str, Any], x: str, window: int = 20):
    episodes = run["episodes"].sort_values(x)
    if episodes.empty:
        return np.array([]), np.array([])
    smooth = episodes["episode_return"].rolling(window, min_periods=1).mean()
    return episodes[x].to_numpy(dtype=float), smooth.to_numpy(dtype=float)


def _band(curves: list[tuple[np.ndarray, np.ndarray]]):
    """Mean and min-max of several curves on a common x grid; each curve counts only where it
    has data, so a seed that stopped early (at its target, say) does not cut the others short."""
    curves = [(x, y) for x, y in curves if len(x)]
    if not curves:
        return None
    grid = np.linspace(min(x[0] for x, _ in curves), max(x[-1] for x, _ in curves), 200)
    ys = np.stack([np.where((grid >= x[0]) & (grid <= x[-1]), np.interp(grid, x, y), np.nan) for x, y in curves])
    covered = ~np.isnan(ys).all(axis=0)
    grid, ys = grid[covered], ys[:, covered]
    return grid, np.nanmean(ys, 0), np.nanmin(ys, 0), np.nanmax(ys, 0)


def plot_runs(run_dirs: list[str | Path], out: str | Path, title: str | None = None, labels: list[str] | None = None):
    """`labels`, one per run, draws each run as its own line under that name instead of grouping
    seeds of one config (runs of different code share a config)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [load_run(d) for d in run_dirs]
    groups = labelled_groups(runs, labels) if labels else group_by_config(runs)
    configs = [as_trained(run["config"]) for run in runs]
    keys_that_differ = sorted({
        k for config in configs for k in config
        if k not in NOT_PART_OF_THE_EXPERIMENT and len({repr(c.get(k)) for c in configs}) > 1
    })
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for (axis, x, xlabel) in ((axes[0], "global_step", "agent steps"), (axes[1], "time_s", "wall time (s)")):
        for i, (key, group) in enumerate(groups.items()):
            color = f"C{i}"
            label = key if labels else _label(group, keys_that_differ)
            for run in group:
                tx, ty = train_curve(run, x)
                axis.plot(tx, ty, color=color, alpha=0.2, linewidth=0.8)
            if len(group) == 1:
                ex, ey = eval_curve(group[0], x)
                axis.plot(ex, ey, color=color, marker="o", markersize=3, label=label)
            else:
                band = _band([eval_curve(run, x) for run in group])
                if band is not None:
                    grid, mean, low, high = band
                    axis.plot(grid, mean, color=color, label=label)
                    axis.fill_between(grid, low, high, color=color, alpha=0.2)
        axis.set_xlabel(xlabel)
        axis.set_ylabel("return")
        axis.grid(alpha=0.3)
    axes[0].legend(loc="best", fontsize=8)
    envs = sorted({run["config"].get("env", "?") for run in runs})
    fig.suptitle(title or f"{', '.join(envs)}: evaluation return (lines), training episodes (light)")
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hogwild_a3c.plot", description=__doc__.splitlines()[0],
                                     allow_abbrev=False)
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    parser.add_argument("--out", default="curves.png", help="PNG file to write (default: curves.png)")
    parser.add_argument("--title", help="figure title")
    parser.add_argument("--labels", nargs="+", help="one name per RUN_DIR, each run drawn on its own")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.labels and (len(args.labels) != len(args.run_dirs) or len(set(args.labels)) != len(args.labels)):
        print(f"error: --labels: {len(args.labels)} names for {len(args.run_dirs)} run directories; "
              "give one distinct name per RUN_DIR", file=sys.stderr)
        return EXIT_USAGE
    for run_dir in args.run_dirs:
        if not ((Path(run_dir) / "config.json").is_file() or any(Path(run_dir).glob("nodes/*/config.json"))):
            print(f"error: {run_dir}: not a run directory (no config.json there, nor under nodes/*/)",
                  file=sys.stderr)
            return EXIT_USAGE
    try:
        out = plot_runs(args.run_dirs, args.out, args.title, args.labels)
    except RunReadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ImportError as exc:
        print(f"error: plotting needs pandas and matplotlib: pip install -e '.[plot]' ({exc})", file=sys.stderr)
        return EXIT_USAGE
    print(f"wrote {out}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
