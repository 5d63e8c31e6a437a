"""Participant pages. Thin: the step modules beside it (arrive.py ... complete.py) hold the
rules, templates the words."""

import functools
import logging
import traceback

from django.conf import settings
from django.db import DatabaseError
from django.http import Http404, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from studies.lib.credentials import mask_path
from studies.lib.domain_bridge import debrief
from studies.lib.flow_errors import FlowError
from studies.models import Participant, Study, current_consent
from studies.participation import arrive as arrival
from studies.participation import problems, rating, withdraw
from studies.participation.chat_turn import expire_if_overdue
from studies.participation.complete import PROLIFIC_COMPLETE_URL, completion_code, completion_url
from studies.participation.consent import ConsentChanged, give_consent
from studies.participation.middleware import OUTAGE
from studies.participation.questionnaire import questionnaire_items, submit_questionnaire
from studies.participation.ratelimit import limit_arrivals
from studies.participation.start import restart
from studies.prolific import sync as prolific_sync

log = logging.getLogger(__name__)


def problem(request, error: FlowError, study=None, participant=None):
    """The friendly page of a step that cannot go on, with the study's way back to Prolific."""
    back = None
    if study is not None and study.other_code and not getattr(participant, "is_preview", False):
        back = PROLIFIC_COMPLETE_URL.format(code=study.other_code)
    context = {"error": error, "study": study, "participant": participant, "prolific_url": back}
    return render(request, "studies/problem.html", context, status=error.status)


def whose(kwargs) -> tuple[Study | None, Participant | None]:
    """The study and participant a participant URL names, if they can be read."""
    try:
        if "token" in kwargs:
            participant = arrival.find_participant(kwargs["token"])
            return participant.study, participant
        if "slug" in kwargs:
            return arrival.open_study(kwargs["slug"]), None
    except (FlowError, DatabaseError):
        pass
    return None, None


def friendly(view):
    """A participant never sees a server error: a flow error, or any unexpected exception,
    gives the friendly page and is recorded for the researcher (the monitor lists it). A
    database outage is left to DatabaseUnavailableMiddleware (its page retries by itself)."""

    @functools.wraps(view)
    def guarded(request, *args, **kwargs):
        try:
            return view(request, *args, **kwargs)
        except (Http404, *OUTAGE):
            raise
        except FlowError as error:
            study, participant = whose(kwargs)
            problems.record(study, participant, request.path, error)
            return problem(request, error, study, participant)
        except Exception:
            log.exception("participant page %s failed", mask_path(request.path))
            study, participant = whose(kwargs)
            problems.record(
                study, participant, request.path, problems.UNEXPECTED, traceback.format_exc()
            )
            return problem(request, problems.UNEXPECTED, study, participant)

    return guarded


# The browser that first arrived keeps its participant's token in a signed cookie, so the same
# person can come back with a new SESSION_ID (see arrive.resume). Signed per study and sent only to
# that study's link; a week outlasts Prolific's longest allowed time (under 24 h).
ARRIVAL_COOKIE = "parley_arrival"
ARRIVAL_COOKIE_AGE = 7 * 24 * 3600


def arrival_salt(study) -> str:
    return f"studies.arrival.{study.pk}"


@require_GET
@limit_arrivals
@friendly
def arrive(request, slug):
    """The Prolific link: /s/<slug>/?PROLIFIC_PID=...&STUDY_ID=...&SESSION_ID=..."""
    study = arrival.open_study(slug)
    known_token = request.get_signed_cookie(
        ARRIVAL_COOKIE, None, salt=arrival_salt(study), max_age=ARRIVAL_COOKIE_AGE
    )
    participant, _ = arrival.arrive(study, request.GET, known_token)
    response = redirect("studies:participant", token=participant.token)
    # Set at the first arrival and renewed on every resume: each of them proved its right.
    response.set_signed_cookie(
        ARRIVAL_COOKIE,
        str(participant.token),
        salt=arrival_salt(study),
        max_age=ARRIVAL_COOKIE_AGE,
        path=reverse("studies:arrive", args=[study.slug]),
        secure=not settings.DEBUG,
        httponly=True,
        samesite="Lax",  # sent on the top-level link from Prolific, not on cross-site requests
    )
    return response


def load(token) -> Participant:
    return expire_if_overdue(arrival.find_participant(token))


@require_GET
@friendly
def participant(request, token):
    """Whatever step the participant is at: re-opening the link resumes here."""
    p = load(token)
    if p.status == Participant.Status.UNSTARTED:  # could not start before: a place anew
        restart(p)
        p = load(token)
    study = p.study
    context = {"participant": p, "study": study}
    match p.status:
        case Participant.Status.CONSENT:
            return render_consent(request, p)
        case Participant.Status.CHAT:
            context["scenario"] = p.scenario
            return render(request, "studies/chat.html", context)
        case Participant.Status.QUESTIONNAIRE:
            return render_questionnaire(request, p, {}, request.GET)
        case Participant.Status.RATING:
            return render_rating(request, p, {}, {})
        case Participant.Status.WITHDRAWN:
            return render_withdrawn(request, p, withdraw.next_step(p))
        case Participant.Status.COMPLETED:
            context["completion_url"] = completion_url(p)
            context["told"] = debrief(p)
            context["completion_code"] = completion_code(p)
            return render(request, "studies/debrief.html", context)
        case _:  # declined consent or timed out
            context["completion_url"] = completion_url(p)
            # the chat page sends here a message the server no longer took: say so
            context["unsent"] = request.GET.get("unsent") == "1"
            return render(request, "studies/ended.html", context)


def render_questionnaire(request, p, errors, data, status=200):
    context = {
        "participant": p,
        "study": p.study,
        "questionnaire": getattr(p.study, "questionnaire", None),
        "fields": [
            {"item": item, "value": data.get(item.key, ""), "error": errors.get(item.key)}
            for item in questionnaire_items(p.study)
        ],
        "errors": errors,
    }
    return render(request, "studies/questionnaire.html", context, status=status)


def render_rating(request, p, errors, data, status=200):
    """One conversation to rate: its words only (no arm, model or source), the study's items."""
    assignment = rating.current(p)
    if assignment is None:  # none left that is theirs (released by hand): say so, never loop
        raise FlowError(
            "Nothing left to rate",
            "There is no conversation left for you to rate in this study. Please message the "
            "researcher through Prolific.",
        )
    done, total = rating.progress(p)
    context = {
        "participant": p,
        "study": p.study,
        "assignment": assignment,
        "turns": assignment.conversation.transcript,
        "speakers": rating.speaker_names(p.study.domain),  # the Domain's words: P4G's persuadee
        "number": done + 1,
        "total": total,
        "fields": [
            {"item": item, "value": data.get(item.key, ""), "error": errors.get(item.key)}
            for item in p.study.questionnaire_items()
        ],
        "realism": p.study.annotation.ask_realism,
        "realism_choices": rating.REALISM_CHOICES,
        "confidence_points": range(1, rating.CONFIDENCE_POINTS + 1),
        "posted": data,
        "errors": errors,
    }
    return render(request, "studies/rate.html", context, status=status)


@require_POST
@friendly
def rate(request, token):
    p = load(token)
    errors = rating.submit(p, request.POST.get("position", ""), request.POST)
    if errors:
        return render_rating(request, load(token), errors, request.POST, status=400)
    return redirect("studies:participant", token=p.token)


def render_consent(request, p, notice: str = "", status=200):
    """The study's consent text as it stands, with its version: the agreement posts it back."""
    context = {
        "participant": p,
        "study": p.study,
        "consent_version": current_consent(p.study),
        "notice": notice,
    }
    return render(request, "studies/consent.html", context, status=status)


@require_POST
@friendly
def consent(request, token):
    p = load(token)
    # Only the page's two buttons decide: anything else (a stray or forged post) changes nothing,
    # so a participant is never declined for good by a request they did not make.
    decision = request.POST.get("decision")
    if decision not in ("accept", "decline"):
        raise FlowError("Please choose", "Please choose whether you agree to take part.")
    try:
        give_consent(p, decision == "accept", request.POST.get("consent_version"))
    except ConsentChanged as changed:  # the new text, to read before deciding
        return render_consent(request, load(token), changed.detail, status=changed.status)
    return redirect("studies:participant", token=p.token)


def render_withdrawn(request, p, step, status=200):
    """After stopping: whether the data may be kept (until answered), and what to do on
    Prolific. `p` is None once their data was erased: the page names nothing of theirs."""
    context = {"participant": p, "study": p.study if p else None, "step": step}
    return render(request, "studies/withdrawn.html", context, status=status)


@require_http_methods(["GET", "POST"])
@friendly
def stop(request, token):
    """ "Stop taking part": GET says what stopping means and asks to confirm; POST stops the
    chat or rating at once (then the participant page asks about the data)."""
    p = load(token)
    if p.status == Participant.Status.WITHDRAWN:
        return redirect("studies:participant", token=p.token)
    if p.status not in Participant.CAN_WITHDRAW:
        raise FlowError(
            "Nothing to stop",
            "You are not taking part in this study at the moment, so there is nothing to stop.",
        )
    if request.method == "POST":
        withdraw.withdraw(p)
        return redirect("studies:participant", token=p.token)
    back = reverse("studies:participant", args=[p.token])
    return render(request, "studies/stop.html", {"participant": p, "study": p.study, "back": back})


@require_POST
@friendly
def withdrawn_data(request, token):
    """The withdrawn participant's answer: keep what was gathered, or erase it."""
    p = load(token)
    decision = request.POST.get("data")
    if decision not in ("keep", "erase"):  # never erased by a stray or forged post
        raise FlowError("Please choose", "Please choose whether we may keep your data.")
    step = withdraw.decide(p, decision == "keep", request.path)
    if step.erased:  # their pages are gone with their data: this one says what happens next
        return render_withdrawn(request, None, step)
    return redirect("studies:participant", token=p.token)


@require_POST
@friendly
def questionnaire(request, token):
    p = load(token)
    errors = submit_questionnaire(p, request.POST)
    if errors:
        return render_questionnaire(request, p, errors, request.POST, status=400)
    return redirect("studies:participant", token=p.token)


@require_GET
@friendly
def done(request, token):
    """Back to Prolific with the code that fits how the participant finished."""
    p = load(token)
    url = completion_url(p)
    if url is None:
        return redirect("studies:participant", token=p.token)
    return HttpResponseRedirect(url)


@csrf_exempt  # Prolific signs its requests; a CSRF token cannot come from another server
@require_POST
def prolific_webhook(request):
    """Prolific's webhook: 2xx for every valid event (a repeated one is acknowledged, not redone),
    4xx for a forged or stale one."""
    try:
        result = prolific_sync.receive_webhook(request.headers, request.body)
    except prolific_sync.WebhookRefused as refused:
        return HttpResponse(refused.reason, status=refused.status, content_type="text/plain")
    return HttpResponse(result, content_type="text/plain")
