"""Is a study ready for participants? The go-live checks, and the arms' endpoint health.

Setting a study Live goes through `set_live` (admin form, list action, the monitor's switch):
it refuses with the list of what is wrong, so participants never meet a study that cannot run.
"""

import asyncio
from dataclasses import asdict, dataclass

from asgiref.sync import async_to_sync
from django.core.cache import cache
from django.db import transaction

from agents.llm import LLMClient, LLMError
from agents.paths import secret

from .domains import get_domain
from .models import Arm, Study

HEALTH_TIMEOUT = 3.0  # seconds an endpoint has to list its models
HEALTH_CACHE_SECONDS = 15  # the monitor refreshes every few seconds: endpoints are asked less


@dataclass
class Health:
    """One arm's endpoint: does it answer GET /models, and does it list the arm's model?"""

    ok: bool
    detail: str


class NotReady(Exception):
    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


async def _endpoint_models(url: str, api_key: str | None) -> list[str] | LLMError:
    async with LLMClient(
        url, api_key=api_key, timeout=HEALTH_TIMEOUT, connect_timeout=HEALTH_TIMEOUT, max_retries=0
    ) as client:
        try:
            return await asyncio.wait_for(client.list_models(), HEALTH_TIMEOUT + 1)
        except TimeoutError:
            return LLMError(f"{url} did not answer within {HEALTH_TIMEOUT:g} s")
        except LLMError as error:
            return error


async def _check_all(endpoints: list[tuple[str, str | None]]) -> list:
    return await asyncio.gather(*(_endpoint_models(url, key) for url, key in endpoints))


def _key_of(arm: Arm) -> str | None:
    return secret(arm.api_key_env) if arm.api_key_env else None


def check_arms(arms: list[Arm]) -> dict[int, Health]:
    """Each arm's health, asked now: one GET /models per distinct endpoint, all at once."""
    health, endpoints = {}, []
    for arm in arms:
        if arm.api_key_env and _key_of(arm) is None:
            health[arm.pk] = Health(False, f"the environment variable {arm.api_key_env} is unset")
        elif (arm.endpoint_url, _key_of(arm)) not in endpoints:
            endpoints.append((arm.endpoint_url, _key_of(arm)))
    answers = dict(zip(endpoints, async_to_sync(_check_all)(endpoints), strict=True))
    for arm in arms:
        if arm.pk in health:
            continue
        models = answers[(arm.endpoint_url, _key_of(arm))]
        if isinstance(models, LLMError):
            health[arm.pk] = Health(False, f"{arm.endpoint_url} does not answer: {models}")
        elif arm.model_name not in models:
            served = ", ".join(models) or "none"
            health[arm.pk] = Health(
                False, f"{arm.endpoint_url} does not serve {arm.model_name} (it serves: {served})"
            )
        else:
            health[arm.pk] = Health(True, f"{arm.endpoint_url} serves {arm.model_name}")
    return health


def _cache_key(arm: Arm) -> str:
    return f"studies.health:{arm.endpoint_url}|{arm.model_name}|{arm.api_key_env}"


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
    """A study with a Domain gives each participant one of its tasks; open chat needs none."""
    return get_domain(study.domain) is not None


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
    arms = list(study.arms.filter(active=True))
    if not arms:
        found.append("There is no active arm.")
    health = (fresh_health if fresh else cached_health)(arms) if arms else {}
    found += [f"Arm {arm.name}: {health[arm.pk].detail}." for arm in arms if not health[arm.pk].ok]
    if not study.completion_code.strip():
        found.append("The completion code is missing.")
    for field in ("no_consent_code", "timeout_code"):
        if not getattr(study, field).strip() and not study.other_code.strip():
            label = field.replace("_", " ")  # codes are CompletionCode rows, read by ending
            found.append(f"The {label} is missing (or set the other code as the way back).")
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
