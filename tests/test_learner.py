"""The learner seam: `A3CLearner` makes the update the worker made before the rooms change.

tests/fixtures/learn-before-rooms.pt was written by the code of bb4b8e3 (before the learner left the
worker): for each case a rollout its Worker collected, the local and
shared weights and Adam's statistics before `Worker.learn`, and the shared weights after it. Here
the same rollout goes through today's learner from the same weights and statistics."""
from pathlib import Path

import numpy as np
import pytest
import torch

from hogwild_a3c.children.reports import InProcessReports
from hogwild_a3c.children.shared import HogwildLink, SharedState
from hogwild_a3c.config import config_from_dict
from hogwild_a3c.envs.make import describe_env
from hogwild_a3c.files.checkpoint import with_current_weight_names
from hogwild_a3c.learning.learner import A3CLearner, LearnBatch
from hogwild_a3c.learning.model import model_for_env
from hogwild_a3c.learning.optim import LrSchedule
from hogwild_a3c.learning.rollout import Rollout

FIXTURE = Path(__file__).parent / "fixtures" / "learn-before-rooms.pt"


@pytest.fixture(scope="module")
def cases():
    """The fixture's weights under today's names (the action head was `policy.*` then), as
    `load_checkpoint` renames a saved model's."""
    loaded = torch.load(FIXTURE, weights_only=True)
    for case in loaded.values():
        for key in ("local_before", "shared_before", "shared_after"):
            case[key] = with_current_weight_names(case[key])
    return loaded


@pytest.fixture(autouse=True)
def one_thread():
    """As in every worker, and as the fixture was written: a conv's gradient sums in that order."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def learn_as_today(case):
    cfg = config_from_dict(case["config"], "fixture")
    info = describe_env(cfg.env, cfg.env_kwargs)
    shared = SharedState.create(model_for_env(info, cfg), 1, cfg.optimizer, LrSchedule(cfg.lr))
    shared.model.load_state_dict(case["shared_before"])
    saved = case["adam_before"][0]
    shared.optimizer_states[0]["step"].copy_(saved["step"])
    for key, tensors in saved.items():
        if key != "step":
            for mine, theirs in zip(shared.optimizer_states[0][key], tensors):
                mine.copy_(theirs)
    local = model_for_env(info, cfg)
    local.load_state_dict(case["local_before"])
    arrays = {name: tensor.numpy() for name, tensor in case["rollout"].items()}
    rollout = Rollout.empty(*arrays["rewards"].shape, info.obs_shape, (arrays["start_h"], arrays["start_c"]),
                            info.distribution)
    for name in ("obs", "actions", "rewards", "values", "dones", "done_values", "resets", "last_values"):
        getattr(rollout, name)[...] = arrays[name]
    rollout.start_state = (case["rollout"]["start_h"], case["rollout"]["start_c"])
    assert A3CLearner(local, HogwildLink(shared, 0, InProcessReports()), cfg).learn(rollout)
    return shared.model.state_dict()


@pytest.mark.parametrize("name", ["vector-cartpole", "atari-pong-float32", "atari-pong-epochs2"])
def test_the_a3c_learner_updates_the_weights_bit_for_bit_as_the_worker_did(cases, name):
    after = learn_as_today(cases[name])
    expected = cases[name]["shared_after"]
    assert list(after) == list(expected)
    moved = [key for key in expected if not torch.equal(expected[key], cases[name]["shared_before"][key])]
    assert len(moved) > 5  # the update did something to compare
    for key in expected:
        assert torch.equal(after[key], expected[key]), key


def test_the_bf16_learn_step_stays_within_bf16s_rounding_of_the_update_from_kept_activations(cases):
    """Before, a bf16 learn step took the encoder's gradient from acting's activations (ONNX
    Runtime's, float32) through a hand-written backward; now it replays the encoder under bf16
    autocast. The same update up to bf16's rounding of the encoder's features: each weight's step
    (after - before) agrees in direction and size with the old one."""
    case = cases["atari-pong-bf16"]
    after, expected, before = learn_as_today(case), case["shared_after"], case["shared_before"]
    new_step = torch.cat([(after[k] - before[k]).flatten() for k in expected if before[k].is_floating_point()])
    old_step = torch.cat([(expected[k] - before[k]).flatten() for k in expected if before[k].is_floating_point()])
    assert float(old_step.norm()) > 0
    assert torch.nn.functional.cosine_similarity(new_step.double(), old_step.double(), dim=0) > 0.99
    assert abs(float(new_step.norm() / old_step.norm()) - 1.0) < 0.05


def test_a_rollout_stored_as_uint8_frames_gives_the_learner_its_frames_within_half_a_level():
    rollout = Rollout.empty(4, 3, (1, 6, 6), (torch.zeros(1, 3, 8), torch.zeros(1, 3, 8)), describe_env(
        "CartPole-v1").distribution, frames_uint8=True)
    frames = np.random.default_rng(0).random((4, 3, 1, 6, 6)).astype(np.float32)
    frames[0, 0, 0, 0, :2] = (0.0, 1.0)
    for t in range(4):
        rollout.store_obs(t, frames[t])
    assert rollout.obs.dtype == np.uint8 and rollout.obs.nbytes * 4 == frames.nbytes
    got = rollout.observations()
    assert got.dtype == torch.float32 and float((got - torch.from_numpy(frames)).abs().max()) <= 0.5 / 255 + 1e-7
    assert got[0, 0, 0, 0, :2].tolist() == [0.0, 1.0]


def test_a_learn_batch_reads_a_uint8_rollout_as_float_frames():
    class Settings:
        gamma, gae_lambda, normalize_advantages = 0.99, 0.95, False

    rollout = Rollout.empty(2, 1, (1, 2, 2), (torch.zeros(1, 1, 4), torch.zeros(1, 1, 4)),
                            describe_env("CartPole-v1").distribution, frames_uint8=True)
    rollout.store_obs(0, np.full((1, 1, 2, 2), 0.5, dtype=np.float32))
    batch = LearnBatch.of(rollout, Settings())
    assert batch.obs.dtype == torch.float32 and float(batch.obs[0].max()) == pytest.approx(128 / 255)
