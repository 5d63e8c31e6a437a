"""The demo study `make demo` seeds: two arms on the base model and a short questionnaire."""

from django.conf import settings
from django.db import transaction

from agents.paths import BASE_MODEL_NAME

from .models import Arm, Item, Questionnaire, Study

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
SEVEN_POINTS = [
    "Strongly disagree",
    "Disagree",
    "Somewhat disagree",
    "Neither agree nor disagree",
    "Somewhat agree",
    "Agree",
    "Strongly agree",
]


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
        ),
    )
    arms = [
        ("friendly", "You are a warm, friendly assistant. Answer in two or three sentences."),
        ("concise", "You are a concise assistant. Answer in one short sentence."),
    ]
    for order, (name, prompt) in enumerate(arms):
        Arm.objects.update_or_create(
            study=study,
            name=name,
            defaults=dict(
                order=order,
                endpoint_url=engine_url,
                model_name=model_name,
                system_prompt=prompt,
                temperature=0.7,
                max_tokens=96,
            ),
        )
    if study.control_arm_id is None:
        study.control_arm = study.arms.get(name="friendly")
        study.save(update_fields=["control_arm"])
    questionnaire, _ = Questionnaire.objects.get_or_create(study=study)
    for order, item in enumerate(ITEMS):
        defaults = dict(order=order, **{k: v for k, v in item.items() if k != "key"})
        if defaults["kind"] in ("likert", "attention"):
            defaults["anchor_labels"] = SEVEN_POINTS
        Item.objects.update_or_create(
            questionnaire=questionnaire, key=item["key"], defaults=defaults
        )
    return study
