"""Images of any size a user's env gives, HWC or CHW, alone or in a Dict, under the preset `auto`
picks for them: the model is built, tried in the main process, acts and learns in a worker. Under
the `vector` preset the value net is an MLP of its own, and its head was once sized from the conv
encoder's output: every worker crashed on every image larger than 16 a side."""
import pytest
import torch

import tests.envs  # noqa: F401 - registers the test envs
from hogwild_a3c.files.rundir import resolve_new
from hogwild_a3c.run.prepare import ConfigError
from tests.helpers import acts_and_learns_in_a_worker

ENVS = {"hwc": "tests.envs:CueImage-v0", "chw": "tests.envs:CueImageCHW-v0", "dict": "tests.envs:CueDict-v0"}


def resolved(form, size):
    return resolve_new({"env": ENVS[form], "env_kwargs": {"size": size}, "num_workers": 0, "lstm_size": 16})


@pytest.mark.parametrize("size", [17, 32, 84, 256])
@pytest.mark.parametrize("form", ["hwc", "chw", "dict"])
def test_an_image_of_any_size_acts_and_learns_under_the_auto_preset(form, size):
    from hogwild_a3c.envs.make import describe_env, env_options

    cfg = resolved(form, size)
    info = describe_env(cfg.env, cfg.env_kwargs, **env_options(cfg))
    acts_and_learns_in_a_worker(cfg, info)


def test_a_model_that_cannot_learn_on_the_envs_observations_is_one_line_before_any_child(monkeypatch, tmp_path):
    """The fault injected: a value head one feature too wide, as the old sizing bug made it."""
    from hogwild_a3c.learning import model as model_module

    original = model_module.ActorCritic.__init__

    def too_wide_value_head(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.value = torch.nn.Linear(self.value.in_features + 1, 1)

    monkeypatch.setattr(model_module.ActorCritic, "__init__", too_wide_value_head)
    from hogwild_a3c.run.prepare import prepare_given

    with pytest.raises(ConfigError) as caught:
        prepare_given({"env": "tests.envs:CueImage-v0", "env_kwargs": {"size": 32}, "num_workers": 0,
                       "run_dir": str(tmp_path / "run")})
    assert not (tmp_path / "run").exists()  # nothing written
    (line,) = caught.value.errors
    assert line.startswith("the model cannot act or learn on this env's observations of shape") and "\n" not in line


def test_an_image_too_small_for_the_encoder_of_a_module_env_is_one_line(tmp_path):
    """`--encoder nature` on a 20x20 image of a `module:Id` env (issue 64 L1): the hint once asked
    gymnasium for the id with its module prefix and crashed with a 61-line traceback."""
    from hogwild_a3c.run.prepare import prepare_given

    with pytest.raises(ConfigError) as caught:
        prepare_given({"env": "tests.envs:CueImage-v0", "env_kwargs": {"size": 20}, "encoder": "nature",
                       "num_workers": 0, "run_dir": str(tmp_path / "run")})
    (line,) = caught.value.errors
    assert line.startswith("--encoder nature: the nature encoder needs images of at least 36x36 (got 20x20)")
    assert "give another --encoder" in line and not (tmp_path / "run").exists()


@pytest.mark.timeout(240)
def test_a_toy_image_task_larger_than_a_grid_is_learned_under_the_auto_preset(tmp_path):
    """Issue 64 H1's threshold: a 32x32 CueImage goes to the conv encoder (not the grid's), under
    the preset `auto` picks, with no flags; chance is 0.25, every step right 1."""
    import hogwild_a3c

    result = hogwild_a3c.train(env="tests.envs:CueImage-v0", env_kwargs={"size": 32}, num_workers=2,
                               max_steps=120_000, target_return=0.9, eval_interval=3, eval_episodes=10,
                               progress=False, run_dir=tmp_path / "run")
    assert result.ended == "target_return", result
