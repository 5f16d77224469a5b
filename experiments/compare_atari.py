"""Screens of a learning lever side by side: `python experiments/compare_atari.py BASE VARIANT...`
reads experiments/results/atari/NAME.csv of each `make bench-atari --out NAME` (ours only) and
prints, per game, each arm's mean over seeds of the last 100 training episodes (the seeds' own
figures beside it), its ratio to BASE, the median human-normalized score of the seed means and
the median steps/s (a larger model costs speed: the lever's price at equal wall time).
`--out FILE` also writes the table there. An arm whose seeds were run apart is `NAME+NAME2`.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import pandas as pd

from bench_atari import WINDOW, normalized
from benchlib import load_config, markdown_table, results_dir


def arm(spec: str) -> pd.DataFrame:
    """The rows of ours in NAME.csv; `NAME+MORE+...` joins tables of one arm run at different times
    (its second seed, say), and is labelled by its first NAME."""
    tables = []
    for name in spec.split("+"):
        path = results_dir("atari") / f"{name}.csv"
        if not path.is_file():
            raise SystemExit(f"error: {path}: no such table; run make bench-atari ARGS='--out {name} ...' first")
        tables.append(pd.read_csv(path))
    table = pd.concat(tables, ignore_index=True)
    return table[table["agent"] == "hogwild_a3c"]


def compare(specs: list[str], config: dict) -> tuple[list[dict], list[dict]]:
    names = [spec.split("+")[0] for spec in specs]
    if len(set(names)) != len(names):
        raise SystemExit(f"error: two arms share the label {next(n for n in names if names.count(n) > 1)}")
    arms = {name: arm(spec) for name, spec in zip(names, specs)}
    base = names[0]
    games = [g for g in config["games"] if all(g in set(t["game"]) for t in arms.values())]
    if not games:
        raise SystemExit(f"error: no game was run in every one of {', '.join(names)}")
    left_out = sorted({g for t in arms.values() for g in t["game"]} - set(games))
    if left_out:
        print(f"left out, not run in every arm: {', '.join(left_out)}", file=sys.stderr)
    rows, means = [], {name: {} for name in names}
    for game in games:
        row: dict = {"game": game}
        for name, table in arms.items():
            scores = table[table["game"] == game][f"train_mean_{WINDOW}"].astype(float).tolist()
            means[name][game] = statistics.mean(scores)
            row[name] = f"{means[name][game]:,.1f} ({' / '.join(f'{v:,.0f}' for v in scores)})"
            if name != base:  # a ratio of scores means something only when both are above 0
                ratio = means[name][game] / means[base][game] if means[base][game] > 0 < means[name][game] else None
                row[f"{name} / {base}"] = "-" if ratio is None else f"{ratio:.2f}"
        rows.append(row)
    summary = [{"arm": name,
                "seeds_per_game": "/".join(str(int((arms[name]["game"] == g).sum())) for g in games),
                "median_human_normalized": statistics.median(normalized(means[name][g], g, config) for g in games),
                "median_steps_per_s": float(arms[name][arms[name]["game"].isin(games)]["steps_per_s"].median()),
                "median_steps": int(arms[name][arms[name]["game"].isin(games)]["steps"].median())} for name in names]
    return rows, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="+", metavar="NAME", help="result tables: the baseline first; NAME+MORE joins "
                        "the tables of one arm (its seeds run apart), labelled NAME")
    parser.add_argument("--out", type=Path, help="also write the markdown here")
    args = parser.parse_args()
    if len(args.names) < 2:
        parser.error("give the baseline's table and at least one variant's")
    rows, summary = compare(args.names, load_config("atari"))
    text = markdown_table(rows, list(rows[0])) + "\n" + markdown_table(summary, list(summary[0]))
    if args.out:
        args.out.write_text(f"<!-- {' '.join(['compare_atari.py', *sys.argv[1:]])} -->\n" + text)
    print(text)


if __name__ == "__main__":
    main()
