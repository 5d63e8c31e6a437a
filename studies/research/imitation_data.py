"""A finished study's conversations, for fine-tuning a simulator on what people wrote.

Who counts: participants who completed the study, are people (no bots, no previews), were not
returned or timed out on Prolific (partial data), and are not excluded by the study's
attention rule. What leaves: each conversation's Domain, scenario and messages, nothing that
identifies a participant (no token, no Prolific ids), and the participants' own turns with
e-mails, phone numbers, links and ids replaced (studies/lib/redact.py; what the scenario gave
them stays). training/tools/imitate.py reads this shape
(RealConversation.from_dict); platform/parley's `imitate_users` command joins the two.
"""

import json
from collections import Counter

from agents.models import Checkpoint
from studies.lib.domain_bridge import OPEN_CHAT
from studies.lib.redact import redact
from studies.models import Message, Study, finished_participants


class NoConversations(ValueError):
    """The study has nothing a simulator can learn from; the message says why."""


def finished_conversations(study: Study) -> list[dict]:
    """One dict per finished conversation with at least one message from its participant:
    {"domain", "data_dir", "scenario": {"id", "domain", "payload", "title"}, "messages",
    "redacted": {kind: count}} (what was replaced in the participant's turns)."""
    if study.domain == OPEN_CHAT:
        raise NoConversations(
            f"study {study.slug!r} has no Domain: a simulator's prompt is a Domain scenario's"
        )
    participants = list(
        finished_participants(study)
        .filter(conversation__messages__role=Message.Role.USER, scenario__isnull=False)
        .exclude(scenario__domain=OPEN_CHAT)
        .distinct()
        .select_related("scenario", "conversation")
        .order_by("created_at", "id")
    )
    if not participants:
        raise NoConversations(
            f"study {study.slug!r} has no finished conversation to learn from (completed, "
            "not excluded, with at least one message from the participant)"
        )
    messages: dict[int, list[dict]] = {}
    for m in Message.objects.filter(
        conversation__participant__in=participants, role__in=Message.Role.values
    ).order_by("conversation_id", "seq"):
        messages.setdefault(m.conversation_id, []).append(m.to_chat())
    out = []
    for p in participants:
        s = p.scenario
        kept, counts = json.dumps(s.payload) + s.title, Counter()
        turns = [
            {**m, "content": redact(m["content"], kept, counts)}
            if m["role"] == Message.Role.USER and isinstance(m.get("content"), str)
            else m
            for m in messages.get(p.conversation.pk, [])
        ]
        out.append(
            {
                "domain": s.domain,
                "data_dir": s.source,
                "scenario": {
                    "id": s.key,
                    "domain": s.domain,
                    "payload": s.payload,
                    "title": s.title,
                },
                "messages": turns,
                "redacted": dict(counts),
            }
        )
    return out


def registered_humanlike():
    """Every registered simulator fine-tuned on a study's people (`imitate_users`)."""
    return Checkpoint.objects.filter(manifest__kind="simulator", manifest__regime="imitation")


def humanlike_simulators(study: Study):
    """The simulators fine-tuned on this study's people (registered by `imitate_users`), newest
    first: what a report adds as a held-out column, each as `heldout_table(checkpoint)`."""
    return registered_humanlike().filter(manifest__source__study=study.slug)


def imitated_study(checkpoint: Checkpoint) -> str:
    return str((checkpoint.manifest.get("source") or {}).get("study") or "?")


def humanlike_label(checkpoint: Checkpoint) -> str:
    """How reports name its column: what it imitates, not just its checkpoint name."""
    return f"human-like (imitation of study {imitated_study(checkpoint)})"


def heldout_table(checkpoint: Checkpoint, name: str = "human-like") -> dict:
    """A run config's [[heldout]] table for a registered human-like simulator (in-process, on
    its base model with the adapter; RunConfig checks it)."""
    return {
        "name": name,
        "kind": "plain",
        "model": checkpoint.base_model,
        "adapter": checkpoint.path,
    }


def served_heldout_table(checkpoint: Checkpoint, urls: list[str], api_key_env: str = "") -> dict:
    """The same simulator played on an engine that serves its adapter under its name (an
    endpoint whose engine serves the adapters folder, where `imitate_users` registered it):
    what a process outside training, like the sim-to-real report, can play."""
    return {
        "name": checkpoint.name,
        "kind": "plain",
        "model": checkpoint.name,
        "endpoint": list(urls),
        "api_key_env": api_key_env,
        "humanlike": True,
        "imitates": imitated_study(checkpoint),
    }
