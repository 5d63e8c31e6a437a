"""Model endpoints as studies use them: register one, check its replicas, point a study's arms
at it (`manage.py serve_agents` does all three; the admin and the beat task use the same).

    endpoint = register_endpoint("smol", "vllm", ["http://127.0.0.1:8001/v1"])
    check_endpoint(endpoint)                     # GET /health and /v1/models of every replica
    point_arms(study, endpoint, {"a": "adapter-a", "b": "adapter-b"})

The endpoint and its replicas are agents' models (agents/models.py); an arm is studies'.
"""

from django.core.exceptions import ValidationError
from django.db import transaction

from agents.models import ModelEndpoint
from studies.lib.lock_objects import lock_arms
from studies.models import Arm, PlanFrozen, Study, arm_model_check, frozen_changes


def register_endpoint(
    name: str, kind: str, urls: list[str], api_key_env: str = "", keep_stored: bool = False
) -> ModelEndpoint:
    """Create or update the endpoint `name` with exactly these replica base URLs (".../v1"), in
    this order; replicas it keeps keep their stored health. `kind`: vllm, embedded or hosted.
    `keep_stored`: the replicas it already had stay as well, after these."""
    return ModelEndpoint.register(name, kind, urls, api_key_env, keep_stored)


def check_endpoint(endpoint: ModelEndpoint) -> ModelEndpoint:
    """Probe every replica now and store status, served models and errors (the beat task does
    this every PARLEY_ENDPOINT_CHECK_INTERVAL seconds)."""
    return endpoint.refresh_health()


@transaction.atomic
def point_arms(
    study: Study, endpoint: ModelEndpoint, models: dict[str, str] | None = None
) -> list[Arm]:
    """Point every arm of `study` at `endpoint`; `models` maps arm names to the model or
    adapter each is to ask for (arms not named keep theirs). Refused (ValidationError, with
    the served names) when an arm's model is served by no healthy replica, checked first if
    the stored health is stale; with PARLEY_ARM_MODEL_CHECK=warn the arms are saved anyway.
    Returns the arms."""
    arms = lock_arms(study)
    unknown = sorted(set(models or {}) - {arm.name for arm in arms})
    if unknown:
        raise ValidationError(f"Study {study.slug} has no arm named {', '.join(unknown)}.")
    repoint(arms, endpoint, models)
    return arms


@transaction.atomic
def repoint(arms, endpoint: ModelEndpoint, models: dict[str, str] | str | None) -> list[str]:
    """Point `arms` at `endpoint` asking for `models` (one name for all, or by arm name; None:
    each keeps its own); the problems, when only warned of (PARLEY_ARM_MODEL_CHECK=warn).
    PlanFrozen when that would change a pre-registered arm's model."""
    for arm in arms:
        arm.endpoint = endpoint
        if isinstance(models, str):
            arm.model_name = models
        elif models:
            arm.model_name = models.get(arm.name, arm.model_name)
    # A pre-registered arm's model is part of its plan: refused before any engine is asked.
    frozen = [f"Arm {arm}: {why}" for arm in arms for why in frozen_changes(arm).values()]
    if frozen:
        raise PlanFrozen(frozen)
    problems = []
    for arm in arms:
        problem = arm.model_problem()
        if problem:
            problems.append(f"Arm {arm}: {problem}")
    if problems and arm_model_check() != "warn":
        raise ValidationError(problems)
    for arm in arms:
        arm.save(update_fields=["endpoint", "model_name"])
    return problems
