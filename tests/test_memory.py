"""Memory by default: an env that shows a cue once and asks for it 3-12 steps later is learned
with no flags (the vector preset's LSTM), where a feed-forward policy can only guess."""
import pandas as pd
import pytest

from hogwild_a3c import train


@pytest.mark.timeout(240)
def test_the_default_flags_recall_a_cue_after_a_delay(tmp_path):
    run_dir = tmp_path / "run"
    # Chance is 0.25 (4 cues); 3 of 3 seeds passed 0.9 within 110k steps (about 25 s on 2 cores).
    assert train.main(["--env", "tests.envs:CueRecall-v0", "--num-workers", "2", "--max-steps", "600000",
                       "--eval-interval", "2", "--eval-episodes", "40", "--target-return", "0.9", "--no-progress",
                       "--run-dir", str(run_dir)]) == 0
    evaluations = pd.read_csv(run_dir / "eval.csv").groupby("global_step")["episode_return"].mean()
    assert evaluations.max() >= 0.9, evaluations.to_dict()


def test_the_cue_recall_task_cannot_be_solved_without_memory():
    """The task is what it claims: the observations after the cue carry nothing of it."""
    from tests.envs import CueRecallEnv

    env = CueRecallEnv()
    seen = set()
    for seed in range(40):
        obs, _ = env.reset(seed=seed)
        cue, steps = int(obs[:4].argmax()), []
        terminated = False
        while not terminated:
            obs, reward, terminated, _, _ = env.step(cue)
            steps.append(obs)
        assert reward == 1.0 and all(not o[:4].any() for o in steps)
        assert 3 <= len(steps) - 1 <= 12
        seen.add(cue)
    assert seen == {0, 1, 2, 3}
