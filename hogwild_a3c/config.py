"""The run configuration: one dataclass whose field docs are the `--help` text (run/cli.py builds
the parser from them), one validator that reports every problem at once before any process
starts, and `config_from_dict`, the one way a saved config (config.json, a checkpoint's copy)
becomes a `Config` again. Field types come from the type hints.

Each field says in its metadata which `--help` group it is in, whether a preset may set it,
whether it may change when a run is resumed (`resumable`: budgets, schedules, process layout,
nothing that changes what an update computes) and whether it is part of the experiment
(`experiment`: runs that differ only in the others are the same experiment, drawn as seeds of
one curve by `plot`).
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import os
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .files.plain_data import env_kwargs_problem, shown


@dataclass(frozen=True)
class _Group:
    """A group of `--help`, and the maker of its fields: each field says in its metadata which
    group it is in, whether a preset may set it, whether a resume may change it and whether it is
    part of the experiment, so that a new setting is one declaration."""

    title: str

    def opt(self, default: Any, help: str, resumable: bool = False, experiment: bool = True,
            required_when_saved: bool = False, preset: bool = False, **argparse_kwargs: Any) -> Any:
        return field(default=default, metadata={
            "help": help, "group": self.title, "preset": preset, "resumable": resumable, "experiment": experiment,
            "required_when_saved": required_when_saved, **argparse_kwargs})

    def preset(self, default: Any, help: str, **kwargs: Any) -> Any:
        """A field of the algorithm or the model, which a preset file may set."""
        return self.opt(default, help, preset=True, **kwargs)

    def run(self, default: Any, help: str, **argparse_kwargs: Any) -> Any:
        """A field about how this run is carried out, not what it computes: resumable, not part of the experiment."""
        return self.opt(default, help, resumable=True, experiment=False, **argparse_kwargs)


ENV = _Group("environment")
PROCS = _Group("processes")
NODES = _Group("several machines (under torchrun; see the README)")
BUDGET = _Group("budgets (a run stops at the first one reached)")
ALGO = _Group("algorithm (defaults shown are universe's; --preset auto replaces them: atari on Atari frames, vector on "
              "flat observations)")
LOGS = _Group("evaluation, logging and the run directory")
FAULTS = _Group("faults")
# The metadata keys that are not argparse's.
OWN_KEYS = ("help", "group", "preset", "resumable", "experiment", "required_when_saved")


RENAMED = {"seed": "universe", "fast": "luminance"}  # old name of a preset or --frame mode -> its name now


@dataclass
class Config:
    env: str = ENV.opt("ALE/Pong-v5", "Gymnasium id (also `module:EnvId-v0`) whose action space has a distribution "
                       "(learning/distributions.py: Discrete, Box of floats, MultiDiscrete, MultiBinary)",
                       required_when_saved=True)
    env_kwargs: dict = ENV.opt(None, "extra keyword arguments for gymnasium.make, as KEY=VALUE (VALUE a Python "
                               "literal)", nargs="*")
    # Where the defaults below come from (see hogwild_a3c/presets/ and README "Presets")
    preset: str = ENV.opt("auto", "settings to start from: auto picks by env (the env's own preset file if the "
                          "package has one, else `atari` for Atari frames, `grid` for small grid images such as "
                          "MiniGrid's, `vector` for the rest); or a preset name: atari, universe, vector, ...; "
                          "--config and flags override it")
    config: str | None = ENV.opt(None, experiment=False,
                                 help="a JSON file of settings (keys are flag names with _ or -, e.g. {\"lr\": "
                                      "0.001}); it may name a \"preset\" to start from; flags override it")
    frame: str = ENV.opt("luminance", "how Atari frames become grey: luminance = ALE's own luminance greyscale; "
                         "universe = the mean of the RGB channels, as universe's _process_frame42; other envs ignore "
                         "it", choices=["luminance", "universe", *RENAMED], metavar="{luminance,universe}")
    image_size: int = ENV.preset(42, "Atari frames (cropped to 160x160 first) and images larger than SIZE on a side "
                                 "become grey and SIZE x SIZE, as the reference treats pixels (84: the DQN papers' "
                                 "frames); smaller images go to the conv as they are (a grid of up to 16 a side, "
                                 "such as MiniGrid's, at full resolution)", metavar="SIZE")
    frame_stack: int = ENV.preset(1, "Atari: the policy sees the last K frames stacked as channels (4 in the DQN "
                                  "papers), so its conv sees motion; 1 = one frame, the LSTM carrying the past "
                                  "(universe's)", metavar="K")
    # The Atari protocol (other envs ignore all but --clip-reward); `--preset universe` has none of it
    clip_reward: bool = ENV.preset(False, "clip each reward to [-1, 1] for learning, as the A3C paper does on Atari; "
                                   "the logged and evaluated returns stay unclipped", negatable=True)
    life_loss: bool = ENV.preset(False, "Atari: a lost life ends a stretch of value bootstrapping (the value beyond "
                                 "it counts 0) without resetting the game or the LSTM", negatable=True)
    fire_reset: bool = ENV.preset(False, "Atari games whose second action is FIRE: press it after each reset and each "
                                  "lost life (Breakout's ball waits for it); evaluation does the same", negatable=True)
    max_pool: bool = ENV.preset(False, "Atari: repeat each action over the frameskip here and see the pixelwise max "
                                "of the last two frames, not ALE v5's last one (shots drawn on alternate frames stay "
                                "visible); evaluation does the same", negatable=True)
    num_workers: int | None = PROCS.opt(None, "worker processes; 0 runs one worker in the main process (serial, "
                                        "repeatable); default: one per core", resumable=True)
    envs_per_worker: int = PROCS.preset(1, "environments each worker steps, acting on them as one batch; a worker "
                                        "then updates once per envs x rollout steps, so raise --lr with it (the "
                                        "atari preset: 8 envs, 10 steps, 4e-4)")
    seed: int = PROCS.opt(0, "seed of the model initialisation, the workers and the environments", experiment=False)
    start_method: str = PROCS.run("spawn", "how children start (fork is unsafe with a warm OpenMP pool)",
                                  choices=["spawn", "forkserver"])
    sync_interval: float = NODES.run(1.0, "multi-node runs (under torchrun): seconds between syncs of the nodes' "
                                     "models (0.5-1 suits 1 GbE, 0.1 suits 10 GbE)")
    sync_mode: str = NODES.opt("sum", "multi-node runs: sum = every node's updates reach every node (A3C, like "
                               "universe's parameter server); avg = model averaging", choices=["sum", "avg"])
    sync_timeout: float = NODES.run(60.0, "multi-node runs: seconds a sync may wait for a frozen node before it fails")
    trust_network: bool = NODES.run(False, "multi-node runs: start without HOGWILD_RUN_TOKEN, admitting any machine "
                                    "that reaches the rendezvous (only on a network that your machines alone can "
                                    "reach)")
    max_steps: int | None = BUDGET.run(None, "stop after this many agent steps, summed over workers (total, across "
                                       "resumes)")
    max_seconds: float | None = BUDGET.run(None, "stop after this many seconds of run time (total, across resumes)")
    target_return: float | None = BUDGET.run(None, "stop once the mean of the last --eval-episodes evaluation returns "
                                             "reaches this")
    rollout_steps: int = ALGO.preset(20, "steps per environment between updates")
    gamma: float = ALGO.preset(0.99, "discount factor")
    gae_lambda: float = ALGO.preset(1.0, "GAE lambda (1.0: advantages are discounted returns minus values)")
    lr: float = ALGO.preset(1e-4, "the optimizer's learning rate")
    lr_warmup_updates: int = ALGO.preset(0, "raise each optimizer's learning rate linearly from 0 to --lr over its "
                                         "first this many updates (0: none, as universe); with Adam, 2000 = 2 / (1 - "
                                         "beta2) is the usual untuned choice")
    lr_decay_steps: int = ALGO.preset(0, "lower the learning rate linearly from --lr to 0 at this many agent steps, "
                                      "summed over workers (the A3C paper's annealing over the run; 0: none, as "
                                      "universe); set it to --max-steps, and raise both together on resume (the rate "
                                      "then rises to the new line)", resumable=True)
    anneal_lr: str = ALGO.preset("none", "budget: lower the learning rate linearly from --lr to 0 at the end of the "
                                 "run's budget, --max-steps or --max-seconds, whichever comes first, as the PPO "
                                 "peers anneal over theirs (no budget: it stays at --lr); none: constant, as "
                                 "universe", choices=["none", "budget"], resumable=True)
    entropy_coef: float = ALGO.preset(0.01, "weight of the entropy bonus")
    value_coef: float = ALGO.preset(0.5, "weight of the value loss")
    max_grad_norm: float = ALGO.preset(40.0, "clip gradients to this global norm")
    normalize_advantages: bool = ALGO.preset(False, "scale each update's advantages to mean 0 and std 1 over its "
                                             "batch (as PPO, Sample Factory and rl_games do), so the policy term "
                                             "keeps one size against the entropy and value terms whatever the "
                                             "rewards' scale", negatable=True)
    epochs: int = ALGO.preset(1, "updates a worker makes from each rollout: 1 is A3C's one; each further pass pulls "
                              "the shared weights again and learns from the same rollout with PPO's clipped policy "
                              "term (--ratio-clip), so a frame teaches more at the cost of one more learn step; each "
                              "pass is one optimizer update, as --lr-warmup-updates counts them", metavar="N")
    ratio_clip: float = ALGO.preset(0.1, "with --epochs above 1: the passes after the first stop pushing a sample's "
                                    "action probability once it is this fraction away from where the first pass "
                                    "found it (PPO's clip range)", metavar="EPS")
    replay_ratio: float = ALGO.preset(0.0, "after each rollout's update, a Poisson-distributed number of this mean of "
                                      "further updates, each from a rollout drawn from the worker's replay memory "
                                      "and corrected with V-trace's truncated importance weights (ACER's replay "
                                      "for A3C); 0: A3C's one update a rollout, no memory", metavar="R")
    replay_size: int = ALGO.preset(128, "with --replay-ratio above 0: the rollouts each worker keeps for replay (the "
                                   "oldest go first); train.log says the memory this takes. Not saved in checkpoints: "
                                   "a resumed run fills it again", metavar="N")
    replay_input: str = ALGO.preset("frames", "with --replay-ratio above 0: what a replayed update starts from. "
                                    "frames: it re-runs the encoder on the kept frames and learns it too; features: "
                                    "the memory keeps the encoder's output as acting computed it, and a replayed "
                                    "update learns the LSTM and heads only, at a fraction of the cost (conv + LSTM "
                                    "models whose acting keeps its activations; others replay frames, as train.log "
                                    "says)", choices=["frames", "features"])
    replay_joint: bool = ALGO.preset(False, "with --replay-ratio above 0: learn from the replayed rollouts in the same "
                                     "update as the rollout just acted (one backward, clip and optimizer step over "
                                     "the sum of their losses, at the weights that update pulls), not in one update "
                                     "each after a pull of its own (not with --epochs above 1)", negatable=True)
    optimizer: str = ALGO.preset("adam", "adam: each worker its own Adam statistics (universe); shared-adam: one set "
                                 "in shared memory; rmsprop, shared-rmsprop: the A3C paper's RMSprop (decay 0.99, "
                                 "epsilon 0.1), per worker or shared",
                                 choices=["adam", "shared-adam", "rmsprop", "shared-rmsprop"])
    lstm_size: int = ALGO.preset(256, "LSTM hidden units (--core lstm)")
    lstm_forget_bias: float = ALGO.preset(1.0, "the LSTM's forget-gate bias at initialisation: 1.0 is universe's "
                                          "(TF's BasicLSTMCell adds 1 to the forget gate); runs saved without it "
                                          "read 0.0")
    core: str = ALGO.preset("lstm", "recurrent LSTM core (universe) or a feedforward one (mlp: the encoder feeds the "
                            "heads)", choices=["lstm", "mlp"])
    hidden_size: int = ALGO.preset(128, "units of each of the 2 layers of the encoder for vector observations")
    encoder: str = ALGO.preset("universe", "what reads Atari frames and images: universe (4 3x3 convs of stride 2, 32 "
                               "filters, ELU), nature (the DQN Nature paper's 3 convs and 512 units, ReLU, "
                               "layer-normalized before an LSTM; for --image-size 84), impala (IMPALA's 3 residual "
                               "stacks and 256 units, layer-normalized); small grids keep their own",
                               choices=["universe", "nature", "impala"])
    action_std: str = ALGO.preset("free", "Box actions (a Gaussian policy): free = one learned log-std per action "
                                  "dimension, whatever the state (CleanRL, SB3); state = the action head gives it "
                                  "for each state (the A3C paper)", choices=["free", "state"])
    action_bound: str = ALGO.preset("clip", "Box actions with finite bounds: the Gaussian's draw, stored as drawn, is "
                                    "sent to the env clipped to [-1, 1] (clip) or squashed by tanh (tanh), then "
                                    "scaled onto the bounds", choices=["clip", "tanh"])
    activation: str = ALGO.preset("elu", "activation of the vector encoder", choices=["elu", "tanh"])
    value_net: str = ALGO.preset("shared", "shared: the value head shares the action head's encoder and core; "
                                 "separate: with --core mlp, an MLP of its own (the lstm core then shares); mlp: an "
                                 "MLP of its own with either core, so with the lstm core the value has no memory "
                                 "(vector observations only)", choices=["shared", "separate", "mlp"])
    loss_reduction: str = ALGO.preset("sum", "sum: universe's loss summed over the batch; mean: averaged, so the clip "
                                      "threshold and lr do not depend on the batch size", choices=["sum", "mean"])
    normalize_obs: bool = ALGO.preset(False, "scale observations by running mean and std (statistics shared by every "
                                      "process and saved in checkpoints)", negatable=True)
    normalize_reward: bool = ALGO.preset(False, "scale rewards by the running std of the discounted return (shared "
                                         "and checkpointed like --normalize-obs)", negatable=True)
    act_backend: str = ALGO.run("auto", "what runs the acting forward in workers and the evaluator: onnxruntime (the "
                                "same step as an ONNX graph, faster a forward on Atari frames), torch, or auto: "
                                "onnxruntime for a conv encoder with an LSTM core when it is installed, else torch",
                                choices=["auto", "torch", "onnxruntime"])
    learn_precision: str = ALGO.run("auto", "the learn step's encoder (its replay forward and backward): bf16 "
                                    "(autocast; faster where the CPU has AVX-512 BF16 or AMX, emulated and slower "
                                    "elsewhere; the LSTM, heads, gradients and optimizer stay float32), float32, or "
                                    "auto: bf16 for a conv encoder on a CPU with native bf16, else float32",
                                    choices=["auto", "float32", "bf16"])
    eval_interval: float = LOGS.run(60.0, "seconds between evaluations of the shared policy")
    eval_episodes: int = LOGS.opt(5, "episodes per evaluation; 0 starts no evaluator", resumable=True)
    eval_nice: int = LOGS.run(0, "how much lower the evaluator's scheduling priority is than the workers' (os.nice, "
                              "0-19): higher leaves the workers more of busy cores, and its episodes take longer; "
                              "--num-workers 0 plays them in the main process, at its priority")
    progress_interval: float = LOGS.run(5.0, "seconds between progress.csv rows")
    checkpoint_interval: float = LOGS.run(300.0, "seconds between checkpoints/latest.pt saves")
    keep_checkpoints: int = LOGS.run(3, "numbered checkpoints kept besides latest.pt and best.pt")
    run_dir: str | None = LOGS.opt(None, "run directory (default: runs/<env>/<timestamp>-s<seed>)", experiment=False)
    progress: bool = LOGS.run(True, "the tqdm progress bar (--no-progress: none; logs still go to the run directory)",
                              negatable=True)
    tensorboard: bool = LOGS.run(False, "also write TensorBoard event files (needs the `tensorboard` extra)")
    wandb: bool = LOGS.run(False, "also log to Weights & Biases (needs the `wandb` extra): offline into the run "
                           "directory unless WANDB_MODE says otherwise; `wandb sync` uploads it later")
    max_worker_restarts: int = FAULTS.run(0, "restart a dead worker up to this many times in all, instead of stopping "
                                          "the run")
    stall_timeout: float = FAULTS.run(120.0, "report a worker or the evaluator that made no progress for this many "
                                      "seconds after it started")
    max_env_errors: int = FAULTS.run(10, "consecutive environment exceptions a worker survives (env recreated, "
                                     "rollout dropped)")
    max_evaluator_restarts: int = FAULTS.run(3, "restart a dead evaluator up to this many times in all; once more "
                                             "stops the run")
    max_skipped_updates: int = FAULTS.run(100, "stop the run when a worker skips this many updates in a row "
                                          "(non-finite loss or gradient)")

    def __post_init__(self) -> None:
        # The reference algorithm was called "seed" (a word --seed already means) before it was
        # called universe; runs saved and commands written then keep working.
        self.preset = RENAMED.get(self.preset, self.preset)
        self.frame = RENAMED.get(self.frame, self.frame)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def resumable_fields() -> set[str]:
    return {f.name for f in dataclasses.fields(Config) if f.metadata["resumable"]}


def experiment_fields() -> set[str]:
    return {f.name for f in dataclasses.fields(Config) if f.metadata["experiment"]}


# What a preset file may set: the algorithm and the model, nothing about processes or budgets.
PRESET_FIELDS = {f.name for f in dataclasses.fields(Config) if f.metadata["preset"]}


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


_TYPE_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false", dict: "an object",
               list: "a list", tuple: "a list"}


def _base_type(hint: Any) -> tuple[type, bool]:
    """(type, optional) of a field from its type hint: `int | None` -> (int, True), `tuple[int, ...]`
    -> (tuple, False), `Literal["a", "b"]` -> (str, False)."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        (inner,) = [arg for arg in args if arg is not type(None)]
        return _base_type(inner)[0], True
    if typing.get_origin(hint) is typing.Literal:
        return type(args[0]), False
    return typing.get_origin(hint) or hint, False


FIELD_TYPES = {name: _base_type(hint) for name, hint in typing.get_type_hints(Config).items()}


def _fits(value: Any, type_: type, optional: bool) -> bool:
    if value is None:
        return optional or type_ is dict
    if isinstance(value, bool):  # bool is an int to Python, never a count or a rate here
        return type_ is bool
    if type_ is float:
        return isinstance(value, numbers.Real)
    if type_ is int:
        return isinstance(value, numbers.Integral)
    return isinstance(value, type_)


def typed_values(values: dict[str, Any], where: str) -> tuple[dict[str, Any], list[str]]:
    """Settings from a file or from Python, as their fields' types (an int where a float goes
    becomes a float, a numpy integer an int); one line per value that does not fit, naming
    `where`. The one type check for everything that does not come through argparse."""
    typed, errors = {}, []
    for name, value in values.items():
        type_, optional = FIELD_TYPES[name]
        if not _fits(value, type_, optional):
            words = _TYPE_WORDS.get(type_, f"a {type_.__name__}")
            errors.append(f"{where}: '{name}' must be {words}{' or null' if optional else ''} (got {shown(value)})")
        elif value is not None and type_ in (int, float):
            typed[name] = type_(value)
        else:
            typed[name] = value
    return typed, errors


# What runs saved before a field existed were trained with, where that differs from its default now.
BEFORE_THE_FIELD_EXISTED = {"lstm_forget_bias": 0.0}


# Fields saved (or passed from Python) under an earlier name: (its name now, how its value converts).
OLD_FIELD_NAMES: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "no_progress": ("progress", lambda value: not value if isinstance(value, bool) else value),
}


def with_current_names(values: dict[str, Any]) -> dict[str, Any]:
    """`values` with any setting of an earlier name under its name now (a name now wins)."""
    renamed = dict(values)
    for old, (new, convert) in OLD_FIELD_NAMES.items():
        if old in renamed:
            value = renamed.pop(old)
            renamed.setdefault(new, convert(value))
    return renamed


def config_from_dict(data: Any, source: str) -> Config:
    """A saved config back as a `Config`, checked like the command line; raises ValueError with
    one line per problem, each naming `source`. A field missing from the file takes its default
    (older versions wrote fewer fields), except the env, without which nothing is known; a
    changed default cannot slip through, as resume compares the config with the checkpoint's."""
    if not isinstance(data, dict):
        raise ValueError(f"{source}: expected a JSON object of settings, found {type(data).__name__}")
    errors = []
    data = with_current_names(data)
    for f in dataclasses.fields(Config):
        if f.name not in data and f.metadata["required_when_saved"]:
            errors.append(f"{source}: missing setting '{f.name}'")
    known = {name: value for name, value in data.items() if name in FIELD_TYPES}
    values, type_errors = typed_values(known, source)
    errors += type_errors
    values.update({name: value for name, value in BEFORE_THE_FIELD_EXISTED.items() if name not in data})
    if errors:
        raise ValueError("\n".join(errors))
    cfg = Config(**values)
    problems = validate(cfg, resuming=True)
    if problems:
        raise ValueError("\n".join(f"{source}: {line}" for line in problems))
    return cfg


MAX_SEED = 2**32 - 1
MAX_STEPS = 2**62
MAX_SYNC_TIMEOUT_S = 86400.0


def _one_of(choices: list[str]) -> str:
    return choices[0] if len(choices) == 1 else f"{', '.join(choices[:-1])} or {choices[-1]}"


def validate(cfg: Config, resuming: bool = False) -> list[str]:
    """Every problem with `cfg`, one line each, naming the flag and what would be valid (a new run's
    folder is checked by `files.rundir`)."""
    errors = []
    # inf passes most comparisons below and NaN fails them with the wrong reason; no setting means either.
    not_finite = {f.name for f in dataclasses.fields(Config) if FIELD_TYPES[f.name][0] is float
                  and getattr(cfg, f.name) is not None and not math.isfinite(getattr(cfg, f.name))}

    def need(ok: bool, flag: str, valid: str, value: Any) -> None:
        if not ok and flag not in not_finite:
            errors.append(f"{flag_name(flag)} must be {valid} (got {value!r})")

    for name in sorted(not_finite):
        errors.append(f"{flag_name(name)} must be a finite number (got {getattr(cfg, name)!r})")
    kwargs_problem = env_kwargs_problem(cfg.env_kwargs)
    if kwargs_problem:
        errors.append(f"--env-kwargs {kwargs_problem}")
    need(cfg.num_workers is None or cfg.num_workers >= 0, "num_workers", "an integer >= 0", cfg.num_workers)
    need(cfg.envs_per_worker >= 1, "envs_per_worker", "an integer >= 1", cfg.envs_per_worker)
    # Each worker's seed is derived from this one, and torch takes seeds of 64 bits at most.
    need(0 <= cfg.seed <= MAX_SEED, "seed", f"an integer from 0 to {MAX_SEED}", cfg.seed)
    # The step counters are int64, and a node's claim bound adds up to 10% to the budget.
    need(cfg.max_steps is None or 0 < cfg.max_steps <= MAX_STEPS, "max_steps", "a positive integer up to 2**62",
         cfg.max_steps)
    need(cfg.max_seconds is None or cfg.max_seconds > 0, "max_seconds", "a positive number", cfg.max_seconds)
    need(cfg.rollout_steps >= 1, "rollout_steps", "an integer >= 1", cfg.rollout_steps)
    need(0.0 < cfg.gamma <= 1.0, "gamma", "in (0, 1]", cfg.gamma)
    need(0.0 <= cfg.gae_lambda <= 1.0, "gae_lambda", "in [0, 1]", cfg.gae_lambda)
    need(cfg.lr > 0, "lr", "a positive number", cfg.lr)
    need(cfg.lr_warmup_updates >= 0, "lr_warmup_updates", "an integer >= 0 (0: no warm-up)", cfg.lr_warmup_updates)
    need(cfg.lr_decay_steps >= 0, "lr_decay_steps", "an integer >= 0 (0: no decay)", cfg.lr_decay_steps)
    # A decay that ends before the budget would leave the rest of the run training at lr 0.
    need(not cfg.lr_decay_steps or cfg.max_steps is None or cfg.lr_decay_steps >= cfg.max_steps, "lr_decay_steps",
         f"0 or at least --max-steps {cfg.max_steps} (the steps after it would train at lr 0)", cfg.lr_decay_steps)
    need(cfg.entropy_coef >= 0, "entropy_coef", "a number >= 0", cfg.entropy_coef)
    need(cfg.value_coef >= 0, "value_coef", "a number >= 0", cfg.value_coef)
    need(cfg.max_grad_norm > 0, "max_grad_norm", "a positive number", cfg.max_grad_norm)
    need(cfg.lstm_size >= 1, "lstm_size", "an integer >= 1", cfg.lstm_size)
    need(math.isfinite(cfg.lstm_forget_bias), "lstm_forget_bias", "a finite number", cfg.lstm_forget_bias)
    need(cfg.hidden_size >= 1, "hidden_size", "an integer >= 1", cfg.hidden_size)
    need(8 <= cfg.image_size <= 256, "image_size", "an integer from 8 to 256", cfg.image_size)
    need(1 <= cfg.frame_stack <= 16, "frame_stack", "an integer from 1 to 16", cfg.frame_stack)
    need(1 <= cfg.epochs <= 16, "epochs", "an integer from 1 to 16", cfg.epochs)
    need(0.0 < cfg.ratio_clip < 1.0, "ratio_clip", "a number between 0 and 1 (0.1-0.2 as PPO)", cfg.ratio_clip)
    need(0.0 <= cfg.replay_ratio <= 16.0, "replay_ratio", "a number from 0 (no replay) to 16", cfg.replay_ratio)
    need(not (cfg.replay_joint and cfg.epochs > 1), "replay_joint",
         f"off with --epochs {cfg.epochs} (a joint update is one pass; drop --replay-joint or set --epochs 1)",
         cfg.replay_joint)
    need(1 <= cfg.replay_size <= 100_000, "replay_size", "an integer from 1 to 100000 (rollouts a worker keeps)",
         cfg.replay_size)
    # torchrun's SIGTERM reaches the trainer's whole process group, a forkserver too, whose death
    # kills every child before the node's stop vote can go out.
    need(cfg.start_method == "spawn" or "TORCHELASTIC_RUN_ID" not in os.environ, "start_method",
         "spawn under torchrun", cfg.start_method)
    for f in dataclasses.fields(Config):  # the choices each field declares, for settings argparse never saw
        choices = f.metadata.get("choices")
        if choices:
            current = [choice for choice in choices if choice not in RENAMED]  # an old name is taken, not offered
            need(getattr(cfg, f.name) in choices, f.name, _one_of(current), getattr(cfg, f.name))
    need(cfg.eval_interval > 0, "eval_interval", "a positive number of seconds", cfg.eval_interval)
    need(cfg.eval_episodes >= 0, "eval_episodes", "an integer >= 0", cfg.eval_episodes)
    need(0 <= cfg.eval_nice <= 19, "eval_nice", "an integer from 0 to 19", cfg.eval_nice)
    need(cfg.eval_nice == 0 or hasattr(os, "nice"), "eval_nice", "0 where os.nice does not exist", cfg.eval_nice)
    need(cfg.progress_interval > 0, "progress_interval", "a positive number of seconds", cfg.progress_interval)
    need(cfg.checkpoint_interval > 0, "checkpoint_interval", "a positive number of seconds", cfg.checkpoint_interval)
    need(cfg.keep_checkpoints >= 1, "keep_checkpoints", "an integer >= 1", cfg.keep_checkpoints)
    need(cfg.max_worker_restarts >= 0, "max_worker_restarts", "an integer >= 0", cfg.max_worker_restarts)
    need(cfg.stall_timeout > 0, "stall_timeout", "a positive number of seconds", cfg.stall_timeout)
    need(cfg.max_env_errors >= 0, "max_env_errors", "an integer >= 0", cfg.max_env_errors)
    need(cfg.max_evaluator_restarts >= 0, "max_evaluator_restarts", "an integer >= 0", cfg.max_evaluator_restarts)
    need(cfg.sync_interval > 0, "sync_interval", "a positive number of seconds", cfg.sync_interval)
    need(0 < cfg.sync_timeout <= MAX_SYNC_TIMEOUT_S, "sync_timeout", f"a positive number of seconds up to "
         f"{MAX_SYNC_TIMEOUT_S:g} (a day)", cfg.sync_timeout)
    need(cfg.max_skipped_updates >= 1, "max_skipped_updates", "an integer >= 1", cfg.max_skipped_updates)
    if cfg.target_return is not None and cfg.eval_episodes == 0:
        errors.append("--target-return needs evaluations: give --eval-episodes >= 1")
    return errors
