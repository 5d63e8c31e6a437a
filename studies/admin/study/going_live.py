"""Setting a study live, pausing and closing it; the go-live checks and the preview."""

from django.contrib import admin, messages
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from studies.models import (
    Arm,
    Study,
    arm_model_check,
)
from studies.participation.start import start_preview
from studies.research import analysis_runs
from studies.setup import go_live


class GoLiveRefused(Exception):
    """Raised inside the change form's transaction (rolling it back) when the study as it would
    be saved cannot go live; the form is then shown again with the problems."""

    def __init__(self, problems: list[str]):
        super().__init__(problems)
        self.problems = problems


class GoingLive:
    """StudyAdmin's going-live part: the checks on every path to Live, pause, close, preview."""

    # --- going live: every path runs go_live.check_go_live -----------------------------------

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        # The checks need the study as saved with its inlines, so they run after the save,
        # inside the admin's transaction; a refusal rolls all of it back and shows the form
        # again, as submitted, with the problems under the status.
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except GoLiveRefused as refused:
            request.golive_problems = refused.problems
            return super().changeform_view(request, object_id, form_url, extra_context)

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change, **kwargs)
        found = getattr(request, "golive_problems", None)
        if found:
            form = type(form.__name__, (form,), {"golive_problems": found})
        return form

    def save_formset(self, request, form, formset, change):
        # PARLEY_ARM_MODEL_CHECK=warn: an arm pointed at a model no healthy replica serves is
        # saved, and the researcher told (Arm.clean refuses it otherwise).
        warnings = []
        if formset.model is Arm and arm_model_check() == "warn":
            for arm_form in formset.forms:
                arm = arm_form.instance
                if arm_form.has_changed() and not arm_form.cleaned_data.get("DELETE"):
                    problem = arm.retargeted() and arm.model_problem(refresh=False)
                    if problem:
                        warnings.append(f"Arm {arm.name}: {problem}.")
        super().save_formset(request, form, formset, change)
        for warning in warnings:
            self.message_user(request, warning, messages.WARNING)

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        study = form.instance
        was_live = form.initial.get("status") == Study.Status.LIVE and change
        if study.status == Study.Status.LIVE and not was_live:
            try:
                go_live.check_go_live(study)
            except go_live.NotReady as not_ready:
                raise GoLiveRefused(not_ready.problems) from not_ready

    @admin.action(permissions=["change"], description="Set live (after the go-live checks)")
    def go_live(self, request, queryset):
        for study in queryset:
            try:
                go_live.set_live(study)
            except go_live.NotReady as not_ready:
                self.message_user(
                    request,
                    format_html(
                        "{} cannot go live: <ul>{}</ul>",
                        study,
                        format_html_join("", "<li>{}</li>", ((p,) for p in not_ready.problems)),
                    ),
                    messages.ERROR,
                )
            else:
                self.message_user(request, f"{study} is live.", messages.SUCCESS)

    @admin.action(permissions=["change"], description="Pause (no new participants)")
    def pause(self, request, queryset):
        n = queryset.filter(status=Study.Status.LIVE).update(status=Study.Status.PAUSED)
        self.message_user(request, f"{n} study(ies) paused.", messages.SUCCESS)

    @admin.action(permissions=["change"], description="Close")
    def close(self, request, queryset):
        n = queryset.exclude(status=Study.Status.CLOSED).update(status=Study.Status.CLOSED)
        self.message_user(request, f"{n} study(ies) closed.", messages.SUCCESS)

    @admin.display(description="Go-live checks")
    def readiness(self, study):
        if not study.pk:
            return "Save the study first."
        found = go_live.problems(study, fresh=False)
        monitor_url = reverse("admin:studies_study_monitor", args=[study.pk])
        if not found:
            shown = format_html(
                '<span class="readiness ok">Ready to go live.</span> <a href="{}">Monitor</a>',
                monitor_url,
            )
        else:
            shown = format_html(
                '<ul class="readiness problems">{}</ul><a href="{}">Monitor</a>',
                format_html_join("", "<li>{}</li>", ((p,) for p in found)),
                monitor_url,
            )
        # Under-powered is said beside the checks, but does not keep a study from going live.
        warning = analysis_runs.power_warning(study)
        if warning:
            return format_html('{}<p class="power-warning">Power: {}</p>', shown, warning)
        return shown

    @admin.display(description="Preview")
    def previews(self, study):
        if not study.pk:
            return "-"
        url = reverse("admin:studies_study_preview", args=[study.pk])
        return (
            format_html_join(
                " · ",
                '<a href="{}?arm={}" target="_blank" class="preview-link">preview {}</a>',
                ((url, arm.pk, arm.name) for arm in study.arms.all()),
            )
            or "no arms"
        )

    def switch(self, request, pk):
        """The monitor's pause switch: pause a live study, or resume it through the go-live
        checks (as any way of going live)."""
        study = get_object_or_404(Study, pk=pk)
        wanted = request.POST.get("to")
        if wanted == Study.Status.PAUSED and study.status == Study.Status.LIVE:
            Study.objects.filter(pk=study.pk, status=Study.Status.LIVE).update(
                status=Study.Status.PAUSED
            )
            self.message_user(request, f"{study} is paused.", messages.SUCCESS)
        elif wanted == Study.Status.LIVE and study.status == Study.Status.PAUSED:
            self.go_live(request, Study.objects.filter(pk=study.pk))
        else:
            self.message_user(
                request,
                f"{study} is {study.get_status_display().lower()}: nothing changed.",
                messages.WARNING,
            )
        return HttpResponseRedirect(reverse("admin:studies_study_monitor", args=[study.pk]))

    def preview(self, request, pk):
        """The arms to preview (the study page links one by ?arm=), each a button. Only the
        button's POST, CSRF-checked like every admin form, makes the preview participant: a
        link followed from another site shows this page and creates nothing."""
        study = get_object_or_404(Study, pk=pk)
        chosen = (request.POST if request.method == "POST" else request.GET).get("arm")
        arms = study.arms.all()
        if chosen is not None or request.method == "POST":
            try:
                arm = study.arms.get(pk=int(chosen))
            except (TypeError, ValueError, Arm.DoesNotExist):
                raise Http404("No such arm in this study.") from None
            if request.method == "POST":
                participant = start_preview(arm)
                url = reverse("studies:participant", args=[participant.token])
                return HttpResponseRedirect(url)
            arms = [arm]
        context = {
            **self.admin_site.each_context(request),
            "title": f"Preview {study}",
            "study": study,
            "arms": arms,
            "chosen": chosen is not None,
            "opts": self.model._meta,
        }
        return render(request, "admin/studies/preview.html", context)
