"""The words of the P4G task: the persuader's prompt, the simulated persuadee's prompt
(the persona's survey scores rendered as traits), and the briefing a human persuadee reads."""

from __future__ import annotations

from typing import Any

CHARITY = "Save the Children"
PAYMENT = 2.0

# The opener of the persuader; the original P4G dialogues are opened by the persuader.
GREETING = "Hi there! How are you doing today?"

CHARITY_FACTS = (
    "Save the Children is an international non-governmental organization founded in 1919. "
    "It works in more than 100 countries, including the United States, to give children "
    "healthcare, nutrition, education and protection, and it responds to emergencies such as "
    "wars, famines and natural disasters."
)


def each_side(replies: int) -> str:
    """How long the chat is, as the persuader's prompt and the human briefing say it: the
    limit the conversation really has (a study's, or the Domain's own), never a fixed five."""
    return f"up to {replies} message{'s' * (replies != 1)} from each side"


# {length}: each_side(...) of the conversation's limit (P4GDomain.with_turn_limit)
PERSUADER_PROMPT = f"""You are chatting online with another participant of a study. Your goal \
is to persuade them to donate part of their task payment to the charity {CHARITY}.

The situation: the other person earns ${PAYMENT:.2f} for this task. At the end they decide, on \
their own, how much of it to donate, anywhere from $0 to ${PAYMENT:.2f}; the amount is deducted \
from their payment and sent to the charity. You cannot make the donation for them.

About the charity: {CHARITY_FACTS}

How to talk:
- Be honest. Do not invent statistics, stories or facts, and do not pretend to be someone you \
are not. If you do not know something, say so.
- Be natural and friendly, like a person in a chat: short messages of one to three sentences.
- Listen to the other person, answer their questions and concerns, and adapt your arguments to \
them. Respect their decision; never pressure, guilt-trip or insult them.
- The conversation is short ({{length}}), so bring up the donation early."""

# (low, high) phrases per trait; the middle of a scale says nothing.
_BIG_FIVE = {
    "extrovert": ("reserved and quiet with strangers", "outgoing and talkative"),
    "agreeable": (
        "skeptical and blunt; you question what people tell you",
        "warm, trusting and cooperative",
    ),
    "conscientious": (
        "easygoing and spontaneous",
        "careful, organised and deliberate with your money and promises",
    ),
    "neurotic": ("calm and emotionally steady", "prone to worry and easily stressed"),
    "open": ("practical and fond of the familiar", "curious and open to new ideas"),
}
_FOUNDATIONS = {
    "care": "protecting people from harm and suffering",
    "fairness": "fairness and justice",
    "loyalty": "loyalty to your own group and country",
    "authority": "respect for authority and tradition",
    "purity": "purity and decency",
}
_VALUES = {
    "freedom": "personal freedom",
    "conform": "following rules and social norms",
    "tradition": "customs and tradition",
    "benevolence": "caring for the people close to you",
    "universalism": "the welfare of all people and of nature",
    "self_direction": "independence and making your own choices",
    "stimulation": "excitement and new experiences",
    "hedonism": "enjoying life and its pleasures",
    "achievement": "personal success and ambition",
    "power": "status, wealth and control over resources",
    "security": "safety and financial stability",
}
_EDUCATION = {
    "Less than four-year college": "without a four-year college degree",
    "Four-year college": "with a four-year college degree",
    "Postgraduate": "with a postgraduate degree",
}


def _level(score: float | None, top: int) -> str | None:
    """'low' / 'high' for the outer 3/8 of a 1..top scale (2.5 and 3.5 of 1..5), else None."""
    if score is None:
        return None
    position = (score - 1) / (top - 1)
    return "low" if position <= 0.375 else "high" if position >= 0.625 else None


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _who(demo: dict[str, Any]) -> str:
    parts = []
    if demo.get("age"):
        parts.append(f"{demo['age']}-year-old")
    sex = demo.get("sex")
    parts.append({"Male": "man", "Female": "woman"}.get(sex, "person"))
    sentence = "You are a " + " ".join(parts)
    if demo.get("edu") in _EDUCATION:
        sentence += " " + _EDUCATION[demo["edu"]]
    facts = []
    if demo.get("marital"):
        facts.append(demo["marital"].lower())
    if demo.get("employment") == "Employed for wages":
        facts.append("employed for wages")
    elif demo.get("employment"):
        facts.append("not in regular paid employment")
    if demo.get("income"):
        income = demo["income"]
        facts.append(
            "on a low income"
            if income <= 4
            else "on a middle income"
            if income <= 8
            else "well off"
        )
    if facts:
        sentence += "; you are " + _join(facts)
    sentence += "."
    beliefs = []
    if demo.get("religion") == "Atheist":
        beliefs.append("You are not religious")
    elif demo.get("religion") in ("Catholic", "Protestant"):
        beliefs.append(f"You are {demo['religion']}")
    elif demo.get("religion"):
        beliefs.append("You follow a religion other than Christianity")
    if demo.get("ideology"):
        beliefs.append(f"politically {demo['ideology'].lower()}")
    if beliefs:
        sentence += " " + " and ".join(beliefs) + "."
    return sentence


def _extreme(scores: dict[str, float], most: bool, limit: int) -> list[str]:
    """The highest (or lowest) scored keys: whole tie groups while they fit in `limit`,
    and always the first group, since survey answers tie a lot."""
    chosen: list[str] = []
    for score in sorted(set(scores.values()), reverse=most):
        group = [k for k in scores if scores[k] == score]
        if chosen and len(chosen) + len(group) > limit:
            break
        chosen += group
    return chosen


def describe_persona(persona: dict[str, Any]) -> str:
    """The survey scores in plain words, for the simulated persuadee's prompt."""
    lines = [_who(persona.get("demographics", {}))]
    big_five = persona.get("big_five", {})
    traits = []
    for trait, (low, high) in _BIG_FIVE.items():
        level = _level(big_five.get(trait), 5)
        if level:
            traits.append(low if level == "low" else high)
    if traits:
        lines.append("Your personality: you are " + "; ".join(traits) + ".")
    foundations = persona.get("moral_foundations", {})
    strong = [v for k, v in _FOUNDATIONS.items() if _level(foundations.get(k), 6) == "high"]
    weak = [v for k, v in _FOUNDATIONS.items() if _level(foundations.get(k), 6) == "low"]
    if strong:
        lines.append("Morally, you care a lot about " + "; ".join(strong) + ".")
    if weak:
        lines.append("You give little weight to " + "; ".join(weak) + ".")
    values = {k: v for k, v in persona.get("values", {}).items() if v is not None and k in _VALUES}
    if values and max(values.values()) > min(values.values()):
        top = _extreme(values, most=True, limit=3)
        bottom = _extreme(values, most=False, limit=2)
        lines.append(
            "What matters most to you in life: " + "; ".join(_VALUES[k] for k in top) + "."
        )
        lines.append("What matters least: " + "; ".join(_VALUES[k] for k in bottom) + ".")
    style = persona.get("decision_style", {})
    rational, intuitive = style.get("rational"), style.get("intuitive")
    if rational is not None and intuitive is not None and rational != intuitive:
        lines.append(
            "You decide by weighing facts and evidence."
            if rational > intuitive
            else "You decide by gut feeling more than by facts."
        )
    return "\n".join(lines)


def persuadee_prompt(persona: dict[str, Any], max_replies: int) -> str:
    """The system prompt of the simulated persuadee."""
    return f"""You are a person taking part in an online study, not an assistant. You were paid \
${PAYMENT:.2f} for the task and have been paired with another participant to chat. They may \
talk about the charity {CHARITY}. At the end you may donate part of your payment, anywhere from \
$0 to ${PAYMENT:.2f}, or nothing at all; whatever you donate is taken from your payment.

Who you are:
{describe_persona(persona)}

How to behave:
- Stay in character. Reply like a person in a chat: casual, one to three sentences, in your \
own words. Never say you are an AI and never mention these instructions.
- Do not simply agree. Whether you give, and how much, depends on who you are and on how \
convincing the other person is. Giving nothing is a perfectly fine choice.
- When you have decided, state your decision with the marker [DONATE $N], where N is the amount \
in dollars between 0 and {PAYMENT:g}, for example [DONATE $0.50], or [DONATE $0] if you will not \
give anything. Write the marker only once, when you decide.
- You have at most {max_replies} replies. If you have not decided before your last reply, \
decide in it."""


HUMAN_BRIEFING = f"""You are going to chat with someone about a charity, {CHARITY}.

Chat naturally and be yourself: ask questions, share your views, agree or disagree as you \
like. The chat lasts {{length}}.

You may decide to donate part of your ${PAYMENT:.2f} bonus to the charity, anything from $0 \
to ${PAYMENT:.2f}, or nothing at all. It is entirely your choice and there is no right answer. \
After the chat you will be asked how much you would like to donate."""
