"""An annotation study in the admin: its setup inline, its pool column, adding conversations
from another study with a draw, the paper's annotation items, and the pool's own list."""

import pytest
from django.urls import reverse

from studies.annotation.items import PAPER_ANNOTATION_ITEMS
from studies.models import AnnotationSetup, RatedConversation
from tests.support.studies import finish, make_study

pytestmark = pytest.mark.django_db


@pytest.fixture
def annotation(db):
    study = make_study(slug="rate", arms=("raters",))
    AnnotationSetup.objects.create(study=study)
    return study


def test_the_study_page_shows_the_pool_and_a_chat_study_says_it_is_none(admin_client, annotation):
    page = admin_client.get(reverse("admin:studies_study_change", args=[annotation.pk]))
    assert page.status_code == 200 and "0 people's, 0 simulated, 0 gold" in page.content.decode()
    chat = make_study(slug="chat")
    page = admin_client.get(reverse("admin:studies_study_change", args=[chat.pk]))
    assert page.status_code == 200 and "a chat study" in page.content.decode()


def test_conversations_are_added_from_another_study_by_arm(admin_client, annotation):
    origin = make_study(slug="origin", arms=("kept", "left"))
    for i, arm in enumerate(["kept", "kept", "left"]):
        finish(origin, f"o{i}", arm=arm)
    url = reverse("admin:studies_study_add_conversations", args=[annotation.pk])
    form = {"origin": origin.pk, "people": "on", "arms": "kept", "min_user_turns": 1}
    response = admin_client.post(url, form)
    assert response.status_code == 302
    assert list(annotation.rated_conversations.values_list("arm", flat=True)) == ["kept", "kept"]
    refused = admin_client.post(url, {**form, "people": ""})
    assert refused.status_code == 200
    assert (
        "Choose people&#x27;s conversations, simulated ones, or both." in refused.content.decode()
    )
    assert annotation.rated_conversations.count() == 2


def test_the_paper_items_are_one_action_away_and_the_pool_has_its_list(admin_client, annotation):
    response = admin_client.post(
        reverse("admin:studies_study_changelist"),
        {"action": "use_paper_annotation_items", "_selected_action": [annotation.pk]},
    )
    assert response.status_code == 302
    keys = list(annotation.questionnaire_items().values_list("key", flat=True))
    assert [k for k in keys if k in {i["key"] for i in PAPER_ANNOTATION_ITEMS}] == [
        i["key"] for i in PAPER_ANNOTATION_ITEMS
    ]
    RatedConversation.objects.create(
        study=annotation, source="simulator", simulator="s", transcript=[]
    )
    listing = admin_client.get(reverse("admin:studies_ratedconversation_changelist"))
    assert listing.status_code == 200 and "simulator" in listing.content.decode()
    prompts = dict(annotation.questionnaire_items().values_list("key", "prompt"))
    assert prompts["user_realism"] == "The user behaved like a real person would."  # open chat


def test_the_paper_items_name_the_speakers_in_the_rated_domains_words(annotation):
    from studies.annotation.items import add_paper_items

    annotation.domain = "p4g"
    add_paper_items(annotation)
    prompts = dict(annotation.questionnaire_items().values_list("key", "prompt"))
    assert prompts["agent_helpfulness"] == "The persuader was helpful."
    assert prompts["user_realism"] == "The persuadee behaved like a real person would."


def test_go_live_asks_for_a_pool_places_for_the_target_and_gold_that_fits(annotation):
    from studies.setup import go_live

    annotation.target_per_arm = 4
    annotation.save()
    assert "The annotation pool has no conversations" in " ".join(go_live.problems(annotation))
    for _ in range(4):
        RatedConversation.objects.create(study=annotation, source="person", transcript=[])
    found = " ".join(go_live.problems(annotation))  # 4 x 3 places / 6 per rater = 2 raters
    assert "places for 2 raters" in found and "the pool has none" in found
    RatedConversation.objects.create(
        study=annotation, source="person", transcript=[], gold={"nonsense": 1}
    )
    annotation.annotation.raters_per_conversation = 6
    annotation.annotation.save()
    found = go_live.problems(annotation)
    assert found == [
        f"Gold conversation {annotation.rated_conversations.last().pk} answers "
        "items the study does not ask: nonsense."
    ]


def test_a_training_runs_samples_are_added_from_the_data_folder_only(
    admin_client, annotation, settings, tmp_path
):
    import json

    settings.DATA_DIR = tmp_path
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    conversation = [{"role": "user", "content": "hello"}]
    (run / "samples.jsonl").write_text(
        json.dumps({"reward": 1, "conversation": conversation}) + "\n"
    )
    url = reverse("admin:studies_study_add_conversations", args=[annotation.pk])
    form = {"samples": "runs/r1/samples.jsonl", "samples_as": "run-r1", "min_user_turns": 1}
    assert admin_client.post(url, form).status_code == 302
    assert list(annotation.rated_conversations.values_list("simulator", flat=True)) == ["run-r1"]
    outside = admin_client.post(url, {**form, "samples": "../../etc/passwd"})
    assert (
        outside.status_code == 200
        and "Not a training run&#x27;s samples.jsonl" in outside.content.decode()
    )


def test_the_pool_ties_a_transcript_to_its_person_only_with_the_participants_permission(
    client, annotation
):
    """view_ratedconversation alone showed "conversation of <Prolific id>" beside every pooled
    transcript. The redacted transcript stays readable (raters, strangers, read it blind); the
    link to the person needs the participants permission."""
    from django.contrib.auth.models import Permission, User

    from studies.annotation.pool import Draw, add_people

    origin = make_study(slug="origin", arms=("kept",))
    person = finish(origin, "5f0c0ffee0ddba11c0ffee77", text="my words")
    add_people(annotation, origin, Draw())
    pooled = annotation.rated_conversations.get()
    url = reverse("admin:studies_ratedconversation_change", args=[pooled.pk])

    def user(name, *codenames):
        account = User.objects.create(username=name, is_staff=True)
        account.user_permissions.set(Permission.objects.filter(codename__in=codenames))
        return account

    client.force_login(user("pool-viewer", "view_ratedconversation"))
    page = client.get(url)
    text = page.content.decode()
    assert page.status_code == 200 and "my words" in text
    assert person.prolific_pid not in text and str(person.token) not in text
    assert f"conversation #{person.conversation.pk}" in text
    listing = client.get(reverse("admin:studies_ratedconversation_changelist")).content.decode()
    assert person.prolific_pid not in listing

    client.force_login(user("researcher", "view_ratedconversation", "view_participant"))
    assert person.prolific_pid in client.get(url).content.decode()
