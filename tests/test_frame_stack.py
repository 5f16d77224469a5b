"""`--frame-stack K`: Atari observations are the last K frames as channels, oldest first, checked
against a slow reference that keeps the single frames of the same game; a reset starts a fresh
stack; a real run trains on stacked frames and its policy plays them."""
import numpy as np
import pytest

from hogwild_a3c import load_policy, train
from hogwild_a3c.envs.make import EnvSpecError, describe_env, make_env
from tests.helpers import one_error_line, small_pong_run

PONG = ("ALE/Pong-v5", {"repeat_action_probability": 0.0})
ACTIONS = [0, 2, 3, 2, 3, 1]


def slow_stack(history: list[np.ndarray], count: int) -> np.ndarray:
    """The last `count` single frames since the reset, the reset frame repeated where there are fewer."""
    padded = [history[0]] * max(0, count - len(history)) + history[-count:]
    return np.concatenate(padded, axis=0)


@pytest.mark.parametrize("count", [2, 4])
def test_stacked_frames_are_the_last_frames_of_the_same_game(count):
    stacked, single = make_env(*PONG, frame_stack=count), make_env(*PONG)
    assert stacked.observation_space.shape == (count, 42, 42)
    seen = []
    for episode_seed in (3, 11):  # the second reset must not carry the first game's frames
        obs, _ = stacked.reset(seed=episode_seed)
        frame, _ = single.reset(seed=episode_seed)
        history = [frame]
        np.testing.assert_array_equal(obs, slow_stack(history, count))
        for t in range(40):
            obs, reward, terminated, truncated, _ = stacked.step(ACTIONS[t % len(ACTIONS)])
            frame, same_reward, *_ = single.step(ACTIONS[t % len(ACTIONS)])
            history.append(frame)
            assert reward == same_reward and not (terminated or truncated)
            np.testing.assert_array_equal(obs, slow_stack(history, count))
            seen.append(obs)
    # Each observation is its own array: a rollout keeps them all, and a view would change under it.
    assert all(a is not b and not np.shares_memory(a, b) for a, b in zip(seen, seen[1:]))
    assert not np.array_equal(seen[5][0], seen[5][-1])  # the game moved between its oldest and newest frame


def test_only_atari_frames_are_stacked():
    with pytest.raises(EnvSpecError, match=r"--frame-stack 2: only Atari frames are stacked; 'CartPole-v1'"):
        describe_env("CartPole-v1", frame_stack=2)
    assert describe_env(*PONG, frame_stack=3).obs_shape == (3, 42, 42)


@pytest.mark.parametrize("flags,message", [
    (["--env", "CartPole-v1", "--frame-stack", "2"], "--frame-stack 2: only Atari frames are stacked"),
    (["--frame-stack", "0"], "--frame-stack must be an integer from 1 to 16 (got 0)"),
])
def test_a_bad_frame_stack_is_one_line_before_any_run_starts(tmp_path, capsys, flags, message):
    run_dir = tmp_path / "run"
    assert train.main([*flags, "--max-steps", "10", "--no-progress", "--run-dir", str(run_dir)]) != 0
    assert message in one_error_line(capsys)
    assert not run_dir.exists()


@pytest.mark.timeout(180)
def test_a_real_atari_run_trains_and_plays_on_stacked_frames(tmp_path):
    policy = load_policy(small_pong_run(tmp_path / "run", "--frame-stack", "2"))
    assert policy.cfg.frame_stack == 2 and policy.env_info.obs_shape == (2, 42, 42)
    assert policy.model.encoder[0].weight.shape[1] == 2  # the first conv reads both frames
    env = policy.make_env()
    obs, _ = env.reset(seed=0)
    state = policy.initial_state()
    for _ in range(5):
        action, state = policy.act(obs, state)
        obs, *_ = env.step(action)
    raw_frame = env.unwrapped.ale.getScreenGrayscale()
    with pytest.raises(ValueError, match=r"of shape \(210, 160\); this policy takes \(2, 42, 42\)"):
        policy.act(raw_frame, state)
