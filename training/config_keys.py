"""A config key as a person writes it, and the error that names one.

`--set KEY=VALUE` on the command line (parse_assignment), a dotted key such as "lora.r" or
"heldout[0].draw" set into a TOML table (`_assign`), whether two keys overlap (key_overlaps), and
ConfigError with the wording of what a field allows (`_why`). training/config.py's one loader
(parse_config, load_config) applies them to RunConfig (training/config_schema.py); nothing here
knows that schema, so the schema and its loader import this module and never the reverse.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
import typing
from collections.abc import Sequence
from typing import Any

from agents.simulators.spec import one_of


class ConfigError(ValueError):
    """A run configuration that cannot be trained; `key` is the dotted key it names."""

    def __init__(self, message: str, key: str = ""):
        super().__init__(message)
        self.key = key


def key_overlaps(a: str, b: str) -> bool:
    """One dotted key is the other or inside it ("tasks" and "tasks.max_eval")."""
    short, long = sorted((a, b), key=len)
    return long == short or long.startswith((f"{short}.", f"{short}["))


def parse_assignment(text: str) -> tuple[str, Any]:
    """`key=value` from a command line: the value is read as TOML (3, 0.5, true, "x", [..]),
    and taken as a plain string when it is not one (`--set simulator.draw=uniform`)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"an override is KEY=VALUE (got {text!r})")
    try:
        value = tomllib.loads(f"value = {raw}")["value"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.strip(), value


_KEY = re.compile(r"[A-Za-z_]\w*(\[\d+\])*(\.[A-Za-z_]\w*(\[\d+\])*)*")
_PART = re.compile(r"([A-Za-z_]\w*)|\[(\d+)\]")


def _assign(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `dotted` (e.g. "lora.r", "heldout[0].draw") in a TOML table, making tables on the way."""
    if not _KEY.fullmatch(dotted):
        raise ConfigError(f"not a config key: {dotted!r}", dotted)
    parts = [name or int(index) for name, index in _PART.findall(dotted)]
    node: Any = data
    for i, part in enumerate(parts[:-1]):
        where = _dotted(parts[: i + 1])
        if isinstance(part, int):
            if not isinstance(node, list) or part >= len(node):
                raise ConfigError(f"{where} is not in this config", where)
            node = node[part]
        else:
            node = node.setdefault(part, {})
        if not isinstance(node, dict | list):
            raise ConfigError(f"{where} is not a table or an array in this config", where)
    last = parts[-1]
    if isinstance(last, int):
        if not isinstance(node, list) or last >= len(node):
            raise ConfigError(f"{dotted} is not in this config", dotted)
        node[last] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise ConfigError(f"{dotted} is not a key of a table", dotted)


# -- errors that name the key, the value and what is allowed ------------------------------------


def _dotted(loc: Sequence[str | int]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _table(annotation: Any) -> type | None:
    """The config dataclass a field holds (itself, or the items of a list of them)."""
    if dataclasses.is_dataclass(annotation):
        return annotation
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is list and args and dataclasses.is_dataclass(args[0]):
        return args[0]
    return None


def _bounds(info: Any) -> str:
    signs = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}
    out = []
    for item in info.metadata:
        for attr, sign in signs.items():
            if getattr(item, attr, None) is not None:
                out.append(f"{sign} {getattr(item, attr)}")
    return " and ".join(out)


_TYPES = {
    "int_type": "int",
    "float_type": "float",
    "bool_type": "bool",
    "string_type": "str",
    "dataclass_type": "a table",
}


def _why(error: dict[str, Any], info: Any) -> str:
    kind = error["type"]
    if kind == "literal_error" and info is not None:
        options = typing.get_args(info.annotation)
        if len(options) == 1 and typing.get_origin(options[0]) is typing.Literal:  # list[Literal]
            options = typing.get_args(options[0])
        return f"must be one of {one_of(options)}"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return f"must be {_bounds(info)}" if info is not None else error["msg"]
    if kind in _TYPES:
        return f"must be {_TYPES[kind]}"
    if kind == "list_type":
        holds = _table(info.annotation) if info is not None else None
        return "must be an array of tables" if holds else "must be a list of strings"
    if kind == "too_short":
        return "must not be empty"
    return error["msg"]
