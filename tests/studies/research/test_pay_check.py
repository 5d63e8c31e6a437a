"""Pay check: the reward as an hourly rate at the median completion time, against Prolific's
minimum (6.00 GBP / 8.00 USD an hour) and recommended (9.00 GBP / 12.00 USD) rates."""

from datetime import timedelta

import pytest
from django.urls import reverse

from studies.analysis import pay
from studies.models import AnalysisRun, Participant
from studies.participation.arrive import arrive
from studies.research import analysis_runs
from tests.support.studies import finish as finish_participant
from tests.support.studies import make_study, prolific

MINUTE = 60


@pytest.mark.parametrize(
    ("reward", "currency", "minutes", "level"),
    [
        (300, "GBP", [20], pay.OK),  # 9.00/h exactly: the recommended rate
        (299, "GBP", [20], pay.BELOW_RECOMMENDED),
        (200, "GBP", [20], pay.BELOW_RECOMMENDED),  # 6.00/h: the minimum, not below it
        (199, "GBP", [20], pay.BELOW_MINIMUM),
        (200, "USD", [20], pay.BELOW_MINIMUM),  # 6.00 USD/h: under the USD minimum of 8.00
        (400, "USD", [20], pay.OK),  # 12.00 USD/h
        (100, "GBP", [5, 20, 60], pay.BELOW_MINIMUM),  # the median (20 min), not the mean
        (100, "GBP", [5, 8, 12, 60], pay.BELOW_RECOMMENDED),  # even count: median 10 min, 6.00/h
    ],
)
def test_levels_follow_the_median_time(reward, currency, minutes, level):
    check = pay.check(reward, currency, [m * MINUTE for m in minutes])
    assert check.level == level, check.message
    assert check.warning == (level in pay.WARNINGS)


def test_the_figures_and_the_message():
    check = pay.check(100, "GBP", [10 * MINUTE, 20 * MINUTE, 30 * MINUTE])
    assert check.median_seconds == 1200 and check.hourly == pytest.approx(300)
    assert (check.minimum, check.recommended, check.completions) == (600, 900, 3)
    assert "£3.00/h" in check.message and "£6.00/h" in check.message
    assert "£2.00" in check.message  # the reward that would reach the minimum at 20 minutes
    usd = pay.check(100, "USD", [10 * MINUTE])
    assert (usd.minimum, usd.recommended) == (800, 1200) and "$6.00/h" in usd.message


def test_no_completions_and_no_reward_say_so():
    empty = pay.check(150, "GBP", [])
    assert empty.level == pay.NO_COMPLETIONS and "No completions yet" in empty.message
    assert not empty.warning and empty.hourly is None
    unset = pay.check(None, "GBP", [600])
    assert unset.level == pay.NO_REWARD and "No reward set" in unset.message
    assert pay.check(None, "USD", []).level == pay.NO_COMPLETIONS
    with pytest.raises(ValueError, match="currency"):
        pay.check(100, "EUR", [600])


def finish(study, pid, minutes, bot=False):
    p = finish_participant(study, pid)
    Participant.objects.filter(pk=p.pk).update(
        created_at=p.completed_at - timedelta(minutes=minutes), is_bot=bot
    )


@pytest.mark.django_db
def test_study_page_warns_below_minimum(admin_client):
    study = make_study(reward=100, reward_currency="GBP")
    url = reverse("admin:studies_study_change", args=[study.pk])
    page = admin_client.get(url).content.decode()
    assert "No completions yet" in page
    for pid, minutes in [("p1", 10), ("p2", 20), ("p3", 30)]:
        finish(study, pid, minutes)
    finish(study, "bot1", 1, bot=True)  # rehearsal data: not a completion time
    abandoned, _ = arrive(study, prolific(pid="p4"))
    check = analysis_runs.pay_check(study)
    assert check.completions == 3 and check.median_seconds == pytest.approx(1200, abs=1)
    page = admin_client.get(url).content.decode()
    assert "below Prolific&#x27;s minimum" in page or "below Prolific's minimum" in page
    assert "£2.00" in page
    study.reward = 250
    study.save()
    page = admin_client.get(url).content.decode()
    assert "recommended" in page and "minimum of" not in page
    assert analysis_runs.pay_check(study).level == pay.BELOW_RECOMMENDED


@pytest.mark.django_db
def test_analysis_report_carries_the_pay_check(admin_client):
    study = make_study(reward=50, reward_currency="USD")
    finish(study, "p1", 15)
    run = analysis_runs.compute(AnalysisRun.objects.create(study=study))
    assert run.status == "done", run.error
    assert run.results["pay"]["level"] == pay.BELOW_MINIMUM and run.results["pay"]["warning"]
    page = admin_client.get(reverse("admin:studies_analysisrun_change", args=[run.pk]))
    assert "Pay:" in page.content.decode()


@pytest.mark.django_db
def test_reward_is_set_in_the_admin_form(admin_client):
    study = make_study()
    page = admin_client.get(reverse("admin:studies_study_change", args=[study.pk])).content
    assert b'name="reward"' in page and b'name="reward_currency"' in page
