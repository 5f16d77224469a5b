"""Learners: what turns a worker's rollout into updates of the shared model.

A worker collects (children/worker.py) and hands each rollout to its learner. `A3CLearner` is the
reference's update: targets (returns and GAE per environment and per episode stretch), a replay of
the rollout with gradients, the loss of `algo.a3c_loss`, the gradient clipped to a global norm and
pushed through the worker's link (on one machine: handed to the shared parameters and applied by
this worker's own optimizer). `ReplayLearner` (`--replay-ratio`) makes that update, keeps the
rollout in the worker's replay memory, and learns again from rollouts drawn from it, with V-trace's
truncated importance weights for the policy that acted them (ACER's design for A3C); `make_learner`
chooses.

The replay re-runs the conv encoder on all T*K frames as one batch, under the learn precision
(`precision.py`), and `nn.LSTM` fused over the sequence from the LSTM state saved at the rollout's
start; one backward. For an encoder of conv + ELU layers the first pass need not run the encoder:
the learner asks the worker's actor to keep the ELUs' outputs (`reads_activations`), and takes the
encoder's features and gradient from them (`encoder_grad.py`), as acting computed them with the
weights this pass learns at. The later passes of `--epochs` pull new weights, so they replay.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from .algo import LossTerms, a3c_loss, normalized_advantages, rollout_targets
from .encoder_grad import KeptActivations, conv_elu_chain, features_from_activations
from .model import ActorCritic, State, has_conv_encoder
from .precision import encoder_context, learn_dtype
from .replay_memory import ReplayMemory, StoredRollout
from .rollout import Rollout
from .vtrace import vtrace_targets


def _no_profiling(phase: str) -> None:
    pass


class Learner(Protocol):
    reads_activations: bool  # whether it asks the actor to keep the encoder's activations

    def learn(self, rollout: Rollout, phase_done: Callable[[str], None] = _no_profiling) -> bool:
        """Update the shared model from `rollout`; False when an update was skipped as non-finite.
        `phase_done(name)` is called after each phase (`make profile-hot-loop` times them)."""


@dataclass
class LearnBatch:
    """A rollout as the learn step reads it: torch views of its arrays, flattened over [t, k]
    where the loss wants them, and its returns and GAE advantages."""

    obs: torch.Tensor  # [T, K, *obs_shape] float32
    resets: torch.Tensor  # [T, K]
    start_state: State
    actions: torch.Tensor  # [T * K, *action_shape]
    advantages: torch.Tensor  # [T * K]
    returns: torch.Tensor  # [T * K]
    size: int

    @classmethod
    def of(cls, rollout: Rollout, cfg: Any) -> LearnBatch:
        returns, advantages = rollout_targets(
            rollout.rewards, rollout.values, rollout.dones, rollout.done_values, rollout.last_values,
            cfg.gamma, cfg.gae_lambda,
        )
        if cfg.normalize_advantages:
            advantages = normalized_advantages(advantages)
        return cls(rollout.observations(), torch.from_numpy(rollout.resets), rollout.start_state,
                   torch.from_numpy(rollout.actions).flatten(0, 1), torch.from_numpy(advantages).flatten(),
                   torch.from_numpy(returns).flatten(), returns.size)


class A3CLearner:
    """The A3C update from each rollout; with `--epochs N`, N updates, each after a fresh pull, the
    later ones with PPO's clipped policy term against the first pass's probabilities."""

    def __init__(self, model: ActorCritic, link: Any, cfg: Any):
        self.model, self.link, self.cfg = model, link, cfg
        # Walking the module tree for parameters() costs more than a small model's update step.
        self.params = list(model.parameters())
        self.encoder_context = encoder_context(cfg.learn_precision)
        self.learn_dtype = learn_dtype(cfg.learn_precision)
        # With --epochs N every pass replays (the later passes' ratios need the first's computation).
        self.convs = conv_elu_chain(model.encoder) if model.lstm is not None and cfg.epochs == 1 else None
        self.reads_activations = self.convs is not None

    def learn(self, rollout: Rollout, phase_done: Callable[[str], None] = _no_profiling) -> bool:
        batch = LearnBatch.of(rollout, self.cfg)
        phase_done("targets")
        # The normalization statistics the rollout was acted and replayed with: every pass keeps them.
        statistics = [buffer.clone() for buffer in self.model.buffers()] if self.cfg.epochs > 1 else []
        first_log_probs = self._update(batch, None, phase_done, "", self._acted_features(rollout, batch))
        if first_log_probs is None:
            return False
        for epoch in range(1, self.cfg.epochs):
            pass_name = f" (pass {epoch + 1})"  # each pass's phases timed apart
            # Each pass is a Hogwild update of its own: its gradient is taken at the shared
            # weights as they are now, the first pass's and the other workers' updates in them.
            self.link.pull(self.model)
            for buffer, kept in zip(self.model.buffers(), statistics):
                buffer.copy_(kept)
            phase_done("pull" + pass_name)
            if self._update(batch, first_log_probs, phase_done, pass_name) is None:
                return False
        return True

    def _acted_features(self, rollout: Rollout, batch: LearnBatch) -> torch.Tensor | None:
        """The encoder's features [T * K, F] from what acting kept, with the encoder's gradient
        taken from them; None when acting kept nothing (an actor that cannot)."""
        if self.convs is None or not rollout.activations:
            return None
        kept = KeptActivations.of_rollout(rollout.activations, rollout.activations_nhwc, self.learn_dtype)
        return features_from_activations(self.convs, self.model.normalized(batch.obs.flatten(0, 1)), kept)

    def _update(self, batch: LearnBatch, old_log_probs: torch.Tensor | None, phase_done: Callable[[str], None],
                pass_name: str, features: torch.Tensor | None = None) -> torch.Tensor | None:
        """One update: A3C's (`old_log_probs` None), or a later pass's clipped one. Returns this
        pass's log-probabilities of the actions, detached (the later passes' ratios are taken
        against the first pass's replay, the same computation, so r = 1 exactly where the weights
        have not moved); None when the update was skipped as non-finite."""
        loss = self._loss(batch, old_log_probs, phase_done, pass_name, features)
        grad_norm = self._apply(loss.total, phase_done, pass_name)
        if grad_norm is None:
            return None
        if old_log_probs is None:  # progress.csv's losses stay A3C's, whatever --epochs is
            self._record(batch, loss, grad_norm)
        return loss.log_probs.detach()

    def _loss(self, batch: LearnBatch, old_log_probs: torch.Tensor | None, phase_done: Callable[[str], None],
              pass_name: str, features: torch.Tensor | None = None) -> LossTerms:
        cfg = self.cfg
        action_params, values = self.model.replay(batch.obs, batch.start_state, batch.resets, self.encoder_context,
                                                  features)
        phase_done("replay forward" + pass_name)
        loss = a3c_loss(action_params.flatten(0, 1), values.flatten(), batch.actions, batch.advantages,
                        batch.returns, value_coef=cfg.value_coef, entropy_coef=cfg.entropy_coef,
                        reduction=cfg.loss_reduction, old_log_probs=old_log_probs, ratio_clip=cfg.ratio_clip,
                        distribution=self.model.distribution)
        phase_done("loss" + pass_name)
        return loss

    def _record(self, batch: LearnBatch, loss: LossTerms, grad_norm: float) -> None:
        size = batch.size if self.cfg.loss_reduction == "sum" else 1  # per-sample losses
        self.link.record_update(loss.policy.item() / size, loss.value.item() / size, loss.entropy.item() / size,
                                grad_norm)

    def _apply(self, total: torch.Tensor, phase_done: Callable[[str], None], pass_name: str) -> float | None:
        """Backward, clip and push one update's loss; its gradient norm, or None when it was
        skipped as non-finite."""
        # None, not zeros: the previous update's gradients must not add into this one's.
        for p in self.params:
            p.grad = None
        total.backward()
        phase_done("backward" + pass_name)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm))
        phase_done("clip" + pass_name)
        if not (math.isfinite(grad_norm) and math.isfinite(total.item())):
            # Applying it would poison the shared weights for every worker.
            self.link.count("skipped_updates")
            return None
        self.link.push(self.model)
        phase_done("push (hand-off + optimizer)" + pass_name)
        return grad_norm


class ReplayLearner(A3CLearner):
    """A3C's update from each rollout, then a Poisson(--replay-ratio) number of updates from
    rollouts drawn uniformly from the worker's last --replay-size ones, each after a fresh pull.

    A replayed rollout was acted by an older policy mu. Its update re-runs the whole rollout and
    s_T at the current weights, from the LSTM state saved at its start, and learns with V-trace's
    value targets and advantages (`vtrace.py`) in place of the on-policy ones; the loss is A3C's.
    With `--replay-input features` the memory keeps the encoder's output as acting computed it (and
    s_T's, computed here), and a replayed update runs and learns the LSTM and heads only.
    """

    def __init__(self, model: ActorCritic, link: Any, cfg: Any, rng: np.random.Generator, frames_uint8: bool):
        super().__init__(model, link, cfg)
        self.rng = rng
        self.frames_uint8 = frames_uint8
        self.keeps_features = keeps_features(model, cfg)
        self.memory: ReplayMemory | None = None  # made from the first rollout, which has the shapes
        self.memory_has_features = False

    def learn(self, rollout: Rollout, phase_done: Callable[[str], None] = _no_profiling) -> bool:
        # Taken before the update: the features of s_T under the weights that acted, as the rest were.
        inputs = self._acted_inputs(rollout) if self.keeps_features and rollout.activations else None
        joint = self.cfg.replay_joint
        applied = self._joint_update(rollout, phase_done) if joint else super().learn(rollout, phase_done)
        if self.memory is None:
            steps, envs = rollout.rewards.shape
            shape = tuple(rollout.obs.shape[2:]) if inputs is None else tuple(inputs[1].shape[1:])
            self.memory = ReplayMemory(self.cfg.replay_size, steps, envs, shape, rollout.start_state[0].shape[-1],
                                       self.model.distribution, self.frames_uint8 and inputs is None)
            self.memory_has_features = inputs is not None
        if self.memory_has_features == (inputs is not None):  # an actor keeps its activations always or never
            self.memory.add(rollout, inputs)
        phase_done("replay memory add")
        for _ in range(self.rng.poisson(self.cfg.replay_ratio) if self.memory.size and not joint else 0):
            self.link.pull(self.model)
            phase_done("pull (replayed)")
            self._replayed_update(self.memory.sample(self.rng), phase_done)
        return applied

    def _joint_update(self, rollout: Rollout, phase_done: Callable[[str], None]) -> bool:
        """One update from the rollout and a Poisson(--replay-ratio) number of replayed ones, at the
        weights the rollout's update pulls anyway: one backward, clip and optimizer step over the
        sum of their losses, where separate updates pay a pull, a clip and a push each. The
        replayed rollouts are drawn before this one joins the memory."""
        batch = LearnBatch.of(rollout, self.cfg)
        phase_done("targets")
        count = self.rng.poisson(self.cfg.replay_ratio) if self.memory is not None and self.memory.size else 0
        replayed = [self.memory.sample(self.rng) for _ in range(count)] if self.memory is not None else []
        loss = self._loss(batch, None, phase_done, "", self._acted_features(rollout, batch))
        total = loss.total
        for stored in replayed:
            total = total + self._replayed_loss(stored, phase_done)
        grad_norm = self._apply(total, phase_done, "")
        if grad_norm is None:
            return False
        self._record(batch, loss, grad_norm)
        return True

    def _acted_inputs(self, rollout: Rollout) -> tuple[np.ndarray, np.ndarray]:
        """The encoder's features of the rollout's frames [T, K, F], as acting computed them, and
        of s_T [K, F], computed here by the same weights."""
        steps, envs = rollout.rewards.shape
        kept = KeptActivations.of_rollout(rollout.activations[-1:], rollout.activations_nhwc[-1:], torch.float32)
        with torch.no_grad():
            last = self.model.encoder(self.model.normalized(torch.from_numpy(rollout.next_obs))).float()
        return kept.features.reshape(steps, envs, -1).numpy(), last.numpy()

    def _replayed_update(self, stored: StoredRollout, phase_done: Callable[[str], None]) -> bool:
        return self._apply(self._replayed_loss(stored, phase_done), phase_done, " (replayed)") is not None

    def _replayed_loss(self, stored: StoredRollout, phase_done: Callable[[str], None]) -> torch.Tensor:
        cfg, distribution = self.cfg, self.model.distribution
        steps = stored.rewards.shape[0]
        if self.memory_has_features:
            action_params, values = self.model.replay_features(stored.obs, stored.start_state, stored.resets)
        else:
            action_params, values = self.model.replay(stored.obs, stored.start_state, stored.resets,
                                                      self.encoder_context)
        params = action_params[:steps].flatten(0, 1)
        actions = torch.from_numpy(stored.actions).flatten(0, 1)
        phase_done("replay forward (replayed)")
        with torch.no_grad():
            log_probs, _ = distribution.evaluate(params.detach(), actions)
        detached = values.detach().numpy()
        log_ratios = log_probs.numpy().reshape(stored.log_probs.shape) - stored.log_probs
        value_targets, advantages = vtrace_targets(stored.rewards, detached[:steps], stored.dones, stored.done_values,
                                                   detached[steps], log_ratios, cfg.gamma, cfg.gae_lambda)
        if cfg.normalize_advantages:
            advantages = normalized_advantages(advantages)
        phase_done("targets (replayed)")
        loss = a3c_loss(params, values[:steps].flatten(), actions, torch.from_numpy(advantages).flatten(),
                        torch.from_numpy(value_targets).flatten(), value_coef=cfg.value_coef,
                        entropy_coef=cfg.entropy_coef, reduction=cfg.loss_reduction, distribution=distribution)
        phase_done("loss (replayed)")
        return loss.total


def keeps_features(model: ActorCritic, cfg: Any) -> bool:
    """Whether a replay memory keeps the encoder's features (`--replay-input features`): only where
    acting keeps the encoder's activations and the value head reads the LSTM."""
    return (cfg.replay_input == "features" and cfg.epochs == 1 and model.lstm is not None
            and model.value_encoder is None and conv_elu_chain(model.encoder) is not None)


def keeps_uint8_frames(model: ActorCritic, unit_interval: bool) -> bool:
    """Whether a replay memory keeps its observations as uint8 levels: images (read by a conv)
    whose every value lies in [0, 1] (`EnvInfo.unit_interval`): exact for frames that were uint8 (Atari),
    within 1/510 for other images, and a quarter of float32's memory."""
    return unit_interval and has_conv_encoder(model)


def replay_memory_line(model: ActorCritic, cfg: Any, unit_interval: bool) -> str | None:
    """train.log's line on what each worker's replay memory holds once full; None without replay."""
    if cfg.replay_ratio <= 0:
        return None
    frames = keeps_uint8_frames(model, unit_interval)
    shape = tuple(model.obs_shape)
    kept = "uint8 frames" if frames else "float32 observations"
    if keeps_features(model, cfg):
        with torch.no_grad():
            shape = tuple(model.encoder(torch.zeros(1, *model.obs_shape)).shape[1:])
        frames, kept = False, f"the encoder's {shape[0]} features a frame (--replay-input features)"
    elif cfg.replay_input == "features":
        kept += (" (--replay-input features needs a conv + ELU encoder, an LSTM, no value net of its own and "
                 "--epochs 1: this model replays frames)")
    size = ReplayMemory.bytes_for(cfg.replay_size, cfg.rollout_steps, cfg.envs_per_worker, shape,
                                  model.initial_state(1)[0].shape[-1], model.distribution, frames)
    return (f"replay memory: {cfg.replay_size} rollouts of {cfg.rollout_steps} steps x {cfg.envs_per_worker} envs "
            f"in each worker, {kept}: {size / 2**20:.1f} MB a worker when full (--replay-size); a mean of "
            f"{cfg.replay_ratio:g} replayed updates after each rollout's (--replay-ratio)")


def make_learner(model: ActorCritic, link: Any, cfg: Any, rng: np.random.Generator | None = None,
                 unit_interval: bool = False) -> Learner:
    """The learner of a worker's local model `model`, pushing through `link`. `rng` draws the
    number of replayed updates and the rollouts they replay; `unit_interval`: the env's
    observations all lie in [0, 1] (`EnvInfo.unit_interval`), so a replay memory keeps image
    frames as uint8 levels."""
    if getattr(cfg, "replay_ratio", 0.0) > 0:  # a Config saved before replay existed has none
        return ReplayLearner(model, link, cfg, rng if rng is not None else np.random.default_rng(),
                             keeps_uint8_frames(model, unit_interval))
    return A3CLearner(model, link, cfg)


def trial_update_problem(model: ActorCritic, cfg: Any) -> str | None:
    """Why `model` cannot act or learn on observations of its shape, or None: one acting step and
    one learn step's forward and backward on zero observations, in the main process before any
    child starts, so that a shape bug is one line at start-up instead of a traceback in every worker."""
    batch = 2
    obs = torch.zeros(batch, batch, *model.obs_shape)
    try:
        with torch.no_grad():
            action_params, _, _ = model.step(obs[0], model.initial_state(batch))
        actions = torch.cat([torch.from_numpy(model.distribution.mode(action_params))] * batch)  # [T * B, ...]
        context = encoder_context(cfg.learn_precision)
        action_params, values = model.replay(obs, model.initial_state(batch), None, context)
        zeros = torch.zeros(batch * batch)
        a3c_loss(action_params.flatten(0, 1), values.flatten(), actions, zeros, zeros,
                 distribution=model.distribution).total.backward()
    except (RuntimeError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        return f"the model cannot act or learn on this env's observations of shape {model.obs_shape}: {first}"
    finally:
        model.zero_grad(set_to_none=True)
    return None
