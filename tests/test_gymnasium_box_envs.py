"""Gymnasium's own Box-action envs under the preset `--preset auto` picks, built, tried at start-up
and acted and learned on by a worker: MuJoCo's HalfCheetah (vectors) and Box2D's CarRacing (96x96
RGB frames), with continuous actions and with its discrete ones (which once crashed every worker)."""
import pytest
import torch

from hogwild_a3c.children.reports import InProcessReports
from hogwild_a3c.children.shared import HogwildLink, SharedState
from hogwild_a3c.children.worker import Worker
from hogwild_a3c.envs.make import describe_env, env_options
from hogwild_a3c.files.rundir import resolve_new
from hogwild_a3c.learning.distributions import Categorical, Gaussian
from hogwild_a3c.learning.learner import trial_update_problem
from hogwild_a3c.learning.model import model_for_env
from hogwild_a3c.learning.optim import LrSchedule


@pytest.mark.parametrize("env, env_kwargs, preset, kind", [
    ("HalfCheetah-v5", {}, "continuous", Gaussian),
    ("CarRacing-v3", {}, "continuous", Gaussian),
    ("CarRacing-v3", {"continuous": False}, "vector", Categorical),
])
def test_a_gymnasium_env_acts_and_learns_under_the_auto_preset(tmp_path, monkeypatch, env, env_kwargs, preset, kind):
    monkeypatch.chdir(tmp_path)  # where MuJoCo's own handler would leave its MUJOCO_LOG.TXT
    cfg = resolve_new({"env": env, "env_kwargs": env_kwargs, "num_workers": 0, "envs_per_worker": 2,
                       "rollout_steps": 5})
    assert cfg.preset == preset
    info = describe_env(cfg.env, cfg.env_kwargs, **env_options(cfg))
    assert isinstance(info.distribution, kind)
    assert trial_update_problem(model_for_env(info, cfg), cfg) is None
    torch.manual_seed(0)
    shared = SharedState.create(model_for_env(info, cfg), 1, cfg.optimizer, LrSchedule(cfg.lr))
    worker = Worker(0, cfg, info, HogwildLink(shared, 0, InProcessReports()), seed=1)
    before = [p.detach().clone() for p in shared.model.parameters()]
    for _ in range(2):
        assert worker.run_rollout() == 10
    worker.close()
    assert any(not torch.equal(a, b) for a, b in zip(before, shared.model.parameters()))
    assert list(tmp_path.iterdir()) == []
