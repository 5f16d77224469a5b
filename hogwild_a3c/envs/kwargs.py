"""What `--env-kwargs` may hold. They come from files too (config.json, a checkpoint, --config): a
crafted value must be refused before gymnasium formats it into a message (a list whose 40 levels
share one list has a repr of 2**40 items) or an env is built from it."""
from __future__ import annotations

from typing import Any

from ..files.atomic import shown

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
