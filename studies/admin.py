"""The researcher's side: set up a study as data, watch it fill, read and export what it gathered."""

from django.contrib import admin
from django.db.models import Count, Q
from django.shortcuts import get_object_or_404, render
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from . import exports
from .models import Arm, Item, Participant, Questionnaire, Response, Scenario, Study


class ArmInline(admin.StackedInline):
    model = Arm
    extra = 0
    fields = [
        ("name", "order", "active"),
        ("endpoint_url", "model_name", "api_key_env"),
        ("temperature", "top_p", "max_tokens", "tool_format"),
        "system_prompt",
        "greeting",
        "extra_params",
    ]


class ScenarioInline(admin.TabularInline):
    model = Scenario
    extra = 0
    fields = ["key", "title", "domain", "active", "instructions"]
    show_change_link = True


@admin.register(Study)
class StudyAdmin(admin.ModelAdmin):
    list_display = ["title", "slug", "domain", "status", "progress", "participant_link"]
    list_filter = ["status", "domain"]
    search_fields = ["title", "slug"]
    prepopulated_fields = {"slug": ["title"]}
    inlines = [ArmInline, ScenarioInline]
    actions = ["export_responses", "export_transcripts"]
    readonly_fields = ["participant_link", "progress", "downloads"]
    fieldsets = [
        (None, {"fields": ["title", "slug", "domain", "status", "participant_link", "progress", "downloads"]}),
        ("Recruitment", {"fields": ["prolific_study_id", "target_per_arm", "time_limit_minutes",
                                    "completion_code", "no_consent_code", "timeout_code"]}),
        ("Participant texts", {"fields": ["consent_text", "instructions", "debrief_text"]}),
        ("Chat", {"fields": ["min_exchanges", "max_exchanges", "max_message_chars"]}),
        ("Analysis", {"fields": ["control_arm", "comparisons", "holm_family"]}),
    ]

    @admin.display(description="Participant link")
    def participant_link(self, study):
        if not study.pk:
            return "-"
        link = study.participant_link()
        sample = "?PROLIFIC_PID={{%PROLIFIC_PID%}}&STUDY_ID={{%STUDY_ID%}}&SESSION_ID={{%SESSION_ID%}}"
        return format_html("<code>{}{}</code>", link, sample)

    @admin.display(description="Completed / active per arm")
    def progress(self, study):
        if not study.pk:
            return "-"
        arms = study.arms.annotate(
            done=Count("participants", filter=Q(participants__status="completed")),
            holding=Count("participants", filter=Q(participants__status__in=Participant.ACTIVE)),
        )
        return format_html_join(
            ", ", "{}: {} / {} (target {})",
            ((a.name, a.done, a.holding, study.target_per_arm) for a in arms),
        ) or "no arms"

    @admin.display(description="Downloads")
    def downloads(self, study):
        if not study.pk:
            return "-"
        return format_html(
            '<a href="{}">responses.csv</a> · <a href="{}">transcripts.csv</a>',
            reverse("admin:studies_study_responses", args=[study.pk]),
            reverse("admin:studies_study_transcripts", args=[study.pk]),
        )

    def get_urls(self):
        own = [
            path("<int:pk>/responses.csv", self.admin_site.admin_view(self.responses_csv),
                 name="studies_study_responses"),
            path("<int:pk>/transcripts.csv", self.admin_site.admin_view(self.transcripts_csv),
                 name="studies_study_transcripts"),
        ]
        return own + super().get_urls()

    def responses_csv(self, request, pk):
        study = get_object_or_404(Study, pk=pk)
        return exports.csv_response(
            exports.response_rows(study.participants.all()), f"{study.slug}-responses.csv"
        )

    def transcripts_csv(self, request, pk):
        study = get_object_or_404(Study, pk=pk)
        return exports.csv_response(
            exports.transcript_rows(study.participants.all()), f"{study.slug}-transcripts.csv"
        )

    @admin.action(description="Export responses (CSV, one row per participant)")
    def export_responses(self, request, queryset):
        participants = Participant.objects.filter(study__in=queryset)
        return exports.csv_response(exports.response_rows(participants), "responses.csv")

    @admin.action(description="Export transcripts (CSV, one row per message)")
    def export_transcripts(self, request, queryset):
        participants = Participant.objects.filter(study__in=queryset)
        return exports.csv_response(exports.transcript_rows(participants), "transcripts.csv")


class ItemInline(admin.TabularInline):
    model = Item
    extra = 0
    fields = ["order", "key", "kind", "prompt", "scale_points", "anchor_low", "anchor_high",
              "reverse_coded", "min_value", "max_value", "required", "expected_answer"]


@admin.register(Questionnaire)
class QuestionnaireAdmin(admin.ModelAdmin):
    list_display = ["study", "title", "item_count"]
    inlines = [ItemInline]

    @admin.display(description="Items")
    def item_count(self, questionnaire):
        return questionnaire.items.count()


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
    list_display = ["prolific_pid", "study", "arm", "scenario", "status", "attention_passed",
                    "created_at", "transcript_link"]
    list_filter = ["status", "arm", "study", "attention_passed"]
    search_fields = ["prolific_pid", "prolific_session_id"]
    readonly_fields = ["study", "arm", "scenario", "token", "prolific_pid", "prolific_study_id",
                       "prolific_session_id", "attention_passed", "outcome", "created_at",
                       "consented_at", "chat_ended_at", "completed_at", "transcript_link"]
    fields = ["status"] + readonly_fields
    inlines = [ResponseInline]
    list_select_related = ["study", "arm", "scenario"]

    def has_add_permission(self, request):
        return False  # participants arrive from Prolific, never by hand

    @admin.display(description="Transcript")
    def transcript_link(self, participant):
        if not participant.pk:
            return "-"
        url = reverse("admin:studies_participant_transcript", args=[participant.pk])
        return format_html('<a href="{}">read</a>', url)

    def get_urls(self):
        own = [path("<int:pk>/transcript/", self.admin_site.admin_view(self.transcript),
                    name="studies_participant_transcript")]
        return own + super().get_urls()

    def transcript(self, request, pk):
        participant = get_object_or_404(Participant.objects.select_related("study", "arm", "scenario"), pk=pk)
        conversation = getattr(participant, "conversation", None)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Transcript of {participant.prolific_pid}",
            "participant": participant,
            "conversation": conversation,
            "messages": conversation.messages.order_by("seq") if conversation else [],
            "responses": participant.responses.select_related("item").order_by("item__order"),
            "opts": self.model._meta,
        }
        return render(request, "admin/studies/transcript.html", context)
