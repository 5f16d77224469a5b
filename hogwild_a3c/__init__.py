"""hogwild_a3c: a Hogwild A3C trainer in PyTorch.

From Python: `train(..., callbacks=[...])` (objects with `Callback`'s methods), `resolve_config(...)`,
`load_policy(path)`, `evaluate(path)` (see `api.py`); `Config` lists every setting. Attributes
load on first use, so that `python -m hogwild_a3c.train` starts light.
"""

__version__ = "0.1.0"
__all__ = ["Callback", "Config", "Policy", "TrainResult", "evaluate", "load_policy", "resolve_config", "train"]


def __getattr__(name: str):
    import importlib

    if name in ("train", "evaluate"):  # callable modules: the command and the function in one
        return importlib.import_module(f"{__name__}.{name}")
    if name in ("load_policy", "Policy", "TrainResult", "resolve_config"):
        return getattr(importlib.import_module(f"{__name__}.api"), name)
    if name == "Callback":
        return importlib.import_module(f"{__name__}.run.callbacks").Callback
    if name == "Config":
        return importlib.import_module(f"{__name__}.config").Config
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
