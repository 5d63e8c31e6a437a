"""Pre-registration on the study page: power, the frozen plan, exploring before freezing."""

import json
from dataclasses import asdict

from django.contrib import admin, messages
from django.http import Http404, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils.html import format_html
from django.views.decorators.http import require_POST

from studies import tasks
from studies.admin.action_forms import (
    ExploreForm,
)
from studies.admin.permissions import pages
from studies.admin.study.inlines import FrozenPlanInlines
from studies.models import (
    Study,
)
from studies.research import analysis_runs, preregistration


class PlanAdminMixin(FrozenPlanInlines):
    """The study page's power analysis and pre-registration: a panel, a freeze button and
    action, the plan's download, and the warnings at the top of the page."""

    @admin.display(description="Participants per arm needed")
    def power(self, study):
        if not study.pk:
            return "Save the study first."
        found = analysis_runs.study_power(study)
        if found is None:
            return "-"
        # format_html escapes its arguments into text first: numbers are formatted here.
        text = format_html(
            "{} per arm to detect g = {} with power {} at alpha {} / {} = {} "
            "(two-sided Welch, Holm's first step; exact {}).",
            found.n_per_arm,
            f"{found.effect:g}",
            f"{found.power:g}",
            f"{found.alpha:g}",
            found.family,
            f"{found.alpha_per_test:.4g}",
            f"{found.n_exact:.2f}",
        )
        warning = analysis_runs.power_warning(study)
        if warning:
            return format_html(
                '{}<br><span class="power-warning errornote">{}</span>', text, warning
            )
        return text

    @admin.display(description="Pre-registration")
    def frozen_plan(self, study):
        if not study.pk:
            return "-"
        frozen = study.preregistered()
        if frozen is None:
            if preregistration.first_participants(study).exists():
                return "Not frozen; the study has participants, so it can no longer be."
            return format_html(
                '<button type="submit" formaction="{}" formmethod="post" class="button" '
                'id="freeze-plan">Freeze the plan (pre-register)</button> Arms, measures, '
                "comparisons, family, alpha, exclusions and target N are then fixed.",
                reverse("admin:studies_study_freeze", args=[study.pk]),
            )
        return format_html(
            'Frozen on {} by {}; SHA-256 <code class="plan-sha256">{}</code> ({}) · '
            '<a href="{}">preregistration.json</a>',
            f"{frozen.frozen_at:%Y-%m-%d %H:%M:%S} UTC",
            frozen.frozen_by or "-",
            frozen.sha256,
            "verified" if frozen.verify() else "DOES NOT MATCH its stored text",
            reverse("admin:studies_study_plan", args=[study.pk]),
        )

    def plan_pages(self):
        return pages(
            self,
            ("<int:pk>/freeze/", require_POST(self.freeze), "studies_study_freeze", "change"),
            ("<int:pk>/preregistration.json", self.plan_json, "studies_study_plan", "view"),
            ("<int:pk>/explore/", self.explore, "studies_study_explore", "change"),
        )

    def explore(self, request, pk):
        """Run an analysis with other measures, comparisons or family than the study's."""
        study = get_object_or_404(Study, pk=pk)
        planned = analysis_runs.planned_settings(study)  # the study's own analysis, offered first
        form = ExploreForm(
            request.POST or None,
            measures=list(planned.measures),
            arms=list(planned.arms or ()),
            initial={
                "measures": list(planned.measures),
                "pairs": planned.pairs,
                "family": planned.family,
                "control": planned.control or "",
            },
        )
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            settings = analysis_runs.chosen_settings(
                study, data["measures"], data["pairs"], data["family"], data["control"]
            )
            run = tasks.start_analysis(study, settings=asdict(settings))
            self.message_user(request, f"Analysis #{run.pk} queued.", messages.SUCCESS)
            return HttpResponseRedirect(reverse("admin:studies_study_change", args=[study.pk]))
        frozen = study.preregistered()
        context = {
            **self.admin_site.each_context(request),
            "title": f"Another analysis of {study}",
            "intro": "The study is pre-registered: an analysis other than its plan is labelled "
            "exploratory in its report and figures."
            if frozen
            else "The study is not pre-registered: this analysis is labelled neither way.",
            "form": form,
            "submit": "Run this analysis",
            "opts": self.model._meta,
        }
        return render(request, "admin/studies/prolific_action.html", context)

    def freeze(self, request, pk):
        self.freeze_plan(request, Study.objects.filter(pk=pk))
        return HttpResponseRedirect(reverse("admin:studies_study_change", args=[pk]))

    @admin.action(
        permissions=["change"], description="Freeze the plan (pre-register, before participants)"
    )
    def freeze_plan(self, request, queryset):
        for study in queryset:
            try:
                frozen = preregistration.freeze(study, by=request.user.get_username())
            except preregistration.FreezeRefused as refused:
                self.message_user(request, str(refused), messages.ERROR)
            else:
                self.message_user(
                    request, f"{study}: plan frozen, SHA-256 {frozen.sha256}.", messages.SUCCESS
                )

    def plan_json(self, request, pk):
        study = get_object_or_404(Study, pk=pk)
        document = preregistration.document(study)
        if document is None:
            raise Http404("This study is not pre-registered.")
        response = HttpResponse(json.dumps(document, indent=2), content_type="application/json")
        response["Content-Disposition"] = (
            f'attachment; filename="{study.slug}-preregistration.json"'
        )
        return response

    def change_view(self, request, object_id, form_url="", extra_context=None):
        study = self.get_object(request, object_id)
        if request.method == "GET" and study is not None:
            warning = analysis_runs.power_warning(study)
            if warning:
                self.message_user(request, f"Power: {warning}", messages.WARNING)
        return super().change_view(request, object_id, form_url, extra_context)
