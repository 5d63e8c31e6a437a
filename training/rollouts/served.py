"""A model on an endpoint for as long as a run: one agents.llm client, opened at the first turn
and kept for every turn after it (no connection set up per turn); and a trained speaker's
adapter sampled on a vLLM server (ServedAdapter).

The trainer is synchronous and a client's connections belong to the event loop that opened
them, so each Endpoint keeps an event loop of its own (asyncio.Runner) and runs every call on
it. close() ends the client and the loop; so does the owner's collection at the end of a run
(or the interpreter's exit), whichever comes first.
"""

from __future__ import annotations

import asyncio
import shutil
import weakref
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from agents.llm import LLMClient

T = TypeVar("T")


class Endpoint:
    def __init__(self, connect: Callable[[], Any]):
        """`connect()` makes the client (an LLMClient) at the first call; it must not refer to
        the Endpoint's owner, or the owner would never be collected."""
        self._open = _Open(connect)
        self._closer = weakref.finalize(self, self._open.close)

    def run(self, work: Callable[[Any], Awaitable[T]]) -> T:
        """`work(client)` to its end, on this endpoint's loop."""
        if not self._closer.alive:
            raise RuntimeError("the endpoint is closed")
        return self._open.run(work)

    def close(self) -> None:
        self._closer()  # runs once: a later call, or the collection, does nothing


class _Open:
    """The loop and the client, apart from the Endpoint so its finalizer can hold them."""

    def __init__(self, connect: Callable[[], Any]):
        self.connect = connect
        self.runner: asyncio.Runner | None = None
        self.client: Any = None

    def run(self, work: Callable[[Any], Awaitable[T]]) -> T:
        if self.runner is None:
            # a loop of its own: this thread's default loop is left alone
            self.runner = asyncio.Runner(loop_factory=asyncio.new_event_loop)
        return self.runner.run(self._call(work))

    async def _call(self, work: Callable[[Any], Awaitable[T]]) -> T:
        if self.client is None:
            self.client = self.connect()
        return await work(self.client)

    def close(self) -> None:
        if self.runner is None:
            return
        try:
            if self.client is not None:
                self.runner.run(self.client.aclose())
        finally:
            self.runner.close()
            self.runner = self.client = None


class SampledIds(list):
    """A turn's sampled ids and the weights' version that sampled them (the served adapter's
    name, or the version a full fine-tuning run pushed: training/rollouts/weight_sync.py);
    Transcript.record keeps it, and the update refuses a step that mixes versions."""

    def __init__(self, ids: list[int], weight_version: str):
        super().__init__(ids)
        self.weight_version = weight_version


class ServedAdapter:
    """A trained speaker's LoRA adapter sampled by a vLLM server from this process's token ids,
    so transcripts keep the exact sampled ids: `/v1/completions` with a token-id prompt and
    `return_token_ids` (LLMClient.complete). After each update its owner calls `publish`: the
    adapter is saved and loaded with `/v1/load_lora_adapter` (vLLM needs --enable-lora,
    VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and the folder on a filesystem it sees). One client
    serves every load and turn of the run. The agent (training/rollouts/agent.py) and a co-trained
    simulator (training/rollouts/simulator.py) sample so."""

    def __init__(
        self,
        base_url: str,
        lm: Any,
        temperature: float,
        max_new_tokens: int,
        api_key: str | None = None,
    ):
        self.base_url, self.lm = base_url, lm
        self.temperature, self.max_new_tokens = temperature, max_new_tokens
        self.model = ""  # the served adapter's name; set by load()
        self.endpoint = Endpoint(lambda: LLMClient(base_url, api_key=api_key, timeout=600))

    def publish(self, policy: Any, folder: Path, name: str, ranks: Any = None) -> None:
        """The adapter as `policy` holds it now, saved under `folder` and served as `name`;
        the previous one is unloaded and its folder (a sibling of `folder`) deleted. With
        several ranks (training.rl.distributed.Ranks) rank 0 alone saves and loads it, and the
        others then sample from it by name: loading it again would unload it under rank 0."""
        if ranks is None or ranks.main:
            policy.save(folder)
            self.load(str(folder), name)
            for old in folder.parent.glob("step-*"):
                if old.name < folder.name:  # the server no longer has it; a long run keeps one
                    shutil.rmtree(old, ignore_errors=True)
        if ranks is not None:
            ranks.barrier()
            if not ranks.main:
                self.model = name

    def load(self, folder: str, name: str, keep_previous: bool = False) -> None:
        """Serve `folder` as `name` and sample from it from now on; the previous adapter is
        unloaded unless `keep_previous`."""
        self.endpoint.run(lambda client: self._load(client, str(folder), name, keep_previous))

    def unload(self, name: str) -> None:
        self.endpoint.run(lambda client: client.unload_lora_adapter(name))

    async def _load(self, client: Any, folder: str, name: str, keep_previous: bool) -> None:
        # replace: a resumed run may name an adapter its previous process already loaded
        await client.load_lora_adapter(name, folder, replace=True)
        previous, self.model = self.model, name
        if previous and previous != name and not keep_previous:
            await client.unload_lora_adapter(previous)

    def sample(self, prompts: list[list[int]]) -> list[list[int]]:
        """Each prompt's turn as the server sampled it (ids, ending with its stop token)."""
        if not self.model:
            raise RuntimeError(f"{type(self).__name__}.load() must name the served adapter first")
        return self.endpoint.run(
            lambda client: asyncio.gather(*(self._complete(client, p) for p in prompts))
        )

    def close(self) -> None:
        self.endpoint.close()

    async def _complete(self, client: Any, prompt: list[int]) -> list[int]:
        result = await client.complete(
            self.model,
            prompt,
            return_token_ids=True,
            max_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=1.0,
            top_k=-1,
            stop_token_ids=self.lm.stop_ids,
            skip_special_tokens=False,
        )
        return SampledIds(turn_ids(result, self.lm.stop_ids), self.model)


def turn_ids(result: Any, stop_ids: list[int]) -> list[int]:
    """A completion's sampled ids ending with the stop token that ended the turn. vLLM 0.32
    returns it in token_ids; should a server leave it out, it is added back (stop_reason names
    it; None means eos), so the transcript closes the turn as in-process sampling does."""
    ids = list(result.token_ids)
    if result.finish_reason == "stop" and (not ids or ids[-1] not in stop_ids):
        reason = result.stop_reason
        ids.append(reason if isinstance(reason, int) else stop_ids[0])
    return ids
