"""Presets as data, --preset and --config, what config.json records, and the running statistics
that normalization keeps in the model (shared, checkpointed, used by evaluate)."""
import json

import numpy as np
import pytest
import torch

from hogwild_a3c import train
from hogwild_a3c.config import PRESET_FIELDS, Config
from hogwild_a3c.files.checkpoint import load_checkpoint
from hogwild_a3c.files.rundir import ConfigError, resolve_new
from hogwild_a3c.learning.algo import a3c_loss
from hogwild_a3c.learning.model import ActorCritic, RunningMoments
from hogwild_a3c.run.presets import available, load_preset, resolve

UNIVERSE_VALUES = {name: getattr(Config(), name) for name in PRESET_FIELDS}


def resolved(**given):
    return resolve_new({"num_workers": 1, **given})


def test_atari_frames_get_universes_model_and_loss_with_the_atari_batching():
    cfg = resolved(env="ALE/Pong-v5")
    assert cfg.preset == "atari"
    tuned = {"envs_per_worker": 8, "rollout_steps": 10, "lr": 4e-4, "gae_lambda": 0.95, "lstm_forget_bias": 0.0,
             "normalize_obs": True,
             "clip_reward": True, "life_loss": True, "fire_reset": True}
    assert {name: getattr(cfg, name) for name in PRESET_FIELDS} == {**UNIVERSE_VALUES, **tuned}
    assert resolved().preset == "atari"  # the default env is Pong


def test_preset_universe_on_atari_is_universes_algorithm_exactly():
    cfg = resolved(env="ALE/Pong-v5", preset="universe")
    assert {name: getattr(cfg, name) for name in PRESET_FIELDS} == UNIVERSE_VALUES


def test_the_universe_preset_file_says_what_the_defaults_are():
    values, errors = load_preset("universe")
    assert not errors and values == UNIVERSE_VALUES


def test_the_old_name_seed_still_gives_universes_preset_with_a_note(capsys):
    cfg = resolved(env="CartPole-v1", preset="seed", frame="seed")
    assert (cfg.preset, cfg.frame) == ("universe", "universe")
    assert {name: getattr(cfg, name) for name in PRESET_FIELDS} == UNIVERSE_VALUES
    err = capsys.readouterr().err
    assert "note: --preset seed is called universe now" in err and "note: --frame seed is called universe" in err
    # a run saved under the old names loads as the new ones, so resume compares like with like
    assert Config(preset="seed", frame="seed").to_dict()["preset"] == "universe"


@pytest.mark.parametrize("env", ["CartPole-v1", "Acrobot-v1", "tests.envs:Counting-v0"])
def test_vector_observations_get_the_vector_preset(env):
    cfg = resolved(env=env)
    vector, _ = load_preset("vector")
    assert cfg.preset in ("vector", env) and cfg.core == "lstm" and cfg.lstm_size == 64 and cfg.loss_reduction == "mean"
    assert cfg.normalize_obs and cfg.normalize_reward
    assert all(getattr(cfg, k) == v for k, v in vector.items()) or cfg.preset == env


def test_preset_universe_gives_universes_algorithm_on_any_env():
    cfg = resolved(env="CartPole-v1", preset="universe")
    assert {name: getattr(cfg, name) for name in PRESET_FIELDS} == UNIVERSE_VALUES


def test_config_file_overrides_the_preset_and_flags_override_the_file(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"preset": "vector", "lr": 0.003, "envs-per-worker": 4, "gamma": 0.95}))
    cfg = resolved(env="ALE/Pong-v5", config=str(path), gamma=0.9)
    assert cfg.preset == "vector" and cfg.loss_reduction == "mean"  # the file chose the preset
    assert cfg.lr == 0.003 and cfg.envs_per_worker == 4  # the file beat the preset
    assert cfg.gamma == 0.9  # the flag beat the file


def test_every_preset_file_loads():
    assert {"atari", "universe", "vector"} <= set(available())
    for name in available():
        values, errors = load_preset(name)
        assert not errors, errors
        assert set(values) <= PRESET_FIELDS


def test_config_json_records_the_resolved_preset_and_resume_reuses_it(tmp_path):
    run_dir = tmp_path / "run"
    assert train.main(["--env", "CartPole-v1", "--num-workers", "0", "--max-steps", "400", "--eval-episodes", "0",
                       "--no-progress", "--run-dir", str(run_dir)]) == 0
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["preset"] == "vector" and saved["core"] == "lstm" and saved["normalize_obs"] is True
    # The checkpoint carries the running statistics, fed by the rollouts.
    model = load_checkpoint(run_dir / "checkpoints" / "latest.pt")["model"]
    assert float(model["obs_norm.count"]) >= 400 and float(model["return_norm.count"]) >= 400
    assert float(model["obs_norm.var"].min()) > 0 and bool((model["obs_norm.mean"] != 0).any())
    assert train.main(["--resume", str(run_dir), "--max-steps", "800", "--no-progress"]) == 0
    assert json.loads((run_dir / "config.json").read_text()) == {**saved, "max_steps": 800}
    after = load_checkpoint(run_dir / "checkpoints" / "latest.pt")["model"]
    assert float(after["obs_norm.count"]) >= 800  # restored, then fed further


def test_evaluate_uses_the_saved_statistics(tmp_path, run_cli):
    run_dir = tmp_path / "run"
    assert train.main(["--env", "CartPole-v1", "--num-workers", "0", "--max-steps", "400", "--eval-episodes", "0",
                       "--no-progress", "--run-dir", str(run_dir)]) == 0
    proc = run_cli("--episodes", "1", run_dir, module="hogwild_a3c.evaluate", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "mean return over 1 episode:" in proc.stdout


BAD = [
    (["--preset", "nope"], "--preset nope: no such preset (available: auto, "),
    (["--preset", "../seed"], "--preset ../seed: no such preset"),
    (["--config", "{missing}"], "--config {missing}: cannot read it"),
    (["--config", "{bad_json}"], "not valid JSON"),
    (["--config", "{unknown_key}"], "unknown or disallowed key 'learning_rate'"),
    (["--config", "{wrong_type}"], "'lr' must be a number"),
    (["--config", "{bad_preset}"], "--preset nope: no such preset"),
    (["--core", "gru"], "--core"),
]


@pytest.mark.parametrize("argv,expected", BAD)
def test_bad_preset_or_config_is_one_line_before_anything_starts(argv, expected, tmp_path, capsys):
    files = {
        "missing": tmp_path / "missing.json",
        "bad_json": tmp_path / "bad.json",
        "unknown_key": tmp_path / "unknown.json",
        "wrong_type": tmp_path / "type.json",
        "bad_preset": tmp_path / "preset.json",
    }
    files["bad_json"].write_text("{\"lr\": 0.001,}")
    files["unknown_key"].write_text(json.dumps({"learning_rate": 0.001}))
    files["wrong_type"].write_text(json.dumps({"lr": "fast"}))
    files["bad_preset"].write_text(json.dumps({"preset": "nope"}))
    argv = [a.format(**{k: str(v) for k, v in files.items()}) for a in argv]
    expected = expected.format(**{k: str(v) for k, v in files.items()})
    try:
        code = train.main(["--env", "CartPole-v1", *argv, "--run-dir", str(tmp_path / "r")])
    except SystemExit as exc:  # argparse's own refusal of a bad choice
        code = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert expected in err[-1], err
    assert not (tmp_path / "r").exists()


def test_running_moments_merge_equals_the_whole_stream():
    rng = np.random.default_rng(0)
    data = rng.normal(3.0, 2.0, size=(1000, 4))
    norm = RunningMoments((4,))
    for chunk in np.array_split(data, 7):
        norm.merge_(chunk)
    np.testing.assert_allclose(norm.mean.numpy(), data.mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(norm.var.numpy(), data.var(axis=0), rtol=1e-5)
    assert float(norm.count) == 1000
    norm.merge_(np.full((3, 4), np.nan))  # a broken env's NaNs are dropped, not merged
    assert float(norm.count) == 1000 and torch.isfinite(norm.mean).all()


def test_running_moments_of_float32_frames_are_their_float64_moments_without_the_broken_rows():
    frames = np.random.default_rng(1).random((80, 1, 6, 6)).astype(np.float32)
    broken = frames.copy()
    broken[5, 0, 2, 3], broken[9, 0, 0, 0] = np.nan, np.inf
    norm = RunningMoments((1, 6, 6))
    norm.merge_(broken)
    kept = np.delete(frames, [5, 9], axis=0).astype(np.float64)
    assert float(norm.count) == 78
    np.testing.assert_allclose(norm.mean.numpy(), kept.mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(norm.var.numpy(), kept.var(axis=0), rtol=1e-6)


def test_mlp_core_acts_and_replays_alike_and_has_no_lstm():
    torch.manual_seed(0)
    model = ActorCritic((3,), 2, core="mlp", hidden_size=16, activation="tanh", normalize_obs=True)
    model.obs_norm.merge_(np.random.default_rng(0).normal(5.0, 3.0, size=(50, 3)))
    assert model.lstm is None and model.initial_state(4)[0].shape == (1, 4, 0)
    obs = torch.randn(6, 4, 3) * 3 + 5
    logits, values = model.replay(obs, model.initial_state(4))
    for t in range(6):
        step_logits, step_values, _ = model.step(obs[t], model.initial_state(4))
        torch.testing.assert_close(step_logits, logits[t])
        torch.testing.assert_close(step_values, values[t])


def test_mean_reduction_is_the_sum_over_the_batch_size():
    torch.manual_seed(0)
    logits, values = torch.randn(10, 3), torch.randn(10)
    actions, adv, ret = torch.randint(0, 3, (10,)), torch.randn(10), torch.randn(10)
    summed = a3c_loss(logits, values, actions, adv, ret, reduction="sum")
    mean = a3c_loss(logits, values, actions, adv, ret, reduction="mean")
    for name in ("total", "policy", "value", "entropy"):
        torch.testing.assert_close(getattr(mean, name), getattr(summed, name) / 10)


def test_resolve_names_the_preset_it_applied():
    values, errors = resolve({"env": "CartPole-v1"})
    assert not errors and values["preset"] == "vector"


def test_a_config_file_may_set_every_optional_setting_and_null(tmp_path):
    """Optional settings (`int | None`) used to fail with KeyError 'int | None', whatever the value."""
    settings = {"max_steps": 20000, "num_workers": 1, "max_seconds": 30, "target_return": 100,
                "run_dir": str(tmp_path / "run")}
    path = tmp_path / "c.json"
    path.write_text(json.dumps({**settings, "max-seconds": None}))
    values, errors = resolve({"config": str(path), "env": "CartPole-v1"})
    assert errors == [] and values["max_steps"] == 20000 and values["max_seconds"] is None
    assert isinstance(values["target_return"], float) and values["num_workers"] == 1


def test_a_config_file_gets_every_fields_choices_checked(tmp_path):
    """argparse checks `choices` on the command line only; files and Python go through validate."""
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"frame": "sepia", "sync_mode": "max", "core": "gru"}))
    try:
        resolve_new({"env": "CartPole-v1", "config": str(path)})
    except ConfigError as exc:
        errors = exc.errors
    else:
        raise AssertionError("accepted")
    assert "--frame must be luminance or universe (got 'sepia')" in errors
    assert "--sync-mode must be sum or avg (got 'max')" in errors
    assert "--core must be lstm or mlp (got 'gru')" in errors
