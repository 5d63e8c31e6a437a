"""Imitation: a user simulator fine-tuned on what real people wrote (supervised LoRA).

Each finished conversation of a study becomes one token sequence as the in-process plain
simulator would have seen it (training/rollouts/simulator.py: the Domain's simulator prompt for that
scenario, the agent's messages as "user" turns), with the person's own messages where the
simulator's replies would be. Only those tokens (and the end-of-turn token after each) are
trained on, mask 1; everything else is context, mask 0. One sequence per conversation trains
every turn given the conversation so far, as one sequence per turn would (causal attention).

    loss = - sum_t mask_t * log p(token_t | tokens_<t) / sum_t mask_t

The model, its LoRA adapter and the optimizer are the trainer's (training/rl/policy.py), the
log-probs its `token_logprobs`. The result is a simulator checkpoint folder (adapter +
manifest.json, kind "simulator") that a run's [simulator] or [[heldout]] table names by its
folder or, once registered, by its name (`adapter = "<name>"`), and that the embedded engine
and vLLM serve like any other adapter. Nothing here knows where the conversations came from:
the platform exports them (studies/research/imitation_data.py) without participant ids.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from agents.domains import get_domain
from agents.domains.base import Domain, Message, Scenario
from agents.serving.adapters import MANIFEST
from agents.simulators.spec import with_persona
from training.config_schema import LoraSpec
from training.rl.logprobs import TokenBatch, token_logprobs
from training.rl.policy import LocalModel, Policy
from training.rl.tokens import Transcript
from training.rollouts.rollout import Rollout
from training.rollouts.simulator import user_messages
from training.trainer.checkpoint import PARTIAL

KIND = "simulator"
REGIME = "imitation"  # what the manifest's regime says: learnt from people, not by RL


class ImitationError(ValueError):
    """Conversations or settings that cannot make a simulator."""


@dataclass
class RealConversation:
    """One finished conversation: its Domain and scenario, and its messages in order as the
    agent saw them (user, assistant, tool), with no participant identifiers."""

    domain: str
    scenario: Scenario
    messages: list[Message]
    data_dir: str = ""  # the Domain's official data folder the scenario came from

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RealConversation:
        s = data["scenario"]
        scenario = Scenario(s["id"], s["domain"], s.get("payload") or {}, s.get("title", ""))
        return cls(data["domain"], scenario, list(data["messages"]), data.get("data_dir", ""))


@dataclass
class ImitationSettings:
    name: str  # the simulator's served name (manifest "name")
    base_model: str
    epochs: int = 3
    lr: float = 2e-4  # LoRA supervised fine-tuning's usual order; RL's 1e-5 would barely move it
    micro_batch: int = 2
    max_tokens: int = 2048  # a longer conversation is cut; turns past it are not trained
    persona: str = ""  # appended to the simulator prompt, as SimulatorSpec.persona is
    lora: LoraSpec = field(default_factory=LoraSpec)
    dtype: str = "float32"
    device: str = "cpu"
    seed: int = 0
    source: dict[str, Any] = field(default_factory=dict)  # provenance for the manifest

    def __post_init__(self) -> None:
        for key in ("epochs", "micro_batch", "max_tokens"):
            if getattr(self, key) < 1:
                raise ImitationError(f"{key} must be >= 1 (got {getattr(self, key)})")
        if not self.lr > 0:
            raise ImitationError(f"lr must be > 0 (got {self.lr})")
        if not self.name.strip():
            raise ImitationError("the simulator needs a name")


def user_transcript(
    lm: LocalModel, domain: Domain, conv: RealConversation, persona: str = ""
) -> Transcript:
    """The conversation as the plain simulator sees it, each person's message in place of a
    reply it would have sampled (mask 1, with the end-of-turn token that stops it)."""
    prompt = with_persona(domain.simulator_system_prompt(conv.scenario), persona)
    view = Rollout(conv.scenario, None, [])
    for message in conv.messages:
        text = message.get("content")
        if message.get("role") != "user" or not isinstance(text, str) or not text.strip():
            view.conversation.append(message)
            continue
        # what LocalUser.respond does before sampling, then records what "was sampled"
        view.user.prompt(lm.fmt, user_messages(domain, prompt, view))
        view.user.record(lm.fmt, lm.fmt.encode(text.strip()) + [lm.turn_stop])
        view.conversation.append(message)
        view.user.consumed = len(view.conversation)
    return view.user


def transcripts(
    lm: LocalModel, conversations: list[RealConversation], persona: str = "", max_tokens: int = 0
) -> list[Transcript]:
    """One training sequence per conversation that has a person's message (cut at
    `max_tokens` when > 0)."""
    domains: dict[tuple[str, str], Domain] = {}
    out = []
    for conv in conversations:
        key = (conv.domain, conv.data_dir)
        if key not in domains:
            domains[key] = get_domain(conv.domain, conv.data_dir or None)
        t = user_transcript(lm, domains[key], conv, persona)
        if max_tokens:
            t.ids, t.mask = t.ids[:max_tokens], t.mask[:max_tokens]
        if sum(t.mask):
            out.append(t)
    return out


def user_turns(conversations: list[RealConversation]) -> int:
    return sum(
        m.get("role") == "user" and bool(str(m.get("content") or "").strip())
        for c in conversations
        for m in c.messages
    )


def batch_of(rows: list[Transcript], pad_id: int) -> TokenBatch:
    return TokenBatch.from_lists([t.ids for t in rows], [t.mask for t in rows], pad_id)


@torch.no_grad()
def mean_logprob(lm: LocalModel, rows: list[Transcript], micro_batch: int = 2) -> float:
    """Mean log-probability per trained token (the people's tokens) under `lm`."""
    total, tokens = 0.0, 0.0
    for i in range(0, len(rows), micro_batch):
        batch = batch_of(rows[i : i + micro_batch], lm.pad_id)
        logp, _ = token_logprobs(lm.model, batch)
        total += float((logp * batch.mask).sum())
        tokens += float(batch.mask.sum())
    return total / tokens if tokens else 0.0


def supervised_step(policy: Policy, rows: list[Transcript], micro_batch: int) -> float:
    """One optimizer step on `rows`: the token-level mean negative log-likelihood of the
    masked tokens (formula in the module docstring), gradient clipped at 1. Returns the loss."""
    total_tokens = max(float(sum(sum(t.mask) for t in rows)), 1.0)
    policy.optimizer.zero_grad(set_to_none=True)
    policy.model.train()
    loss_value = 0.0
    for i in range(0, len(rows), micro_batch):
        batch = batch_of(rows[i : i + micro_batch], policy.pad_id)
        logp, _ = token_logprobs(policy.model, batch)
        loss = -(logp * batch.mask).sum() / total_tokens  # this chunk's share of the mean
        loss.backward()
        loss_value += loss.item()
    params = [p for p in policy.model.parameters() if p.requires_grad]
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    policy.optimizer.step()
    policy.model.eval()
    return loss_value


def imitate(
    conversations: list[RealConversation],
    settings: ImitationSettings,
    out: Path,
    progress: Callable[[dict[str, Any]], None] | None = None,
    batch_conversations: int = 8,
) -> Path:
    """Fine-tune a LoRA simulator on the people's turns of `conversations`; write it to `out`
    (adapter + manifest.json) and return `out`. An existing `out` is never overwritten."""
    out = Path(out)
    if out.exists():
        raise ImitationError(f"{out} already exists: choose another name or folder")
    if not conversations:
        raise ImitationError("no conversations to learn from")
    torch.manual_seed(settings.seed)
    policy = Policy(
        settings.base_model,
        lora=settings.lora,
        lr=settings.lr,
        dtype=settings.dtype,
        device=settings.device,
    )
    rows = transcripts(policy, conversations, settings.persona, settings.max_tokens)
    if not rows:
        raise ImitationError("the conversations hold no message written by a person")
    with policy.model.disable_adapter():
        before = mean_logprob(policy, rows, settings.micro_batch)
    rng = random.Random(settings.seed)
    steps, losses = 0, []
    per_epoch = math.ceil(len(rows) / batch_conversations)
    for epoch in range(settings.epochs):
        order = rows[:]
        rng.shuffle(order)
        for i in range(0, len(order), batch_conversations):
            losses.append(
                supervised_step(policy, order[i : i + batch_conversations], settings.micro_batch)
            )
            steps += 1
            if progress:
                progress(
                    {
                        "epoch": epoch + 1,
                        "step": steps,
                        "total_steps": per_epoch * settings.epochs,
                        "loss": losses[-1],
                    }
                )
    after = mean_logprob(policy, rows, settings.micro_batch)
    metrics = {
        "user_logprob_base": before,  # mean per token of the people's turns, base model
        "user_logprob": after,  # the same after fine-tuning (held-in: not a test score)
        "final_loss": losses[-1],
    }
    temp = out.with_name(out.name + PARTIAL)
    shutil.rmtree(temp, ignore_errors=True)
    policy.save(temp)
    manifest = {
        "name": settings.name,
        "kind": KIND,
        "adapter": True,
        "base_model": str(settings.base_model),
        "domain": ",".join(sorted({c.domain for c in conversations})),
        "regime": REGIME,
        "step": steps,
        "metrics": metrics,
        "source": {
            **settings.source,
            "conversations": len(rows),
            "user_turns": user_turns(conversations),
            "user_tokens": int(sum(sum(t.mask) for t in rows)),
        },
        "config": {**asdict(settings), "source": None, "batch_conversations": batch_conversations},
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (temp / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str))
    os.replace(temp, out)
    return out
