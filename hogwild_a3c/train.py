"""`python -m hogwild_a3c.train`: train an A3C agent (see `--help`).

This module stays light so that Ctrl-C while the heavy modules import (torch alone takes a
second or two) ends with one line and exit status 130 instead of a traceback. The main process
itself is `run/prepare.py` (the checks) and `run/session.py` (the run). Exit status: 0 when a budget or
the target was reached (or a callback stopped it, or the nodes of a multi-node run left this one
out), 1 on a failure, 2 on bad input, 130 after SIGINT, 143 after SIGTERM.
"""
from __future__ import annotations

import os
import signal
import sys
import types

from .run.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_SIGINT, EXIT_USAGE


def main(argv: list[str] | None = None) -> int:
    return _train(argv)[0]


def _train(argv: list[str] | None) -> tuple[int, bool]:
    """The exit status, and whether Ctrl-C came before the run began."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # Until the run begins, Ctrl-C is only recorded and acted on between steps: a KeyboardInterrupt
    # raised inside a C extension's import can surface as an unrelated error (a TypeError out of
    # `_ssl` was seen here) or leave CPython's "unhandled KeyboardInterrupt" flag set.
    pressed: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: pressed.append(signum))
    session = None
    try:
        from .files.logs import CsvSchemaError
        from .files.rundir import ConfigError
        from .nodes.admission import AdmissionTimeout, NotAdmitted
        from .run.prepare import prepare
        from .run.session import Session
    except BaseException:  # a broken install: its own traceback, not one about ConfigError being unbound
        signal.signal(signal.SIGINT, previous)
        raise
    try:
        if not pressed:
            session = Session(prepare(argv, interrupted=lambda: bool(pressed)), argv)
    except ConfigError as exc:
        for line in exc.errors:
            print(f"error: {line}", file=sys.stderr)
        return EXIT_USAGE, False
    except NotAdmitted as exc:  # exit 0: torchrun would restart a failed node into the same refusal
        print(f"refused: {exc}", file=sys.stderr)
        return EXIT_OK, False
    except AdmissionTimeout as exc:  # a node that never came to the start: torchrun restarts every node
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED, False
    except KeyboardInterrupt:
        if not pressed:
            raise
        print("interrupted before training started; nothing was trained", file=sys.stderr)
        return EXIT_SIGINT, True
    finally:
        signal.signal(signal.SIGINT, previous)
    if pressed:
        if session is not None:
            session.abandon()
        print("interrupted before training started; nothing was trained", file=sys.stderr)
        return EXIT_SIGINT, True
    assert session is not None  # not pressed, so prepare() ran to its end
    try:
        return session.run().exit_code, False  # the session releases the lock on every way out
    except CsvSchemaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE, False
    except KeyboardInterrupt:  # before the session put in its own handlers
        print("interrupted before training started; nothing was trained", file=sys.stderr)
        return EXIT_SIGINT, False


def command() -> None:
    """The shell entry point (`python -m` and the console script)."""
    code, interrupted_before_the_run = _train(None)
    if interrupted_before_the_run:
        # Nothing was started. A Ctrl-C that reached the interpreter before our handler (while a C
        # extension ran Python code) could have left CPython's "unhandled KeyboardInterrupt" flag
        # set, which makes it kill itself with SIGINT at exit (status -2): skip the finalizer.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


class _CallableModule(types.ModuleType):
    """`hogwild_a3c.train(env=..., max_steps=...)` from Python runs the same training and returns
    a `TrainResult` (`api.train`); this module is also the command."""

    def __call__(self, *args, **kwargs):
        from .api import train

        return train(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    command()
