"""The P4G task as the paper's release ran it (CHATS-lab/scope_usim), beside parley's own.

Everything here follows the release's files, each cited where its value is taken:

- the prompts: `usim/p4g/prompts.py` @ 1c2c23a2e36b137298c5751843ff853d0d480f5f
  (`build_persuader_system_prompt`, `build_persuadee_system_prompt`): the persuader is a
  Mechanical Turk worker with a persona of its own, earns a bonus equal to the donation, must not
  propose a donation too early and writes under `WORD_LIMIT` words; the persuadee is told to
  decide wisely and states a donation as `[DONATE $N]` or `[GIVE $N]`;
- the persona text: `usim/p4g/persona.py` @ e348b9f8bf04127eb9b6495498ac68c3585dbe12
  (`get_persona_text`: the survey answers as five bullet lines inside `<persona>` tags);
- the episode: `usim/core/environment/p4g/environment.py` @ 1d1253b94dd9946f85af96efb9eb8fb166f9df2f
  (the persuader speaks first, from its system prompt alone; the episode ends after
  num_turns // 2 exchanges or as soon as the reward is above 0, so a $0 decision does not end it);
- the donation and reward: `usim/p4g/reward.py` @ 2762e9b0a188befc4e9cd002a682d5418fd3c0fc
  (`extract_donation_amount`, `compute_p4g_reward`), read here by `release_donation`;
- the split: `data/README.md` @ 06aface04dfa1d5790f146f787464a15590783ba: the 739 training and
  200 test dialogues are the file lists of the release's `data/p4g/train/` and `data/p4g/test/`
  (`<conversation_id>.jsonl`, no split script survives), 78 corpus dialogues in neither. The
  data source reads the training files in sorted order (`usim/p4g/data_source.py` @ 1c2c23a).

The official data is never in this repository: a run names the folder that holds
`full_info.csv` and the release's `train/` (and `test/`) folders (RunConfig.domain_data).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from agents.domains.p4g.donation import conversation_donation

WORD_LIMIT = 50  # --p4g-word-limit 50 (cmd/slime/p4g/*.sh @ 1470e27a)

# The release's persona text: its five lines and, in each, the survey fields with their labels
# (usim/p4g/persona.py @ e348b9f). Freedom is listed with the moral foundations there.
_PERSONA_LINES: tuple[tuple[str, tuple[tuple[str, str, str], ...]], ...] = (
    (
        "Demographics",
        (
            ("Age", "demographics", "age"),
            ("Sex", "demographics", "sex"),
            ("Race", "demographics", "race"),
            ("Education", "demographics", "edu"),
            ("Marital Status", "demographics", "marital"),
            ("Employment", "demographics", "employment"),
            ("Income", "demographics", "income"),
            ("Religion", "demographics", "religion"),
            ("Ideology", "demographics", "ideology"),
        ),
    ),
    (
        "Big-Five Personality Traits [1-5]",
        (
            ("Extroversion", "big_five", "extrovert"),
            ("Agreeableness", "big_five", "agreeable"),
            ("Conscientiousness", "big_five", "conscientious"),
            ("Neuroticism", "big_five", "neurotic"),
            ("Openness", "big_five", "open"),
        ),
    ),
    (
        "Moral Foundations [1-6]",
        (
            ("Care", "moral_foundations", "care"),
            ("Fairness", "moral_foundations", "fairness"),
            ("Loyalty", "moral_foundations", "loyalty"),
            ("Authority", "moral_foundations", "authority"),
            ("Purity", "moral_foundations", "purity"),
            ("Freedom", "values", "freedom"),
        ),
    ),
    (
        "Schwartz Values [1-6]",
        (
            ("Conformity", "values", "conform"),
            ("Tradition", "values", "tradition"),
            ("Benevolence", "values", "benevolence"),
            ("Universalism", "values", "universalism"),
            ("Self Direction", "values", "self_direction"),
            ("Stimulation", "values", "stimulation"),
            ("Hedonism", "values", "hedonism"),
            ("Achievement", "values", "achievement"),
            ("Power", "values", "power"),
            ("Security", "values", "security"),
        ),
    ),
    (
        "Decision Making Style [1-5]",
        (
            ("Rational", "decision_style", "rational"),
            ("Intuitive", "decision_style", "intuitive"),
        ),
    ),
)


def _shown(value: Any) -> str:
    if value is None:
        return ""
    return f"{value:g}" if isinstance(value, float) else str(value)


def persona_text(persona: dict[str, Any]) -> str:
    """A persona payload (personas.persona_from_record) as the release writes it into a prompt.
    A blank survey answer is written empty, as the release writes a missing field."""
    lines = ["<persona>"]
    for title, fields in _PERSONA_LINES:
        shown = ", ".join(
            f"{label}: {_shown(persona.get(group, {}).get(key))}" for label, group, key in fields
        )
        lines.append(f"- {title}: {shown}")
    lines.append("</persona>")
    return "\n".join(lines)


def persuader_prompt(persona: str, num_turns: int, word_limit: int = WORD_LIMIT) -> str:
    """The release's persuader system prompt (usim/p4g/prompts.py @ 1c2c23a,
    build_persuader_system_prompt); `num_turns` counts both sides' messages."""
    exchanges = num_turns // 2
    return f"""You are an Amazon Mechanical Turk worker completing a $2 communication task.
- You are motivated by this task payment — you value every cent you earn.
- Act naturally as the person in the <persona> tag—think and respond as they would, including \
their quirks, beliefs, biases, and reasoning.
- Complete the communication task outlined in the <scenario> tag as the persona would naturally \
respond.
- Respond in a real-time chat interface. Keep each response under {word_limit} words, \
conversational, and authentic—avoid formal, robotic, or repetitive language.
- Guide the conversation for {exchanges} chat turns. Do not propose or agree to a donation too \
early—build rapport gradually and naturally.
Only output your reply to your chat partner—do not explain your reasoning.

{persona}

<scenario>
You are presented with the following task content:

---
You are randomly assigned to be the Persuader in this communication task.

As the persuader, your job is to persuade your partner to donate some or all of their incoming \
payment for this task ($2.00) to a children's charity called Save the Children.

You will earn a bonus equal to whatever amount your partner donates if they agree to donate. You \
can keep this bonus or donate it to maximize the charitable impact.

Required Actions:
- Ask for a SPECIFIC donation amount: "How much would you like to donate to the charity from \
your task payment?"
- Explain the deduction: "Your donation will be directly deducted from your task payment. You \
can choose any amount from $0 to your full payment ($2.00)."
- If your partner asks how the donation will get to the charity: "The research team will \
collect all donations and send them to Save the Children."

Conversation Strategy:
- Start with a greeting or small talk to open the conversation naturally.
- Build rapport gradually before discussing donations.
- If needed (especially after a donation has been made), let your partner know about the \
minimum requirement of {exchanges} chat turns, to avoid meaningless conversation or repeated \
greetings.

Basic information about Save the Children:
Save the Children is an international non-governmental organization that promotes children's \
rights, provides relief and helps support children in developing countries.

You can refer to Save the Children's website to gather more information if you like to.
https://www.savethechildren.org/
---
</scenario>

<rules>
- Your responses can sometimes contain minor grammatical errors to sound more natural.
- Begin the conversation with a brief greeting or small talk.
- Your response should not exceed {word_limit} words.
</rules>"""


def persuadee_prompt(persona: str, word_limit: int = WORD_LIMIT) -> str:
    """The release's persuadee system prompt (usim/p4g/prompts.py @ 1c2c23a,
    build_persuadee_system_prompt, without the Persona-Guided prefix: a regime's guidelines go
    before it as they go before any simulator prompt)."""
    return f"""You are an Amazon Mechanical Turk worker completing a $2 communication task.
- You are motivated by this task payment — you value every cent you earn.
- Act naturally as the person in the <persona> tag—think and respond as they would, including \
their quirks, beliefs, biases, and reasoning.
- Complete the communication task outlined in the <scenario> tag as the persona would naturally \
respond.
- Respond in a real-time chat interface. Keep each response under {word_limit} words, \
conversational, and authentic—avoid formal, robotic, or repetitive language.
Only output your reply to your chat partner—do not explain your reasoning.

{persona}

<scenario>
You are presented with the following task content:

---
Welcome to the communication task. You will now start a conversation with your partner about a \
children's charity.
Please don't game the task by replying short and meaningless sentences.
---
</scenario>

<task>
You have just made $2.00.
You have access to this money whenever you like, and you are free to use it in whatever way you \
wish.
You are about to interact with an individual about a children's charity. They may try to get you \
to donate or to give them some of your money.
You must make decision wisely, and not spend the money or give it away very easily.
</task>

<rules>
- Your responses can sometimes contain minor grammatical errors to sound more natural.
- To contribute, provide, donate or give money say [DONATE $N] or [GIVE $N], where N is the \
amount you will donate/give (N can be either decimal or integer).
For example, to give $0.2, say [GIVE $0.2], or to donate $1.25, say [DONATE $1.25].
You MUST say it in this format, otherwise the donation will not be made.
- Your response should not exceed {word_limit} words.
</rules>"""


# The release's two readings of a persuadee message (usim/p4g/reward.py @ 2762e9b): a marker
# `[DONATE $N]` / `[GIVE $N]`; else a giving verb followed at once (after an optional "the
# whole", "all" or "entire" and an optional "$") by a number. Negation, tense and who gives are
# not read: "I won't donate $1" counts as $1, and "give you $1" (a word between) does not count.
_RELEASE_MARKER = re.compile(r"\[(?:donate|give)\s*\$?(\d+\.?\d*)\]", re.IGNORECASE)
_RELEASE_STATEMENT = re.compile(
    r"\b(?:donat|giv|contribut)(?:e|ing)\s*(?:the whole|all|entire)?\s*\$?(\d*\.\d{1,2}|\d+)\b",
    re.IGNORECASE,
)


def release_message_donation(text: str | None) -> float | None:
    """The amount one persuadee message states by the release's reading, or None: its last
    marker, else its last statement. Not clamped (the reward caps at 1)."""
    if not text:
        return None
    for pattern in (_RELEASE_MARKER, _RELEASE_STATEMENT):
        found = pattern.findall(text)
        if found:
            return float(found[-1])
    return None


def release_donation(conversation: list[dict[str, Any]]) -> float | None:
    """The last amount a persuadee (role "user") message states, by the release's reading; None
    when none states one (the release scores that as $0)."""
    return conversation_donation(conversation, release_message_donation)


def split_ids(folder: Path) -> dict[str, str]:
    """{dialogue id: "train" | "test"} from the release's split folders beside full_info.csv:
    `train/` (required) and `test/` of `<conversation_id>.jsonl` files, copied unchanged from
    the release's data/p4g/. Only the file names are read, as the release's rollouts read
    only each file's two speaker ids."""
    train = folder / "train"
    if not train.is_dir() or not any(train.glob("*.jsonl")):
        raise FileNotFoundError(
            f"the release's P4G split is not at {train}: copy CHATS-lab/scope_usim data/p4g/train"
            " (and data/p4g/test) beside full_info.csv; its file names are the split"
            " (data/README.md @ 06aface)"
        )
    ids = {path.stem: "train" for path in train.glob("*.jsonl")}
    test = folder / "test"
    if test.is_dir():
        for path in test.glob("*.jsonl"):
            if path.stem in ids:
                raise ValueError(f"{path.stem} is in both {train} and {test}")
            ids[path.stem] = "test"
    return ids
