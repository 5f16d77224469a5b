"""Any observation: images of any size and layout, Dict and Tuple observations, packed into one
vector, checked against slow references; and envs of those kinds trained, resumed, evaluated and
recorded for real (tests/envs.py's cue tasks, which only the image solves)."""
import json
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

import hogwild_a3c
from hogwild_a3c import evaluate
from hogwild_a3c.envs.make import EnvSpecError, describe_env, make_env
from hogwild_a3c.envs.observations import ObservationError, layout_of
from hogwild_a3c.learning.model import build_model
from hogwild_a3c.run.presets import auto_preset
from tests import envs as test_envs  # noqa: F401 - registers the test envs

CUE_DICT = "tests.envs:CueDict-v0"


def test_a_dict_is_packed_key_by_key_as_a_slow_reference_packs_it():
    space = gym.make(CUE_DICT).observation_space
    layout = layout_of(space)
    assert [(p.key, p.kind, p.shape) for p in layout.parts] == [
        ("flip", "onehot", (2,)), ("image", "image", (3, 8, 8)), ("noise", "vector", (2,))]
    assert layout.dropped == ("mission (Text)",)
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
    obs = {"image": image, "flip": 1, "noise": np.array([0.5, -0.25], np.float32), "mission": "x"}
    expected = [0.0, 1.0]  # one-hot of flip = 1
    for c in range(3):  # the image channel by channel (CHW), each pixel / 255
        for y in range(8):
            for x in range(8):
                expected.append(image[y, x, c] / 255.0)
    expected += [0.5, -0.25]
    np.testing.assert_allclose(layout.pack(obs), np.array(expected, np.float32), rtol=1e-6)


def test_hwc_chw_and_float_images_of_one_picture_pack_alike():
    hwc, chw, flt = (make_env(f"tests.envs:{name}") for name in ("CueImage-v0", "CueImageCHW-v0", "CueImageFloat-v0"))
    packed = [env.reset(seed=3)[0] for env in (hwc, chw, flt)]
    assert packed[0].shape == (192,) and packed[0].dtype == np.float32
    np.testing.assert_allclose(packed[0], packed[1])
    np.testing.assert_allclose(packed[0], packed[2], rtol=1e-6)
    assert packed[0].max() == 1.0 and packed[0].min() == 0.0


def test_a_large_image_is_made_grey_and_resized_as_linear_interpolation_does():
    layout = layout_of(gym.spaces.Box(0, 255, (60, 64, 3), np.uint8), image_size=42)
    (part,) = layout.parts
    assert (part.shape, part.grey_size) == ((1, 42, 42), 42)
    columns = np.tile(np.arange(64, dtype=np.float64), (60, 1))  # each pixel's value is its column
    image = np.repeat(columns[:, :, None], 3, axis=2).astype(np.uint8)
    packed = layout.pack(image).reshape(42, 42)

    def centre_aligned(n_in, n_out, values):  # slow reference: sample at each output pixel's centre
        positions = np.clip((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0, n_in - 1)
        return np.interp(positions, np.arange(n_in), values)

    expected_row = centre_aligned(64, 42, np.arange(64) / 255.0)
    np.testing.assert_allclose(packed, np.tile(expected_row, (42, 1)), atol=1e-5)


def test_above_80_a_large_image_is_an_area_average_so_a_one_pixel_line_keeps_its_light():
    """At --image-size 84 the two-step resize would go through 80 and enlarge; every pixel's light
    is kept instead, as for Atari frames (the slow reference: the mean of each 2x3 block)."""
    layout = layout_of(gym.spaces.Box(0, 255, (168, 252, 3), np.uint8), image_size=84)
    image = np.zeros((168, 252, 3), np.uint8)
    image[:, 101] = 255  # one column lit, in every channel
    packed = layout.pack(image).reshape(84, 84)
    expected = (image.mean(axis=2) / 255.0).reshape(84, 2, 84, 3).mean(axis=(1, 3))
    np.testing.assert_allclose(packed, expected, atol=1e-5)
    assert packed.sum() * 2 * 3 == pytest.approx(168, rel=1e-4)


def test_tuples_multibinary_and_discrete_are_taken_and_bad_spaces_say_what_is_supported():
    space = gym.spaces.Tuple((gym.spaces.Discrete(3, start=1), gym.spaces.MultiBinary(4),
                              gym.spaces.Box(0, 5, (2, 3), np.int64)))
    layout = layout_of(space)
    packed = layout.pack((2, np.array([1, 0, 1, 1]), np.arange(6).reshape(2, 3)))
    np.testing.assert_array_equal(packed, [0, 1, 0, 1, 0, 1, 1, 0, 1, 2, 3, 4, 5])
    assert layout_of(gym.spaces.Box(-1, 1, (4,), np.float32)) is None  # a float vector goes as it is
    with pytest.raises(ObservationError, match="a Box of rank 4 .* supported: a Box of rank 1-3"):
        layout_of(gym.spaces.Box(0, 1, (2, 3, 4, 5)))
    with pytest.raises(ObservationError, match="image: an image of shape \\(9, 9, 9\\) has no channel axis"):
        layout_of(gym.spaces.Dict({"image": gym.spaces.Box(0, 1, (9, 9, 9))}))


def test_a_small_grid_gets_the_grid_preset_and_its_full_resolution_encoder():
    assert auto_preset(CUE_DICT)[0] == "grid" and auto_preset("tests.envs:CueImageFloat-v0")[0] == "grid"
    assert auto_preset("tests.envs:Image-v0")[0] == "vector" and auto_preset("CartPole-v1")[0] == "vector"
    info = describe_env(CUE_DICT)
    model = build_model(info.obs_shape, info.distribution, 16, info.layout)
    grid = model.encoder.image_encoders[0]
    assert type(grid).__name__ == "GridEncoder" and grid.out_features == 32 * 4 * 4
    logits, value, _ = model.step(torch.zeros(5, *info.obs_shape), model.initial_state(5))
    assert logits.shape == (5, 4) and value.shape == (5,)


def test_an_id_that_an_installed_package_registers_names_the_package_form():
    # pytest is installed and registers nothing: the hint needs only a package of the id's first word.
    with pytest.raises(EnvSpecError, match="pytest registers its envs when imported: give --env pytest:Pytest-Foo-v0"):
        describe_env("Pytest-Foo-v0")


@pytest.mark.timeout(240)
def test_a_dict_env_trains_resumes_evaluates_and_records(tmp_path, capsys):
    run_dir = tmp_path / "run"
    result = hogwild_a3c.train(env=CUE_DICT, num_workers=1, max_steps=80_000, target_return=0.9, eval_interval=3,
                               eval_episodes=5, progress=False, run_dir=run_dir)
    assert result.ended == "target_return", result  # chance is 0.25: the image and flip keys were both used
    assert "dropped mission (Text)" in (run_dir / "train.log").read_text()
    assert json.loads((run_dir / "config.json").read_text())["preset"] == "grid"
    resumed = hogwild_a3c.train(resume=run_dir, env=CUE_DICT, max_steps=result.global_step + 2_000, target_return=None)
    assert resumed.ok and resumed.global_step >= result.global_step + 2_000

    policy = hogwild_a3c.load_policy(run_dir, env=CUE_DICT)
    raw_env = gym.make(CUE_DICT)
    obs, _ = raw_env.reset(seed=0)
    state = policy.initial_state()
    right = 0
    for _ in range(8):  # the env's own dict observations, packed by the policy as in training
        action, state = policy.act(obs, state, greedy=True)
        obs, reward, *_ = raw_env.step(action)
        right += reward > 0
    assert right >= 6
    packed_obs, _ = policy.make_env().reset(seed=0)
    raw_obs, _ = gym.make(CUE_DICT).reset(seed=0)
    assert policy.act(packed_obs, policy.initial_state(), greedy=True)[0] == \
        policy.act(raw_obs, policy.initial_state(), greedy=True)[0]

    record = tmp_path / "videos"
    capsys.readouterr()
    assert evaluate.main([str(run_dir), "--env", CUE_DICT, "--episodes", "1", "--greedy", "--record",
                          str(record)]) == 0
    assert "mean return over 1 episode" in capsys.readouterr().out
    (video,) = record.iterdir()
    assert video.name == "episode-1.mp4" and video.read_bytes()[4:8] == b"ftyp"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("env_id", ["tests.envs:CueImageFloat-v0", "tests.envs:CueImageCHW-v0"])
def test_float_and_chw_images_that_are_not_atari_train(tmp_path, env_id):
    result = hogwild_a3c.train(env=env_id, num_workers=1, max_steps=60_000, target_return=0.9, eval_interval=3,
                               eval_episodes=5, progress=False, run_dir=tmp_path / "run")
    assert result.ended == "target_return", result


@pytest.mark.timeout(240)
def test_minigrid_is_taken_with_no_flags_and_its_mission_text_is_dropped(tmp_path):
    pytest.importorskip("minigrid")  # in the dev extra, so `make test` has it
    env_id = "minigrid:MiniGrid-DoorKey-5x5-v0"
    info = describe_env(env_id)
    assert [(p.key, p.kind, p.shape) for p in info.layout.parts] == [
        ("direction", "onehot", (4,)), ("image", "image", (3, 7, 7))]
    assert info.layout.dropped == ("mission (MissionSpace)",) and auto_preset(env_id)[0] == "grid"
    result = hogwild_a3c.train(env=env_id, num_workers=1, max_steps=3_000, eval_interval=1, eval_episodes=2,
                               progress=False, run_dir=tmp_path / "run")
    assert result.ok and result.global_step >= 3_000
    assert hogwild_a3c.evaluate(result.run_dir, episodes=1, env=env_id)[0] >= 0.0


def test_a_bare_minigrid_id_names_the_package_form(tmp_path):
    pytest.importorskip("minigrid")
    # A fresh process, as a newcomer's: one that imported minigrid already knows its ids.
    proc = subprocess.run([sys.executable, "-m", "hogwild_a3c.train", "--env", "MiniGrid-Empty-5x5-v0",
                           "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("error")]
    assert line.endswith("minigrid registers its envs when imported: give --env minigrid:MiniGrid-Empty-5x5-v0")
    assert not (tmp_path / "run").exists()


def test_dict_keys_holding_a_dot_are_parts_of_their_own_beside_the_nested_keys_they_spell():
    """Issue 64 M3: parts were found by their key split on ".": "robot.pos" crashed the workers
    (KeyError 'robot'), and beside {"robot": {"pos": ...}} one part was packed twice, the other never."""
    from hogwild_a3c.envs.observations import layout_of

    space = gym.spaces.Dict({"robot.pos": gym.spaces.Box(-9, 9, (2,), np.float32),
                             "robot": gym.spaces.Dict({"pos": gym.spaces.Box(-9, 9, (3,), np.float32)}),
                             "t": gym.spaces.Tuple([gym.spaces.Discrete(2, start=1)])})
    layout = layout_of(space)
    obs = {"robot.pos": np.float32([1, 2]), "robot": {"pos": np.float32([3, 4, 5])}, "t": (2,)}
    packed = layout.pack(obs)
    assert sorted(packed.tolist()) == [0.0, 1.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert [part.key for part in layout.parts] == ["robot.pos", "robot.pos", "t.0"]  # for people, alike
    by_path = {part.path: packed[part.offset:part.offset + part.size].tolist() for part in layout.parts}
    assert by_path == {("robot.pos",): [1.0, 2.0], ("robot", "pos"): [3.0, 4.0, 5.0], ("t", 0): [0.0, 1.0]}


def test_packing_a_wide_dict_reads_each_parts_size_a_bounded_number_of_times(monkeypatch):
    """Issue 64 M2: each key's offset summed the sizes of all the keys before it, so a Dict of
    10,000 keys took minutes to start. Counted, not timed: reads of Part.size per key."""
    from hogwild_a3c.envs import observations

    reads = [0]
    original = observations.Part.size

    def counted(self):
        reads[0] += 1
        return original.fget(self)

    monkeypatch.setattr(observations.Part, "size", property(counted))
    keys = 2000
    space = gym.spaces.Dict({f"k{i}": gym.spaces.Box(0, 1, (1,), np.float32) for i in range(keys)})
    layout = observations.layout_of(space)
    assert [part.offset for part in layout.parts] == list(range(keys))
    assert reads[0] <= 4 * keys, reads[0]
