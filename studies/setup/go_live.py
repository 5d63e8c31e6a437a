"""Is a study ready for participants? The go-live checks, and the arms' endpoint health.

Setting a study Live goes through `set_live` (admin form, list action, the monitor's switch):
it refuses with the list of what is wrong, so participants never meet a study that cannot run.
"""

from dataclasses import asdict, dataclass

from django.core.cache import cache
from django.db import transaction

from agents.models import ModelEndpoint
from studies.lib.domain_bridge import shared_domain
from studies.models import Arm, Study

HEALTH_CACHE_SECONDS = 15  # the monitor refreshes every few seconds: endpoints are asked less


@dataclass
class Health:
    """One arm's endpoint: is a replica up, and does a replica that is up serve the arm's model?"""

    ok: bool
    detail: str


class NotReady(Exception):
    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


def check_arms(arms: list[Arm]) -> dict[int, Health]:
    """Each arm's health, asked now: every replica of the arms' endpoints is probed (once per
    endpoint) and what it answered is stored in the registry."""
    endpoints = {}
    for arm in arms:
        endpoints.setdefault(arm.endpoint_id, None)
    for endpoint in ModelEndpoint.objects.prefetch_related("replicas").filter(pk__in=endpoints):
        endpoints[endpoint.pk] = endpoint.refresh_health()
    health = {}
    for arm in arms:
        endpoint = endpoints[arm.endpoint_id]
        problem = endpoint.model_problem(arm.model_name, refresh=False)
        health[arm.pk] = Health(
            problem is None, problem or f"endpoint {endpoint.name} serves {arm.model_name}"
        )
    return health


def _cache_key(arm: Arm) -> str:
    return f"studies.health:{arm.endpoint_id}|{arm.model_name}"


def fresh_health(arms: list[Arm]) -> dict[int, Health]:
    """check_arms, and the answers remembered for the pages that show health."""
    health = check_arms(arms)
    cache.set_many({_cache_key(arm): asdict(health[arm.pk]) for arm in arms}, HEALTH_CACHE_SECONDS)
    return health


def cached_health(arms: list[Arm]) -> dict[int, Health]:
    """Health remembered briefly per (endpoint, model): pages that refresh themselves do not
    ask the endpoints on every load."""
    found = cache.get_many([_cache_key(arm) for arm in arms])
    health = {arm.pk: Health(**found[_cache_key(arm)]) for arm in arms if _cache_key(arm) in found}
    missing = [arm for arm in arms if arm.pk not in health]
    if missing:
        health.update(fresh_health(missing))
    return health


def needs_scenarios(study: Study) -> bool:
    """A chat study with a Domain gives each participant one of its tasks (a domain no longer
    registered raises ValueError here); open chat and annotation studies need none."""
    return study.needs_scenarios() and shared_domain(study.domain) is not None


def problems(study: Study, fresh: bool = True) -> list[str]:
    """Everything that would keep participants from taking part, in words; empty when ready.
    `fresh`: ask the endpoints now (going live), else a brief cache will do (panels)."""
    found = []
    try:
        if needs_scenarios(study) and not study.scenarios.filter(active=True).exclude(
            domain=Study.OPEN_CHAT
        ):
            found.append(
                f"The task ({study.get_domain_display()}) needs scenarios: the pool has no "
                "active scenario. Import some from the domain."
            )
    except ValueError as error:  # a domain no longer registered
        found.append(f"The study's domain cannot be loaded: {error}")
    if not hasattr(study, "questionnaire"):
        found.append("There is no questionnaire.")
    elif not study.questionnaire.items.exists():
        found.append("The questionnaire has no items.")
    found += input_problems(study)
    arms = list(study.arms.filter(active=True))
    if not arms:
        found.append("There is no active arm.")
    if hasattr(study, "annotation"):  # raters read stored conversations: no model is asked
        found += annotation_problems(study)
    else:
        health = (fresh_health if fresh else cached_health)(arms) if arms else {}
        found += [
            f"Arm {arm.name}: {health[arm.pk].detail}." for arm in arms if not health[arm.pk].ok
        ]
    if not study.retention_days:
        found.append(
            "The retention period is missing: set how many days after arrival each "
            "participant's identifying data (Prolific ids, link, identifying free text) is kept "
            "before it is purged, as your ethics approval states."
        )
    if not study.completion_code.strip():
        found.append("The completion code is missing.")
    for field in ("no_consent_code", "timeout_code"):
        if not getattr(study, field).strip() and not study.other_code.strip():
            label = field.replace("_", " ")  # codes are CompletionCode rows, read by ending
            found.append(f"The {label} is missing (or set the other code as the way back).")
    return found


def annotation_problems(study: Study) -> list[str]:
    """An annotation study needs conversations to rate, enough places for its target of raters
    (each conversation takes k, each rater n), and its gold answers to name its items."""
    setup, found = study.annotation, []
    pool = study.rated_conversations.filter(gold__isnull=True).count()
    if not pool:
        return ["The annotation pool has no conversations: add some from a finished study."]
    places = pool * setup.raters_per_conversation
    wanted = study.target_per_arm * study.arms.filter(active=True).count()
    if wanted * setup.conversations_per_rater > places:
        found.append(
            f"The pool has places for {places // setup.conversations_per_rater} raters "
            f"({pool} conversations x {setup.raters_per_conversation} raters each / "
            f"{setup.conversations_per_rater} per rater), fewer than the target of {wanted}."
        )
    if setup.gold_per_rater and not study.rated_conversations.filter(gold__isnull=False):
        found.append(
            f"Each rater should get {setup.gold_per_rater} gold conversation(s), but the pool "
            "has none (set known answers on a conversation, or set gold per rater to 0)."
        )
    keys = {item.key for item in study.questionnaire_items()}
    for gold in study.rated_conversations.filter(gold__isnull=False):
        unknown = sorted(set(gold.gold) - keys)
        if unknown:
            found.append(
                f"Gold conversation {gold.pk} answers items the study does not ask: "
                f"{', '.join(unknown)}."
            )
    return found


def input_problems(study: Study) -> list[str]:
    """Each answer the Domain reads from the questionnaire needs one item mapped to it that can
    hold it; an item mapped to an answer the Domain does not read is a mistake too."""
    needs = {need.name: need for need in study.domain_inputs()}
    items = [item for item in study.questionnaire_items() if item.domain_input]
    found = []
    for need in needs.values():
        mapped = [item for item in items if item.domain_input == need.name]
        if not mapped:
            found.append(
                f"The task ({study.get_domain_display()}) needs {need.describe()} from the "
                'questionnaire: set "answers the task\'s" on the item that asks it.'
            )
        for item in mapped:
            problem = item.input_problem(need)
            if problem:
                found.append(f"Questionnaire item {item.key}: {problem}")
    for item in items:
        if item.domain_input not in needs:
            found.append(
                f"Questionnaire item {item.key} answers {item.domain_input!r}, which the task "
                f"({study.get_domain_display()}) does not read."
            )
    return found


def check_go_live(study: Study) -> None:
    """Raise NotReady with the list of problems unless the study can take participants."""
    found = problems(study)
    if found:
        raise NotReady(found)


def set_live(study: Study) -> Study:
    """Every way of making a study Live comes here: the checks first, then the status."""
    check_go_live(study)
    with transaction.atomic():
        Study.objects.filter(pk=study.pk).update(status=Study.Status.LIVE)
    study.status = Study.Status.LIVE
    return study
