"""The researcher's side: set up a study as data, watch it fill, read and export what it gathered."""

import functools
import json
from dataclasses import asdict

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Count, Q
from django.http import Http404, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.template.loader import render_to_string
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join
from django.views.decorators.http import require_http_methods, require_POST

from agents.models import Checkpoint, ModelEndpoint
from studies import tasks
from studies.admin.action_forms import (
    BonusCSVForm,
    DonationMatchForm,
    ExploreForm,
    ImportPoolForm,
    RejectForm,
)
from studies.analysis.plots import styles_as_attributes
from studies.analysis.text import with_labels
from studies.models import (
    AnalysisRun,
    Arm,
    BonusPayment,
    CompletionCode,
    Item,
    Participant,
    PlanFrozen,
    ProlificEvent,
    Questionnaire,
    Response,
    Review,
    Scenario,
    SimulatorEvaluation,
    Study,
    StudyError,
    arm_model_check,
    frozen_changes,
    only_people,
)
from studies.participation import flow
from studies.prolific import client as prolific_client
from studies.prolific import sync as prolific_sync
from studies.research import analysis_runs, exports, monitor, preregistration
from studies.setup import arm_adapters, arm_endpoints, go_live
from studies.setup.scenario_pools import PoolError, import_pool


def pages(model_admin: admin.ModelAdmin, *routes) -> list:
    """A ModelAdmin's own pages, each (route, view, url name, permission), behind the admin's
    login and, like the built-in pages, the model permission: "view" to read, "change" to act,
    "participants" to read what participants wrote (see can_read_participants)."""
    return [
        path(
            route, model_admin.admin_site.admin_view(permitted(model_admin, perm, view)), name=name
        )
        for route, view, name, perm in routes
    ]


def can_read_participants(request) -> bool:
    """The one rule for participants' own data (transcripts, answers, every per-participant page
    and export): the permission to view participants, as their list and pages require."""
    opts = Participant._meta
    return any(
        request.user.has_perm(f"{opts.app_label}.{get_permission_codename(action, opts)}")
        for action in ("view", "change")  # as ModelAdmin.has_view_permission
    )


def permitted(model_admin: admin.ModelAdmin, perm: str, view):
    """The view, refused (403) to whoever lacks the permission on the model or its object."""
    has_permission = {
        "view": model_admin.has_view_permission,
        "change": model_admin.has_change_permission,
        "participants": lambda request, obj: (
            model_admin.has_view_permission(request, obj) and can_read_participants(request)
        ),
    }[perm]

    @functools.wraps(view)
    def checked(request, *args, **kwargs):
        obj = model_admin.get_object(request, str(kwargs["pk"])) if "pk" in kwargs else None
        if not has_permission(request, obj):
            raise PermissionDenied
        return view(request, *args, **kwargs)

    return checked


class ArmForm(forms.ModelForm):
    def clean(self):
        # An arm newly asking a vLLM endpoint for a registered checkpoint: the replicas load
        # it first, as "Attach to study arm(s)" does, so that Arm.clean finds it served.
        cleaned = super().clean()
        endpoint, name = cleaned.get("endpoint"), cleaned.get("model_name")
        if endpoint and name and {"endpoint", "model_name"} & set(self.changed_data):
            checkpoint = Checkpoint.objects.filter(name=name).first()
            if checkpoint is not None and name not in endpoint.served_models():
                arm_adapters.load_checkpoint(endpoint, checkpoint)  # Arm.clean says if none did
        return cleaned


class ArmInline(admin.StackedInline):
    model = Arm
    form = ArmForm
    extra = 0
    fields = [
        ("name", "order", "active"),
        ("endpoint", "model_name"),
        ("temperature", "top_p", "max_tokens"),
        ("tool_format", "tool_choice"),
        "system_prompt",
        "greeting",
        "extra_params",
    ]


def repeated(formset: forms.BaseInlineFormSet, field: str) -> list[str]:
    """The values of `field` that more than one kept row of `formset` gives (blanks aside)."""
    values = [
        form.cleaned_data.get(field)
        for form in formset.forms
        if form.cleaned_data and not form.cleaned_data.get("DELETE")
    ]
    return sorted({v for v in values if v and values.count(v) > 1})


class CompletionCodeFormSet(forms.BaseInlineFormSet):
    def clean(self):
        super().clean()
        if twice := repeated(self, "ending"):
            raise forms.ValidationError(f"One code per ending: {', '.join(twice)} is given twice.")


class CompletionCodeInline(admin.TabularInline):
    model = CompletionCode
    formset = CompletionCodeFormSet
    extra = 0
    fields = ["code_type", "code", "ending", "action", "redirect"]
    readonly_fields = ["redirect"]

    @admin.display(description="Redirect")
    def redirect(self, code):
        return format_html("<code>{}</code>", code.redirect_url) if code.pk else "-"


class ScenarioInline(admin.TabularInline):
    model = Scenario
    extra = 0
    fields = ["key", "title", "domain", "active", "instructions"]
    show_change_link = True


class GoLiveRefused(Exception):
    """Raised inside the change form's transaction (rolling it back) when the study as it would
    be saved cannot go live; the form is then shown again with the problems."""

    def __init__(self, problems: list[str]):
        super().__init__(problems)
        self.problems = problems


class StudyForm(forms.ModelForm):
    golive_problems: list[str] = []  # set by StudyAdmin.get_form on the second pass

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        field = self.fields.get("control_arm")
        if field is None:
            return
        # only this study's arms; a new study has none until it is saved with them
        study = self.instance
        field.queryset = study.arms.all() if study.pk else Arm.objects.none()
        if not study.pk or not field.queryset.exists():
            field.help_text = "Save the study with its arms first, then choose its control arm."

    def clean(self):
        cleaned = super().clean()
        for problem in self.golive_problems:
            self.add_error("status", f"Cannot go live: {problem}")
        return cleaned


# --- planning and pre-registration (issue 14) ---------------------------------------------------


def frozen_plan_formset(formset_class):
    """An inline formset of arms or items that refuses, with the field named, what a study's
    frozen plan does not allow (the models refuse it too; this says it on the form)."""

    class FrozenPlanFormSet(formset_class):
        def clean(self):
            super().clean()
            refused = []
            for form in self.forms:
                if not form.is_bound or form.instance.pk is None and not form.has_changed():
                    continue
                if self.can_delete and self._should_delete_form(form):
                    if form.instance.pk is not None:
                        refused += frozen_changes(form.instance, deleting=True).values()
                    continue
                for field, message in frozen_changes(form.instance).items():
                    form.add_error(field if field in form.fields else None, message)
            if refused:
                raise forms.ValidationError(refused)

    return FrozenPlanFormSet


class FrozenPlanInlines:
    """Inlines of arms or items whose forms refuse what a frozen plan holds."""

    def get_formsets_with_inlines(self, request, obj=None):
        for formset, inline in super().get_formsets_with_inlines(request, obj):
            yield frozen_plan_formset(formset), inline


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


@admin.register(Study)
class StudyAdmin(PlanAdminMixin, admin.ModelAdmin):
    form = StudyForm
    list_display = [
        "title",
        "slug",
        "domain",
        "status",
        "target_progress",
        "monitor_link",
        "participant_link",
    ]
    list_filter = ["status", "domain"]
    search_fields = ["title", "slug"]
    prepopulated_fields = {"slug": ["title"]}
    inlines = [CompletionCodeInline, ArmInline, ScenarioInline]
    actions = [
        "go_live",
        "pause",
        "close",
        "run_analysis",
        "export_responses",
        "export_transcripts",
        "run_bots",
        "sync_prolific",
        "freeze_plan",
    ]
    readonly_fields = [
        "power",
        "frozen_plan",
        "participant_link",
        "progress",
        "readiness",
        "previews",
        "pool",
        "downloads",
        "analysis",
        "pay_check",
        "prolific",
    ]
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "title",
                    "slug",
                    "domain",
                    "status",
                    "readiness",
                    "participant_link",
                    "previews",
                    "progress",
                    "pool",
                    "downloads",
                    "analysis",
                ]
            },
        ),
        (
            "Recruitment",
            {
                "fields": [
                    "prolific_study_id",
                    "prolific",
                    "estimated_minutes",
                    "target_per_arm",
                    "time_limit_minutes",
                    "close_when_full",
                    ("reward", "reward_currency"),
                    "pay_check",
                ]
            },
        ),
        (
            "Participant texts",
            {"fields": ["consent_text", "instructions", "debrief_text", "outcome_feedback"]},
        ),
        ("Chat", {"fields": ["min_exchanges", "max_exchanges", "max_message_chars"]}),
        ("Analysis", {"fields": ["control_arm", "comparisons", "holm_family"]}),
        (
            "Plan: power and pre-registration",
            {
                "fields": [
                    "frozen_plan",
                    ("alpha", "target_effect", "target_power"),
                    "power",
                    ("exclude_failed_attention", "exclude_unfinished"),
                    "lower_is_better",
                ]
            },
        ),
    ]

    @admin.display(description="Participant link")
    def participant_link(self, study):
        if not study.pk:
            return "-"
        link = study.participant_link()
        sample = (
            "?PROLIFIC_PID={{%PROLIFIC_PID%}}&STUDY_ID={{%STUDY_ID%}}&SESSION_ID={{%SESSION_ID%}}"
        )
        return format_html("<code>{}{}</code>", link, sample)

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

    def get_queryset(self, request):
        people = only_people("participants")
        return (
            super()
            .get_queryset(request)
            .annotate(
                completed_people=Count(
                    "participants",
                    distinct=True,
                    filter=people
                    & Q(
                        participants__status=Participant.Status.COMPLETED,
                        participants__arm__active=True,
                    ),
                ),
                active_arms=Count("arms", filter=Q(arms__active=True), distinct=True),
            )
        )

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

    def change_view(self, request, object_id, form_url="", extra_context=None):
        # Underpaying is what gets a study stopped on Prolific: said at the top, not only in its
        # field further down the form.
        study = self.get_object(request, object_id)
        if request.method == "GET" and study is not None:
            check = analysis_runs.pay_check(study)
            if check.warning:
                self.message_user(request, f"Pay check: {check.message}", messages.WARNING)
        return super().change_view(request, object_id, form_url, extra_context)

    @admin.display(description="Scenario pool")
    def pool(self, study):
        if not study.pk:
            return "-"
        url = reverse("admin:studies_study_import", args=[study.pk])
        return format_html(
            '{} scenario(s) · <a href="{}">import from a domain</a>', study.scenarios.count(), url
        )

    def import_scenarios(self, request, pk):
        study = get_object_or_404(Study, pk=pk)
        form = ImportPoolForm(
            request.POST or None,
            initial={"domain": study.domain if study.domain != Study.OPEN_CHAT else "retail"},
        )
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                added, existing = import_pool(
                    study,
                    data["domain"],
                    data["count"],
                    data["split"] or None,
                    data["source"],
                    data["seed"],
                )
            except PoolError as error:
                form.add_error(None, str(error))
            else:
                self.message_user(
                    request,
                    f"{added} scenario(s) added, {existing} already in the pool.",
                    messages.SUCCESS,
                )
                return HttpResponseRedirect(reverse("admin:studies_study_change", args=[study.pk]))
        context = {
            **self.admin_site.each_context(request),
            "title": f"Import scenarios into {study}",
            "form": form,
            "study": study,
            "opts": self.model._meta,
        }
        return render(request, "admin/studies/import_pool.html", context)

    def get_fieldsets(self, request, obj=None):
        # No download links for whoever may not read what participants wrote (they would 403).
        fieldsets = super().get_fieldsets(request, obj)
        if can_read_participants(request):
            return fieldsets
        return [
            (name, {**options, "fields": [
                "downloads_withheld" if field == "downloads" else field
                for field in options["fields"]
            ]})
            for name, options in fieldsets
        ]  # fmt: skip

    def get_readonly_fields(self, request, obj=None):
        return [*super().get_readonly_fields(request, obj), "downloads_withheld"]

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

    @admin.action(
        permissions=["change"],
        description="Run bots (two per arm) through the live study, in the background",
    )
    def run_bots(self, request, queryset):
        # Bots are marked on arrival and stay out of exports and analysis (studies/rehearsal/bots.py).
        for study in queryset:
            if study.status != Study.Status.LIVE:  # bots arrive by the participant link
                self.message_user(request, f"{study} is not live: no bots.", messages.WARNING)
                continue
            n = 2 * max(study.arms.filter(active=True).count(), 1)
            task_id = tasks.start_bots(study, n, 2)
            self.message_user(
                request, f"{n} bots queued on {study} (task {task_id}).", messages.SUCCESS
            )

    @admin.display(description="Prolific")
    def prolific(self, study):
        if not study.pk or not study.prolific_study_id:
            return "Not linked: set the Prolific study id."
        states = dict(
            study.participants.exclude(prolific_status="")
            .values_list("prolific_status")
            .annotate(n=Count("pk"))
        )
        awaiting = study.participants.filter(prolific_status=prolific_client.AWAITING_REVIEW)
        suggested = [
            f"{p.prolific_pid} ({category})"
            for p in awaiting
            for category, (allowed, _) in prolific_sync.RULES.items()
            if allowed(p)
        ]
        payments = study.bonus_payments.all()[:5]
        return format_html(
            "Submissions: {} · rejections Prolific's rules allow (failed attention checks, "
            "exceptionally fast): {} · bonuses: {} · <a href='{}'>bonuses from a CSV</a>",
            ", ".join(f"{k}: {v}" for k, v in sorted(states.items())) or "none synced yet",
            ", ".join(suggested) or "nobody",
            ", ".join(f"#{b.pk} {b.get_state_display()}" for b in payments) or "none",
            reverse("admin:studies_study_bonus_csv", args=[study.pk]),
        )

    @admin.action(permissions=["change"], description="Sync submissions with Prolific now")
    def sync_prolific(self, request, queryset):
        task_id = tasks.start_prolific_sync()
        self.message_user(request, f"Prolific sync queued (task {task_id}).", messages.SUCCESS)

    def bonus_csv(self, request, pk):
        study = get_object_or_404(Study, pk=pk)
        if not can_change_participants(request):
            raise PermissionDenied
        form = BonusCSVForm(request.POST or None, request.FILES or None)
        if request.method == "POST" and form.is_valid():
            upload = request.FILES["file"]
            try:
                lines = prolific_sync.csv_lines(study, form.cleaned_data["file"])
                payment, skipped = prolific_sync.create_payment(study, lines, f"CSV {upload.name}")
            except prolific_sync.BonusError as error:
                form.add_error("file", str(error))
            else:
                report_bonuses(self, request, payment, skipped)
                return HttpResponseRedirect(reverse("admin:studies_study_change", args=[study.pk]))
        context = {
            **self.admin_site.each_context(request),
            "title": f"Bonuses from a CSV for {study}",
            "intro": "Each participant is bonused at most once in a study; rows of participants "
            "already bonused are skipped.",
            "form": form,
            "submit": "Set up and pay",
            "opts": self.model._meta,
        }
        return render(request, "admin/studies/prolific_action.html", context)

    def get_urls(self):
        return (
            self.plan_pages()
            + pages(
                self,
                ("<int:pk>/bonus-csv/", self.bonus_csv, "studies_study_bonus_csv", "change"),
                ("<int:pk>/import/", self.import_scenarios, "studies_study_import", "change"),
                (
                    "<int:pk>/analyse/",
                    require_POST(self.analyse),
                    "studies_study_analyse",
                    "change",
                ),
                (
                    "<int:pk>/responses.csv",
                    self.responses_csv,
                    "studies_study_responses",
                    "participants",
                ),
                (
                    "<int:pk>/transcripts.csv",
                    self.transcripts_csv,
                    "studies_study_transcripts",
                    "participants",
                ),
                ("<int:pk>/monitor/", self.monitor, "studies_study_monitor", "view"),
                ("<int:pk>/monitor.json", self.monitor_json, "studies_study_monitor_json", "view"),
                (
                    "<int:pk>/switch/",
                    require_POST(self.switch),
                    "studies_study_switch",
                    "change",
                ),
                (
                    "<int:pk>/preview/",
                    require_http_methods(["GET", "POST"])(self.preview),
                    "studies_study_preview",
                    "view",
                ),
            )
            + super().get_urls()
        )

    # --- the live monitor ---------------------------------------------------------------------

    MONITOR_REFRESH_SECONDS = 5

    def monitor_body(self, request, study) -> tuple[dict, str]:
        data = monitor.snapshot(study)
        html = render_to_string(
            "admin/studies/monitor_body.html",
            {
                "data": data,
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
                participant = flow.start_preview(arm)
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


class ItemFormSet(forms.BaseInlineFormSet):
    """The answers the study's Domain reads are offered for its items, each to one item only."""

    def add_fields(self, form, index):  # every form, the empty one (added rows) included
        super().add_fields(form, index)
        study = self.instance.study if self.instance.study_id else None
        if study is not None and "domain_input" in form.fields:  # else: checked at go-live
            needs = [(need.name, need.describe()) for need in study.domain_inputs()]
            form.fields["domain_input"].choices = [("", "---------"), *needs]

    def clean(self):
        super().clean()
        if twice := repeated(self, "domain_input"):
            raise forms.ValidationError(
                f"One item per answer the task reads: {', '.join(twice)} is given twice."
            )


class ItemInline(admin.TabularInline):
    model = Item
    formset = ItemFormSet
    extra = 0
    fields = [
        "order",
        "key",
        "kind",
        "prompt",
        "scale_points",
        "anchor_low",
        "anchor_high",
        "reverse_coded",
        "min_value",
        "max_value",
        "required",
        "expected_answer",
        "domain_input",
    ]


@admin.register(Questionnaire)
class QuestionnaireAdmin(FrozenPlanInlines, admin.ModelAdmin):
    list_display = ["study", "title", "item_count"]
    inlines = [ItemInline]

    @admin.display(description="Items")
    def item_count(self, questionnaire):
        return questionnaire.items.count()

    def has_delete_permission(self, request, obj=None):
        # Its items are a frozen plan's measures and attention checks.
        if obj is not None and obj.study.preregistered() is not None:
            return False
        return super().has_delete_permission(request, obj)


@admin.register(Scenario)
class ScenarioAdmin(admin.ModelAdmin):
    list_display = ["key", "title", "study", "domain", "active"]
    list_filter = ["study", "domain", "active"]
    search_fields = ["key", "title"]


class ResponseInline(admin.TabularInline):
    model = Response
    extra = 0
    fields = ["item", "value_number", "value_text", "created_at"]
    readonly_fields = fields
    can_delete = False


@admin.register(Participant)
class ParticipantAdmin(admin.ModelAdmin):
    list_display = [
        "prolific_pid",
        "study",
        "arm",
        "scenario",
        "status",
        "kind",
        "attention_passed",
        "prolific_status",
        "partial_data",
        "created_at",
        "transcript_link",
    ]
    list_filter = [
        "status",
        "prolific_status",
        "partial_data",
        "is_preview",
        "is_bot",
        "arm",
        "study",
        "attention_passed",
    ]
    actions = ["approve_on_prolific", "reject_on_prolific", "donation_match_bonus"]
    search_fields = ["prolific_pid", "prolific_session_id"]
    readonly_fields = [
        "study",
        "arm",
        "scenario",
        "prolific_pid",
        "prolific_study_id",
        "prolific_session_id",
        "kind",
        "attention_passed",
        "prolific_status",
        "prolific_synced_at",
        "partial_data",
        "outcome",
        "created_at",
        "consented_at",
        "chat_ended_at",
        "completed_at",
        "transcript_link",
    ]
    # No token: it opens the participant's own chat and acts as them, which nobody in the admin
    # needs (the transcript link shows the conversation).
    fields = ["status"] + readonly_fields
    inlines = [ResponseInline]
    list_select_related = ["study", "arm", "scenario"]

    def has_add_permission(self, request):
        return False  # participants arrive from Prolific, never by hand

    @admin.action(permissions=["change"], description="Approve on Prolific (AWAITING REVIEW only)")
    def approve_on_prolific(self, request, queryset):
        queued, skipped = prolific_sync.decide(queryset, Review.Action.APPROVE)
        report_decisions(self, request, "approval", queued, skipped)

    @admin.action(
        permissions=["change"], description="Reject on Prolific (with message and category)"
    )
    def reject_on_prolific(self, request, queryset):
        form = RejectForm(request.POST if "apply" in request.POST else None)
        if form.is_valid():
            data = form.cleaned_data
            queued, skipped = prolific_sync.decide(
                queryset, Review.Action.REJECT, data["message"], data["rejection_category"]
            )
            report_decisions(self, request, "rejection", queued, skipped)
            return None
        return action_page(
            self, request, queryset, form, "reject_on_prolific", "Reject",
            "Only submissions AWAITING REVIEW are rejected; a failed-attention-check rejection "
            "only where Prolific's rules allow it (one failure under 5 minutes, else two).",
        )  # fmt: skip

    @admin.action(permissions=["change"], description="Bonus: the P4G donation match")
    def donation_match_bonus(self, request, queryset):
        form = DonationMatchForm(request.POST if "apply" in request.POST else None)
        if form.is_valid():
            for study in Study.objects.filter(participants__in=queryset).distinct():
                lines = prolific_sync.donation_match(
                    queryset.filter(study=study), form.cleaned_data["factor"]
                )
                if not lines:
                    self.message_user(
                        request, f"{study}: nobody with a donation.", messages.WARNING
                    )
                    continue
                try:
                    payment, skipped = prolific_sync.create_payment(
                        study, lines, f"P4G donation match x{form.cleaned_data['factor']}"
                    )
                except prolific_sync.BonusError as error:
                    self.message_user(request, f"{study}: {error}", messages.ERROR)
                    continue
                report_bonuses(self, request, payment, skipped)
            return None
        return action_page(
            self, request, queryset, form, "donation_match_bonus", "Set up and pay",
            "Each completed participant with a P4G donation gets it (times the factor) as a bonus, "
            "once per study.",
        )  # fmt: skip

    @admin.display(description="Kind")
    def kind(self, participant):
        """Previews and bots are marked: they count in no assignment, export or analysis."""
        if participant.is_preview:
            return "preview"
        return "bot" if participant.is_bot else "person"

    @admin.display(description="Transcript")
    def transcript_link(self, participant):
        if not participant.pk:
            return "-"
        url = reverse("admin:studies_participant_transcript", args=[participant.pk])
        return format_html('<a href="{}">read</a>', url)

    def get_urls(self):
        return (
            pages(
                self,
                (
                    "<int:pk>/transcript/",
                    self.transcript,
                    "studies_participant_transcript",
                    "participants",
                ),
            )
            + super().get_urls()
        )

    def transcript(self, request, pk):
        participant = get_object_or_404(
            Participant.objects.select_related("study", "arm", "scenario"), pk=pk
        )
        conversation = getattr(participant, "conversation", None)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Transcript of {participant.prolific_pid}"
            + (" (preview: counted nowhere)" if participant.is_preview else ""),
            "participant": participant,
            "conversation": conversation,
            "transcript": conversation.messages.order_by("seq") if conversation else [],
            "responses": participant.responses.select_related("item").order_by("item__order"),
            "opts": self.model._meta,
        }
        return render(request, "admin/studies/transcript.html", context)


@admin.register(StudyError)
class StudyErrorAdmin(admin.ModelAdmin):
    """What participants met instead of the page they asked for (they saw a friendly one)."""

    list_display = ["created_at", "study", "participant", "title", "path"]
    list_filter = ["study"]
    search_fields = ["title", "detail", "participant__prolific_pid"]
    list_select_related = ["study", "participant"]
    fields = ["study", "participant", "created_at", "path", "title", "detail", "traceback"]
    readonly_fields = fields

    def has_add_permission(self, request):
        return False  # recorded by the participant pages only

    def has_change_permission(self, request, obj=None):
        return False


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


# --- checkpoints onto arms ------------------------------------------------------------------------
# The registry of checkpoints belongs to agents; attaching one to an arm is a studies action, so
# studies extends agents' admin (as projects extend django.contrib.auth's UserAdmin).


class AttachCheckpointForm(forms.Form):
    arms = forms.ModelMultipleChoiceField(
        queryset=Arm.objects.select_related("study"),
        help_text="Each arm will ask for this checkpoint.",
    )
    endpoint = forms.ModelChoiceField(
        queryset=ModelEndpoint.objects.all(), help_text="The endpoint that serves the checkpoint."
    )


# Whatever admin the apps below registered (agents', perhaps extended by training), plus this.
_CheckpointAdmin = type(admin.site.get_model_admin(Checkpoint))
admin.site.unregister(Checkpoint)


@admin.register(Checkpoint)
class StudyCheckpointAdmin(_CheckpointAdmin):
    actions = ["attach_to_arm"]

    def has_attach_permission(self, request) -> bool:
        """Attaching rewrites the arms: it needs the permission to change arms."""
        return request.user.has_perm(
            f"{Arm._meta.app_label}.{get_permission_codename('change', Arm._meta)}"
        )

    @admin.action(permissions=["attach"], description="Attach to study arm(s)")
    def attach_to_arm(self, request, queryset):
        if queryset.count() != 1:
            self.message_user(request, "Choose exactly one checkpoint to attach.", messages.ERROR)
            return None
        checkpoint = queryset.get()
        form = AttachCheckpointForm(
            request.POST if "apply" in request.POST else None,
            initial={"endpoint": ModelEndpoint.default()},
        )
        if form.is_valid():
            arms, endpoint = form.cleaned_data["arms"], form.cleaned_data["endpoint"]
            # vLLM serves a new checkpoint once asked (the embedded engine finds it by itself);
            # first, so that the check of the arms' model sees it served
            for problem in arm_adapters.load_checkpoint(endpoint, checkpoint):
                self.message_user(request, problem, messages.WARNING)
            try:
                warnings = arm_endpoints.repoint(arms, endpoint, checkpoint.name)
            except PlanFrozen as frozen:  # an arm of a pre-registered study: nothing attached
                self.message_user(request, " ".join(frozen.messages), messages.ERROR)
                return HttpResponseRedirect(reverse("admin:agents_checkpoint_changelist"))
            except ValidationError as refused:  # a model no healthy replica serves
                for problem in refused.messages:
                    form.add_error(None, problem)
            else:
                for warning in warnings:
                    self.message_user(request, warning, messages.WARNING)
                self.message_user(
                    request,
                    f"{checkpoint} attached to {', '.join(map(str, arms))}.",
                    messages.SUCCESS,
                )
                return HttpResponseRedirect(reverse("admin:agents_checkpoint_changelist"))
        context = {
            **self.admin_site.each_context(request),
            "title": f"Attach {checkpoint} to arms",
            "form": form,
            "checkpoint": checkpoint,
            "opts": self.model._meta,
            "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
        }
        return render(request, "admin/studies/attach_checkpoint.html", context)


# --- Prolific --------------------------------------------------------------------------------------


def can_change_participants(request) -> bool:
    """Decisions and bonuses act on participants' submissions: the permission to change them."""
    opts = Participant._meta
    return request.user.has_perm(f"{opts.app_label}.{get_permission_codename('change', opts)}")


def action_page(model_admin, request, queryset, form, action, submit, intro):
    participants = list(queryset)
    context = {
        **model_admin.admin_site.each_context(request),
        "title": submit,
        "intro": intro,
        "form": form,
        "participants": participants,
        "action": action,
        "submit": submit,
        "opts": model_admin.model._meta,
        "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
    }
    return render(request, "admin/studies/prolific_action.html", context)


def report_decisions(model_admin, request, what, queued, skipped):
    for participant, why in skipped:
        model_admin.message_user(request, f"{participant} skipped: {why}.", messages.WARNING)
    if queued:
        for study in {p.study for p in queued}:
            tasks.send_prolific_reviews(study)
        model_admin.message_user(
            request, f"{len(queued)} {what}(s) queued for Prolific.", messages.SUCCESS
        )


def report_bonuses(model_admin, request, payment, skipped):
    if skipped:
        names = ", ".join(str(p) for p in skipped)
        model_admin.message_user(
            request, f"Skipped (already bonused in this study): {names}.", messages.WARNING
        )
    if payment is not None:
        tasks.start_bonus_payment(payment)
        model_admin.message_user(
            request,
            f"Bonus payment #{payment.pk} of {payment.bonuses.count()} participant(s) queued.",
            messages.SUCCESS,
        )


@admin.register(BonusPayment)
class BonusPaymentAdmin(admin.ModelAdmin):
    list_display = ["__str__", "study", "source", "state", "setup_id", "created_at", "paid_at"]
    list_filter = ["state", "study"]
    fields = [
        "study",
        "source",
        "state",
        "setup_id",
        "total_amount",
        "error",
        "created_at",
        "set_up_at",
        "pay_sent_at",
        "paid_at",
        "lines",
    ]
    readonly_fields = fields

    def has_add_permission(self, request):
        return False  # payments come from a rule or a CSV

    def has_change_permission(self, request, obj=None):
        return False  # their state is Prolific's answer, never edited by hand

    @admin.display(description="Bonuses")
    def lines(self, payment):
        paid = [(b.participant, b.amount) for b in payment.bonuses.all()]
        return format_html_join(", ", "{}: {}", paid + payment.refused_lines)


@admin.register(ProlificEvent)
class ProlificEventAdmin(admin.ModelAdmin):
    list_display = ["event_id", "event_type", "resource_id", "result", "received_at"]
    list_filter = ["event_type"]
    readonly_fields = ["event_id", "event_type", "resource_id", "payload", "result", "received_at"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
