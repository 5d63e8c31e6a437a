"""Hosted model providers, declared once: how each is recognised, and how a chat request is
shaped on its way out to it (LLMClient does the shaping, on every call).

Callers speak one vocabulary, the OpenAI chat API's common parameters: `temperature`, `top_p`,
`max_tokens` (the reply's token cap), `reasoning_effort` ("" or None = not sent) and
`response_format`. Each Provider says what its API does with them:

    openai-reasoning  api.openai.com, GPT-5 family and o-series: the cap is
                      `max_completion_tokens` (it also counts the hidden reasoning tokens);
                      `temperature` and `top_p` are not sent (these models answer HTTP 400 to any
                      temperature but 1, and to top_p); `reasoning_effort` is sent
    openai            api.openai.com, other chat models: `max_completion_tokens` (OpenAI's name
                      now; `max_tokens` is deprecated); no `reasoning_effort` (400)
    anthropic         api.anthropic.com/v1 (OpenAI-compatible layer): `response_format` and
                      `reasoning_effort` are ignored there (documented), so choice turns are read
                      from the text and re-asked; temperature is capped at 1
    gemini            generativelanguage.googleapis.com/v1beta/openai: enforces json_schema and
                      takes `reasoning_effort`
    openrouter        openrouter.ai/api/v1, the release's gateway for most of its panel: the
                      routed model decides whether `response_format` holds, so it is not trusted;
                      effort goes as `reasoning: {"effort": ...}` (OpenRouter's own form)
    generic           vLLM, the embedded engine, any other OpenAI-compatible server: everything
                      passes as given (vLLM enforces response_format by guided decoding)

"auto" picks the first provider whose host and model pattern match, else generic. Sources:
OpenAI's reasoning-model guide and error bodies; docs.anthropic.com/en/api/openai-sdk (the
field table); ai.google.dev/gemini-api/docs/openai; openrouter.ai/docs (reasoning tokens). The
release (CHATS-lab/scope_usim usim/core/api_model_adapter.py @ ff06bcd2) likewise sends no
temperature or top_p to models whose id starts with "gpt-5".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

AUTO = "auto"
# The values `reasoning_effort` may take where it is accepted (OpenAI's; Gemini and OpenRouter
# map the same words). "" = not sent: the provider's default.
REASONING_EFFORTS = ("", "none", "minimal", "low", "medium", "high")


@dataclass(frozen=True)
class Provider:
    """One API's rules for a chat request (see the module docstring)."""

    name: str
    label: str
    hosts: tuple[str, ...] = ()  # base-URL host names that identify it ("" host: any)
    models: str = ""  # a regex the model id must match (search, case-insensitive); "" = any
    key_env: str = ""  # the variable its keys conventionally live in
    token_cap: str = "max_tokens"  # the name of the reply's token cap on this API
    fixed_sampling: bool = False  # temperature and top_p are the model's own: not sent
    max_temperature: float | None = None  # above this the API clamps or refuses
    enforces_response_format: bool = True  # False: a choice turn is read from free text
    reasoning: str = ""  # how reasoning_effort is sent: "reasoning_effort" | "reasoning.effort"
    # | "" (not accepted: a config asking for it is refused)
    why: str = ""  # one line for the README and the dry run

    def serves(self, base_url: str) -> bool:
        """`base_url` is this provider's own API (one of its hosts)."""
        host = (urlparse(base_url).hostname or "").lower()
        return any(host == h or host.endswith("." + h) for h in self.hosts)

    def matches(self, base_url: str, model: str) -> bool:
        if self.hosts and not self.serves(base_url):
            return False
        return not self.models or re.search(self.models, model or "", re.IGNORECASE) is not None

    def shape(self, params: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """`params` (the common vocabulary, above) as this API takes them, and a note for each
        change made. ValueError for a parameter the API would silently ignore or refuse."""
        out, notes = dict(params), []
        effort = out.pop("reasoning_effort", None)
        if effort:
            if self.reasoning == "reasoning_effort":
                out["reasoning_effort"] = effort
            elif self.reasoning == "reasoning.effort":
                extra = dict(out.get("extra_body") or {})
                extra["reasoning"] = {**(extra.get("reasoning") or {}), "effort": effort}
                out["extra_body"] = extra
                notes.append(f"reasoning_effort {effort} sent as reasoning.effort")
            else:
                raise ValueError(f"{self.label} does not take reasoning_effort ({effort!r})")
        if self.fixed_sampling:
            dropped = [f"{k} {out.pop(k)}" for k in ("temperature", "top_p") if k in out]
            if dropped:
                notes.append(f"{' and '.join(dropped)} not sent ({self.label}: fixed sampling)")
        if self.token_cap != "max_tokens" and "max_tokens" in out:
            cap = out.pop("max_tokens")
            if cap is not None:
                out[self.token_cap] = cap
                notes.append(f"max_tokens {cap} sent as {self.token_cap}")
        if not self.enforces_response_format and out.get("response_format"):
            notes.append("response_format is not enforced: choices are read from the text")
        return out, notes

    def refusal(self, temperature: float | None, reasoning_effort: str) -> tuple[str, str] | None:
        """(the parameter, why) when a simulator asking this of this provider cannot be run as
        asked; None when it can (a None temperature is not sent)."""
        if reasoning_effort and not self.reasoning:
            return (
                "reasoning_effort",
                f"{self.label} does not take reasoning_effort (leave it empty)",
            )
        if (
            self.max_temperature is not None
            and not self.fixed_sampling
            and temperature is not None
            and temperature > self.max_temperature
        ):
            why = (
                f"{self.label} caps temperature at {self.max_temperature:g} (asked {temperature:g})"
            )
            return "temperature", why
        return None


# Most specific first: "auto" takes the first that matches.
PROVIDERS: dict[str, Provider] = {
    p.name: p
    for p in (
        Provider(
            "openai-reasoning",
            "OpenAI reasoning model (GPT-5 family, o-series)",
            hosts=("api.openai.com",),
            # gpt-5-chat-* is the non-reasoning chat model and samples as asked
            models=r"^(?:gpt-5(?!(?:\.\d+)?-chat)|o\d)",
            key_env="OPENAI_API_KEY",
            token_cap="max_completion_tokens",
            fixed_sampling=True,
            reasoning="reasoning_effort",
            why="HTTP 400 to max_tokens and to any temperature but 1 (and to top_p): the cap is"
            " sent as max_completion_tokens, temperature and top_p are not sent",
        ),
        Provider(
            "openai",
            "OpenAI chat model",
            hosts=("api.openai.com",),
            key_env="OPENAI_API_KEY",
            token_cap="max_completion_tokens",
            max_temperature=2.0,
            why="max_tokens is deprecated there: the cap is sent as max_completion_tokens",
        ),
        Provider(
            "anthropic",
            "Anthropic (OpenAI-compatible endpoint)",
            hosts=("api.anthropic.com",),
            key_env="ANTHROPIC_API_KEY",
            max_temperature=1.0,
            enforces_response_format=False,
            why="response_format and reasoning_effort are ignored: choice turns are read from"
            " the text and re-asked; temperature above 1 is clamped, so it is refused",
        ),
        Provider(
            "gemini",
            "Google Gemini (OpenAI-compatible endpoint)",
            hosts=("generativelanguage.googleapis.com",),
            key_env="GEMINI_API_KEY",
            max_temperature=2.0,
            reasoning="reasoning_effort",
            why="sent as asked; json_schema is enforced",
        ),
        Provider(
            "openrouter",
            "OpenRouter-style gateway",
            hosts=("openrouter.ai",),
            key_env="OPENROUTER_API_KEY",
            enforces_response_format=False,
            reasoning="reasoning.effort",
            why="whether response_format holds depends on the routed model, so choice turns are"
            " read from the text and re-asked; effort is sent as reasoning.effort",
        ),
        Provider(
            "generic",
            "OpenAI-compatible server (vLLM, the embedded engine, any other)",
            reasoning="reasoning_effort",
            why="everything is sent as given",
        ),
    )
}
GENERIC = PROVIDERS["generic"]
PROVIDER_CHOICES = (AUTO, *PROVIDERS)


def sampling_params(
    temperature: float | None,
    max_tokens: int,
    top_p: float | None = 1.0,
    reasoning_effort: str = "",
) -> dict[str, Any]:
    """A simulator's generation settings in the common vocabulary, before shaping: a None
    temperature or top_p, top_p 1.0 (every API's default) and an empty effort are not sent, so
    the provider's own defaults apply."""
    params: dict[str, Any] = {"max_tokens": max_tokens}
    if temperature is not None:
        params["temperature"] = temperature
    if top_p is not None and top_p != 1.0:
        params["top_p"] = top_p
    if reasoning_effort:
        params["reasoning_effort"] = reasoning_effort
    return params


def provider_for(name: str | Provider, base_url: str, model: str) -> Provider:
    """The Provider `name` names, or with "auto" the one recognised from the endpoint and
    model (generic when none is)."""
    if isinstance(name, Provider):
        return name
    if name != AUTO:
        try:
            return PROVIDERS[name]
        except KeyError:
            raise ValueError(
                f"unknown provider {name!r}: expected one of {', '.join(PROVIDER_CHOICES)}"
            ) from None
    return next(p for p in PROVIDERS.values() if p.matches(base_url, model))
