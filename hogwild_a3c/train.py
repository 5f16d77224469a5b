"""`python -m hogwild_a3c.train`: train an A3C agent (see `--help`).

This module stays light so that Ctrl-C while the heavy modules import (torch alone takes a
second or two) ends with one line and exit status 130 instead of a traceback. The main process
itself is `training.py`. Exit status: 0 when a budget or the target was reached, 1 on a
failure, 2 on bad input, 130 after SIGINT, 143 after SIGTERM.
"""
from __future__ import annotations

import os
import sys
import types

EXIT_USAGE, EXIT_SIGINT = 2, 130
_interrupted_before_the_run = False


def main(argv: list[str] | None = None) -> int:
    global _interrupted_before_the_run
    argv = list(sys.argv[1:] if argv is None else argv)
    running = False  # run_training has begun: from here files are open and must be flushed
    try:
        from .logs import CsvSchemaError
        from .rundir import ConfigError
        from .training import prepare, run_training

        try:
            prepared = prepare(argv)
        except ConfigError as exc:
            for line in exc.errors:
                print(f"error: {line}", file=sys.stderr)
            return EXIT_USAGE
        try:
            running = True
            return run_training(prepared, argv)
        except CsvSchemaError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        finally:
            prepared.lock.release()
    except KeyboardInterrupt:
        _interrupted_before_the_run = not running
        print("interrupted before training started; nothing was trained", file=sys.stderr)
        return EXIT_SIGINT


def command() -> None:
    """The shell entry point (`python -m` and the console script)."""
    code = main()
    if _interrupted_before_the_run:
        # A KeyboardInterrupt that passed through a C extension's PyRun_String while torch was
        # importing leaves CPython's "unhandled KeyboardInterrupt" flag set even though main()
        # caught it, and the interpreter would then kill itself with SIGINT at exit (status -2,
        # seen about 1 run in 15). No run had begun (prepare writes only whole files), so
        # skipping the finalizer loses nothing.
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
