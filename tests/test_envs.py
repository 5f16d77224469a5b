import numpy as np
import pytest

from hogwild_a3c.envs.make import EnvSpecError, UniverseFrames, describe_env, make_env, parse_env_kwargs
from hogwild_a3c.learning.distributions import Categorical
from tests.helpers import slow_linear_resize


def test_pong_observation_is_1x42x42_float32_in_unit_range():
    env = make_env("ALE/Pong-v5")
    obs, _ = env.reset(seed=0)
    for _ in range(50):
        obs, *_ = env.step(env.action_space.sample())
        assert obs.shape == (1, 42, 42) and obs.dtype == np.float32
        assert 0.0 <= obs.min() and obs.max() <= 1.0
    assert obs.std() > 0  # a real picture, not a blank frame
    env.close()


def test_preprocessing_matches_the_two_step_universe_resize():
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, size=(210, 160), dtype=np.uint8)
    wrapper = UniverseFrames(make_env("CartPole-v1"))  # any env will do: only the resize is tested
    ours = wrapper.observation(frame)[0]
    cropped = frame[34:194].astype(np.float64)
    reference = slow_linear_resize(slow_linear_resize(cropped, 80, 80), 42, 42) / 255.0
    np.testing.assert_allclose(ours, reference, atol=1e-5)
    rgb = np.stack([frame] * 3, axis=2)
    np.testing.assert_allclose(wrapper.observation(rgb)[0], ours, atol=1e-6)


def test_pong_is_described_for_the_model():
    info = describe_env("ALE/Pong-v5", {"repeat_action_probability": 0.0})
    assert info.obs_shape == (1, 42, 42) and info.distribution == Categorical(6)


def test_env_kwargs_reach_gymnasium_make():
    env = make_env("CartPole-v1", {"max_episode_steps": 5})
    env.reset(seed=0)
    truncated = False
    for _ in range(5):
        *_, truncated, _ = env.step(0 if _ % 2 else 1)
    assert truncated


def test_env_kwargs_parse_python_literals():
    assert parse_env_kwargs(["a=1", "b=0.5", "c='x'", "d=True", "e=plain", "f=[1, 2]"]) == {
        "a": 1, "b": 0.5, "c": "x", "d": True, "e": "plain", "f": [1, 2]
    }
    with pytest.raises(EnvSpecError, match="KEY=VALUE"):
        parse_env_kwargs(["novalue"])


def test_a_users_module_env_id_works():
    info = describe_env("tests.envs:Counting-v0", {"length": 3})
    assert info.obs_shape == (2,) and info.distribution == Categorical(2)


def test_an_env_without_an_observation_space_is_not_blamed_on_env_kwargs():
    """No --env-kwargs were given, so none are named (issue 64 L4)."""
    import tests.envs  # noqa: F401 - registers the test envs

    with pytest.raises(EnvSpecError) as caught:
        describe_env("tests.envs:NoObservationSpace-v0")
    line = str(caught.value)
    assert line.startswith("--env 'tests.envs:NoObservationSpace-v0': making the env raised TypeError: observation "
                           "space does not inherit from") and "--env-kwargs" not in line and "\n" not in line


def test_making_an_atari_env_prints_no_ale_banner():
    """Each child made its env and printed ALE's two-line banner through the progress bar."""
    import subprocess
    import sys

    made = subprocess.run([sys.executable, "-c", "from hogwild_a3c.envs.make import make_env; "
                           "make_env('ALE/Pong-v5').reset(seed=0); print('made')"],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0 and made.stdout.strip() == "made", made.stderr
    assert "A.L.E" not in made.stdout + made.stderr and "Stella" not in made.stdout + made.stderr
