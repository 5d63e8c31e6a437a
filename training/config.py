"""Loading a run config: a config enters only through `parse_config` (the TOML loader
`load_config`, the CLI's `--set` overrides and the admin's TrainingRun all call it).

RunConfig itself, each field declared once with its help and bounds beside it, is in
training/config_schema.py, below this. parse_config validates a table against those fields;
unknown keys and bad values raise ConfigError naming the key, the value and what is allowed,
so a typo never trains silently with a default. ConfigError, the dotted keys of overrides and
the wording of what a field allows are in training/config_keys.py, below both.
"""

from __future__ import annotations

import copy
import difflib
import json
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from training.config_keys import ConfigError, _assign, _dotted, _table, _why, key_overlaps

# Registered experiments' hashed code imports these from here (training/collapse3/runner.py:
# RunConfig, load_config, BehaviourSpec; training/collapse3/equilibrium.py: load_config;
# training/collapse2/flat_prior.py: LoraSpec), and those files' bytes may not change. Everything
# else imports the schema from training.config_schema.
from training.config_schema import BehaviourSpec, LoraSpec, RunConfig

__all__ = ["BehaviourSpec", "LoraSpec", "RunConfig", "load_config", "parse_config"]


# -- the one loader -----------------------------------------------------------------------------

_RUN = TypeAdapter(RunConfig)


def parse_config(data: Mapping[str, Any], overrides: Mapping[str, Any] | None = None) -> RunConfig:
    """The one way a run config enters: a TOML table (a file, a preset, the admin's fields) with
    `overrides` applied (keys dotted into tables, e.g. {"lora.r": 4, "heldout[0].draw": ...};
    a plain key replaces its whole value), validated against the declared fields."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"config must be a table (got {data!r})")
    data = copy.deepcopy(dict(data))
    for key, value in (overrides or {}).items():
        _assign(data, key, value)
    try:
        return _RUN.validate_python(data)
    except ValidationError as error:
        raise _config_error(error) from None


def load_config(path: str | Path, overrides: Mapping[str, Any] | None = None) -> RunConfig:
    """Read a TOML file into a validated RunConfig (see parse_config for `overrides`)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no config file at {path}")
    try:
        # .json: a RunConfig.to_dict() written out (how the TrainingRun's task hands a run to
        # the launcher)
        data = (
            json.loads(path.read_text())
            if path.suffix == ".json"
            else tomllib.loads(path.read_text())
        )
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not valid {path.suffix[1:].upper()}: {exc}") from exc
    try:
        return parse_config(data, overrides)
    except ConfigError as exc:
        if any(key_overlaps(exc.key, key) for key in overrides or {}):
            raise  # the override is wrong, not the file
        raise ConfigError(f"{path}: {exc}", exc.key) from exc


# -- errors that name the key, the value and what is allowed ------------------------------------


def _field_at(loc: Sequence[str | int]) -> tuple[type | None, Any]:
    """The table holding the last key of `loc`, and that key's FieldInfo (None if unknown)."""
    table: type | None = RunConfig
    info = None
    for part in loc:
        if isinstance(part, int):
            continue
        info = table.__pydantic_fields__.get(part) if table is not None else None
        if info is None:
            return table, None
        table = _table(info.annotation)
    return table, info


def _config_error(error: ValidationError) -> ConfigError:
    messages, keys, missing = [], [], []
    for e in error.errors():
        loc, kind = e["loc"], e["type"]
        if kind == "missing":
            missing.append(_dotted(loc))
            continue
        if kind == "unexpected_keyword_argument":
            table, _ = _field_at(loc[:-1])
            known = sorted(table.__pydantic_fields__) if table is not None else []
            close = difflib.get_close_matches(str(loc[-1]), known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            key = _dotted(loc)
            messages.append(
                f"unknown key {key!r}{hint} (got {e['input']!r}; known: {', '.join(known)})"
            )
        elif kind == "rule":
            ctx = e["ctx"]
            key = _dotted([*loc, ctx["key"]])
            messages.append(f"{key} {ctx['why']} (got {ctx['value']!r})")
        else:
            key = _dotted(loc)
            messages.append(f"{key} {_why(e, _field_at(loc)[1])} (got {e['input']!r})")
        keys.append(key)
    if missing:
        keys.append(missing[0])
        messages.append(f"missing required key(s): {', '.join(missing)}")
    return ConfigError("; ".join(messages), keys[0] if keys else "")
