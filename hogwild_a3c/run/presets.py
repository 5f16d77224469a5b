"""Presets: the algorithm's defaults as data, one JSON file per preset in `hogwild_a3c/presets/`.

A run's settings are resolved once, before any process starts, in this order (later wins):

1. the `Config` dataclass defaults: universe's algorithm (universe-starter-agent on Atari);
2. a preset: `--preset NAME`, or with `--preset auto` (the default) the env's own file
   `presets/<env id>.json` if the package has one, else `atari` for Atari frames, `continuous` for
   Box actions, `grid` for small grid images (MiniGrid) and `vector` for the rest;
3. `--config FILE`, a user's JSON file of settings (it may name a `"preset"` to start from);
4. the flags given on the command line.

The resolved values, with the preset's name, are written to config.json, so `--resume` and
`evaluate` reproduce them without looking at presets again. A preset file is a JSON object of
`Config` fields from `config.PRESET_FIELDS`, plus optional `"base"` (a preset it extends) and
`"about"` (a sentence for people). Any problem is one line naming the file or flag.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from ..config import FIELD_TYPES, PRESET_FIELDS, RENAMED, Config, typed_values, with_current_names
from ..files.atomic import read_json_data

PRESET_DIR = Path(__file__).resolve().parent.parent / "presets"  # beside the entry points: the files users read
META_KEYS = {"base", "about"}


def available() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def env_preset_name(env_id: str) -> str:
    """The file name an env's own preset would have: its id without any `module:` prefix, with
    characters other than letters, digits, `_.-` replaced by `_` (ALE/Pong-v5 -> ALE_Pong-v5)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", env_id.partition(":")[2] or env_id)


_PICKED: dict[str, tuple[str, str]] = {}  # by env id and kwargs: the env is made once a process, not per question


def auto_preset(env_id: str, env_kwargs: Any = None) -> tuple[str, str]:
    """The preset `--preset auto` picks for an env, and why (for train.log): the env's own preset
    if there is one; else by the env's family: `atari` for Atari frames, `continuous` for Box
    actions, `grid` for an observation holding a small grid image (MiniGrid's), `vector` for the
    rest. Only the spaces are read (the env is made and closed)."""
    key = repr((env_id, env_kwargs))
    if key not in _PICKED:
        _PICKED[key] = _pick(env_id, env_kwargs)
    return _PICKED[key]


def _pick(env_id: str, env_kwargs: Any) -> tuple[str, str]:
    own = env_preset_name(env_id)
    if (PRESET_DIR / f"{own}.json").is_file():
        return own, "the env's own preset file"
    from ..envs.atari import is_atari
    from ..envs.make import _import_env_module, _route_mujoco_warnings, parse_env_kwargs
    from ..envs.observations import has_small_grid
    from ..learning.distributions import Gaussian

    try:
        name = _import_env_module(env_id)
        if is_atari(name):
            return "atari", "Atari frames"
        kwargs = env_kwargs if isinstance(env_kwargs, dict) else parse_env_kwargs(env_kwargs or [])
        import gymnasium

        _route_mujoco_warnings(name)
        env = gymnasium.make(name, **kwargs)
        try:
            if Gaussian.takes(env.action_space):
                return "continuous", "Box actions, drawn from a Gaussian"
            if has_small_grid(env.observation_space):
                return "grid", "a small grid image in the observation"
            return "vector", "observations other than Atari frames or small grids, and actions that are not a Box"
        finally:
            env.close()
    except Exception:  # noqa: BLE001 - an unknown id or a bad kwarg is reported by describe_env, with its own line
        return "vector", "the env could not be made to look at (describe_env says why)"


def preset_line(cfg: Config) -> str:
    """train.log's line on where the run's settings came from."""
    picked, why = auto_preset(cfg.env, cfg.env_kwargs)
    if cfg.preset == picked:
        return f"settings from preset {cfg.preset} (what --preset auto picks for {why}), then --config and flags"
    return (f"settings from preset {cfg.preset} as asked (--preset auto would pick {picked}, for {why}), then "
            "--config and flags")


def _check_values(values: dict[str, Any], allowed: set[str], where: str) -> tuple[dict[str, Any], list[str]]:
    """The known settings, typed as their fields; one line per unknown key or value of the wrong type."""
    errors, known = [], {}
    for key, value in values.items():
        if key in META_KEYS:
            continue
        if key not in allowed:
            what = ("a preset may set only " + ", ".join(sorted(allowed)) if allowed is PRESET_FIELDS
                    else "not a setting")
            errors.append(f"{where}: unknown or disallowed key {key!r} ({what})")
        else:
            known[key] = value
    typed, type_errors = typed_values(known, where)
    return typed, errors + type_errors


def _read_json(path: Path, where: str) -> tuple[dict[str, Any], list[str]]:
    try:
        data = read_json_data(path, follow=True)
    except OSError as exc:
        return {}, [f"{where}: cannot read it ({exc.strerror or exc})"]
    except ValueError as exc:
        return {}, [f"{where}: not valid JSON ({exc})"]
    if not isinstance(data, dict):
        return {}, [f"{where}: must hold a JSON object of settings (got {type(data).__name__})"]
    return data, []


def load_preset(name: str, _seen: tuple[str, ...] = ()) -> tuple[dict[str, Any], list[str]]:
    """The settings of preset `name` with its bases applied (base first)."""
    name = RENAMED.get(name, name)
    path = PRESET_DIR / f"{name}.json"
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or not path.is_file():
        return {}, [f"--preset {name}: no such preset (available: auto, {', '.join(available())})"]
    if name in _seen:
        return {}, [f"preset {name}: its \"base\" chain loops ({' -> '.join((*_seen, name))})"]
    data, errors = _read_json(path, f"preset file {path}")
    own, value_errors = _check_values(data, PRESET_FIELDS, f"preset file {path}")
    errors += value_errors
    values: dict[str, Any] = {}
    if "base" in data and not errors:
        values, errors = load_preset(str(data["base"]), (*_seen, name))
    values.update(own)
    return values, errors


def read_config_file(path: str) -> tuple[dict[str, Any], list[str]]:
    """A user's `--config FILE`: any setting but `config` itself; keys may use - or _."""
    where = f"--config {path}"
    data, errors = _read_json(Path(path), where)
    data = with_current_names({str(k).replace("-", "_"): v for k, v in data.items()})
    allowed = set(FIELD_TYPES) - {"config"}
    values, value_errors = _check_values({k: v for k, v in data.items() if k != "about"}, allowed, where)
    return values, errors + value_errors


def resolve(given: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Flags given on the command line -> every setting that differs from the dataclass
    defaults, from the preset, the config file and the flags, with `preset` set to the name of
    the preset actually applied (never "auto")."""
    errors: list[str] = []
    from_file: dict[str, Any] = {}
    if given.get("config") is not None:
        from_file, errors = read_config_file(given["config"])
    env = given.get("env", from_file.get("env", Config.env))
    name = given.get("preset", from_file.get("preset", "auto"))
    if name == "auto":
        name, _ = auto_preset(env if isinstance(env, str) else Config.env,
                              given.get("env_kwargs", from_file.get("env_kwargs")))
    for flag, value in (("--preset", name), ("--frame", given.get("frame", from_file.get("frame")))):
        if value in RENAMED:
            print(f"note: {flag} {value} is called {RENAMED[value]} now (the reference, universe-starter-agent, "
                  "apart from --seed); the old name still works", file=sys.stderr)
    name = RENAMED.get(name, name)
    preset_values, preset_errors = load_preset(name)
    errors += preset_errors
    return {**preset_values, **from_file, **given, "preset": name}, errors
