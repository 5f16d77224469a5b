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
_interrupted_while_importing = False


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
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
            return run_training(prepared, argv)
        except CsvSchemaError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        finally:
            prepared.lock.release()
    except KeyboardInterrupt:
        global _interrupted_while_importing
        _interrupted_while_importing = True
        print("interrupted before training started; nothing was trained", file=sys.stderr)
        return EXIT_SIGINT


def command() -> None:
    """The shell entry point (`python -m` and the console script)."""
    code = main()
    if _interrupted_while_importing:
        # A KeyboardInterrupt that passed through a C extension's PyRun_String while torch was
        # importing leaves CPython's "unhandled KeyboardInterrupt" flag set even though main()
        # caught it, and the interpreter would then kill itself with SIGINT at exit (status -2,
        # seen about 1 run in 15). Nothing was started yet, so skip the finalizer.
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
