"""What the command lines say: no prefix matching, grouped `--help`, one line for a bad env id
or keyword, and a clear word about envs that worker processes cannot make."""
import argparse
import dataclasses
import subprocess
import sys
import textwrap

import pytest

from hogwild_a3c import evaluate, plot
from hogwild_a3c.config import Config
from hogwild_a3c.envs.make import EnvSpecError, check_spawnable, describe_env
from hogwild_a3c.run.cli import build_parser, help_groups
from tests.helpers import REPO


def test_a_prefix_of_a_flag_is_not_taken_for_the_flag(capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["--envs", "4"])  # once taken as --envs-per-worker 4
    assert exit_.value.code == 2 and "unrecognized arguments: --envs 4" in capsys.readouterr().err
    assert vars(build_parser().parse_args(["--envs-per-worker", "4"])) == {"envs_per_worker": 4}
    with pytest.raises(SystemExit):
        evaluate.main(["run", "--epi", "2"])
    assert "unrecognized arguments: --epi" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        plot.main(["run", "--o", "x.png"])
    assert "unrecognized arguments: --o" in capsys.readouterr().err


def test_train_help_is_grouped_and_every_flag_is_in_one_group():
    parser = build_parser()
    groups = {g.title: [a.dest for a in g._group_actions] for g in parser._action_groups}
    assert list(groups)[2:] == help_groups()
    fields = [f.name for f in dataclasses.fields(Config)]
    in_groups = [dest for title in help_groups() for dest in groups[title]]
    assert in_groups == fields  # each once, in Config's order
    assert groups["processes"] == ["num_workers", "envs_per_worker", "seed", "start_method"]
    assert groups["faults"] == ["max_worker_restarts", "stall_timeout", "max_env_errors", "max_evaluator_restarts",
                                "max_skipped_updates"]
    assert parser.parse_args([]) == argparse.Namespace()  # still only the flags given


def test_each_flag_states_its_default_once():
    for action in build_parser()._actions:
        if action.help and action.option_strings != ["-h", "--help"]:
            assert action.help.count("default") <= 1, action.help
    (run_dir,) = [a for a in build_parser()._actions if a.dest == "run_dir"]
    assert "default: runs/<env>/<timestamp>-s<seed>" in run_dir.help and "none" not in run_dir.help


def test_a_bare_atari_id_suggests_its_namespace():
    with pytest.raises(EnvSpecError) as error:
        describe_env("Pong-v5")
    message = str(error.value)
    assert message.startswith("--env 'Pong-v5':") and message.endswith("did you mean 'ALE/Pong-v5'?")
    assert "\n" not in message


@pytest.mark.parametrize("env_id,keyword",
                         [("ALE/Pong-v5", "repeat_action_probability"), ("CartPole-v1", "sutton_barto_reward")])
def test_a_bad_env_keyword_is_named_in_one_short_line(env_id, keyword):
    with pytest.raises(EnvSpecError) as error:
        describe_env(env_id, {"foo": 1})
    message = str(error.value)
    assert message.startswith(f"--env-kwargs foo=1: '{env_id}' has no keyword argument 'foo'")
    assert keyword in message  # the keywords it does take
    assert "{" not in message and "\n" not in message  # not Gymnasium's dump of every keyword


def test_ids_every_process_knows_are_spawnable():
    for env_id in ("CartPole-v1", "ALE/Pong-v5", "tests.envs:Counting-v0", "NoSuchEnv-v0"):
        assert check_spawnable(env_id) is None, env_id


def test_an_id_registered_by_an_imported_module_names_the_module():
    # conftest imported tests.envs, which registered Counting-v0 in this process only.
    message = check_spawnable("Counting-v0")
    assert message is not None and message.startswith("--env 'Counting-v0' is registered in this process only")
    assert "--env tests.envs:Counting-v0" in message and "--num-workers 0" in message


def run_python(tmp_path, code: str, script: bool) -> str:
    """Run `code` as a script file (spawned children re-run it) or with -c (like a notebook: there
    is no file to re-run); returns its stdout."""
    code = textwrap.dedent(code)
    if script:
        path = tmp_path / "user_script.py"
        path.write_text(code)
        argv = [sys.executable, str(path)]
    else:
        argv = [sys.executable, "-c", code]
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


USER_ENV = """
import gymnasium as gym
import numpy as np
from hogwild_a3c.envs.make import check_spawnable

class MyEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)
"""


def test_an_env_registered_in_a_notebook_gets_one_line_with_two_ways_out(tmp_path):
    registered = USER_ENV + "gym.register('Mine-v0', entry_point=MyEnv)\nprint(check_spawnable('Mine-v0'))\n"
    out = run_python(tmp_path, registered, script=False)
    assert out.startswith("--env 'Mine-v0' is registered in __main__ (a notebook or the interactive prompt)")
    assert "--env MODULE:Mine-v0" in out and "--num-workers 0" in out


def test_a_script_that_registers_at_top_level_is_spawnable(tmp_path):
    top_level = (USER_ENV + "gym.register('Mine-v0', entry_point=MyEnv)\n"
                 "if __name__ == '__main__':\n    print(check_spawnable('Mine-v0'))\n")
    assert run_python(tmp_path, top_level, script=True) == "None"  # the children re-run the script
    guarded = (USER_ENV + "if __name__ == '__main__':\n"
               "    gym.register('Mine-v0', entry_point=MyEnv)\n    print(check_spawnable('Mine-v0'))\n")
    assert "--num-workers 0" in run_python(tmp_path, guarded, script=True)  # the children skip the registration


def test_in_a_real_notebook_kernel_the_env_is_reported(tmp_path):
    import nbformat
    from nbclient import NotebookClient

    cell = (f"import sys\nsys.path.insert(0, {str(REPO)!r})\n" + USER_ENV
            + "gym.register('Mine-v0', entry_point=MyEnv)\nprint(check_spawnable('Mine-v0'))\n")
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)])
    NotebookClient(notebook, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    (output,) = notebook.cells[0].outputs
    assert output["text"].startswith("--env 'Mine-v0' is registered in __main__ (a notebook")


def test_field_types_come_from_the_type_hints_whatever_their_form():
    """`FIELD_TYPES` reads real type hints: a `Literal` or `tuple[int, ...]` field (which the
    old string parsing could not read, a KeyError on import) gets its base type."""
    import typing

    from hogwild_a3c.config import FIELD_TYPES, _base_type

    assert _base_type(typing.Literal["a", "b"]) == (str, False)
    assert _base_type(tuple[int, ...]) == (tuple, False)
    assert _base_type(int | None) == (int, True)
    assert _base_type(typing.Optional[float]) == (float, True)  # noqa: UP045 - the older spelling, on purpose
    assert FIELD_TYPES["num_workers"] == (int, True) and FIELD_TYPES["env_kwargs"] == (dict, False)
