"""Reading a donation out of what the persuadee wrote.

Two forms count: the explicit marker a simulated persuadee is told to use, `[DONATE $N]`,
and plain first-person statements ("I'll donate $1.50", "count me in for 50 cents").
Across a message and across the conversation the last amount stated wins; amounts are
clamped to the task's 0..2 USD. Negated, past-tense and questioning statements, limits and
other people's giving never count: "I won't donate $1", "Should I give $2?", "we can donate
up to $2" and "you should donate $2" leave the donation undecided. Plain statements are a
best effort (a regex reading of chat, not language understanding); the marker is exact.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from agents.messages import message_text

MAX_DONATION = 2.0
# The amounts a simulated persuadee decides between when its decision is constrained.
DECISION_AMOUNTS = (0.0, 0.5, 1.0, 1.5, 2.0)


def dollars(amount: float) -> str:
    """$0, $0.50, $1, $1.50, $2: how the task writes an amount."""
    return f"${amount:g}" if float(amount).is_integer() else f"${amount:.2f}"


def marker(amount: float) -> str:
    """The decision marker a simulated persuadee writes, e.g. [DONATE $1.50]."""
    return f"[DONATE {dollars(amount)}]"


_NUM = r"(\d+(?:\.\d+)?|\.\d+)"

# The marker the simulated persuadee is asked to write; lenient about spacing and "$".
_MARKER = re.compile(
    r"\[\s*donat(?:e|ion)\s*[:=]?\s*\$?\s*" + _NUM + r"\s*(?:usd|dollars?)?\s*\]", re.IGNORECASE
)

_WORD_DOLLARS = {"zero": 0.0, "a": 1.0, "one": 1.0, "two": 2.0}
_WORD_CENTS = {
    "five": 5,
    "ten": 10,
    "fifteen": 15,
    "twenty": 20,
    "twenty-five": 25,
    "twenty five": 25,
    "thirty": 30,
    "forty": 40,
    "fifty": 50,
    "sixty": 60,
    "seventy": 70,
    "seventy-five": 75,
    "seventy five": 75,
    "eighty": 80,
    "ninety": 90,
}
_WHOLE = r"all of it|(?:the|my) (?:whole|full|entire) (?:thing|amount|bonus|payment)"

# One amount; named groups say how to read it. Alternatives run longest-first so
# "half a dollar" is not read as "half".
_AMOUNT = re.compile(
    r"(?:"
    r"\$\s*" + _NUM.replace("(", "(?P<dollar_sign>", 1) + r"(?!\d)"
    r"|" + _NUM.replace("(", "(?P<cents>", 1) + r"\s*(?:cents?\b|¢)"
    r"|" + _NUM.replace("(", "(?P<percent>", 1) + r"\s*(?:%|percent\b)"
    r"|" + _NUM.replace("(", "(?P<dollars>", 1) + r"\s*(?:(?:dollars?|bucks?|usd)\b|\$)"
    r"|\b(?P<half_dollar>half a dollar)\b"
    r"|\b(?P<word_cents>" + "|".join(sorted(_WORD_CENTS, key=len, reverse=True)) + r")\s+cents?\b"
    r"|\b(?P<word_dollars>zero|a|one|two)\s+(?:dollars?|bucks?)\b"
    r"|\b(?P<whole>" + _WHOLE + r")\b"
    r"|(?P<half>\bhalf\b|(?<![\d.])1/2(?![\d/]))"
    # A bare number is read as dollars unless a word other than these follows ("5 stars").
    r"|(?<![\w.$])" + _NUM.replace("(", "(?P<bare>", 1) + r"(?![\w%¢.])"
    r"(?!\s*(?!(?:to|for|towards|now|today|please|and|of|then|instead|usd)\b)[a-z])"
    r")",
    re.IGNORECASE,
)

# Verbs of giving, present or future only ("donated" is a story about the past).
_VERB = re.compile(
    r"\b(?:donat(?:e|ing)|giv(?:e|ing)|contribut(?:e|ing)|pledg(?:e|ing)|spar(?:e|ing)|"
    r"chip(?:ping)? in|put(?:ting)? in|count me in(?: for)?|put me down(?: for)?|"
    r"sign me up(?: for)?|make it|go with|donation)\b",
    re.IGNORECASE,
)

# A clause ends at punctuation or "but"; the speaker, negation and amount are read in it.
_CLAUSE_END = re.compile(r"[.!?;,\n](?!\d)|\b(?:but|however|though)\b", re.IGNORECASE)
_AMOUNT_WINDOW = 45

_NEGATION = re.compile(
    r"\b(?:not|never|no|nor|neither|nope|nah|cannot|refuse|refusing|unable|"
    r"wont|cant|dont|doesnt|didnt|wouldnt|shouldnt|couldnt|isnt|arent)\b|n't\b",
    re.IGNORECASE,
)
# A limit is not a decision: "we can donate up to $2".
_BOUND = re.compile(
    r"\b(?:up to|as much as|more than|less than|at most|at least|maximum|max|limit)\b",
    re.IGNORECASE,
)
_FIRST_PERSON = re.compile(
    r"\b(?:i|i'm|i'll|i'd|i've|im|ill|id|ive|me|my|we|we'll|we're|let's|lets|us)\b", re.IGNORECASE
)
_OTHER_SUBJECT = re.compile(
    r"\b(?:you|he|she|they|people|everyone|everybody|someone|somebody|others|it|one)\b",
    re.IGNORECASE,
)
# "Should I give $1" asks rather than decides.
_INVERTED_QUESTION = re.compile(
    r"\b(?:should|can|could|shall|may|would|do|did|will|must)\s+(?:i|we)\b", re.IGNORECASE
)
# Words that may open a giving clause without a subject: "Sure, happy to donate $1".
_LEAD_IN = set(
    "sure ok okay yes yeah yep alright all right fine great then so well and happy glad "
    "willing ready will gonna going to just also definitely absolutely certainly now actually "
    "maybe ok".split()
)


def _amount_value(match: re.Match[str]) -> float:
    kind = match.lastgroup
    text = match.group(kind).lower()
    if kind in ("dollar_sign", "dollars", "bare"):
        return float(text)
    if kind == "cents":
        # "0.30 cents" is a slip for 30 cents: nobody gives a fraction of a cent.
        return float(text) if float(text) < 1 else float(text) / 100
    if kind == "percent":
        return float(text) / 100 * MAX_DONATION
    if kind == "word_dollars":
        return _WORD_DOLLARS[text]
    if kind == "word_cents":
        return _WORD_CENTS[text] / 100
    if kind == "half_dollar":
        return 0.5
    if kind == "half":
        return MAX_DONATION / 2
    return MAX_DONATION  # "whole": all of it


def _clamp(amount: float) -> float:
    return min(max(amount, 0.0), MAX_DONATION)


def _speaker_is_persuadee(lead: str, verb: str) -> bool:
    """The words before the verb must make it the writer's own giving: the nearest subject
    is "I"/"we", or nothing but lead-in words precede a base-form verb ("Sure, happy to give")."""
    first = [m.start() for m in _FIRST_PERSON.finditer(lead)]
    other = [m.start() for m in _OTHER_SUBJECT.finditer(lead)]
    if first:
        return not other or max(first) > max(other)
    if re.search(r"ing\b", verb, re.IGNORECASE):
        return False  # "Donating $2 is a lot" talks about giving, it does not give
    words = re.findall(r"[a-z']+", lead.lower())
    return all(word in _LEAD_IN for word in words)


def _statements(text: str) -> Iterable[tuple[int, float]]:
    """(position, amount) of each plain first-person giving statement."""
    for verb in _VERB.finditer(text):
        clause_start = max(
            (m.end() for m in _CLAUSE_END.finditer(text, 0, verb.start())), default=0
        )
        lead = text[clause_start : verb.start()]
        if _NEGATION.search(lead) or _INVERTED_QUESTION.search(lead):
            continue
        if not _speaker_is_persuadee(lead, verb.group()):
            continue
        end = _CLAUSE_END.search(text, verb.end())
        clause_end = end.start() if end else len(text)
        if text[clause_end : clause_end + 1] == "?":
            continue  # a question is not a decision
        window_end = min(clause_end, verb.end() + _AMOUNT_WINDOW)
        amount = _AMOUNT.search(text, verb.end(), window_end)
        between = (verb.end(), amount.start()) if amount else None
        if amount is None or _NEGATION.search(text, *between) or _BOUND.search(text, *between):
            continue  # "I'll give nothing, not even $1", "we can donate up to $2"
        yield amount.start(), _amount_value(amount)


def _normalise(text: str) -> str:
    # Curly apostrophes are common in typed chat; the patterns use the straight one.
    return text.replace("\u2019", "'").replace("\u2018", "'")


def parse_donation(text: str | None) -> float | None:
    """The donation stated in one message (last one wins), clamped to 0..2, or None."""
    if not text:
        return None
    text = _normalise(text)
    found = [(m.start(), float(m.group(1))) for m in _MARKER.finditer(text)]
    # A marker's own amount must not also be read as a statement inside it.
    spans = [m.span() for m in _MARKER.finditer(text)]
    found += [
        (pos, amount)
        for pos, amount in _statements(text)
        if not any(start <= pos < end for start, end in spans)
    ]
    if not found:
        return None
    return _clamp(max(found, key=lambda item: item[0])[1])


def conversation_donation(
    conversation: list[dict[str, Any]], parse: Callable[[str], float | None] | None = None
) -> float | None:
    """The last donation the persuadee (role "user") stated anywhere in the conversation, read
    by `parse` (parley's reader, parse_donation, unless another is given)."""
    parse = parse or parse_donation
    amount = None
    for message in conversation:
        if message.get("role") == "user":
            stated = parse(message_text(message))
            if stated is not None:
                amount = stated
    return amount
