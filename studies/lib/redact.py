"""Personal details a participant may type into a chat, replaced before their words leave the
study (a simulator fine-tuned on them would learn and repeat them).

What is replaced: e-mail addresses, phone numbers, web links and Prolific-style ids (24 hex
digits). What is kept: any of these the scenario itself gave the participant (a tau2 user's
e-mail or order id is the role they play, not who they are), so the imitation still says it.
Names and street addresses are not detected: a pattern cannot tell them from the scenario's
own words, so the command that exports them says so.
"""

import re
from collections import Counter

# Order matters: a link can hold an e-mail or digits, an e-mail can hold digits.
PATTERNS = (
    ("link", re.compile(r"\b(?:https?://|www\.)\S+", re.IGNORECASE)),
    ("email", re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b")),
    ("id", re.compile(r"\b[0-9a-f]{24}\b", re.IGNORECASE)),
    # 7 or more digits, optionally after + or (, with spaces, dots, dashes or brackets between
    ("phone", re.compile(r"(?<![\w#])[+(]?\d(?:[\s.()-]*\d){6,}(?!\w)")),
)


def redact(text: str, kept: str = "", counts: Counter | None = None) -> str:
    """`text` with each personal detail replaced by [email], [phone], [link] or [id], unless it
    appears in `kept` (the scenario's own text); `counts` (by kind) is added to when given."""
    for kind, pattern in PATTERNS:

        def replace(match: re.Match, kind: str = kind) -> str:
            found = match.group(0)
            if found in kept:
                return found
            if counts is not None:
                counts[kind] += 1
            return f"[{kind}]"

        text = pattern.sub(replace, text)
    return text
