"""Every row lock is named once, in studies/lib/lock_objects.py, and each one really locks its
row (and only the rows its query always locked) on PostgreSQL."""

import io
import re
import threading
import tokenize
from collections import Counter
from pathlib import Path

import pytest
from django.db import DatabaseError, connection, transaction

from studies.lib import lock_objects
from studies.models import (
    Arm,
    BonusPayment,
    Conversation,
    Participant,
    RatedConversation,
    RatingAssignment,
    Study,
    Withdrawal,
)
from studies.participation.arrive import arrive
from studies.participation.consent import give_consent
from tests.support.studies import make_study, prolific

ROOT = Path(__file__).resolve().parents[3]
PRODUCT = ("studies", "agents", "training", "platform")
HOME = "studies/lib/lock_objects.py"
# The locks that cannot live in HOME, each counted: HOME is above the studies data layer
# (pyproject.toml's layers) and the agents app is below studies (lock_objects' docstring).
BELOW_HOME = {
    "studies/models/participant.py": 1,  # time_out_overdue's SKIP LOCKED sweep
    "studies/models/consent.py": 1,  # current_consent(lock=True)
    "agents/models.py": 1,  # ModelEndpoint.register
}
RAW_LOCK = re.compile(r"\bFOR\s+(NO\s+KEY\s+)?(UPDATE|SHARE)\b", re.IGNORECASE)


def row_locks(source: str) -> int:
    """The row locks a module writes: `select_for_update` in its code, or FOR UPDATE / FOR
    SHARE in a string (raw SQL); comments do not count."""
    count = 0
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.NAME and token.string == "select_for_update":
            count += 1
        elif token.type == tokenize.STRING and RAW_LOCK.search(token.string):
            count += 1
    return count


def test_no_row_lock_is_written_outside_lock_objects():
    found = Counter()
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative != HOME and "migrations" not in path.parts:
                if locks := row_locks(path.read_text(encoding="utf-8")):
                    found[relative] = locks
    assert dict(found) == BELOW_HOME, (
        f"A row lock belongs in {HOME}, named, with its place in the lock order there."
    )


def test_the_scan_sees_a_lock_and_not_a_comment():
    assert row_locks("x = Participant.objects.select_for_update().get(pk=1)\n") == 1
    assert row_locks('cursor.execute("SELECT 1 FROM t FOR UPDATE")\n') == 1
    assert row_locks("# FOR UPDATE needs a transaction: select_for_update\nx = 1\n") == 0


# --- each lock holds its rows, on PostgreSQL ---------------------------------------------------


def held(model, pk) -> bool:
    """Whether another connection finds the row locked: a NOWAIT lock of that row alone (no
    join: unordered), tried in a transaction of its own on another thread."""
    outcome = {}

    def other_connection():
        try:
            with transaction.atomic():
                list(model.objects.filter(pk=pk).order_by().select_for_update(nowait=True))
            outcome["held"] = False
        except DatabaseError:
            outcome["held"] = True
        finally:
            connection.close()

    thread = threading.Thread(target=other_connection)
    thread.start()
    thread.join(30)
    return outcome["held"]


@pytest.fixture
def rows(postgres):
    study = make_study()
    participant, _ = arrive(study, prolific())
    participant = give_consent(participant, True)
    rated = RatedConversation.objects.create(
        study=study, transcript=[], source=RatedConversation.Source.PERSON
    )
    return {
        "study": study,
        "participant": participant,
        "arm": participant.arm,
        "other_arm": study.arms.exclude(pk=participant.arm_id).get(),
        "conversation": Conversation.objects.get(participant=participant),
        "assignment": RatingAssignment.objects.create(
            participant=participant, conversation=rated, position=0
        ),
        "withdrawal": Withdrawal.objects.create(study=study, participant=participant),
        "payment": BonusPayment.objects.create(study=study, source="test"),
    }


MODELS = {
    "study": Study,
    "participant": Participant,
    "arm": Arm,
    "other_arm": Arm,
    "conversation": Conversation,
    "assignment": RatingAssignment,
    "withdrawal": Withdrawal,
    "payment": BonusPayment,
}

# (the lock, taking it from the rows, the rows it locks, rows it leaves free). The free ones
# are part of each lock's meaning: `of=("self",)` and an unordered query keep a joined row free.
LOCKS = [
    (
        "lock_participant",
        lambda r: lock_objects.lock_participant(r["participant"].pk),
        ["participant"],
        ["study", "arm", "conversation"],
    ),
    (
        "lock_participant_with_page",
        lambda r: lock_objects.lock_participant_with_page(r["participant"].pk),
        ["participant"],
        ["study", "arm", "conversation"],
    ),
    (
        "lock_participants",
        lambda r: list(
            lock_objects.lock_participants(
                Participant.objects.filter(pk=r["participant"].pk).select_related("study")
            )
        ),
        ["participant"],
        ["study"],
    ),
    (
        "lock_study",
        lambda r: lock_objects.lock_study(r["study"].pk),
        ["study"],
        ["arm", "participant"],
    ),
    ("lock_arm", lambda r: lock_objects.lock_arm(r["arm"].pk), ["arm"], ["other_arm", "study"]),
    (
        "lock_arm_ids",
        lambda r: lock_objects.lock_arm_ids(r["study"]),
        ["arm", "other_arm", "study"],
        ["participant"],
    ),
    ("lock_arms", lambda r: lock_objects.lock_arms(r["study"]), ["arm", "other_arm"], ["study"]),
    (
        "lock_chat_conversation",
        lambda r: lock_objects.lock_chat_conversation(r["participant"].pk),
        ["conversation"],
        ["participant"],
    ),
    (
        "lock_conversation_id",
        lambda r: lock_objects.lock_conversation_id(r["conversation"].pk),
        ["conversation"],
        ["participant"],
    ),
    (
        "lock_conversation",
        lambda r: lock_objects.lock_conversation(r["conversation"].pk),
        ["conversation"],
        ["participant"],
    ),
    (
        "lock_rating_assignment",
        lambda r: lock_objects.lock_rating_assignment(r["participant"], 0),
        ["assignment"],
        ["participant"],
    ),
    (
        "lock_withdrawal",
        lambda r: lock_objects.lock_withdrawal(r["participant"]),
        ["withdrawal"],
        ["participant"],
    ),
    # select_related("study") without `of=`: PostgreSQL locks the joined study row as well.
    (
        "lock_bonus_payment",
        lambda r: lock_objects.lock_bonus_payment(r["payment"].pk),
        ["payment", "study"],
        ["participant"],
    ),
]


def test_every_named_lock_is_tested():
    named = {name for name in vars(lock_objects) if name.startswith("lock_")}
    assert named == {name for name, *_ in LOCKS}


@pytest.mark.services
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name, take, locked, free", LOCKS, ids=[lock[0] for lock in LOCKS])
def test_the_lock_holds_its_rows_until_the_transaction_ends(rows, name, take, locked, free):
    with transaction.atomic():
        take(rows)
        for row in locked:
            assert held(MODELS[row], rows[row].pk), f"{name} leaves the {row} free"
        for row in free:
            assert not held(MODELS[row], rows[row].pk), f"{name} locks the {row} as well"
    for row in locked:
        assert not held(MODELS[row], rows[row].pk), f"{name} outlives its transaction"


def test_a_raters_consent_locks_the_study_before_the_consent_version(postgres):
    """An admin's save of a study locks its row, then versions the consent text; a rater's
    consent took the consent version first, then the study (to assign conversations): the two
    deadlocked (PostgreSQL ended the researcher's save). Both now go study -> consent version."""
    from django.test.utils import CaptureQueriesContext

    from studies.models import AnnotationSetup

    study = make_study(slug="rate-order", arms=("raters",))
    AnnotationSetup.objects.create(study=study, conversations_per_rater=1)
    RatedConversation.objects.create(
        study=study, transcript=[{"speaker": "user", "text": "hi"}], source="person"
    )
    participant, _ = arrive(study, prolific(pid="rater-1"))
    with CaptureQueriesContext(connection) as queries:
        give_consent(participant, True)
    locked = [re.search(r'FROM "(\w+)"', q["sql"])[1] for q in queries if "FOR UPDATE" in q["sql"]]
    order = [t for t in locked if t in ("studies_study", "studies_consentversion")]
    assert order and order[0] == "studies_study", locked
    assert "studies_consentversion" in order, locked
