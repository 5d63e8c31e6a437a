"""Token bookkeeping: a conversation as one speaker's model sees it, grown by exact token ids.

A Transcript is the token sequence of one side of one conversation. Other messages enter it as
chat-template text (mask 0); the speaker's own turns enter as the very ids it sampled (mask 1),
followed by the template's end-of-turn scaffolding (mask 0). The model generates from these ids
and is trained on them, so nothing is re-tokenized between sampling and the loss.

New messages are rendered as what the template writes after a stand-in assistant turn (the
anchor) when applied to [system, user, anchor, *new]: the template's own formatting of a
continuation, whatever the template is. The anchor's end is found by a marker in its content,
not by rendering it alone: a template may render a conversation's last assistant turn otherwise
than an earlier one (Qwen3's thinking templates give the last one an empty `<think>` block), and
the user turn is there because some templates refuse a conversation without one (Qwen3.5's
"No user query found in messages").

Tools (training/rollouts/agent.py): in the JSON format they are text in the system message; in a
template's native format (Qwen3's) the opening is rendered with `tools=`, so the system turn
carries them as the template writes them, and tool results enter as the template's `tool` role.
The agent's tool-call turn is its sampled ids like any other turn: they are the template's own
rendering of the call whenever the model writes the call as the template does (its tags,
`{"name": ..., "arguments": ...}` JSON), so what is trained is what the template would render.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from training.rl.sampling import KVCache

_OPENING = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
_MARK = "\u2063MARK\u2063"  # text no reply contains, to find where a turn's content ends
_ANCHOR = [*_OPENING, {"role": "assistant", "content": _MARK}]


class ChatFormat:
    """One tokenizer's chat template, split into the pieces a growing Transcript needs."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        opening = self._opening_text = self.render(_OPENING)
        self.generation_prompt = self.encode(self.render(_OPENING, True)[len(opening) :])
        self._turn_end_text = self._after_anchor(self.render(_ANCHOR))
        self.turn_end = self.encode(self._turn_end_text)

    def render(
        self, messages: list[dict], generation_prompt: bool = False, tools: list[dict] | None = None
    ) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=generation_prompt
        )

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def opening(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """The first messages of a conversation (system prompt included; `tools` rendered by
        the template itself, for a native tool format)."""
        return self.encode(self.render(messages, tools=tools))

    def continuation(self, messages: list[dict]) -> list[int]:
        """Messages that follow an assistant turn, formatted as the template would."""
        full = self.render(_ANCHOR + list(messages))
        rest = self._after_anchor(full)
        if not (full.startswith(self._opening_text) and rest.startswith(self._turn_end_text)):
            raise ValueError("this chat template does not render conversations by appending turns")
        return self.encode(rest[len(self._turn_end_text) :])

    @staticmethod
    def _after_anchor(text: str) -> str:
        return text[text.index(_MARK) + len(_MARK) :]

    def close_turn(self, sampled: list[int]) -> list[int]:
        """What the template puts after a turn's content, minus the stop token already sampled."""
        if sampled and self.turn_end and sampled[-1] == self.turn_end[0]:
            return self.turn_end[1:]
        return self.turn_end


@dataclass
class Transcript:
    """One speaker's token view of one conversation. `consumed` counts the conversation's
    messages already in `ids`; `_prompt_tail` is the generation prompt left dangling by an
    untracked turn (one whose sampled ids were not recorded)."""

    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    allowed: dict[int, list[int]] = field(default_factory=dict)  # index -> ids a choice allowed
    consumed: int = 0
    # the weights' version of each turn a server sampled (training/rollouts/served.py's
    # SampledIds); none for turns sampled in this process
    weight_versions: list[str] = field(default_factory=list)
    _prompt_tail: int = 0
    # the speaker's keys and values for these ids, carried from turn to turn while the
    # conversation is played (training/rl/sampling.py); play() drops them when it ends
    cache: KVCache = field(default_factory=KVCache, repr=False, compare=False)

    def prompt(
        self, fmt: ChatFormat, messages: list[dict], tools: list[dict] | None = None
    ) -> list[int]:
        """Append `messages` (mask 0) and the generation prompt; return the ids to sample from.
        The first call gets the opening messages, system prompt included (with `tools`, the
        template's own rendering of them)."""
        if self._prompt_tail:
            del self.ids[-self._prompt_tail :], self.mask[-self._prompt_tail :]
        body = fmt.continuation(messages) if self.ids else fmt.opening(messages, tools)
        self._extend(body + fmt.generation_prompt, 0)
        self._prompt_tail = len(fmt.generation_prompt)
        return list(self.ids)

    def record(
        self, fmt: ChatFormat, sampled: list[int], allowed: list[list[int]] | None = None
    ) -> None:
        """The speaker's own turn: its exact sampled ids (mask 1), then the turn's closing. For a
        choice turn, `allowed` gives each sampled position's allowed ids: a forced position
        (one allowed id) was no choice of the model's and gets mask 0."""
        version = getattr(sampled, "weight_version", None)
        if version is not None:
            self.weight_versions.append(version)
        if allowed is None:
            self._extend(list(sampled), 1)
        else:
            for token, options in zip(sampled, allowed, strict=True):
                if len(options) > 1:
                    self.allowed[len(self.ids)] = list(options)
                self._extend([token], int(len(options) > 1))
        self._extend(fmt.close_turn(sampled), 0)
        self._prompt_tail = 0

    def _extend(self, ids: list[int], value: int) -> None:
        self.ids.extend(ids)
        self.mask.extend([value] * len(ids))


class MixedWeightVersions(ValueError):
    """A step's served turns came from more than one version of the weights."""


def one_weight_version(transcripts: list[Transcript], role: str = "") -> str | None:
    """The one weights' version every served turn of these transcripts was sampled from (None
    when none was served). GRPO's ratio compares each token's log-prob now with the one it
    was sampled at, and a group's advantages compare its members: both assume one policy
    sampled them all, so a step whose turns came from several versions is refused."""
    counts: dict[str, int] = {}
    for transcript in transcripts:
        for version in transcript.weight_versions:
            counts[version] = counts.get(version, 0) + 1
    if len(counts) > 1:
        whose = f"{role}'s " if role else ""
        raise MixedWeightVersions(
            f"this step's {whose}turns were sampled from {len(counts)} versions of the weights"
            f" (turns per version: {counts}); every turn of a step must come from the weights"
            " pushed for it: was the server updated by another trainer while the step ran?"
        )
    return next(iter(counts), None)
