"""The KV cache keyword of the installed transformers: `cache` from 5.x (5.40 drops
`past_key_values`), `past_key_values` before it. Read once per model class from its forward;
the embedded engine and training's forwards both ask here."""

from __future__ import annotations

import functools
import inspect
from typing import Any


def cache_keyword(model: Any) -> str:
    """The name under which `model`'s forward takes a KV cache."""
    return _cache_keyword(type(_unwrapped(model)))


def cache_arg(model: Any, cache: Any) -> dict[str, Any]:
    """The keyword argument that hands `cache` to `model`'s forward."""
    return {cache_keyword(model): cache}


def cache_of(out: Any) -> Any:
    """The KV cache a forward returned (`out.cache`, or `out.past_key_values` before 5.x)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


@functools.cache
def _cache_keyword(model_class: type) -> str:
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def _unwrapped(model: Any) -> Any:
    """The transformers model inside peft's and torch's wrappers (their forward takes **kwargs)."""
    while True:
        if hasattr(model, "get_base_model"):  # peft
            model = model.get_base_model()
        elif hasattr(model, "module") and callable(model.module):  # FSDP, DDP
            model = model.module
        else:
            return model
