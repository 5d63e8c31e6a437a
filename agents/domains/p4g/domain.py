"""Persuasion for Good: the agent persuades, the user (simulated or human) decides a donation."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

from agents.domains.base import Domain, Message, Outcome, QuestionnaireInput, Scenario
from agents.domains.p4g import prompts, release
from agents.domains.p4g.donation import (
    DECISION_AMOUNTS,
    MAX_DONATION,
    conversation_donation,
    marker,
)
from agents.domains.p4g.personas import load_bundled, load_full_info, load_release

# A person's outcome in a P4G study: the donation they intend, asked after the chat (the paper's
# measure) by the questionnaire item the researcher maps to it.
DONATION = QuestionnaireInput(
    "donation", "the donation the participant intends", 0.0, MAX_DONATION, "dollars"
)
# The key the seeded questionnaires give that item (existing items with it were mapped by
# studies' migration 0014); any other key works once the item is mapped.
INTENDED_DONATION = "intended_donation"


def donation_reward(amount: float | None) -> float:
    """The agent's reward: min(amount / 2, 1); no donation is 0."""
    return 0.0 if amount is None else min(amount / MAX_DONATION, 1.0)


def human_outcome(intended_donation: float | None, conversation: list[Message]) -> Outcome:
    """A human persuadee's Outcome: the donation answered in the questionnaire decides,
    the amount stated in the chat (if any) is recorded beside it."""
    if intended_donation is not None:
        if isinstance(intended_donation, bool) or not isinstance(intended_donation, int | float):
            raise ValueError(f"intended donation must be a number, got {intended_donation!r}")
        if not (math.isfinite(intended_donation) and 0 <= intended_donation <= MAX_DONATION):
            raise ValueError(
                f"intended donation must be between 0 and {MAX_DONATION:g}, got {intended_donation}"
            )
        intended_donation = float(intended_donation)
    return Outcome(
        reward=donation_reward(intended_donation),
        success=bool(intended_donation),
        components={"donation": intended_donation},
        details={
            "source": "questionnaire",
            "answered": intended_donation is not None,
            "chat_donation": conversation_donation(conversation),
        },
    )


PARLEY, RELEASE = "parley", "release"


class P4GDomain(Domain):
    """Two protocols (`protocol`), the same personas' survey, the same reward min(amount / 2, 1):

    - "parley" (the default, and the one for human studies): an honest persuader without a
      persona opens with a fixed greeting; the simulated persuadee's last reply is one of five
      `[DONATE $N]` markers; any stated donation, $0 included, ends the chat; parley's careful
      reader of donations (donation.py). Personas: the bundled set, or the official
      full_info.csv when `data_dir` names it (the file, its folder, or a folder holding
      p4g/full_info.csv), split by a hash of the persuadee.
    - "release": the task as the paper's release ran it (release.py, with files and commits):
      the persuader has the dialogue's persuader persona, a bonus equal to the donation and a
      50-word limit, and writes the first message itself; the persuadee may write
      `[DONATE $N]` or `[GIVE $N]`, its last reply is free; only a donation above $0 ends the
      episode; the release's reader of donations. Its tasks are the release's dialogues, read
      from `data_dir` (full_info.csv and the release's train/ and test/ folders): never the
      bundled personas."""

    name = "p4g"
    title = "Persuasion for Good"
    agent_name, user_name = "persuader", "persuadee"
    simulator_reward = "adversarial"  # the release: 1 - the agent's reward
    max_turns = 10  # messages; the persuader opens, so each side writes 5
    max_tool_calls_per_turn = 0
    questionnaire_inputs = (DONATION,)
    protocols = {
        PARLEY: "parley's honest persuader (fixed greeting, five decision markers at the end,"
        " any stated donation ends the chat); for studies with people",
        RELEASE: "the release's task (CHATS-lab/scope_usim): persuader persona, bonus, 50 words,"
        " the policy opens, [DONATE $N]/[GIVE $N], free last reply, $0 does not end it; needs"
        " the official data and the release's split",
    }

    def __init__(self, data_dir: Path | str | None = None, protocol: str = PARLEY):
        if protocol not in self.protocols:
            raise ValueError(
                f"unknown P4G protocol {protocol!r}: expected one of {', '.join(self.protocols)}"
            )
        if protocol == RELEASE and data_dir is None:
            raise ValueError(
                "the release's P4G protocol needs the official data (full_info.csv with the"
                " release's train/ and test/ folders beside it): give its folder; the bundled"
                " personas have no persuader persona and no release split"
            )
        self.protocol = protocol
        self.data_dir = Path(data_dir) if data_dir is not None else None
        self._scenarios: list[Scenario] | None = None
        if protocol == RELEASE:
            self.first_speaker = "agent"  # the policy writes the opening message

    def scenarios(self, split: str | None = None) -> list[Scenario]:
        if split not in (None, "train", "test"):
            raise ValueError(f"split must be 'train', 'test' or None, got {split!r}")
        if self._scenarios is None:
            if self.protocol == RELEASE:
                self._scenarios = load_release(self.data_dir)
            elif self.data_dir is not None:
                self._scenarios = load_full_info(self.data_dir)
            else:
                self._scenarios = load_bundled()
        return [s for s in self._scenarios if split is None or s.payload["split"] == split]

    def stated_donation(self, conversation: list[Message]) -> float | None:
        """The donation the persuadee stated, by this protocol's reader (None: none stated)."""
        if self.protocol == RELEASE:
            return release.release_donation(conversation)
        return conversation_donation(conversation)

    def with_turn_limit(self, max_turns: int) -> P4GDomain:
        limited = copy.copy(self)  # the same scenarios, loaded once
        limited.max_turns = max_turns
        return limited

    def agent_system_prompt(self, scenario: Scenario) -> str:
        if self.protocol == RELEASE:  # the persuader's own persona, never the persuadee's
            persona = release.persona_text(scenario.payload["persuader"])
            return release.persuader_prompt(persona, self.max_turns)
        # the persuader never sees the persona
        return prompts.PERSUADER_PROMPT.format(length=prompts.each_side(self.max_turns // 2))

    def greeting(self, scenario: Scenario) -> str | None:
        return None if self.protocol == RELEASE else prompts.GREETING

    def new_state(self, scenario: Scenario) -> dict[str, Any]:
        return {}  # no tools, nothing to keep: the conversation itself is the state

    def user_instructions(self, scenario: Scenario) -> str:
        # a person plays themselves, never the persona
        return prompts.HUMAN_BRIEFING.format(length=prompts.each_side(self.max_turns // 2))

    def simulator_system_prompt(self, scenario: Scenario) -> str:
        if self.protocol == RELEASE:
            return release.persuadee_prompt(release.persona_text(scenario.payload["persona"]))
        return prompts.persuadee_prompt(scenario.payload["persona"], self.max_turns // 2)

    def user_choices(
        self, scenario: Scenario, conversation: list[Message], final: bool
    ) -> list[str] | None:
        """parley's protocol: a simulated persuadee's last reply is its decision, one of the five
        markers (its prompt promises a decision there, and a small model otherwise rarely
        states one). The release's: free text to the end."""
        if self.protocol == PARLEY and final and conversation_donation(conversation) is None:
            return [marker(a) for a in DECISION_AMOUNTS]
        return None

    def is_done(self, conversation: list[Message]) -> str | None:
        amount = self.stated_donation(conversation)
        # the release ends an episode once its reward is above 0 (environment.py @ 1d1253b):
        # a stated $0 talks on; parley's ends at any stated decision
        if amount is not None and (self.protocol == PARLEY or amount > 0):
            return "donation"
        return super().is_done(conversation)

    def closing_reply(self, end_reason: str) -> bool:
        # parley: the persuader thanks the person before the chat ends; the release's episode
        # ends on the persuadee's message
        return end_reason == "donation" and self.protocol == PARLEY

    def outcome_words(self, outcome: Outcome) -> str | None:
        return None  # the donation is confirmed on every debrief; the rest is the agent's score

    def confirmation(self, outcome: Outcome) -> str | None:
        """The donation that counts (the questionnaire's answer, else the amount stated in the
        chat), and the chat's amount beside it when the two differ. The chat's score puts 0 for
        no stated amount (the reward): that is no decision, never "you chose not to donate"."""
        answered = outcome.details.get("source") == "questionnaire"
        amount = outcome.components.get("donation") if answered else None
        stated = outcome.details.get("chat_donation")
        if amount is None:
            amount = stated
        if amount is None:
            return "You did not choose a donation."
        text = (
            f"You chose to donate ${amount:.2f} of your ${MAX_DONATION:.2f} bonus to "
            "Save the Children."
            if amount
            else "You chose not to donate to Save the Children."
        )
        if stated is not None and stated != amount:
            text += f" (In the chat you mentioned ${stated:.2f}.)"
        return text

    def score(
        self, conversation: list[Message], state: Any, end_reason: str | None = None
    ) -> Outcome:
        amount = self.stated_donation(conversation)
        return Outcome(
            reward=donation_reward(amount),
            success=bool(amount),
            components={"donation": 0.0 if amount is None else amount},
            details={
                "donation_stated": amount is not None,
                "chat_donation": amount,
                "end_reason": end_reason,
            },
        )

    def outcome_from_answers(
        self, answers: dict[str, Any], conversation: list[Message]
    ) -> Outcome | None:
        if DONATION.name not in answers:
            raise ValueError(f"no answer for {DONATION.describe()}")
        outcome = human_outcome(answers[DONATION.name], conversation)
        # the amount stated in the chat, read as this protocol reads it (the release's reader
        # under "release"), so the debrief's "(In the chat you mentioned ...)" says the same
        outcome.details["chat_donation"] = self.stated_donation(conversation)
        return outcome
