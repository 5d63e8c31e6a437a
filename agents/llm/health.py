"""Is a replica serving? One probe of an OpenAI-compatible server: `GET /health` (at the
server's root, as vLLM and the embedded engine answer it) and `GET /v1/models`.

The endpoint registry (agents.models) stores what `probe_all` finds; the chat path never
probes (it learns of a dead replica from its own failed connection, agents.llm.replicas).
"""

import asyncio
import time
from dataclasses import dataclass, field

import aiohttp

from agents.llm.client import LLMClient
from agents.llm.errors import LLMError

PROBE_TIMEOUT = 3.0  # seconds a replica has for each of its two answers


@dataclass
class Probe:
    """What one replica answered: up with the models it serves, or down with why."""

    url: str
    up: bool
    models: list[str] = field(default_factory=list)
    error: str = ""
    seconds: float = 0.0


def health_url(base_url: str) -> str:
    """`http://host:8001/v1` -> `http://host:8001/health` (vLLM serves it beside /v1)."""
    return base_url.rstrip("/").removesuffix("/v1") + "/health"


async def probe(
    url: str, api_key: str | None = None, *, health: bool = True, timeout: float = PROBE_TIMEOUT
) -> Probe:
    """Ask one replica. `health`: also require `GET /health` to answer 200 (hosted APIs have
    no such route: their kind skips it)."""
    started = time.monotonic()

    def down(error: str) -> Probe:
        return Probe(url, False, error=error, seconds=time.monotonic() - started)

    if health:
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
                session.get(health_url(url)) as response,
            ):
                if response.status != 200:
                    text = (await response.text(errors="replace")).strip()[:200]
                    return down(f"GET {health_url(url)} answered {response.status}: {text}")
        except TimeoutError:
            return down(f"GET {health_url(url)} did not answer within {timeout:g} s")
        except aiohttp.ClientError as error:
            return down(f"GET {health_url(url)} failed: {error}")
    async with LLMClient(
        url, api_key=api_key, timeout=timeout, connect_timeout=timeout, max_retries=0
    ) as client:
        try:
            models = await asyncio.wait_for(client.list_models(), timeout + 1)
        except TimeoutError:
            return down(f"GET {url}/models did not answer within {timeout:g} s")
        except LLMError as error:
            return down(str(error))
    return Probe(url, True, models=models, seconds=time.monotonic() - started)


async def probe_all(
    urls: list[str], api_key: str | None = None, *, health: bool = True, timeout=PROBE_TIMEOUT
) -> list[Probe]:
    """Every replica at once, in the order given."""
    return list(
        await asyncio.gather(*(probe(u, api_key, health=health, timeout=timeout) for u in urls))
    )
