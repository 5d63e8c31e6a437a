"""The per-person export (GDPR Art. 15): everything parley holds about one participant, as JSON,
read from the same places the erasure empties (studies/privacy/places.py).

The token is the one thing held and not shown: it opens the participant's pages and lets its
holder write as them, and an export travels (to the person, by e-mail). The export says so.
"""

import json

from django.utils import timezone

from studies.lib.credentials import TOKEN_MASK
from studies.models import Participant
from studies.privacy.places import PLACES, Person

FORMAT = "parley.person/1"


def export_participant(participant: Participant) -> dict:
    person = Person(participant)
    held = {
        "format": FORMAT,
        "exported_at": timezone.now().isoformat(),
        "study": participant.study.slug,
        "prolific_pid": participant.prolific_pid,
        "token": "held, not shown: it opens the participant's own pages",
        "places": {
            place.name: {"where": place.where, "held": place.held(person)} for place in PLACES
        },
    }
    # Where the token is held inside other text (an old problem's path, a log line), it is
    # shown masked too.
    text = json.dumps(held, default=str)
    for spelling in (str(participant.token), participant.token.hex):
        text = text.replace(spelling, TOKEN_MASK)
    return json.loads(text)


def export_json(participants) -> str:
    """One person's participations (one per study) as one JSON document."""
    return json.dumps(
        {"format": FORMAT, "participations": [export_participant(p) for p in participants]},
        indent=2,
        default=str,
    )
