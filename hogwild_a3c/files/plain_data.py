"""Data read from files (a run's config.json, a checkpoint, --config) is data: `shown` writes any
value into a message in a bounded, escaped form, and `env_kwargs_problem` checks --env-kwargs as
plain data of a bounded size before gymnasium or an env sees them. Imports nothing of the package,
so the config can use it at the bottom of the house."""
from __future__ import annotations

import reprlib
from typing import Any

SHOWN_CHARS = 80


# A bounded repr: a crafted value (a list nested 40 deep whose levels share one list) has a
# plain repr of exponential length; this one looks at a few levels and items only.
_BOUNDED_REPR = reprlib.Repr()  # keyword arguments only from Python 3.12
for _name, _bound in {"maxlevel": 3, "maxlist": 6, "maxtuple": 6, "maxdict": 6, "maxset": 6,
                      "maxstring": SHOWN_CHARS, "maxother": SHOWN_CHARS, "maxlong": 40}.items():
    setattr(_BOUNDED_REPR, _name, _bound)


def shown(value: Any, limit: int = SHOWN_CHARS) -> str:
    """`value` as it may go into a message or a log line: a bounded repr, so a newline or a
    terminal escape read from a file is written as `\\n`, `\\x1b`, in at most `limit` characters."""
    text = _BOUNDED_REPR.repr(value).encode("ascii", "backslashreplace").decode()
    return text if len(text) <= limit else text[:limit - 3] + "..."


# env_kwargs come from files too (config.json, a checkpoint, --config): a crafted value must be
# refused before gymnasium formats it into a message (a list whose 40 levels share one list has
# a repr of 2**40 items) or an env is built from it.
MAX_ENV_KWARGS_DEPTH = 8
MAX_ENV_KWARGS_VALUES = 10_000
MAX_ENV_KWARGS_STRING = 10_000


def env_kwargs_problem(kwargs: Any) -> str | None:
    """Why `kwargs` is not plain data of a bounded size (numbers, strings, booleans, null,
    lists and string-keyed objects, at most 8 levels deep), or None."""
    budget = [MAX_ENV_KWARGS_VALUES]  # counts every visit, so a value shared by many levels counts each time

    def walk(value: Any, depth: int) -> str | None:
        budget[0] -= 1
        if budget[0] < 0:
            return f"holds more than {MAX_ENV_KWARGS_VALUES:,} values"
        if depth > MAX_ENV_KWARGS_DEPTH:
            return f"is nested more than {MAX_ENV_KWARGS_DEPTH} levels deep"
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    return f"has the key {shown(key)}, not a string"
                problem = walk(item, depth + 1)
                if problem:
                    return problem
        elif isinstance(value, (list, tuple)):
            for item in value:
                problem = walk(item, depth + 1)
                if problem:
                    return problem
        elif isinstance(value, str) and len(value) > MAX_ENV_KWARGS_STRING:
            return f"holds a string of {len(value):,} characters (at most {MAX_ENV_KWARGS_STRING:,})"
        elif value is not None and not isinstance(value, (str, bool, int, float)):
            return (f"holds {shown(value)}, a {type(value).__name__}; values are numbers, strings, true/false, null, "
                    "lists and objects")
        return None

    return walk(kwargs, 0)
