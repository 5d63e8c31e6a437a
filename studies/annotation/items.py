"""The paper's annotation items, ready-made: what its study app asks raters about a
conversation (1-7 each; weirdness reverse-coded), and a free text on anything weird
(../shared/reference/README.md, "Human study app ... annotation mode")."""

from studies.lib.domain_bridge import speaker_names
from studies.models import Study
from studies.setup.questionnaires import seed_questionnaire

PAPER_ANNOTATION_ITEMS = [
    dict(key="overall_quality", prompt="Overall, this was a good conversation."),
    dict(key="naturalness", prompt="The conversation felt natural."),
    dict(key="agent_helpfulness", prompt="The {agent} was helpful."),
    dict(key="agent_weirdness", prompt="The {agent} said weird things.", reverse_coded=True),
    dict(key="user_realism", prompt="The {user} behaved like a real person would."),
    dict(key="task_completion", prompt="The {user}'s task was completed."),
    dict(
        key="attention",
        prompt="To show you are reading, please choose 2 (Disagree).",
        kind="attention",
        expected_answer="2",
    ),
    dict(
        key="weird",
        prompt="Describe anything weird in the conversation (optional).",
        kind="text",
        required=False,
    ),
]


def add_paper_items(study: Study) -> None:
    """The items, their speakers named in the words of the study's Domain (the rated one)."""
    names = speaker_names(study.domain)
    seed_questionnaire(
        study,
        [{**item, "prompt": item["prompt"].format(**names)} for item in PAPER_ANNOTATION_ITEMS],
    )
