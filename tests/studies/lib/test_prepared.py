"""Prepared reads (studies/lib/prepared_queries.py) give exactly what their querysets give."""

import uuid

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from studies.chat.agent_turn import LATER_MESSAGES
from studies.lib.lock_objects import LOCK_CHAT, LOCK_CONVERSATION, lock_participant_with_page
from studies.lib.prepared_queries import Prepared, fields_of, instances
from studies.models import Message, Participant
from studies.participation.arrive import PARTICIPANT, STUDY, arrive
from studies.participation.chat_turn import MESSAGES
from studies.participation.consent import give_consent, is_annotation
from tests.support.studies import prolific

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def conversation(study):
    participant, _ = arrive(study, prolific())
    give_consent(participant, True)
    conversation = participant.conversation
    rows = [
        dict(role=Message.Role.USER, content="Hi", client_id="c1"),
        dict(role=Message.Role.ASSISTANT, content="", tool_calls=[{"id": "t", "x": [1, "é"]}]),
        dict(role=Message.Role.TOOL, content='{"ok": true}', tool_call_id="t", tool_name="f"),
        dict(role=Message.Role.ASSISTANT, content="Done", ttft_ms=12, latency_ms=40),
    ]
    for seq, fields in enumerate(rows, start=1):
        Message.objects.create(conversation=conversation, seq=seq, **fields)
    return conversation


def test_messages_are_the_querysets_instances(conversation):
    prepared = instances(Message, MESSAGES.rows(conversation.pk))
    expected = list(Message.objects.filter(conversation=conversation))
    assert sorted(prepared, key=lambda m: m.seq) == expected  # same rows (by pk)
    for mine, theirs in zip(sorted(prepared, key=lambda m: m.seq), expected, strict=True):
        for name in fields_of(Message):  # JSON, datetimes and nulls converted alike
            assert getattr(mine, name) == getattr(theirs, name), name
        assert not mine._state.adding and mine._state.db == "default"
    assert MESSAGES.rows(conversation.pk + 1000) == []


def test_every_value_goes_to_its_place(conversation, study):
    for seq in range(0, 6):
        expected = set(
            Message.objects.filter(conversation=conversation, seq__gt=seq).values_list(
                "seq", "reply_to_id", "pk"
            )
        )
        assert set(LATER_MESSAGES.rows(conversation.pk, seq)) == expected
    # Values given in another order than the SQL uses them.
    between = Prepared(
        lambda high, low: Message.objects.filter(seq__gt=low, seq__lt=high).values_list("seq"),
        2,
    )
    assert sorted(between.rows(4, 1)) == [(2,), (3,)]
    assert sorted(between.rows(5, 2)) == [(3,), (4,)]


def test_locks_inside_a_transaction(conversation):
    participant = conversation.participant
    participant.refresh_from_db()
    with transaction.atomic():
        [(pk, ended_at, status, created_at)] = LOCK_CHAT.rows(participant.pk)
        assert LOCK_CONVERSATION.rows(conversation.pk) == [(conversation.pk,)]
    assert (pk, ended_at, status) == (conversation.pk, None, participant.status)
    assert created_at == participant.created_at


def test_bad_preparations_are_refused(db):
    unused = Prepared(lambda pk: Message.objects.values_list("pk"), 1)
    with pytest.raises(ValueError, match="do not appear"):
        unused.rows(1)
    with pytest.raises(TypeError, match="expected 2 values"):
        LATER_MESSAGES.rows(1)


def test_objects_are_the_querysets_with_their_relations(conversation):
    participant = conversation.participant
    prepared = PARTICIPANT.objects(participant.token)
    expected = list(
        Participant.objects.select_related("study", "study__annotation", "arm", "scenario").filter(
            token=participant.token
        )
    )
    assert prepared == expected
    [mine], [theirs] = prepared, expected
    for name in fields_of(Participant):
        assert getattr(mine, name) == getattr(theirs, name), name
    with CaptureQueriesContext(connection) as read:  # the relations came with it
        assert (mine.study, mine.arm, mine.scenario) == (theirs.study, theirs.arm, None)
        assert not is_annotation(mine.study)
        assert mine.study.title == theirs.study.title and mine.arm.name == theirs.arm.name
    assert len(read) == 0
    assert PARTICIPANT.objects(uuid.uuid4()) == []


def test_objects_by_text_and_under_a_lock(conversation, study):
    assert STUDY.objects(study.slug) == [study]
    assert STUDY.objects(study.slug + "x") == []
    participant = conversation.participant
    with transaction.atomic():
        locked = lock_participant_with_page(participant.pk)
        assert locked == participant and locked.study == study
    with pytest.raises(Participant.DoesNotExist):
        lock_participant_with_page(participant.pk + 1000)


def test_objects_refuse_what_they_cannot_make(db):
    values = Prepared(lambda pk: Message.objects.filter(pk=pk).values_list("pk"), 1)
    with pytest.raises(TypeError, match="model instances"):
        values.objects(1)
    prefetching = Prepared(lambda pk: Message.objects.filter(pk=pk).prefetch_related("replies"), 1)
    with pytest.raises(ValueError, match="prefetch_related"):
        prefetching.objects(1)


# Each kind a compiled read takes, against a column of that kind. The suite runs once on the
# README's default database (SQLite) and once on PostgreSQL (.ci/run), so each kind is tested on
# each database parley supports; the two send a UUID differently (hex text, native uuid).
KINDS = {
    int: (lambda row: row.pk, lambda v: Participant.objects.filter(pk=v)),
    str: (lambda row: row.prolific_pid, lambda v: Participant.objects.filter(prolific_pid=v)),
    uuid.UUID: (lambda row: row.token, lambda v: Participant.objects.filter(token=v)),
}
OTHER = {int: 10**6, str: "no-such-pid", uuid.UUID: uuid.UUID(int=7)}


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "django"])
@pytest.mark.parametrize("kind", list(KINDS), ids=lambda kind: kind.__name__)
def test_each_kind_on_this_database(conversation, kind, compiled, settings):
    settings.PARLEY_COMPILED_READS = compiled  # off: Django's own query path, the same answers
    value_of, build = KINDS[kind]
    participant = conversation.participant
    prepared = Prepared(build, 1, kinds=(kind,))
    by_value = Prepared(lambda v: build(v).values_list("pk", "token"), 1, kinds=(kind,))
    value = value_of(participant)
    assert isinstance(value, kind)
    assert prepared.objects(value) == list(build(value)) == [participant]
    assert by_value.rows(value) == [(participant.pk, participant.token)]
    assert prepared.objects(OTHER[kind]) == list(build(OTHER[kind])) == []
    # compiled once per database (the second read of another value reuses the SQL), or never
    assert list(prepared._compiled) == ([connection.alias] if compiled else [])
    values = Prepared(lambda v: build(v).values_list("pk"), 1, kinds=(kind,))
    with pytest.raises(TypeError, match="model instances"):
        values.objects(value)
    wrong = "1" if kind is not str else 1
    with pytest.raises(TypeError, match=f"a {kind.__name__} was expected"):
        prepared.objects(wrong)


def test_other_kinds_are_refused_where_declared(db):
    from datetime import datetime

    with pytest.raises(TypeError, match="a compiled read takes int, str, UUID"):
        Prepared(lambda at: Message.objects.filter(created_at=at), 1, kinds=(datetime,))
