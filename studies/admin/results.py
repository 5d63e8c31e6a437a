"""Analysis runs and simulator evaluations: what a researcher reads."""

import json

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from studies.admin.permissions import can_read_participants, pages
from studies.analysis.plots import styles_as_attributes
from studies.analysis.text import with_labels
from studies.models import (
    AnalysisRun,
    SimulatorEvaluation,
)
from studies.research import analysis_runs


@admin.register(AnalysisRun)
class AnalysisRunAdmin(admin.ModelAdmin):
    list_display = [
        "__str__",
        "study",
        "status",
        "trigger",
        "created_at",
        "finished_at",
        "included",
    ]
    list_filter = ["status", "trigger", "study"]
    readonly_fields = [
        "study",
        "status",
        "trigger",
        "created_at",
        "started_at",
        "finished_at",
        "erasures",
        "downloads",
        "summary",
        "figures_view",
        "settings",
        "error",
    ]
    fields = readonly_fields

    def has_add_permission(self, request):
        return False  # runs start from a study (action or button)

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="Included")
    def included(self, run):
        return (run.results or {}).get("participants", {}).get("included", "-")

    @admin.display(description="Erased since")
    def erasures(self, run):
        """Said beside the results: they count people whose rows have since left the inputs."""
        if not run.erased_participants:
            return "-"
        return (
            f"Computed before the erasure of {run.erased_participants} participant(s) on request: "
            "their rows are gone from the inputs; these results still count them."
        )

    @admin.display(description="Downloads")
    def downloads(self, run):
        if run.results is None:
            return "-"
        return format_html(
            '<a href="{}">results.csv</a> · <a href="{}">report.json</a> · <a href="{}">input.csv</a>',
            reverse("admin:studies_analysisrun_download", args=[run.pk, "csv"]),
            reverse("admin:studies_analysisrun_download", args=[run.pk, "json"]),
            reverse("admin:studies_analysisrun_download", args=[run.pk, "input"]),
        )

    @admin.display(description="Results")
    def summary(self, run):
        if run.results is None:
            return (
                "Not computed yet."
                if run.status != AnalysisRun.Status.FAILED
                else "The run failed; see the error below."
            )
        report = with_labels(run.results)
        return render_to_string("admin/studies/analysis_results.html", {"report": report})

    @admin.display(description="Figures")
    def figures_view(self, run):
        # Each figure an image of its own URL, not SVG inlined in the page: the page's CSP
        # refuses inline styles, and an image's own scripts never run.
        shown = format_html_join(
            "",
            '<div class="figure"><img src="{}" alt="{}"></div>',
            (
                (reverse("admin:studies_analysisrun_figure", args=[run.pk, name]), name)
                for name in (run.figures or {})
            ),
        )
        return format_html('<div class="analysis-figures">{}</div>', shown) if shown else "-"

    class Media:
        css = {"all": ["admin/studies/analysis.css"]}

    def get_urls(self):
        return (
            pages(
                self,
                (
                    "<int:pk>/download/<str:kind>/",
                    self.download,
                    "studies_analysisrun_download",
                    "view",
                ),
                (
                    "<int:pk>/figure/<str:figure>.svg",
                    self.figure,
                    "studies_analysisrun_figure",
                    "view",
                ),
            )
            + super().get_urls()
        )

    def figure(self, request, pk, figure):
        run = get_object_or_404(AnalysisRun, pk=pk)
        svg = (run.figures or {}).get(figure)
        if svg is None:
            raise Http404("No such figure.")
        # Runs stored before figures were styled by attributes are converted as they are served.
        response = HttpResponse(styles_as_attributes(svg), content_type="image/svg+xml")
        # Opened on its own it is a document: it needs nothing, so it may load and run nothing.
        response["Content-Security-Policy"] = "default-src 'none'"
        return response

    def download(self, request, pk, kind):
        run = get_object_or_404(AnalysisRun, pk=pk)
        name = f"{run.study.slug}-analysis-{run.pk}"
        if kind == "json":
            body, ctype, ext = json.dumps(run.results, indent=2), "application/json", "json"
        elif kind == "csv":
            body, ctype, ext = analysis_runs.comparisons_csv(run.results or {}), "text/csv", "csv"
        elif kind == "input":  # one row per participant: their answers, under the same rule
            if not can_read_participants(request):
                raise PermissionDenied
            body, ctype, ext, name = run.inputs.get("csv", ""), "text/csv", "csv", name + "-input"
        else:
            raise Http404("Unknown download.")
        response = HttpResponse(body, content_type=ctype)
        response["Content-Disposition"] = f'attachment; filename="{name}.{ext}"'
        return response


@admin.register(SimulatorEvaluation)
class SimulatorEvaluationAdmin(admin.ModelAdmin):
    """The stored held-out simulator conversations of the sim-to-real report, to read."""

    list_display = ["arm", "checkpoint", "simulator", "scenario", "sample", "success", "reward"]
    list_filter = ["arm__study", "simulator", "success"]
    readonly_fields = [f.name for f in SimulatorEvaluation._meta.fields]

    def has_add_permission(self, request):
        return False  # played by the evaluation job only

    def has_change_permission(self, request, obj=None):
        return False
