"""Universe's frames on real Atari screens: `frame="universe"` against a slow, literal transcription
of `_process_frame42` (crop, resize each RGB channel 160 -> 80 -> 42, mean of the channels,
1/255), and `frame="luminance"` against the same resize of ALE's own greyscale screen; and the
84x84 frames of `--image-size 84` against an area average by pixel replication."""
import numpy as np
import pytest

from hogwild_a3c import load_policy
from hogwild_a3c.envs.make import AtariFrame, EnvSpecError, describe_env, make_env
from tests.helpers import slow_linear_resize, small_pong_run


def slow_process_frame42(rgb: np.ndarray) -> np.ndarray:
    """Universe's order of operations, one channel at a time, in float64."""
    cropped = rgb[34:194, :160].astype(np.float64)
    channels = [slow_linear_resize(slow_linear_resize(cropped[:, :, c], 80, 80), 42, 42) for c in range(3)]
    return np.mean(channels, axis=0) / 255.0


def slow_grey_frame42(grey: np.ndarray) -> np.ndarray:
    cropped = grey[34:194, :160].astype(np.float64)
    return slow_linear_resize(slow_linear_resize(cropped, 80, 80), 42, 42) / 255.0


def play(env, steps: int = 60):
    """A fixed action sequence from a fixed seed, long enough for the ball and both paddles."""
    obs, _ = env.reset(seed=3)
    for t in range(steps):
        obs, *_ = env.step([0, 2, 3, 2, 3, 1][t % 6])
    return obs


@pytest.fixture(scope="module")
def frames():
    """(observation, raw screen) after the same play, for both frame modes."""
    out = {}
    for mode in ("universe", "luminance"):
        env = make_env("ALE/Pong-v5", {"repeat_action_probability": 0.0}, frame=mode)
        obs = play(env)
        ale = env.unwrapped.ale
        out[mode] = (obs, ale.getScreenRGB(), ale.getScreenGrayscale())
        env.close()
    return out


def test_seed_frames_are_the_rgb_channel_mean_of_a_real_pong_screen(frames):
    obs, rgb, _ = frames["universe"]
    assert rgb.shape == (210, 160, 3) and len(np.unique(rgb.reshape(-1, 3), axis=0)) >= 3  # a real colour picture
    assert obs.shape == (1, 42, 42) and obs.dtype == np.float32
    np.testing.assert_allclose(obs[0], slow_process_frame42(rgb), atol=2e-6)


def test_fast_frames_are_ales_greyscale_resized_the_same_way(frames):
    obs, _, grey = frames["luminance"]
    np.testing.assert_allclose(obs[0], slow_grey_frame42(grey), atol=2e-6)


def test_a_batch_of_grey_frames_is_each_frame_resized_alone(frames):
    """`AtariFrame.grey_batch`, for frames that come from a vector env as one array."""
    _, _, grey = frames["luminance"]
    batch = np.stack([grey, np.flipud(grey), np.zeros_like(grey)])
    out = AtariFrame().grey_batch(batch)
    assert out.shape == (3, 1, 42, 42) and out.dtype == np.float32
    for k in range(3):
        np.testing.assert_allclose(out[k, 0], slow_grey_frame42(batch[k]), atol=2e-6)


def test_the_two_modes_see_the_same_screen_in_different_greys(frames):
    seed_obs, seed_rgb, _ = frames["universe"]
    fast_obs, fast_rgb, _ = frames["luminance"]
    assert np.array_equal(seed_rgb, fast_rgb)  # same emulator state: only the grey conversion differs
    difference = np.abs(seed_obs - fast_obs).max()
    assert 5 / 255 < difference < 40 / 255, difference * 255


def test_obs_type_rgb_in_env_kwargs_is_the_universe_mode_and_conflicts_are_refused():
    env = make_env("ALE/Pong-v5", {"repeat_action_probability": 0.0, "obs_type": "rgb"})
    by_kwarg = play(env)
    env.close()
    env = make_env("ALE/Pong-v5", {"repeat_action_probability": 0.0}, frame="universe")
    by_mode = play(env)
    env.close()
    np.testing.assert_array_equal(by_kwarg, by_mode)
    with pytest.raises(EnvSpecError, match="--frame universe needs RGB"):
        make_env("ALE/Pong-v5", {"obs_type": "grayscale"}, frame="universe")
    with pytest.raises(EnvSpecError, match="--frame must be one of luminance, universe"):
        describe_env("ALE/Pong-v5", frame="colour")
    with pytest.raises(EnvSpecError, match="obs_type='ram'"):
        describe_env("ALE/Pong-v5", {"obs_type": "ram"})


def test_frame_mode_is_ignored_by_envs_without_frames():
    assert describe_env("CartPole-v1", frame="universe").obs_shape == (4,)


def test_the_old_name_of_universes_frames_still_works():
    old, new = make_env("ALE/Pong-v5", {"repeat_action_probability": 0.0}, frame="seed"), \
        make_env("ALE/Pong-v5", {"repeat_action_probability": 0.0}, frame="universe")
    np.testing.assert_array_equal(old.reset(seed=0)[0], new.reset(seed=0)[0])


def slow_area_resize(image: np.ndarray, size: int) -> np.ndarray:
    """Each pixel repeated `size` times each way, then the mean of each block of len(image)**2
    copies: every output pixel is the exact area average of its share of the input."""
    big = np.repeat(np.repeat(image.astype(np.float64), size, axis=0), size, axis=1)
    block = len(image)
    return big.reshape(size, block, size, block).mean(axis=(1, 3))


def test_84_frames_are_the_area_average_of_the_crop(frames):
    _, _, grey = frames["luminance"]
    obs = make_env("ALE/Pong-v5", {"repeat_action_probability": 0.0}, image_size=84)
    assert obs.observation_space.shape == (1, 84, 84)
    np.testing.assert_allclose(AtariFrame(84)(grey)[0], slow_area_resize(grey[34:194], 84) / 255.0, atol=2e-6)


def test_a_one_pixel_shot_survives_84_but_can_fade_at_42():
    """What the larger side is for: SpaceInvaders' shots are one pixel wide. An area average keeps
    every pixel's light (the frame's total stays the same); universe's linear resize samples."""
    frame = np.zeros((210, 160), dtype=np.uint8)
    frame[100:104, 77] = 255  # a shot: 4 rows of one column
    big, small = AtariFrame(84)(frame)[0], AtariFrame(42)(frame)[0]
    assert big.sum() * (160 / 84) ** 2 == pytest.approx(4.0, rel=1e-4)
    assert big.max() > 2 * small.max() > 0


@pytest.mark.timeout(180)
def test_a_real_atari_run_trains_on_84x84_frames(tmp_path):
    policy = load_policy(small_pong_run(tmp_path / "run", "--image-size", "84"))
    assert policy.env_info.obs_shape == (1, 84, 84)
    # 84 halved four times is 6: the LSTM reads 32 x 6 x 6 features, not 42's 32 x 3 x 3
    assert policy.model.lstm.weight_ih_l0.shape == (4 * 16, 32 * 6 * 6)
