"""Issue 64 L2: an env that breaks Gymnasium's contract is one line at start-up, naming the env and
what it returned, before any process starts and before anything is written (it was a 40-200 line
traceback in every worker)."""
import pytest

import tests.envs  # noqa: F401 - registers the test envs
from hogwild_a3c import train
from tests.helpers import one_error_line


@pytest.mark.parametrize("env_id, words", [
    ("ResetReturnsText-v0", "reset() returned 'ready', not (observation, info)"),
    ("GrowingObservation-v0", "step() returned an observation of shape (3,); its observation space declares (2,)"),
    ("MissingKey-v0", "space keys: ['position', 'speed']"),  # Gymnasium's own checker says it
    ("DiscreteOutOfRange-v0", "reset(): an observation its declared space does not describe (IndexError"),
    ("EmptyBox-v0", "its observation space Box([], [], (0,), float32) holds no numbers"),
])
def test_an_env_that_breaks_its_contract_is_one_line_before_anything_starts(tmp_path, capsys, env_id, words):
    run_dir = tmp_path / "run"
    assert train.main(["--env", f"tests.envs:{env_id}", "--num-workers", "1", "--run-dir", str(run_dir)]) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"error: --env 'tests.envs:{env_id}': ") and words in line, line
    assert not run_dir.exists()


def test_an_env_that_raises_at_its_first_step_is_left_to_the_workers_rules_for_env_errors(tmp_path):
    """Not a broken contract: its failures are counted by --max-env-errors, as later in a run."""
    run_dir = tmp_path / "run"
    code = train.main(["--env", "tests.envs:Faulty-v0", "--env-kwargs", "fault='raise'", "fail_at=1",
                       "max_failures=1", "--num-workers", "0", "--max-steps", "200", "--eval-episodes", "0",
                       "--lstm-size", "8", "--no-progress", "--run-dir", str(run_dir)])
    assert code == 0 and (run_dir / "checkpoints" / "latest.pt").exists()
