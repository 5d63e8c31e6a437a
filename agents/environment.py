"""The register of every environment variable parley reads, and the one module that reads the
environment. Each variable is declared at module level where it is read, with what it takes,
its default and what it means; docs/configuration.md is written from this register
(`python -m parley.configuration_doc`), and a test fails on a read that bypasses it.

No Django here: training machines import this too. Django's settings turn InvalidSetting into
ImproperlyConfigured (platform/parley/settings.py).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import environs

KINDS = ("str", "int", "float", "bool", "names", "path", "url", "choice")

# Parsed one way, everywhere: environs (marshmallow's fields and validators) rather than int()
# or float() (an error that names no variable) or `== "1"` (any other yes read as no).
_environment = environs.Env()


@_environment.parser_for("names")
def _names(value: str) -> tuple[str, ...]:
    """A comma-separated list, each name stripped, empty ones dropped."""
    return tuple(part.strip() for part in value.split(",") if part.strip())


class InvalidSetting(ValueError):
    """A variable set to something it does not take: names the variable, the rule and the value."""


_NOT_GIVEN: Any = object()


@dataclass(frozen=True)
class Setting:
    """One environment variable: `kind` is how it is parsed, `least`/`most` inclusive bounds,
    `above` an exclusive lower bound, `choices` what a "choice" may be. `shown_default` is how
    the docs show a default worked out when it is read (from another variable, or the data
    folder), which the reader passes to read(default=...)."""

    name: str
    kind: str
    default: Any
    help: str
    module: str
    least: float | None = None
    most: float | None = None
    above: float | None = None
    choices: tuple[str, ...] | None = None
    shown_default: str | None = None

    def is_set(self) -> bool:
        """Whether the variable is in the environment at all (blank included)."""
        return self.name in os.environ

    def raw(self) -> str | None:
        """The text as set, None when unset: for a rule about the text itself (a blank value)."""
        return os.environ.get(self.name)

    def read(self, default: Any = _NOT_GIVEN) -> Any:
        """The variable parsed as its kind, or the default when it is unset or blank (a `NAME=`
        line left in an env file), except that a blank list is the empty one. A value that is
        not of its kind, or outside its bounds, raises InvalidSetting."""
        if default is _NOT_GIVEN:
            default = self.default
        raw = os.environ.get(self.name)
        if raw is None:
            return default
        if not raw.strip():
            return () if self.kind == "names" else default
        if self.kind == "path":
            return Path(raw)
        if self.kind == "url":
            scheme, separator, rest = raw.partition("://")
            if not (scheme and separator and rest):
                raise self._invalid(raw)
            return raw
        rules = []
        if self.least is not None or self.most is not None:
            rules.append(environs.validate.Range(min=self.least, max=self.most))
        if self.above is not None:
            rules.append(environs.validate.Range(min=self.above, min_inclusive=False))
        if self.choices is not None:
            rules.append(environs.validate.OneOf(self.choices))
        parse = getattr(_environment, "str" if self.kind == "choice" else self.kind)
        try:
            return parse(self.name, **({"validate": rules} if rules else {}))
        except environs.EnvError:
            raise self._invalid(raw) from None

    def expects(self) -> str:
        """What the variable takes, in words: "a whole number of 1 or more"."""
        if self.choices is not None:
            return "one of " + ", ".join(self.choices)
        expected = {
            "int": "a whole number",
            "float": "a number",
            "bool": "a yes or no: 1/0, true/false, yes/no or on/off",
            "names": "a comma-separated list",
            "path": "a path",
            "url": "a URL (scheme://...)",
        }.get(self.kind, "text")
        if self.least is not None and self.most is not None:
            return f"{expected} from {_number(self.least)} to {_number(self.most)}"
        if self.least is not None:
            return f"{expected} of {_number(self.least)} or more"
        if self.most is not None:
            return f"{expected} of {_number(self.most)} or less"
        if self.above is not None:
            return f"{expected} above {_number(self.above)}"
        return expected

    def _invalid(self, raw: str) -> InvalidSetting:
        return InvalidSetting(f"{self.name} must be {self.expects()} (got {raw!r}).")


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


REGISTER: dict[str, Setting] = {}


def setting(
    name: str,
    kind: str,
    default: Any,
    *,
    help: str,
    least: float | None = None,
    most: float | None = None,
    above: float | None = None,
    choices: tuple[str, ...] | None = None,
    shown_default: str | None = None,
) -> Setting:
    """Declare the variable `name`, read in the calling module, and return it (read it with
    .read()). A variable is declared once, by the module that reads it; the same module
    declaring it again (a reload) replaces its entry."""
    if kind not in KINDS:
        raise ValueError(f"{name}: kind {kind!r} is not one of {', '.join(KINDS)}")
    if (kind == "choice") != (choices is not None):
        raise ValueError(f"{name}: a choice, and only a choice, names its choices")
    caller = sys._getframe(1).f_globals
    # `python -m training` runs training/__main__.py as "__main__": its own name is the spec's.
    spec = caller.get("__spec__")
    module = spec.name if spec is not None else caller["__name__"]
    declared = Setting(
        name, kind, default, help, module, least, most, above, choices, shown_default
    )
    earlier = REGISTER.get(name)
    if earlier is not None and earlier.module != module:
        raise ValueError(f"{name} is declared twice: in {earlier.module} and in {module}")
    REGISTER[name] = declared
    return declared


def named(name: str) -> str | None:
    """The variable a config or an arm names (an API key's variable: the name is data, so it
    cannot be declared), None when unset or empty."""
    return os.environ.get(name) or None
