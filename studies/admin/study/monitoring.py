"""The live monitor and the progress columns of the study list."""

from django.contrib import admin
from django.db.models import Count, Q
from django.http import JsonResponse
from django.shortcuts import get_object_or_404, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import dateparse, formats, timezone
from django.utils.html import format_html, format_html_join

from studies.admin.permissions import can_read_participants
from studies.models import (
    Participant,
    Study,
    only_people,
)
from studies.research import analysis_runs, monitor


def readable_time(text: str | None) -> str | None:
    """A snapshot's ISO time as a researcher reads it: the site's local time (TIME_ZONE),
    "4 Mar 2026, 06:06:07 CET". monitor.json keeps the ISO text for programs."""
    if not text:
        return text
    moment = timezone.localtime(dateparse.parse_datetime(text))
    return f"{formats.date_format(moment, 'j M Y, H:i:s')} {moment.tzname()}"


def readable_times(data: dict) -> dict:
    """The snapshot with its times readable, for the page (the rest as it is)."""
    return {
        **data,
        "active": [
            {
                **c,
                "started": readable_time(c["started"]),
                "last_activity": readable_time(c["last_activity"]),
            }
            for c in data["active"]
        ],
        "errors": [{**e, "at": readable_time(e["at"])} for e in data["errors"]],
    }


class Monitoring:
    """StudyAdmin's monitor page and progress columns."""

    @admin.display(description="Monitor")
    def monitor_link(self, study):
        url = reverse("admin:studies_study_monitor", args=[study.pk])
        return format_html('<a href="{}">watch</a>', url)

    @admin.display(description="Completed / target")
    def target_progress(self, study):
        """Completed people against the study's whole target (target per arm x active arms)."""
        done = getattr(study, "completed_people", None)
        arms = getattr(study, "active_arms", None)
        if done is None or arms is None:
            return "-"
        return f"{done}/{study.target_per_arm * arms}"

    @admin.display(description="Completed / holding a place per arm (people)")
    def progress(self, study):
        if not study.pk:
            return "-"
        people = only_people("participants")
        arms = study.arms.annotate(
            done=Count(
                "participants",
                filter=people & Q(participants__status=Participant.Status.COMPLETED),
            ),
            holding=Count(
                "participants", filter=people & Q(participants__status__in=Participant.ACTIVE)
            ),
        )
        return (
            format_html_join(
                ", ",
                "{}: {} / {} (target {})",
                ((a.name, a.done, a.holding, study.target_per_arm) for a in arms),
            )
            or "no arms"
        )

    @admin.display(description="Pay check")
    def pay_check(self, study):
        if not study.pk:
            return "-"
        check = analysis_runs.pay_check(study)
        if check.warning:
            return format_html('<span class="pay-warning errornote">{}</span>', check.message)
        return check.message

    def monitor_body(self, request, study) -> tuple[dict, str]:
        data = monitor.snapshot(study, identities=can_read_participants(request))
        html = render_to_string(
            "admin/studies/monitor_body.html",
            {
                "data": readable_times(data),
                "study": study,
                "can_change": self.has_change_permission(request, study),
                "statuses": Participant.Status.choices,
            },
            request=request,
        )
        return data, html

    def monitor(self, request, pk):
        study = get_object_or_404(Study, pk=pk)
        _, body = self.monitor_body(request, study)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Monitor: {study}",
            "study": study,
            "body": body,
            "refresh_url": reverse("admin:studies_study_monitor_json", args=[study.pk]),
            "refresh_ms": self.MONITOR_REFRESH_SECONDS * 1000,
            "opts": self.model._meta,
        }
        return render(request, "admin/studies/monitor.html", context)

    def monitor_json(self, request, pk):
        study = get_object_or_404(Study, pk=pk)
        data, body = self.monitor_body(request, study)
        return JsonResponse({**data, "html": body})
