import os
import subprocess
import sys

import pytest

import tests.envs  # noqa: F401 - registers the test environments in this process
from tests.helpers import REPO


@pytest.fixture
def run_cli():
    """Run `python -m MODULE ARGS` from the repo root; returns the CompletedProcess."""

    def run(*args, module="hogwild_a3c.train", timeout=180, **kwargs):
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        return subprocess.run(
            [sys.executable, "-m", module, *map(str, args)],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, **kwargs,
        )

    return run
