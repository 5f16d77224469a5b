"""Every command the README shows runs as written: each `.venv/bin/python -m hogwild_a3c...`
line parses with that module's own parser (no training run), and the make targets it names exist."""
import re
import shlex

import pytest

from hogwild_a3c import evaluate, plot
from hogwild_a3c.run.cli import build_parser
from tests.helpers import REPO

PARSERS = {"hogwild_a3c.train": build_parser, "hogwild_a3c.evaluate": evaluate.build_parser,
           "hogwild_a3c.plot": plot.build_parser}
README = (REPO / "README.md").read_text()


def readme_commands() -> list[str]:
    lines = [line.strip() for line in README.splitlines()]
    return [line for line in lines if line.startswith(".venv/bin/python -m hogwild_a3c")]


def test_the_readme_shows_commands_of_every_tool():
    modules = {shlex.split(line, comments=True)[2] for line in readme_commands()}
    assert modules == set(PARSERS)


@pytest.mark.parametrize("line", readme_commands())
def test_each_readme_command_parses(line):
    tokens = shlex.split(line, comments=True)
    module, args = tokens[2], tokens[3:]
    if args == ["--help"]:
        with pytest.raises(SystemExit) as exit_:
            PARSERS[module]().parse_args(args)
        assert exit_.value.code == 0
    else:
        PARSERS[module]().parse_args(args)  # argparse exits 2 on anything it does not take


def test_the_make_targets_the_readme_names_exist():
    makefile = (REPO / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z0-9-]*):", makefile, re.MULTILINE))
    named = (set(re.findall(r"`make ([a-z][a-z0-9-]*)", README))
             | set(re.findall(r"^make ([a-z][a-z0-9-]*)", README, re.MULTILINE)))
    assert named and named <= targets, named - targets


def test_the_readme_stays_short():
    assert len(README.splitlines()) <= 220
