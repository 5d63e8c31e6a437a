"""The study admin: one ModelAdmin assembled from a mixin per concern (as Django's own
admin splits its views), with the study's fields, URLs and pool."""

from django.contrib import admin, messages
from django.db.models import Count, Q
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.views.decorators.http import require_http_methods, require_POST

from studies import tasks
from studies.admin.action_forms import (
    ImportPoolForm,
)
from studies.admin.permissions import can_read_participants, pages
from studies.admin.study.annotation_pool import AnnotationPool, AnnotationSetupInline
from studies.admin.study.downloads import Downloads
from studies.admin.study.frozen_plan import PlanAdminMixin
from studies.admin.study.going_live import GoingLive
from studies.admin.study.inlines import ArmInline, CompletionCodeInline, ScenarioInline, StudyForm
from studies.admin.study.monitoring import Monitoring
from studies.admin.study.prolific_actions import ProlificActions
from studies.models import (
    Participant,
    Study,
    only_people,
)
from studies.research import analysis_runs, retention
from studies.setup.scenario_pools import PoolError, import_pool


@admin.register(Study)
class StudyAdmin(
    GoingLive,
    Monitoring,
    Downloads,
    ProlificActions,
    AnnotationPool,
    PlanAdminMixin,
    admin.ModelAdmin,
):
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
    inlines = [CompletionCodeInline, ArmInline, ScenarioInline, AnnotationSetupInline]
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
        "use_paper_annotation_items",
    ]
    readonly_fields = [
        "power",
        "frozen_plan",
        "participant_link",
        "progress",
        "readiness",
        "previews",
        "pool",
        "annotation_pool",
        "downloads",
        "analysis",
        "pay_check",
        "prolific",
        "data_retention",
        "consent_versions",
    ]
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "title",
                    "slug",
                    "domain",
                    "domain_protocol",
                    "status",
                    "readiness",
                    "participant_link",
                    "previews",
                    "progress",
                    "pool",
                    "annotation_pool",
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
        (
            "Participants' data",
            {
                "fields": [
                    "consent_versions",
                    "pays_partial",
                    "retention_days",
                    "data_retention",
                ]
            },
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

    @admin.display(description="Data purged")
    def data_retention(self, study):
        """When the study's identifying data is purged (its retention period)."""
        if not study.pk:
            return "Set the retention period; the study cannot go live without one."
        return retention.schedule(study).describe()

    @admin.display(description="Consent versions")
    def consent_versions(self, study):
        """Each consent text participants agreed to: a new one is made when the text changes
        after someone has agreed."""
        if not study.pk:
            return "-"
        rows = analysis_runs.consent_versions(study)
        return format_html_join(
            "",
            "<div>v{} · sha256 {} · {} · {} participant(s){}</div>",
            (
                (
                    v["version"],
                    v["sha256"][:12],
                    v["created_at"][:16].replace("T", " "),
                    v["participants"],
                    " · reconstructed from the text of that day" if v["reconstructed"] else "",
                )
                for v in rows
            ),
        )

    @admin.display(description="Participant link")
    def participant_link(self, study):
        if not study.pk:
            return "-"
        link = study.participant_link()
        sample = (
            "?PROLIFIC_PID={{%PROLIFIC_PID%}}&STUDY_ID={{%STUDY_ID%}}&SESSION_ID={{%SESSION_ID%}}"
        )
        return format_html("<code>{}{}</code>", link, sample)

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
        # No download links for whoever may not read what participants wrote (they would 403),
        # and no Prolific ids.
        fieldsets = super().get_fieldsets(request, obj)
        if can_read_participants(request):
            return fieldsets
        withheld = {"downloads": "downloads_withheld", "prolific": "prolific_without_ids"}
        return [
            (
                name,
                {
                    **options,
                    "fields": [
                        withheld.get(field, field) if isinstance(field, str) else field
                        for field in options["fields"]
                    ],
                },
            )
            for name, options in fieldsets
        ]

    def get_readonly_fields(self, request, obj=None):
        return [
            *super().get_readonly_fields(request, obj),
            "downloads_withheld",
            "prolific_without_ids",
        ]

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

    def get_urls(self):
        return (
            self.plan_pages()
            + self.annotation_pages()
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
                    "<int:pk>/ratings.<str:kind>",
                    self.ratings,
                    "studies_study_ratings",
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
