"""Which LoRA adapters a study's arms ask for, and a new one put on a running vLLM endpoint.

The embedded engine serves a checkpoint as soon as Checkpoint.register links it into its
adapters folder (it rescans on every request). vLLM serves the adapters named at its start
(serve_agents names every arm's), and takes more while it runs through /v1/load_lora_adapter
(VLLM_ALLOW_RUNTIME_LORA_UPDATING, which serve_agents sets): `load_checkpoint` asks every
replica, and the admin's "Attach to study arm(s)" calls it before it points the arms.
"""

import asyncio
from pathlib import Path

from asgiref.sync import async_to_sync

from agents.llm import LLMClient
from agents.llm.errors import LLMError
from agents.models import Checkpoint, ModelEndpoint, adapters_dir
from agents.serving.adapters import find_adapters
from studies.models import Study

LOAD_TIMEOUT = 120.0  # seconds: vLLM reads the adapter and warms it up before it answers


class UnknownAdapter(ValueError):
    """An arm asks for a model that is neither the base model nor a known adapter."""


def adapter_path(name: str) -> Path | None:
    """The folder of the adapter served as `name`: a registered checkpoint, or one found in
    the embedded engine's adapters folder; None if there is none."""
    checkpoint = Checkpoint.objects.filter(name=name).first()
    if checkpoint is not None and Path(checkpoint.path).is_dir():
        return Path(checkpoint.path)
    found = find_adapters(adapters_dir()).get(name)
    return found.path if found else None


def study_adapters(study: Study, base_name: str) -> dict[str, Path]:
    """Adapter name -> folder for every arm of `study` that does not ask for the base model;
    UnknownAdapter naming the arms whose model cannot be found."""
    adapters, unknown = {}, []
    for arm in study.arms.all():
        if arm.model_name == base_name or arm.model_name in adapters:
            continue
        path = adapter_path(arm.model_name)
        if path is None:
            unknown.append(f"{arm.name} ({arm.model_name})")
        else:
            adapters[arm.model_name] = path
    if unknown:
        raise UnknownAdapter(
            f"study {study.slug}: no checkpoint or adapter folder for arm(s) "
            f"{', '.join(unknown)}; the base model is {base_name}"
        )
    return adapters


def load_checkpoint(endpoint: ModelEndpoint, checkpoint: Checkpoint) -> list[str]:
    """Have every replica of a vLLM endpoint serve `checkpoint` under its name from now on
    (replacing what was served under that name), as the embedded engine does by itself.
    Returns the problems, one per replica that refused or did not answer (the others serve
    it); nothing to do for other kinds of endpoint."""
    if endpoint.kind != ModelEndpoint.Kind.VLLM:
        return []
    urls, path = endpoint.urls(), str(Path(checkpoint.path).resolve())

    async def load(url):
        async with LLMClient(url, api_key=endpoint.api_key(), timeout=LOAD_TIMEOUT) as client:
            await client.load_lora_adapter(checkpoint.name, path, replace=True)

    async def load_everywhere():
        return await asyncio.gather(*(load(url) for url in urls), return_exceptions=True)

    problems = []
    for url, outcome in zip(urls, async_to_sync(load_everywhere)(), strict=True):
        if isinstance(outcome, LLMError):
            problems.append(f"{url} could not load {checkpoint.name}: {outcome}")
        elif isinstance(outcome, BaseException):
            raise outcome
    return problems
