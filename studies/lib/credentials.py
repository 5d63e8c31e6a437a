"""What lets someone act as a participant or names them, masked wherever it would be kept or
shown to people who may not act as that participant: the server's log (parley/server_log.py) and
the problems the monitor lists (studies/participation/problems.py).

A participant's pages and chat socket are reached by their token alone (/p/<token>/,
/ws/p/<token>/): whoever holds the path can read the conversation and write as them. Prolific's
link carries PROLIFIC_PID, STUDY_ID and SESSION_ID (SESSION_ID is the submission: it ties the
data to the person on Prolific); Prolific's ids are 24 hexadecimal digits.
"""

import hashlib
import hmac
import re

from django.conf import settings

TOKEN_MASK = "[token]"
# A participant's path anywhere in a text (a bare path, a full URL, a request line).
PARTICIPANT_PATH = re.compile(r"(?P<ws>/ws)?/p/(?!\[token\])[^/?#\s\"'<>]+")
PROLIFIC_PARAMETERS = re.compile(
    r"\b(?P<name>PROLIFIC_PID|STUDY_ID|SESSION_ID)=[^&\s\"'#<>]*", re.IGNORECASE
)
PROLIFIC_ID = re.compile(r"\b[0-9a-f]{24}\b", re.IGNORECASE)


def keyed_hash(value) -> str:
    """A short stand-in for a token or a Prolific id where something must tell participants
    apart (the rate limiter's counts): the same for the same value, and without the site's
    secret key no way back to it."""
    key = settings.SECRET_KEY.encode()
    return hmac.new(key, str(value).encode(), hashlib.sha256).hexdigest()[:16]


def mask_path(path: str) -> str:
    """`path` with a participant's token replaced: /p/<token>/questionnaire/ ->
    /p/[token]/questionnaire/."""
    return PARTICIPANT_PATH.sub(lambda m: f"{m['ws'] or ''}/p/{TOKEN_MASK}", path)


def mask(text: str) -> str:
    """`text` with every participant token (in a participant path), every Prolific
    link parameter's value and every Prolific-style id replaced."""
    text = mask_path(text)
    text = PROLIFIC_PARAMETERS.sub(lambda m: f"{m['name']}=[redacted]", text)
    return PROLIFIC_ID.sub("[prolific id]", text)
