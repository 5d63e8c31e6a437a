"""What a study gathered: the analysis, the CSV downloads and exports."""

from django.contrib import admin, messages
from django.http import Http404, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils.html import format_html

from studies import tasks
from studies.admin.permissions import can_read_participants
from studies.annotation import analysis as annotation_analysis
from studies.models import (
    Participant,
    Study,
)
from studies.research import exports


class Downloads:
    """StudyAdmin's analysis link and the downloads, each behind can_read_participants."""

    @admin.display(description="Downloads")
    def downloads_withheld(self, study):
        return "Responses and transcripts need the permission to view participants."

    @admin.display(description="Downloads")
    def downloads(self, study):
        if not study.pk:
            return "-"
        # Bot participants (rehearsals, load runs) are left out unless asked for (?bots=1).
        links = format_html(
            '<a href="{0}">responses.csv</a> · <a href="{1}">transcripts.csv</a> · '
            'with bot participants: <a href="{0}?bots=1">responses</a>, '
            '<a href="{1}?bots=1">transcripts</a>',
            reverse("admin:studies_study_responses", args=[study.pk]),
            reverse("admin:studies_study_transcripts", args=[study.pk]),
        )
        if hasattr(study, "annotation"):
            links = format_html(
                '{} · ratings: <a href="{}">ratings.csv</a>, <a href="{}">ratings.json</a>',
                links,
                reverse("admin:studies_study_ratings", args=[study.pk, "csv"]),
                reverse("admin:studies_study_ratings", args=[study.pk, "json"]),
            )
        if study.preregistered() is None:
            return links
        plan = reverse("admin:studies_study_plan", args=[study.pk])
        return format_html('{} · <a href="{}">preregistration.json</a>', links, plan)

    @admin.display(description="Analysis")
    def analysis(self, study):
        if not study.pk:
            return "-"
        latest = study.analysis_runs.first()
        # A button of the change form itself (forms cannot nest); it posts to the analyse view.
        button = format_html(
            '<button type="submit" formaction="{}" formmethod="post" class="button" id="run-analysis">'
            "Run analysis now</button>",
            reverse("admin:studies_study_analyse", args=[study.pk]),
        )
        button = format_html(
            '{} <a href="{}">another analysis…</a>',
            button,
            reverse("admin:studies_study_explore", args=[study.pk]),
        )
        if latest is None:
            return format_html("{} no run yet", button)
        url = reverse("admin:studies_analysisrun_change", args=[latest.pk])
        return format_html(
            '{} latest: <a href="{}">{}</a> ({})', button, url, latest, latest.get_status_display()
        )

    def analyse(self, request, pk):
        study = get_object_or_404(Study, pk=pk)
        run = tasks.start_analysis(study)
        self.message_user(request, f"Analysis #{run.pk} queued.", messages.SUCCESS)
        return HttpResponseRedirect(reverse("admin:studies_study_change", args=[study.pk]))

    @admin.action(
        permissions=["change"], description="Run the analysis (Welch + Holm) in the background"
    )
    def run_analysis(self, request, queryset):
        runs = [tasks.start_analysis(study) for study in queryset]
        self.message_user(request, f"{len(runs)} analysis run(s) queued.", messages.SUCCESS)

    def responses_csv(self, request, pk):
        study = get_object_or_404(Study, pk=pk)
        return exports.csv_response(
            exports.response_rows(study.participants.all(), request.GET.get("bots") == "1"),
            f"{study.slug}-responses.csv",
        )

    def transcripts_csv(self, request, pk):
        study = get_object_or_404(Study, pk=pk)
        return exports.csv_response(
            exports.transcript_rows(study.participants.all(), request.GET.get("bots") == "1"),
            f"{study.slug}-transcripts.csv",
        )

    def ratings(self, request, pk, kind):
        """An annotation study's ratings, one row per rating, raters numbered."""
        study = get_object_or_404(Study, pk=pk, annotation__isnull=False)
        if kind not in ("csv", "json"):
            raise Http404(f"no ratings.{kind}")
        text, content_type = (
            (annotation_analysis.ratings_csv(study), "text/csv; charset=utf-8")
            if kind == "csv"
            else (annotation_analysis.ratings_json(study), "application/json")
        )
        response = HttpResponse(text, content_type=content_type)
        response["Content-Disposition"] = f'attachment; filename="{study.slug}-ratings.{kind}"'
        return response

    def has_participants_permission(self, request, obj=None) -> bool:
        """The export actions' permission: the study's, and the one rule for participants' data."""
        return self.has_view_permission(request, obj) and can_read_participants(request)

    @admin.action(
        permissions=["participants"], description="Export responses (CSV, one row per participant)"
    )
    def export_responses(self, request, queryset):
        participants = Participant.objects.filter(study__in=queryset)
        return exports.csv_response(exports.response_rows(participants), "responses.csv")

    @admin.action(
        permissions=["participants"], description="Export transcripts (CSV, one row per message)"
    )
    def export_transcripts(self, request, queryset):
        participants = Participant.objects.filter(study__in=queryset)
        return exports.csv_response(exports.transcript_rows(participants), "transcripts.csv")
