"""Which conversations a rater gets: k distinct raters per conversation, never more; n per
rater, balanced over the pool's sources and arms, in random order, with gold ones mixed in.

Assignment takes the study's row lock, so two raters arriving together are served one after
the other on PostgreSQL and a conversation's k places are never over-filled; a rater who leaves
frees the places they had not rated yet.
"""

import random
from collections import Counter, defaultdict

from django.db import transaction
from django.db.models import Count, Q

from studies.lib.lock_objects import lock_study
from studies.models import Participant, RatedConversation, RatingAssignment, Study


class NoConversations(Exception):
    """Nothing left for this rater: every conversation has its k raters, or they took part in
    every study the rest come from."""


def assign(participant: Participant, rng: random.Random | None = None) -> list[RatingAssignment]:
    """The rater's conversations, made once (a rater who comes back gets the same ones)."""
    rng = rng or random.Random()
    with transaction.atomic():
        study = lock_study(participant.study_id)
        mine = list(participant.rating_assignments.select_related("conversation"))
        if mine:
            return mine
        setup = study.annotation
        pool = available(study, participant, setup.raters_per_conversation)
        chosen = balanced(pool, setup.conversations_per_rater, rng)
        if not chosen:
            raise NoConversations
        gold = list(study.rated_conversations.filter(gold__isnull=False))
        chosen += rng.sample(gold, min(setup.gold_per_rater, len(gold)))
        rng.shuffle(chosen)
        return RatingAssignment.objects.bulk_create(
            RatingAssignment(participant=participant, conversation=c, position=i)
            for i, c in enumerate(chosen, 1)
        )


def available(study: Study, participant: Participant, k: int) -> list[RatedConversation]:
    """Conversations with a free place that this rater may see: none from a study they took
    part in (the same Prolific id), none they already hold."""
    took_part = (
        Participant.objects.filter(prolific_pid=participant.prolific_pid)
        .exclude(study=study)
        .values("study_id")
    )
    held = Count("assignments", filter=holding("assignments__"))
    return list(
        study.rated_conversations.filter(gold__isnull=True)
        .exclude(origin_study__in=took_part)
        .annotate(held=held)
        .filter(held__lt=k)
        .order_by("pk")
    )


def holding(via: str = "") -> Q:
    """The assignments that hold one of a conversation's places: rated, or assigned to a rater
    still taking part. A rater who times out or returns frees theirs at once, with no hook;
    previews (staff) and bots (rehearsals) never take a person's place."""
    people = Q(**{f"{via}participant__is_preview": False, f"{via}participant__is_bot": False})
    return people & (
        Q(**{f"{via}status": RatingAssignment.Status.RATED})
        | Q(
            **{
                f"{via}status": RatingAssignment.Status.ASSIGNED,
                f"{via}participant__status__in": Participant.ACTIVE,
            }
        )
    )


def balanced(pool: list[RatedConversation], n: int, rng: random.Random) -> list:
    """n conversations, as even as the pool allows over its strata (source and arm): each pick
    goes to a stratum this rater has fewest of, and within it to a conversation with the
    fewest raters so far; ties at random."""
    by_stratum = defaultdict(list)
    for conversation in pool:
        by_stratum[conversation.stratum].append(conversation)
    for members in by_stratum.values():
        rng.shuffle(members)
        members.sort(key=lambda c: c.held)  # stable: random among equally rated
    picked, per_stratum = [], Counter()
    while len(picked) < n and by_stratum:
        fewest = min(per_stratum[s] for s in by_stratum)
        candidates = [s for s in by_stratum if per_stratum[s] == fewest]
        stratum = rng.choice(sorted(candidates))
        picked.append(by_stratum[stratum].pop(0))
        per_stratum[stratum] += 1
        if not by_stratum[stratum]:
            del by_stratum[stratum]
    return picked


def release(participants) -> int:
    """Mark the unrated assignments of raters who left (returned, timed out) as released, for
    the record; their places are free already (`holding`). How many were marked."""
    return RatingAssignment.objects.filter(
        participant__in=participants, status=RatingAssignment.Status.ASSIGNED
    ).update(status=RatingAssignment.Status.RELEASED)
