"""Gymnasium's own Box-action envs under the preset `--preset auto` picks, built, tried at start-up
and acted and learned on by a worker: MuJoCo's HalfCheetah (vectors) and Box2D's CarRacing (96x96
RGB frames), with continuous actions and with its discrete ones (which once crashed every worker)."""
import pytest

from hogwild_a3c.envs.make import describe_env, env_options
from hogwild_a3c.files.rundir import resolve_new
from hogwild_a3c.learning.distributions import Categorical, Gaussian
from tests.helpers import acts_and_learns_in_a_worker


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
    acts_and_learns_in_a_worker(cfg, info)
    assert list(tmp_path.iterdir()) == []
