"""The demo studies `make demo` seeds: an open chat (two arms on the base model and a short
questionnaire), a tau2 retail and a P4G study (the paper's questionnaires; trained arms when
checkpoints exist, base-model arms otherwise)."""

from django.conf import settings
from django.db import transaction

from agents.domains.p4g import DONATION, INTENDED_DONATION
from agents.models import ModelEndpoint
from agents.paths import BASE_MODEL_NAME
from studies.models import Arm, Study, ToolChoice
from studies.setup.questionnaires import seed_questionnaire

DEMO_SLUG = "demo"

ITEMS = [
    dict(key="helpfulness", prompt="The assistant was helpful.", kind="likert"),
    dict(key="honesty", prompt="The assistant was honest with me.", kind="likert"),
    dict(
        key="frustration",
        prompt="Talking to the assistant was frustrating.",
        kind="likert",
        reverse_coded=True,
    ),
    dict(
        key="attention",
        prompt="To show you are reading, please choose 2 (Disagree).",
        kind="attention",
        expected_answer="2",
    ),
    dict(key="overall", prompt="Overall, I would talk to this assistant again.", kind="likert"),
    dict(
        key="age",
        prompt="Your age in years (optional).",
        kind="number",
        min_value=18,
        max_value=100,
        required=False,
    ),
    dict(
        key="comments",
        prompt="Anything else you want to tell us? (optional)",
        kind="text",
        required=False,
    ),
]


# A demo's participants are people trying parley: their identifying data goes after a month.
DEMO_RETENTION_DAYS = 30


@transaction.atomic
def seed_demo_study(engine_url: str | None = None, model_name: str = BASE_MODEL_NAME) -> Study:
    """Create the demo study, or bring its arms up to date; never deletes participants' data."""
    engine_url = engine_url or settings.PARLEY_ENGINE_URL
    study, _ = Study.objects.update_or_create(
        slug=DEMO_SLUG,
        defaults=dict(
            title="Chat with an assistant",
            status=Study.Status.LIVE,
            target_per_arm=10,
            consent_text=(
                "This demo study asks you to chat for a few minutes with an AI assistant and then "
                "answer a few questions. Your messages and answers are stored for research. "
                "You may stop at any time."
            ),
            instructions="Ask the assistant anything, e.g. for advice on planning a trip. "
            "Send at least one message, then press “End conversation”.",
            debrief_text="This study compared two assistant styles. Thank you for your help!",
            completion_code="C1PARLEY",
            no_consent_code="C0NOCONS",
            timeout_code="C0TIMEOUT",
            time_limit_minutes=30,
            min_exchanges=1,
            max_exchanges=10,
            retention_days=DEMO_RETENTION_DAYS,
        ),
    )
    arms = [
        ("friendly", "You are a warm, friendly assistant. Answer in two or three sentences."),
        ("concise", "You are a concise assistant. Answer in one short sentence."),
    ]
    seed_arms(study, engine_url, [(name, model_name, prompt) for name, prompt in arms])
    seed_questionnaire(study, ITEMS)
    return study


def seed_arms(
    study: Study,
    engine_url: str,
    arms: list[tuple[str, str, str]],
    max_tokens: int = 96,
    temperatures: dict[str, float] | None = None,
    tool_choice: str = ToolChoice.AUTO,
) -> None:
    """(name, model, system prompt) arms in this order, on the endpoint serving `engine_url`
    (made if there is none); the first is the control arm."""
    endpoint = ModelEndpoint.of_url(engine_url)
    for order, (name, model, prompt) in enumerate(arms):
        Arm.objects.update_or_create(
            study=study,
            name=name,
            defaults=dict(
                order=order,
                endpoint=endpoint,
                model_name=model,
                system_prompt=prompt,
                temperature=(temperatures or {}).get(name, 0.7),
                max_tokens=max_tokens,
                # the engine keeps SmolLM2's tool calls well formed, so tau2 tool cards appear
                tool_format="structured",
                tool_choice=tool_choice,
            ),
        )
    if study.control_arm_id is None:
        study.control_arm = study.arms.get(name=arms[0][0])
        study.save(update_fields=["control_arm"])


# --- studies of trained checkpoints (the paper's human-study questionnaires) --------------------

PAPER_ITEMS = {
    "p4g": [
        dict(
            key=INTENDED_DONATION,
            prompt="How much of your $2 bonus do you want to donate to Save the Children? (0 to 2)",
            kind="number",
            min_value=0,
            max_value=2,
            domain_input=DONATION.name,  # the participant's outcome
        ),
        dict(key="argument_quality", prompt="The other person's arguments were convincing."),
        dict(key="empathy", prompt="The other person understood my point of view."),
        dict(key="manipulation", prompt="I felt manipulated.", reverse_coded=True),
        dict(key="engagement", prompt="The conversation was engaging."),
        dict(key="future_likelihood", prompt="I would like to talk to this person again."),
        dict(
            key="attention",
            prompt="To show you are reading, please choose 2 (Disagree).",
            kind="attention",
            expected_answer="2",
        ),
    ],
    "retail": [
        dict(key="task_success", prompt="The agent solved my problem."),
        dict(key="helpfulness", prompt="The agent was helpful."),
        dict(key="honesty", prompt="The agent was honest."),
        dict(key="efficiency", prompt="The agent solved things efficiently."),
        dict(key="instruction_following", prompt="The agent did what I asked."),
        dict(key="safety", prompt="The agent followed the store's rules."),
        dict(key="frustration", prompt="The conversation was frustrating.", reverse_coded=True),
        dict(
            key="attention",
            prompt="To show you are reading, please choose 2 (Disagree).",
            kind="attention",
            expected_answer="2",
        ),
        dict(key="overall", prompt="Overall I was satisfied with the agent."),
    ],
}


def trained_checkpoints() -> dict:
    """Register every agent checkpoint under <data>/runs; the latest per domain and regime among
    those that differ from the base model (a run that took no optimizer step is the base model
    under another name, so it would make a meaningless arm)."""
    from agents.domains import STUDY_DOMAINS
    from agents.models import Checkpoint
    from agents.paths import data_dir
    from agents.serving.adapters import MANIFEST

    for manifest in sorted((data_dir() / "runs").glob(f"*/checkpoints/*/{MANIFEST}")):
        Checkpoint.register(manifest.parent)
    latest: dict[str, dict[str, Checkpoint]] = {}
    for checkpoint in Checkpoint.objects.filter(manifest__kind="agent").order_by(
        "step", "created_at"
    ):
        if checkpoint.manifest.get("metrics", {}).get("optimizer_steps", 1) == 0:
            continue
        if checkpoint.domain in STUDY_DOMAINS:
            latest.setdefault(checkpoint.domain, {})[checkpoint.regime] = checkpoint
    return latest


# The task studies a fresh clone's demo seeds beside the open chat: a Domain, its texts, and its
# chat limits (P4G: the persuader opens, so the Domain's 10 messages are 5 of the person's).
TASK_STUDIES = {
    "retail": dict(
        title="Customer service chat (tau2 retail)",
        consent_text="You will chat with an AI customer-service agent of an online shop about a "
        "short task, then answer a few questions. Your messages and answers are stored for "
        "research. You may stop at any time.",
        instructions="Play the customer described in this panel. End the conversation when "
        "your request is handled or the agent cannot help.",
        max_exchanges=15,
        max_tokens=192,  # room for a JSON tool call
    ),
    "p4g": dict(
        title="Donation conversation (Persuasion for Good)",
        consent_text="You will chat with another party about a children's charity, then answer "
        "a few questions. Your messages and answers are stored for research. You may stop at "
        "any time.",
        instructions="Chat as yourself. You may decide to donate part of your bonus, or not.",
        max_exchanges=5,
        max_tokens=96,
    ),
}
BASE_ARM = "base"
# Without trained checkpoints a second base-model arm (greedy decoding) keeps the study one of
# two arms to compare; it is set inactive once trained arms exist (its data stays).
GREEDY_ARM = "base-greedy"


@transaction.atomic
def seed_domain_studies(engine_url: str | None = None) -> list[Study]:
    """A study per Domain (tau2 retail, P4G, and any other with trained checkpoints and a
    paper questionnaire): the base model against each trained regime's latest checkpoint, or
    base-model arms when there is none. Scenarios from the Domain's bundled test split; never
    deletes participants' data."""
    from studies.setup.scenario_pools import import_pool

    engine_url = engine_url or settings.PARLEY_ENGINE_URL
    trained = trained_checkpoints()
    studies = []
    for domain in dict.fromkeys([*TASK_STUDIES, *trained]):
        if domain not in PAPER_ITEMS:
            continue
        texts = {**TASK_STUDIES.get(domain, {})}
        max_tokens = texts.pop("max_tokens", 96)
        study, _ = Study.objects.get_or_create(
            slug=f"demo-{domain}",
            defaults={
                "title": f"Trained agents: {domain}",
                "consent_text": "You will chat with an AI agent about a short task, then answer "
                "a few questions.",
                "instructions": "Follow the task in this panel. End the conversation when you "
                "are done.",
                "max_exchanges": 10,
                **texts,
                "domain": domain,
                "status": Study.Status.LIVE,
                "target_per_arm": 10,
                "debrief_text": "The agents you met were trained with different user simulators. "
                "Thank you!",
                "completion_code": "C1PARLEY",
                "retention_days": DEMO_RETENTION_DAYS,
                "no_consent_code": "C0NOCONS",
                "timeout_code": "C0TIMEOUT",
            },
        )
        by_regime = trained.get(domain, {})
        arms = [(BASE_ARM, BASE_MODEL_NAME, 0.7)]
        arms += [(regime, c.name, 0.7) for regime, c in sorted(by_regime.items())]
        if not by_regime:
            arms.append((GREEDY_ARM, BASE_MODEL_NAME, 0.0))
        seed_arms(
            study,
            engine_url,
            [(name, model, "") for name, model, _ in arms],
            max_tokens=max_tokens,
            temperatures={name: t for name, _, t in arms},
            # SmolLM2 left to decide called a tool in 0 of 40 retail turns: each reply starts
            # with one, so the demo shows tool cards (a Domain without tools ignores it)
            tool_choice=ToolChoice.FIRST,
        )
        study.arms.filter(name=GREEDY_ARM).update(active=not by_regime)
        if not study.scenarios.exists():
            import_pool(study, domain, count=10, split="test")
        seed_questionnaire(study, PAPER_ITEMS[domain])
        studies.append(study)
    return studies


seed_trained_studies = seed_domain_studies  # the name before base-model arms were seeded too
