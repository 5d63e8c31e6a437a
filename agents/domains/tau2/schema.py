"""Record shapes for the tau2 databases and the values tools build from agent arguments.

tau2-bench keeps its DBs as pydantic models and hashes `model_dump()`. We keep plain dicts in
that same canonical form (every declared field, in declared order, missing optionals as None,
numbers coerced the way pydantic's lax mode coerces them), so our hash of a DB is the official one
and `--dump-db` writes files in the official schema.
"""

from __future__ import annotations

import math
from typing import Any


class Shape:
    def __call__(self, value: Any, path: str = "value") -> Any:
        raise NotImplementedError


def _fail(path: str, expected: str, value: Any) -> ValueError:
    return ValueError(f"{path}: expected {expected}, got {type(value).__name__} {value!r:.60}")


class Str(Shape):
    def __call__(self, value, path="value"):
        if isinstance(value, str):
            return value
        if isinstance(value, bytes):
            return value.decode()
        raise _fail(path, "a string", value)


class Int(Shape):
    """bool, integral float and numeric strings are accepted, like pydantic's lax int."""

    def __call__(self, value, path="value"):
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            if math.isfinite(value) and value.is_integer():
                return int(value)
            raise _fail(path, "a whole number", value)
        if isinstance(value, str):
            text = value.strip()
            try:
                return int(text)
            except ValueError:
                pass
            head, dot, tail = text.partition(".")
            if dot and head.lstrip("+-").isdigit() and set(tail) <= {"0"}:
                return int(head)
        raise _fail(path, "an integer", value)


class Float(Shape):
    def __call__(self, value, path="value"):
        if isinstance(value, float):
            return value
        if isinstance(value, int):
            try:
                return float(value)
            except OverflowError:
                raise _fail(path, "a number", value) from None
        if isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                pass
        raise _fail(path, "a number", value)


class Bool(Shape):
    def __call__(self, value, path="value"):
        if isinstance(value, bool):
            return value
        if value in (0, 1):
            return bool(value)
        raise _fail(path, "true or false", value)


class OneOf(Shape):
    """A string literal (pydantic Literal[...])."""

    def __init__(self, *choices: str):
        self.choices = choices

    def __call__(self, value, path="value"):
        if isinstance(value, str) and value in self.choices:
            return value
        raise ValueError(
            f"{path}: expected one of {', '.join(map(repr, self.choices))}, got {value!r:.60}"
        )


class Maybe(Shape):
    def __init__(self, shape: Shape):
        self.shape = shape

    def __call__(self, value, path="value"):
        return None if value is None else self.shape(value, path)


class ListOf(Shape):
    def __init__(self, shape: Shape):
        self.shape = shape

    def __call__(self, value, path="value"):
        if not isinstance(value, list | tuple):
            raise _fail(path, "a list", value)
        return [self.shape(item, f"{path}[{i}]") for i, item in enumerate(value)]


class DictOf(Shape):
    def __init__(self, shape: Shape, key: Shape | None = None):
        self.shape, self.key = shape, key or Str()

    def __call__(self, value, path="value"):
        if not isinstance(value, dict):
            raise _fail(path, "an object", value)
        return {self.key(k, path): self.shape(v, f"{path}[{k!r}]") for k, v in value.items()}


REQUIRED = object()


class Record(Shape):
    """A pydantic model: fields in declared order; unknown keys are dropped (or refused when
    `strict`, like tau2's top-level DB models)."""

    def __init__(self, name: str, *fields: tuple, strict: bool = False):
        self.name = name
        self.fields = [(f[0], f[1], f[2] if len(f) > 2 else REQUIRED) for f in fields]
        self.strict = strict

    def __call__(self, value, path=None):
        path = path or self.name
        if not isinstance(value, dict):
            raise _fail(path, f"a {self.name} object", value)
        if self.strict:
            extra = set(value) - {f[0] for f in self.fields}
            if extra:
                raise ValueError(f"{path}: unknown field(s) {', '.join(sorted(map(str, extra)))}")
        out = {}
        for name, shape, default in self.fields:
            if name in value:
                out[name] = shape(value[name], f"{path}.{name}")
            elif default is REQUIRED:
                raise ValueError(f"{path}: missing field {name!r}")
            else:
                out[name] = default
        return out


class Tagged(Shape):
    """A union of records told apart by one literal field (payment `source`, flight `status`)."""

    def __init__(self, tag: str, variants: dict[str, Record]):
        self.tag, self.variants = tag, variants

    def __call__(self, value, path="value"):
        tag = value.get(self.tag) if isinstance(value, dict) else None
        if tag not in self.variants:
            raise ValueError(
                f"{path}: {self.tag} must be one of {', '.join(self.variants)}, got {tag!r:.40}"
            )
        return self.variants[tag](value, path)


STR, INT, FLOAT, BOOL = Str(), Int(), Float(), Bool()


def each_record(value: Any, shape: Record) -> list[dict] | None:
    """tau2 tools turn a list argument into models only when every item is an object; otherwise
    the raw value travels on and fails (or is stored) later. None means "left raw"."""
    items = list(value)  # not iterable: TypeError, as in tau2
    if all(isinstance(item, dict) for item in items):
        return [shape(item, f"{shape.name}[{i}]") for i, item in enumerate(items)]
    return None
