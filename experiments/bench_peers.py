"""`make bench-peers`: the trainers built for speed, measured beside ours on this machine.

Each peer lives in a virtual environment of its own under experiments/peers/<peer>/.venv, made
here from experiments/peers/<peer>/requirements.txt (their pins never touch the project's).

Parts (`--part`):

- raw-env: the raw Atari environment's agent steps/s on random actions, `ALE/Pong-v5` without
  sticky actions, on the trainer's layout (2 processes x 8 envs, one thread each), started
  together: ale-py with our 42x42 frames (`raw_env.py`, what bench-pong divides by), against
  EnvPool's synchronous batch step with its own 84x84 pipeline (4 frames stacked) and at 42x42
  (one frame); and EnvPool as its users run it on 2 cores, one process of 16 envs on its own
  2 threads. Interleaved: each repeat runs every row once. Writes
  experiments/results/peers/<date>-raw-env.md.

- pong: Pong without sticky actions, each trainer with its own published Atari settings, until
  the mean return of its last 20 training episodes reaches +18 or --budget-minutes pass: the
  wall time from the command's start and the agent steps (a peer's frames / 4) at that point,
  and where the budget ran out, where each got to. Ours with no flags (`hogwild_a3c.train`, its
  episodes.csv; our evaluator's first 5-episode mean of +18 beside it); Sample Factory 2.1.1's
  own Atari example (`peers/sample_factory/train_sf.py`, its `Avg episode reward` over
  `--stats_avg 20` and `Total num frames`). Writes experiments/results/peers/<date>-pong.md.

- atari-30min: Breakout and SpaceInvaders (`--games`) with sticky actions 0.25, each trainer for
  --budget-minutes (30) of wall time: the mean return of its last 100 training episodes then,
  and its agent steps. Ours with no flags on `ALE/<Game>-v5`; Sample Factory's example on
  `<Game>NoFrameskip-v4` with the same stickiness (`train_sf.py`). Writes
  experiments/results/peers/<date>-atari-<budget>min.md.

- reuse: rl_games' own config against the same with one pass over each batch (`mini_epochs=1`), on
  Pong (`--reuse-games`, SpaceInvaders too), each for --budget-minutes: its training mean at 100k,
  200k, ... agent steps, to say how much of its per-step lead is sample reuse. Writes
  experiments/results/peers/<date>-reuse.md.

rl_games 1.6.5 (PPO on EnvPool 1.2.5) races in both with its own EnvPool configs
(`peers/rl_games/train_rlg.py`, which lists what 2 cores and no GPU change), read from the line
its launcher prints each epoch. PufferLib 3.0.0 races in both with its own Atari config
(`peers/pufferlib/train_puffer.py`, built from its source archive by `peers/pufferlib/build.py`
since its pip install cannot work here), read from the games its launcher writes down.
`--peers` chooses which peers race (`--no-ours` leaves ours out).
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
import venv
from collections.abc import Callable
from pathlib import Path

from benchlib import EXPERIMENTS, REPO, RUNS, header, markdown_table, write_dated_result
from raw_env import SECONDS, WARMUP, raw_env_steps_per_s

PEERS = EXPERIMENTS / "peers"
PEER_NAMES = ("sample_factory", "rl_games", "pufferlib")  # raced in pong and atari-30min
TARGET, LAST_EPISODES = 18.0, 20  # the race's finish: the mean of the last 20 training episodes reaches +18


def peer_python(peer: str) -> str:
    """The peer's own interpreter, its virtual environment made and its requirements installed
    first if missing, then its build.py run where it has one (a stamp file records that the
    install finished)."""
    folder = PEERS / peer
    env_dir, stamp = folder / ".venv", folder / ".venv" / ".installed"
    python = env_dir / "bin" / "python"
    if not stamp.exists():
        print(f"making {env_dir} from {folder / 'requirements.txt'}", flush=True)
        venv.create(env_dir, with_pip=True, clear=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "-r", str(folder / "requirements.txt")], check=True)
        if (folder / "build.py").exists():
            subprocess.run([str(python), str(folder / "build.py")], check=True)
        stamp.touch()
    return str(python)


def envpool_rate(python: str, processes: int, envs: int, threads: int, size: int, stack: int, seconds: float,
                 warmup: float) -> tuple[float, str]:
    out = subprocess.run([python, str(PEERS / "envpool" / "raw_env.py"), "Pong-v5", str(processes), str(envs),
                          str(threads), str(size), str(stack), str(seconds), str(warmup)],
                         check=True, capture_output=True, text=True, timeout=900)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return result["steps_per_s"], result["envpool"]


def raw_env_part(args) -> str:
    python = peer_python("envpool")
    versions: set[str] = set()

    def envpool(processes: int, envs: int, threads: int, size: int, stack: int) -> float:
        rate, version = envpool_rate(python, processes, envs, threads, size, stack, args.seconds, args.warmup)
        versions.add(version)
        return rate

    rows = {
        "ale-py, our 42x42 frames (2 processes x 8 envs, 1 thread each)":
            lambda: raw_env_steps_per_s("ALE/Pong-v5", {"repeat_action_probability": 0.0}, {}, 2, 8,
                                        args.seconds, args.warmup),
        "EnvPool, its 84x84 x 4 stack (2 processes x 8 envs, 1 thread each)":
            lambda: envpool(2, 8, 1, 84, 4),
        "EnvPool, 42x42, 1 frame (2 processes x 8 envs, 1 thread each)":
            lambda: envpool(2, 8, 1, 42, 1),
        "EnvPool, its 84x84 x 4 stack (1 process x 16 envs, 2 threads)":
            lambda: envpool(1, 16, 2, 84, 4),
    }
    samples: dict[str, list[float]] = {name: [] for name in rows}
    for repeat in range(args.repeats):
        for name, measure in rows.items():
            samples[name].append(measure())
            print(f"repeat {repeat + 1}: {name}: {samples[name][-1]:,.0f} steps/s", flush=True)
    reference = statistics.median(samples[next(iter(rows))])
    table = [{"environment": name, "agent steps/s": statistics.median(values),
              "against ale-py (ours)": statistics.median(values) / reference,
              "runs": ", ".join(f"{v:,.0f}" for v in values)} for name, values in samples.items()]
    text = header("The raw Atari environment: ale-py against EnvPool", make_command(), {
                      "env": "ALE/Pong-v5 (EnvPool: Pong-v5), frameskip 4, repeat_action_probability 0, random actions",
                      "EnvPool": f"{', '.join(sorted(versions))} in experiments/peers/envpool/.venv "
                                 "(requirements.txt there); episodic_life and reward_clip off, "
                                 "its noop starts on (its default)",
                      "per cell": f"median of {args.repeats} interleaved runs of {args.seconds:g} s after a "
                                  f"{args.warmup:g} s warm-up",
                  })
    text += "\n" + markdown_table(table, ["environment", "agent steps/s", "against ale-py (ours)", "runs"])
    text += f"\nPeers not raced in this file: {not_raced(args)}.\n"
    return text


def make_command() -> str:
    """How this run was asked for, for the results file's header."""
    words = [f'"{word}"' if " " in word else word for word in sys.argv[1:]]  # double quotes: ARGS='...' holds them
    return "make bench-peers" + (f" ARGS='{' '.join(words)}'" if words else "")


# (the 20-episode mean or None, agent steps so far): what a trainer has reached, read from its own files
Reading = tuple[float | None, int]


def race(command: list[str], cwd: Path, log: Path, budget_s: float, read: Callable[[], Reading],
         target: float | None = TARGET) -> dict:
    """Run `command` until `read` says its training episodes average `target` (None: never), or
    `budget_s` passes, polling every 2 s; then stop it (SIGINT, so ours saves; its whole process
    group is killed if it lingers). Times are wall seconds from the command's start, start-up included."""
    start = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        result: dict = {"seconds_to_target": None, "steps_to_target": None}
        mean, steps = None, 0
        try:
            while proc.poll() is None and time.monotonic() - start < budget_s:
                time.sleep(2)
                if target is None:  # read once, at the end
                    continue
                mean, steps = read()
                if mean is not None and mean >= target:
                    result.update(seconds_to_target=time.monotonic() - start, steps_to_target=steps)
                    break
        finally:
            stopped = time.monotonic() - start
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=90)
                except subprocess.TimeoutExpired:
                    pass
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # any child left behind (a peer's sampler processes)
            proc.wait()
    mean, steps = read()
    result.update(stopped_s=stopped, steps_at_stop=steps, mean_last_at_stop=mean, exit_code=proc.returncode,
                  steps_per_s=steps / stopped if stopped else 0.0)
    return result


def csv_rows(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    lines = path.read_text().splitlines()[1:]
    return [line.split(",") for line in lines if line.count(",") >= 3]


def ours_reading(run_dir: Path, window: int = LAST_EPISODES) -> Reading:
    """The mean return of our last `window` training episodes (whole games: a lost life ends no
    episode in episodes.csv), None before there are that many, and the agent steps so far."""
    rows = csv_rows(run_dir / "episodes.csv")  # time_s, global_step, worker, episode_return, episode_length
    if not rows:
        return None, 0
    last = [float(row[3]) for row in rows[-window:]]
    return (statistics.mean(last) if len(last) == window else None), int(rows[-1][1])


def ours_evaluator_figure(run_dir: Path) -> str:
    """Our evaluator's figure: the trainer clock and step of its first 5-episode mean of +18, or
    its best mean when none reached it before the race stopped."""
    evaluations: dict[tuple[str, str], list[float]] = {}
    for row in csv_rows(run_dir / "eval.csv"):  # time_s, global_step, episode_return, episode_length
        evaluations.setdefault((row[0], row[1]), []).append(float(row[2]))
    for (time_s, step), returns in evaluations.items():
        if statistics.mean(returns) >= TARGET:
            return f"{float(time_s) / 60:.1f} min, {int(step):,} steps"
    best = max((statistics.mean(returns) for returns in evaluations.values()), default=None)
    return "no evaluation" if best is None else f"not reached; best mean {best:.1f}"


ANSI = re.compile(r"\x1b\[[0-9;]*m")
SF_FRAMES = re.compile(r"Total num frames: (\d+)")
SF_REWARD = re.compile(r"Avg episode reward: \[\(0, '(-?[\d.]+)'\)\]")


def sample_factory_reading(log: Path) -> Reading:
    """Its `Avg episode reward` (the last --stats_avg training episodes) and its `Total num frames`
    (agent steps x its frameskip of 4, with summaries_use_frameskip). That reward is summed per
    life and clipped: a game's score only in a game without lives and with rewards of +-1, as
    Pong; for other games see `sample_factory_games_reading`."""
    text = ANSI.sub("", log.read_text(errors="replace")) if log.exists() else ""
    frames, rewards = SF_FRAMES.findall(text), SF_REWARD.findall(text)
    return (float(rewards[-1]) if rewards else None), (int(frames[-1]) // 4 if frames else 0)


def sample_factory_games_reading(python: str, train_dir: Path) -> Reading:
    """Its whole-game training mean from its summaries (read_summaries.py, in its venv): in games
    with lives its stdout's figure is the clipped reward of one life."""
    out = subprocess.run([python, str(PEERS / "sample_factory" / "read_summaries.py"), str(train_dir)],
                         check=True, capture_output=True, text=True, timeout=300)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    return found["mean"], int(found["frames"]) // 4


SF_FLAGS = ["--device", "cpu"]  # with --stats_avg, all that changes from its example's defaults
RLG_RACE = re.compile(r"RACE mean=(-?[\d.]+(?:e[-+]?\d+)?) games=(\d+) steps=(\d+)")
RLG_CHANGES = ("device cpu (its config leaves cuda:0), torch_compile off (no epoch in 90 s on 2 cores with it), "
               "16 actors instead of its 64 or 48 with the minibatch cut in proportion (as many minibatches an "
               "epoch as published: one epoch of 64 x 128 steps took minutes here)")


def ours_command(args, env_flags: list[str], seed: int, budget_s: float, run_dir: Path) -> list[str]:
    """Ours with no flags but the env's, or with --ours-flags; its own budget a minute past the race's, so
    that the race, not the trainer, decides when it stops."""
    return [sys.executable, "-m", "hogwild_a3c.train", *env_flags, "--seed", str(seed), "--max-seconds",
            str(budget_s + 60), "--no-progress", "--run-dir", str(run_dir), *shlex.split(args.ours_flags)]


def ours_flags_problem(ours_flags: str) -> str | None:
    """Why our trainer would refuse these flags, or None: asked of its own parser before any race starts,
    so that a typo costs a line, not a race of ours that dies at start-up among peers that run for 30 min."""
    from hogwild_a3c.run.cli import build_parser

    parser = build_parser()
    refusal = []
    parser.error = lambda message: (refusal.append(message), sys.exit(2))  # its message, without usage or exit
    try:
        parser.parse_args(["--env", "ALE/Pong-v5", *shlex.split(ours_flags)])
    except SystemExit:
        return refusal[0] if refusal else "our trainer's parser refused them"
    return None


def ours_label(args) -> str:
    return f"hogwild_a3c (ours), `{args.ours_flags}`" if args.ours_flags else "hogwild_a3c (ours), no flags"


def not_raced(args) -> str:
    left_out = [name for name in PEER_NAMES if name not in args.peers]
    ours = [] if args.ours else ["ours: left out by --no-ours (its rows from this or an earlier day on this machine "
                                 "are in this folder's other files)"]
    return "; ".join([*ours, *(f"{name}: left out by --peers" for name in left_out)]) or "none"


def rl_games_reading(log: Path, window: int) -> Reading:
    """Its launcher's last `RACE` line: the mean of its last `window` whole games (EnvPool's
    unclipped scores), None until it has that many, and its agent steps."""
    text = log.read_text(errors="replace") if log.exists() else ""
    found = RLG_RACE.findall(text)
    if not found:
        return None, 0
    mean, games, steps = found[-1]
    return (float(mean) if int(games) >= window else None), int(steps)


def rl_games_race(config: str, out: Path, name: str, seed: int, window: int, sticky: float, budget_s: float,
                  target: float | None, changes: str = "") -> dict:
    python = peer_python("rl_games")
    log = out / f"rl-games-{name}.log"
    command = [python, "-u", str(PEERS / "rl_games" / "train_rlg.py"), config, str(out / "rl-games"), name, str(seed),
               str(window), str(sticky), changes]
    return race(command, PEERS / "rl_games", log, budget_s, functools.partial(rl_games_reading, log, window), target)


PUFFER_FRAMESKIP = 4  # its steps are frames (its Atari config plays at frameskip 1); ours act every 4
PUFFER_CHANGES = ("device cpu (its config trains on cuda), 16 envs on 2 worker processes instead of its 128 on 16 "
                  "(it refuses more workers than cores), its train batch 8,192 and minibatch 2,048 cut in the same "
                  "proportion to 1,024 and 256 (as many minibatches an epoch as published; an epoch of 8,192 took "
                  "minutes here), its vector's batch of half the envs kept (8 of 16)")
PUFFER_GAMES = {"breakout": "breakout", "spaceinvaders": "space_invaders"}
PUFFER_TRAINER = "PufferLib 3.0.0, its atari.ini (frameskip 1)"
PUFFER_ABOUT = ("3.0.0 in experiments/peers/pufferlib/.venv, built from its source archive by build.py there (its "
                "pip install cannot run here; requirements.txt: torch 2.13.0+cpu, numpy 1.26.4, gymnasium 0.29.1, "
                "ale-py 0.9.0); its config/atari.ini with default.ini (PPO: the Nature CNN's three convs on "
                "105x80 grey frames, one frame, then an LSTM of 512; Muon at lr 0.015, 1 epoch a batch, 64-step "
                "BPTT, gamma 0.995, GAE 0.90, rewards clipped to [-1, 1] for learning, whole games) with: "
                f"{PUFFER_CHANGES}; its agent steps are frames, shown here divided by {PUFFER_FRAMESKIP} as ours are")


def pufferlib_reading(games_csv: Path, window: int) -> Reading:
    """The mean of the last `window` whole games its launcher wrote down (None until it has that
    many), and its frames so far as agent steps at frameskip 4."""
    text = games_csv.read_text() if games_csv.exists() else ""
    lines = text.split("\n")[1:-1]  # whole lines only: the last piece is empty or still being written
    cells = [line.rstrip("\r").split(",") for line in lines]
    if not cells:
        return None, 0
    returns = [float(value) for _, value in cells if value]
    mean = statistics.mean(returns[-window:]) if len(returns) >= window else None
    return mean, int(cells[-1][0]) // PUFFER_FRAMESKIP


def pufferlib_race(game: str, out: Path, name: str, seed: int, window: int, sticky: float, budget_s: float,
                   target: float | None) -> dict:
    python = peer_python("pufferlib")
    games_csv = out / f"pufferlib-{name}.csv"
    command = [python, "-u", str(PEERS / "pufferlib" / "train_puffer.py"), game, str(games_csv), str(seed), str(sticky)]
    # run in the run's folder: it writes checkpoints and a resources folder where it starts
    return race(command, out, out / f"pufferlib-{name}.log", budget_s,
                functools.partial(pufferlib_reading, games_csv, window), target)


def pong_part(args) -> str:
    sf_python = peer_python("sample_factory") if "sample_factory" in args.peers else ""
    out = RUNS / "peers" / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True)
    rows = []
    for seed in args.seeds:
        if args.ours:
            run_dir = out / f"ours-s{seed}"
            command = ours_command(args, ["--env", "ALE/Pong-v5", "--env-kwargs", "repeat_action_probability=0.0"],
                                   seed, args.budget_minutes * 60, run_dir)
            result = race(command, REPO, out / f"ours-s{seed}.log", args.budget_minutes * 60,
                          functools.partial(ours_reading, run_dir))
            rows.append({"trainer": ours_label(args), "seed": seed, **result,
                         "our evaluator at +18": ours_evaluator_figure(run_dir)})
            print(rows[-1], flush=True)
        if "sample_factory" in args.peers:
            log = out / f"sample-factory-s{seed}.log"
            command = [sf_python, str(PEERS / "sample_factory" / "train_sf.py"), "--env", "atari_pong", "--experiment",
                       f"pong-s{seed}", "--train_dir", str(out / "sample-factory"), "--seed", str(seed), *SF_FLAGS,
                       "--stats_avg", str(LAST_EPISODES)]
            result = race(command, PEERS / "sample_factory", log, args.budget_minutes * 60,
                          functools.partial(sample_factory_reading, log))
            rows.append({"trainer": "Sample Factory 2.1.1, APPO, its Atari example", "seed": seed, **result,
                         "our evaluator at +18": "-"})
            print(rows[-1], flush=True)
        if "rl_games" in args.peers:
            result = rl_games_race("ppo_pong_envpool.yaml", out, f"pong-s{seed}", seed, LAST_EPISODES, 0.0,
                                   args.budget_minutes * 60, TARGET)
            rows.append({"trainer": "rl_games 1.6.5, PPO on EnvPool, its ppo_pong_envpool", "seed": seed, **result,
                         "our evaluator at +18": "-"})
            print(rows[-1], flush=True)
        if "pufferlib" in args.peers:
            result = pufferlib_race("pong", out, f"pong-s{seed}", seed, LAST_EPISODES, 0.0, args.budget_minutes * 60,
                                    TARGET)
            rows.append({"trainer": PUFFER_TRAINER, "seed": seed, **result,
                         "our evaluator at +18": "-"})
            print(rows[-1], flush=True)
    table = [{"trainer": row["trainer"], "seed": row["seed"],
              "minutes to +18": "not in budget" if row["seconds_to_target"] is None else
              f"{row['seconds_to_target'] / 60:.1f}",
              "agent steps to +18": "-" if row["steps_to_target"] is None else f"{row['steps_to_target']:,}",
              "stopped at (min)": f"{row['stopped_s'] / 60:.1f}", "agent steps then": f"{row['steps_at_stop']:,}",
              "mean of last 20 then": "-" if row["mean_last_at_stop"] is None else f"{row['mean_last_at_stop']:.1f}",
              "agent steps/s": f"{row['steps_per_s']:,.0f}",
              "our evaluator at +18": row["our evaluator at +18"]} for row in rows]
    text = header("Pong to a training mean of +18: ours against the peers", make_command(), {
        "finish": f"the mean return of the last {LAST_EPISODES} training episodes reaches +{TARGET:g}, read every 2 s "
                  "from each trainer's own output (ours: episodes.csv; Sample Factory: its 'Avg episode reward' "
                  "with --stats_avg 20, reported every 5 s); wall time from the command's start, start-up included; "
                  f"budget {args.budget_minutes:g} min a run; runs interleaved, one at a time",
        "env": "Pong without sticky actions: ours ALE/Pong-v5 with repeat_action_probability=0 and our atari "
               "preset's protocol (42x42 frames, noop starts, FIRE at reset, life loss, clipped rewards in "
               "training); Sample Factory PongNoFrameskip-v4 with its example's wrappers (84x84 grey, 4 frames "
               "stacked, frameskip 4 with max-pooling, noop starts, FIRE at reset, life loss, clipped rewards)",
        "Sample Factory": "2.1.1 in experiments/peers/sample_factory/.venv (requirements.txt there: torch 2.13.0+cpu, "
                          "gymnasium 0.29.1, ale-py 0.9.1, numpy 1.26.4); its sf_examples.atari defaults (APPO: "
                          "8 workers x 1 env, rollout 128, batch 256, 4 epochs, lr 2.5e-4 linear decay, the Nature "
                          f"CNN) with only `{' '.join(SF_FLAGS)}` (no GPU here) and `--stats_avg {LAST_EPISODES}` "
                          "(our window)",
        "rl_games": "1.6.5 with EnvPool 1.2.5 in experiments/peers/rl_games/.venv (requirements.txt there); its "
                    "configs/atari/ppo_pong_envpool.yaml (PPO: Nature CNN, EnvPool Pong-v5: 84x84 x 4 frames, no "
                    "sticky actions, rewards clipped for learning; 128-step horizon, 4 epochs, lr 3e-4 adaptive) "
                    f"with: {RLG_CHANGES}; games_to_track {LAST_EPISODES} (our window)",
        "PufferLib": PUFFER_ABOUT + "; Pong with its frameskip 1 and no sticky actions, as published; the "
                     f"finish is the same mean of its last {LAST_EPISODES} whole games",
        "peers raced": " ".join(args.peers),
        "run files": str(out.relative_to(REPO)),
    })
    text += "\n" + markdown_table(table, list(table[0]))
    text += f"\nPeers not raced in this file: {not_raced(args)}.\n"
    return text


# The games of the 30-minute races: ours as `make train` runs Atari (ALE v5, sticky actions 0.25),
# Sample Factory's example on the same ROM with the same stickiness (train_sf.py). Qbert has no peer config
# here: it is one of issue 65's screen games, raced by ours alone.
STICKY_GAMES = {"breakout": ("ALE/Breakout-v5", "atari_breakout_sticky"),
                "spaceinvaders": ("ALE/SpaceInvaders-v5", "atari_spaceinvaders_sticky"),
                "qbert": ("ALE/Qbert-v5", None)}
WINDOW_30_MIN = 100
RLG_CONFIGS = {"breakout": "ppo_breakout_envpool.yaml", "spaceinvaders": "ppo_invaders_envpool.yaml"}


def atari_30_min_part(args) -> str:
    sf_python = peer_python("sample_factory") if "sample_factory" in args.peers else ""
    out = RUNS / "peers" / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True)
    budget = args.budget_minutes * 60
    rows = []
    for game in args.games:
        ours_env, sf_env = STICKY_GAMES[game]
        for seed in args.seeds:
            if args.ours:
                run_dir = out / f"ours-{game}-s{seed}"
                command = ours_command(args, ["--env", ours_env], seed, budget, run_dir)
                result = race(command, REPO, out / f"ours-{game}-s{seed}.log", budget,
                              functools.partial(ours_reading, run_dir, WINDOW_30_MIN), target=None)
                rows.append({"game": game, "trainer": ours_label(args), "seed": seed, **result})
                print(rows[-1], flush=True)
            if "sample_factory" in args.peers:
                log = out / f"sample-factory-{game}-s{seed}.log"
                command = [sf_python, str(PEERS / "sample_factory" / "train_sf.py"), "--env", sf_env, "--experiment",
                           f"{game}-s{seed}", "--train_dir", str(out / "sample-factory"), "--seed", str(seed),
                           *SF_FLAGS, "--stats_avg", str(WINDOW_30_MIN)]
                result = race(command, PEERS / "sample_factory", log, budget,
                              functools.partial(sample_factory_games_reading, sf_python,
                                                out / "sample-factory" / f"{game}-s{seed}"), target=None)
                rows.append({"game": game, "trainer": "Sample Factory 2.1.1, APPO, its Atari example", "seed": seed,
                             **result})
                print(rows[-1], flush=True)
            if "rl_games" in args.peers:
                result = rl_games_race(RLG_CONFIGS[game], out, f"{game}-s{seed}", seed, WINDOW_30_MIN, 0.25, budget,
                                       None)
                rows.append({"game": game, "trainer": f"rl_games 1.6.5, PPO on EnvPool, its {RLG_CONFIGS[game]}",
                             "seed": seed, **result})
                print(rows[-1], flush=True)
            if "pufferlib" in args.peers:
                result = pufferlib_race(PUFFER_GAMES[game], out, f"{game}-s{seed}", seed, WINDOW_30_MIN, 0.25, budget,
                                        None)
                rows.append({"game": game, "trainer": PUFFER_TRAINER, "seed": seed,
                             **result})
                print(rows[-1], flush=True)
    table = [{"game": row["game"], "trainer": row["trainer"], "seed": row["seed"],
              f"mean of last {WINDOW_30_MIN} training episodes": "-" if row["mean_last_at_stop"] is None else
              f"{row['mean_last_at_stop']:.1f}",
              "stopped at (min)": f"{row['stopped_s'] / 60:.1f}", "agent steps": f"{row['steps_at_stop']:,}",
              "agent steps/s": f"{row['steps_per_s']:,.0f}"} for row in rows]
    text = header(f"Atari with sticky actions after {args.budget_minutes:g} minutes: ours against the peers",
                  make_command(), {
        "measure": f"the mean return of the last {WINDOW_30_MIN} training episodes (whole games) when "
                   f"{args.budget_minutes:g} min of wall time from the command's start have passed, start-up "
                   "included ('-': fewer episodes than that); runs one at a time, interleaved",
        "env": "sticky actions 0.25, frameskip 4: ours ALE/<Game>-v5 with "
               f"{'`' + args.ours_flags + '` on' if args.ours_flags else 'no flags,'} the atari preset; Sample "
               "Factory <Game>NoFrameskip-v4 with repeat_action_probability 0.25 and its example's wrappers",
        "Sample Factory": "2.1.1 in experiments/peers/sample_factory/.venv, its sf_examples.atari defaults with only "
                          f"`{' '.join(SF_FLAGS)}` and `--stats_avg {WINDOW_30_MIN}`",
        "rl_games": "1.6.5 with EnvPool 1.2.5 in experiments/peers/rl_games/.venv, its configs/atari "
                    "ppo_breakout_envpool.yaml and ppo_invaders_envpool.yaml (EnvPool <Game>-v5, episodic life, "
                    f"whole-game scores) with repeat_action_probability 0.25 and: {RLG_CHANGES}",
        "PufferLib": PUFFER_ABOUT + "; its env's repeat_action_probability set to 0.25, its frameskip 1 kept",
        "peers raced": " ".join(args.peers),
        "run files": str(out.relative_to(REPO)),
    })
    text += "\n" + markdown_table(table, list(table[0]))
    text += f"\nPeers not raced in this file: {not_raced(args)}.\n"
    return text


# What the per-step lead of rl_games' PPO is made of: its sample reuse (4 passes over each batch in
# minibatches) against one pass, the rest of its recipe (84x84 x 4 frames, Nature CNN) untouched.
REUSE_ARMS = {"its default (4 mini-epochs)": "", "1 mini-epoch (no reuse)": "mini_epochs=1"}
REUSE_GAMES = {"pong": ("ppo_pong_envpool.yaml", 0.0, LAST_EPISODES),
               "spaceinvaders": ("ppo_invaders_envpool.yaml", 0.25, WINDOW_30_MIN)}
REUSE_MILESTONES = (100_000, 200_000, 300_000, 400_000, 500_000, 750_000, 1_000_000)


def mean_at_milestones(log: Path) -> dict[int, float | None]:
    """Its training mean (the last RACE line) at the first epoch past each milestone of agent steps."""
    lines = RLG_RACE.findall(log.read_text(errors="replace")) if log.exists() else []
    found: dict[int, float | None] = {}
    for milestone in REUSE_MILESTONES:
        past = [float(mean) for mean, _games, steps in lines if int(steps) >= milestone]
        found[milestone] = past[0] if past else None
    return found


def reuse_part(args) -> str:
    out = RUNS / "peers" / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True)
    rows = []
    for game in args.reuse_games:
        config, sticky, window = REUSE_GAMES[game]
        for seed in args.seeds:
            for arm, changes in REUSE_ARMS.items():
                name = f"{game}-{'default' if not changes else changes.replace('=', '')}-s{seed}"
                result = rl_games_race(config, out, name, seed, window, sticky, args.budget_minutes * 60, None,
                                       changes)
                at = mean_at_milestones(out / f"rl-games-{name}.log")
                rows.append({"game": game, "arm": arm, "seed": seed, **result, "at": at})
                print(rows[-1], flush=True)
    reached = [m for m in REUSE_MILESTONES if any(row["at"][m] is not None for row in rows)]
    table = [{"game": row["game"], "rl_games arm": row["arm"], "seed": row["seed"],
              **{f"mean at {m // 1000}k steps": "-" if row["at"][m] is None else f"{row['at'][m]:.1f}"
                 for m in reached},
              "agent steps/s": f"{row['steps_per_s']:,.0f}", "agent steps": f"{row['steps_at_stop']:,}"}
             for row in rows]
    text = header("Where rl_games' per-step lead comes from: its sample reuse ablated", make_command(), {
        "measure": "the mean of its last whole games (Pong 20, SpaceInvaders 100; EnvPool's unclipped per-game "
                   "score) at the first epoch past each number of agent steps; each arm runs "
                   f"{args.budget_minutes:g} min of wall time, one at a time. Scores per agent step do not depend "
                   "on the machine's speed for this synchronous PPO",
        "arms": "its config as `--part pong` races it (16 actors x 128 steps, 4 mini-epochs of 8 minibatches) "
                "against mini_epochs=1 (each sample used in one minibatch update, as A3C uses it once)",
        "rl_games": f"1.6.5 with EnvPool 1.2.5 in experiments/peers/rl_games/.venv; {RLG_CHANGES}",
        "run files": str(out.relative_to(REPO)),
    })
    text += "\n" + markdown_table(table, list(table[0]))
    return text


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["raw-env", "pong", "atari-30min", "reuse"], default="raw-env")
    parser.add_argument("--reuse-games", nargs="+", choices=sorted(REUSE_GAMES), default=["pong"],
                        help="reuse: the games rl_games' sample reuse is ablated on")
    parser.add_argument("--games", nargs="+", choices=sorted(STICKY_GAMES), default=sorted(STICKY_GAMES),
                        help="atari-30min: the sticky-actions games")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="pong: seeds, each trainer once per seed")
    parser.add_argument("--peers", nargs="*", choices=PEER_NAMES, default=list(PEER_NAMES),
                        help="pong, atari-30min: the peers that race ours (`--peers` alone: none, ours only, as "
                             "when a seed of ours is added to a day's races)")
    parser.add_argument("--ours", action=argparse.BooleanOptionalAction, default=True,
                        help="pong, atari-30min: race ours too (--no-ours: only the peers, when ours already ran "
                             "that day on the same machine; the file says so)")
    parser.add_argument("--ours-flags", default="",
                        help="pong, atari-30min: extra flags for ours, to race a peer's recipe in our trainer "
                             "(named in the row; empty: the defaults; a single flag with no value needs the = form, "
                             "--ours-flags=--flag, or argparse reads it as an option of its own)")
    parser.add_argument("--budget-minutes", type=float, default=30.0,
                        help="pong: the most a run may take; atari-30min: each run's length")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=SECONDS)
    parser.add_argument("--warmup", type=float, default=WARMUP)
    args = parser.parse_args()
    if args.repeats < 1 or args.seconds <= 0 or args.warmup < 0 or args.budget_minutes <= 0:
        parser.error("--repeats must be at least 1, --seconds and --budget-minutes above 0 and --warmup at least 0")
    if args.part != "raw-env" and not args.ours and not args.peers:
        parser.error("--no-ours with no --peers leaves nothing to race: name a peer, or drop --no-ours")
    peerless = [game for game in args.games if STICKY_GAMES[game][1] is None]
    if args.part == "atari-30min" and peerless and args.peers:
        parser.error(f"--games {' '.join(peerless)}: no peer has a config for it here; pass --peers alone "
                     "(ours only), or race the peers on breakout or spaceinvaders")
    problem = ours_flags_problem(args.ours_flags)
    if problem:
        parser.error(f"--ours-flags: {problem}; see python -m hogwild_a3c.train --help")
    parts = {"raw-env": raw_env_part, "pong": pong_part, "atari-30min": atari_30_min_part, "reuse": reuse_part}
    name = args.part if args.part != "atari-30min" else f"atari-{args.budget_minutes:g}min"
    write_dated_result("peers", name, parts[args.part](args))


if __name__ == "__main__":
    main()
