"""Long learning runs, excluded from `make test`; run them with `make test-slow`."""
import numpy as np
import pandas as pd
import pytest

from hogwild_a3c import train

pytestmark = pytest.mark.slow


def _learn(tmp_path, *flags, target, budget_s):
    run_dir = tmp_path / "run"
    code = train.main([*flags, "--target-return", str(target), "--eval-episodes", "5", "--eval-interval", "10",
                       "--max-seconds", str(budget_s), "--no-progress", "--run-dir", str(run_dir)])
    evals = pd.read_csv(run_dir / "eval.csv")
    return code, float(np.mean(evals["episode_return"].tail(5)))


@pytest.mark.timeout(1300)
def test_cartpole_to_475(tmp_path):
    code, mean = _learn(tmp_path, "--env", "CartPole-v1", "--num-workers", "2", "--lr", "1e-3", "--lstm-size", "64",
                        target=475, budget_s=1200)
    assert code == 0 and mean >= 475


@pytest.mark.timeout(1300)
def test_cartpole_with_shared_adam_and_batched_envs(tmp_path):
    code, mean = _learn(tmp_path, "--env", "CartPole-v1", "--num-workers", "2", "--envs-per-worker", "4",
                        "--optimizer", "shared-adam", "--lr", "1e-3", "--lstm-size", "64", target=195, budget_s=1200)
    assert code == 0 and mean >= 195


@pytest.mark.timeout(1300)
@pytest.mark.xfail(reason="not learned yet: evaluation return stayed at -500 (entropy 1.05 of ln 3) after 2.6M steps "
                          "and 490 s on 2 cores, 2026-11-30; kept running so a fix shows up as XPASS", strict=False)
def test_acrobot(tmp_path):
    code, mean = _learn(tmp_path, "--env", "Acrobot-v1", "--num-workers", "2", "--lr", "1e-3", "--lstm-size", "64",
                        target=-120, budget_s=1200)
    assert code == 0 and mean >= -120
