"""A study's questionnaire from a list of items (the demo studies', the paper's, the annotation
set), by key: run again, it updates the items it names and leaves the rest."""

from studies.models import Item, Questionnaire, Study

SEVEN_POINTS = [
    "Strongly disagree",
    "Disagree",
    "Somewhat disagree",
    "Neither agree nor disagree",
    "Somewhat agree",
    "Agree",
    "Strongly agree",
]


def seed_questionnaire(study: Study, items: list[dict]) -> None:
    """Items by key, Likert unless said otherwise, seven labelled points."""
    questionnaire, _ = Questionnaire.objects.get_or_create(study=study)
    for order, item in enumerate(items):
        defaults = {
            "order": order,
            "kind": "likert",
            **{k: v for k, v in item.items() if k != "key"},
        }
        if defaults["kind"] in ("likert", "attention"):
            defaults["anchor_labels"] = SEVEN_POINTS
        Item.objects.update_or_create(
            questionnaire=questionnaire, key=item["key"], defaults=defaults
        )
