"""SimulatorSpec.sampling: "provider" sends neither temperature nor top_p, so a hosted user
samples at its provider's defaults, as the release's hosted tau2 users did (its environment
passes tau2's gym only the API key as user_llm_args); "sent" sends them. Checked on the request
body a real server receives, through agents.llm's client."""

import pytest

from agents.domains import get_domain
from agents.llm.client import LLMClient
from agents.simulators.spec import SimulatorSpec
from tests.support.scripted_server import ScriptedServer
from training.config import parse_config
from training.config_keys import ConfigError
from training.regimes.regime import ModelCache, frozen_simulator
from training.rollouts.rollout import Rollout


def one_user_turn(tmp_path, **spec):
    retail = get_domain("retail")
    with ScriptedServer([{"content": "I need to return a lamp."}]) as chat:
        cfg = parse_config(
            {
                "name": "s",
                "domain": "retail",
                "simulator": {"endpoint": chat.url, "model": "claude-haiku-4.5", **spec},
            }
        )
        user = frozen_simulator(cfg.simulator, ModelCache(cfg), 0)
        rollout = Rollout.begin(retail, retail.scenarios("train")[0])
        user.respond(retail, [rollout])
        user.close()
    assert rollout.conversation[-1]["content"] == "I need to return a lamp."
    (body,) = chat.requests
    return body


def test_provider_sampling_sends_neither_temperature_nor_top_p(tmp_path):
    body = one_user_turn(tmp_path, sampling="provider", max_new_tokens=512)
    assert "temperature" not in body and "top_p" not in body
    assert body["max_tokens"] == 512  # the cap is still sent
    sent = one_user_turn(tmp_path, temperature=0.7, top_p=0.95)
    assert sent["temperature"] == 0.7 and sent["top_p"] == 0.95


def test_provider_sampling_is_shaped_for_every_provider_without_them():
    for endpoint, model in [
        ("https://openrouter.ai/api/v1", "anthropic/claude-haiku-4.5"),
        ("https://api.openai.com/v1", "gpt-5-mini"),
        ("https://api.anthropic.com/v1", "claude-haiku-4-5"),
    ]:
        spec = SimulatorSpec(endpoint=endpoint, model=model, api_key_env="K", sampling="provider")
        client = LLMClient(endpoint, api_key="x", provider=spec.provider)
        body = client.request_body(
            model, [{"role": "user", "content": "hi"}], **spec.request_params()
        )
        assert "temperature" not in body and "top_p" not in body, endpoint


@pytest.mark.parametrize(
    "spec, key",
    [
        (
            {"endpoint": "http://x/v1", "model": "m", "sampling": "provider", "temperature": 1.0},
            "simulator.temperature",
        ),
        (
            {"endpoint": "http://x/v1", "model": "m", "sampling": "provider", "top_p": 0.95},
            "simulator.top_p",
        ),
        ({"sampling": "provider"}, "simulator.sampling"),  # in-process: nothing to leave unsent
    ],
)
def test_provider_sampling_refuses_a_value_that_would_read_as_sent(spec, key):
    with pytest.raises(ConfigError) as error:
        parse_config({"name": "s", "domain": "retail", "simulator": spec})
    assert error.value.key == key


def test_a_provider_sampling_config_loads_again_from_what_it_saves():
    """A run saves its whole config (config.json, manifests) with every field, temperature and
    top_p at their defaults included; loading that must not read them as sent."""
    cfg = parse_config(
        {
            "name": "s",
            "domain": "retail",
            "heldout": [
                {
                    "name": "h",
                    "endpoint": "https://openrouter.ai/api/v1",
                    "model": "z-ai/glm-5",
                    "api_key_env": "OPENROUTER_API_KEY",
                    "sampling": "provider",
                }
            ],
        }
    )
    again = parse_config(cfg.to_dict())
    assert again == cfg and again.heldout[0].request_params() == {"max_tokens": 64}
