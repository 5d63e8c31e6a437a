"""Hosted simulators in a run: SimulatorSpec's provider, top_p and reasoning_effort (validated at
load), EndpointUser's requests shaped for the provider, a choice turn on an Anthropic-style
stand-in re-asked then counted as a fallback, and the online dry run's one request per endpoint
simulator reporting the provider's own refusal (tests/support/provider_servers.py)."""

from __future__ import annotations

import re

import pytest

from agents.domains import domain_class
from agents.simulators.spec import SimulatorSpec
from tests.support.provider_servers import AnthropicServer, GPT5Server
from tests.support.scripted_server import ScriptedServer
from training.__main__ import main
from training.config import parse_config
from training.config_keys import ConfigError
from training.rollouts.rollout import Rollout
from training.rollouts.simulator import EndpointUser
from training.tools.dryrun import dry_run


def run_table(**simulator) -> dict:
    return {"name": "x", "domain": "p4g", "heldout": [{"name": "panel", **simulator}]}


@pytest.mark.parametrize(
    ("simulator", "key", "says"),
    [
        ({"top_p": 0.95}, "heldout[0].top_p", "is for an endpoint simulator"),
        ({"reasoning_effort": "low"}, "heldout[0].reasoning_effort", "endpoint simulator"),
        (
            {"endpoint": "https://openrouter.ai/api/v1", "model": "z-ai/glm-5"},
            "heldout[0].api_key_env",
            "the key of OpenRouter-style gateway (conventionally OPENROUTER_API_KEY)",
        ),
        (
            {
                "endpoint": "https://api.anthropic.com/v1",
                "model": "claude-haiku-4-5",
                "api_key_env": "ANTHROPIC_API_KEY",
                "reasoning_effort": "low",
            },
            "heldout[0].reasoning_effort",
            "Anthropic (OpenAI-compatible endpoint) does not take reasoning_effort",
        ),
        (
            {
                "endpoint": "https://api.anthropic.com/v1",
                "model": "claude-haiku-4-5",
                "api_key_env": "ANTHROPIC_API_KEY",
                "temperature": 1.5,
            },
            "heldout[0].temperature",
            "caps temperature at 1",
        ),
        (
            {"endpoint": "http://127.0.0.1:9/v1", "model": "m", "provider": "openia"},
            "heldout[0].provider",
            "must be one of auto, openai-reasoning, openai, anthropic, gemini, openrouter",
        ),
    ],
)
def test_a_provider_setting_that_cannot_be_sent_is_refused_at_load(simulator, key, says):
    with pytest.raises(ConfigError, match=re.escape(says)) as refused:
        parse_config(run_table(**simulator))
    assert refused.value.key == key


def test_the_papers_panel_settings_load_for_gpt5_mini():
    """temperature 0.7 and top_p 0.95 load for GPT-5-mini: they are not sent to it (its
    sampling is fixed), as the release's adapter does not send them either."""
    config = parse_config(
        run_table(
            endpoint="https://api.openai.com/v1",
            model="gpt-5-mini",
            api_key_env="OPENAI_API_KEY",
            top_p=0.95,
            reasoning_effort="minimal",
        )
    )
    spec = config.heldout[0]
    assert spec.provider_spec().name == "openai-reasoning"
    shaped, notes = spec.provider_spec().shape(spec.request_params())
    assert shaped == {"max_completion_tokens": 64, "reasoning_effort": "minimal"}
    assert any("temperature 0.7 and top_p 0.95 not sent" in n for n in notes)


def decision_rollout(domain):
    scenario = domain.scenarios("train")[0]
    ask = {"role": "assistant", "content": "Would you donate $1 to Save the Children?"}
    return Rollout(scenario, None, [], conversation=[ask])


def test_an_endpoint_user_on_anthropic_re_asks_a_choice_turn_then_counts_the_fallback():
    domain = domain_class("p4g-decision")()
    replies = [{"content": "Let me think."}, {"content": "[DONATE $1]"}]
    replies += [{"content": f"No idea ({i})."} for i in range(3)]
    with AnthropicServer(replies) as server:
        spec = SimulatorSpec(
            name="haiku", endpoint=server.url, model="claude-haiku-4-5", provider="anthropic"
        )
        user = EndpointUser(spec)
        chose, never = decision_rollout(domain), decision_rollout(domain)
        user.respond(domain, [chose])
        user.respond(domain, [never])
        user.close()
    assert chose.conversation[-1]["content"] == "[DONATE $1]" and chose.fallbacks == 0
    assert never.fallbacks == 1 and never.conversation[-1]["content"] == "No idea (2)."
    assert len(server.requests) == 5  # 2 for the first, 1 + retries (2) for the second


def test_an_endpoint_user_sends_top_p_and_effort_only_when_set(letters):
    rollout = decision_rollout(letters)  # a free-text turn: no choices in this Domain
    with ScriptedServer([{"content": "Sure."}, {"content": "Maybe."}]) as server:
        for extra in ({}, {"top_p": 0.95, "reasoning_effort": "low"}):
            user = EndpointUser(SimulatorSpec(name="s", endpoint=server.url, model="m", **extra))
            user.respond(letters, [rollout])
            user.close()
    plain, tuned = server.requests
    assert "top_p" not in plain and "reasoning_effort" not in plain
    assert (tuned["top_p"], tuned["reasoning_effort"], tuned["temperature"]) == (0.95, "low", 0.7)
    assert tuned["max_tokens"] == 64


def gpt5_config(tmp_path, base_model, url, provider, key_env="") -> str:
    path = tmp_path / "run.toml"
    key = f'api_key_env = "{key_env}"\n' if key_env else ""
    path.write_text(
        f'name = "wiring"\ndomain = "p4g"\nbase_model = "{base_model}"\n'
        f'[simulator]\nname = "smollm2"\n'
        f'[[heldout]]\nname = "gpt5"\nendpoint = "{url}"\nmodel = "gpt-5-mini"\n'
        f'provider = "{provider}"\ntop_p = 0.95\n{key}'
    )
    return str(path)


def test_the_online_dry_run_reports_the_providers_refusal_before_any_step(
    tmp_path, base_model, monkeypatch, capsys
):
    monkeypatch.setenv("PANEL_KEY", "sk-secret-value")
    with GPT5Server([{"content": "Hello!"}]) as server:
        unshaped = gpt5_config(tmp_path, base_model, server.url, "generic", "PANEL_KEY")
        assert main(["run", unshaped, "--dry-run"]) == 1
        out = capsys.readouterr().out
        shaped = gpt5_config(tmp_path, base_model, server.url, "openai-reasoning", "PANEL_KEY")
        result = dry_run(shaped)
    assert "FAIL  held-out gpt5 request: POST" in out
    assert "failed with 400: Unsupported parameter: 'max_tokens'" in out
    assert "Use 'max_completion_tokens' instead" in out and "sk-secret-value" not in out
    check = next(c for c in result["checks"] if c["name"] == "held-out gpt5 request")
    assert check["ok"], check
    assert "temperature 0.7 and top_p 0.95 not sent" in check["detail"]
    assert result["ok"], [c for c in result["checks"] if not c["ok"]]
    assert server.requests[-1]["max_completion_tokens"] == 64  # the run's cap, as shaped
    assert server.headers[-1]["authorization"] == "Bearer sk-secret-value"


def test_a_reply_cut_before_any_text_fails_the_dry_run(tmp_path, base_model):
    class Thinking(GPT5Server):  # a reasoning model that spent its cap thinking
        async def complete(self, request):
            self.requests.append(await request.json())
            from starlette.responses import JSONResponse

            message = {"role": "assistant", "content": ""}
            choice = {"index": 0, "message": message, "finish_reason": "length"}
            return JSONResponse(
                {"id": "x", "object": "chat.completion", "model": "gpt-5-mini", "choices": [choice]}
            )

    with Thinking([]) as server:
        result = dry_run(gpt5_config(tmp_path, base_model, server.url, "openai-reasoning"))
    check = next(c for c in result["checks"] if c["name"] == "held-out gpt5 request")
    assert not check["ok"] and "used all max_new_tokens = 64 before any text" in check["detail"]
