"""The command line of `python -m hogwild_a3c.train`: one flag per `Config` field, in the groups
the fields declare, with each field's help (so `--help` never drifts from the config)."""
from __future__ import annotations

import argparse
import dataclasses
import re

from ..config import FIELD_TYPES, OWN_KEYS, PRESET_FIELDS, Config, flag_name


def help_groups() -> list[str]:
    """The `--help` groups' titles, in the order their first fields are declared."""
    return list(dict.fromkeys(f.metadata["group"] for f in dataclasses.fields(Config)))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hogwild_a3c.train",
        description="Train an A3C agent with lock-free (Hogwild) workers sharing one model.",
        argument_default=argparse.SUPPRESS,  # so that flags the user actually gave can be told apart
        allow_abbrev=False,  # `--envs 4` must not quietly mean `--envs-per-worker 4`
    )
    groups = {title: parser.add_argument_group(title) for title in help_groups()}
    for f in dataclasses.fields(Config):
        group = groups[f.metadata["group"]]
        kwargs = {k: v for k, v in f.metadata.items() if k not in OWN_KEYS}
        help_text = f.metadata["help"]
        type_ = FIELD_TYPES[f.name][0]
        if type_ is bool:
            negatable = kwargs.pop("negatable", False)
            action = argparse.BooleanOptionalAction if negatable else "store_true"
            group.add_argument(flag_name(f.name), action=action,
                               help=help_text + (" (default: from the preset)" if f.name in PRESET_FIELDS else ""))
            continue
        type_ = str if type_ is dict else type_
        metavar = kwargs.pop("metavar", "KEY=VALUE" if f.name == "env_kwargs" else None)
        if not re.search(r"\bdefault\b", help_text):  # unless the help already tells its default
            default_text = "none" if f.default is None else f.default
            if f.name in PRESET_FIELDS:
                help_text += f" (universe's default: {default_text}; presets may set it)"
            else:
                help_text += f" (default: {default_text})"
        group.add_argument(flag_name(f.name), type=type_, metavar=metavar, help=help_text, **kwargs)
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its latest checkpoint")
    return parser
