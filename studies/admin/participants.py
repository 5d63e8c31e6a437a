"""Participants, their answers and problems, and the decisions taken on their submissions."""

from django.contrib import admin, messages
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils.html import format_html

from studies import tasks
from studies.admin.action_forms import (
    DonationMatchForm,
    RejectForm,
)
from studies.admin.permissions import can_read_participants, identified, pages
from studies.admin.privacy import DataRights
from studies.models import (
    Participant,
    Response,
    Review,
    Study,
    StudyError,
)
from studies.prolific import sync as prolific_sync


class ResponseInline(admin.TabularInline):
    model = Response
    extra = 0
    fields = ["item", "value_number", "value_text", "created_at"]
    readonly_fields = fields
    can_delete = False


@admin.register(Participant)
class ParticipantAdmin(DataRights, admin.ModelAdmin):
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
    actions = [
        "approve_on_prolific",
        "reject_on_prolific",
        "donation_match_bonus",
        "access_request_export",
        "erase_on_request",
    ]
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
        "consent_version",
        "withdrawn",
        "purged_at",
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

    def has_delete_permission(self, request, obj=None):
        # Deleting the row would leave their files and no audit record: the one way to remove a
        # participant is "Erase on request" (studies/privacy/erasure.py), which does both.
        return False

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
            self,
            request,
            queryset,
            form,
            "reject_on_prolific",
            "Reject",
            "Only submissions AWAITING REVIEW are rejected; a failed-attention-check rejection "
            "only where Prolific's rules allow it (one failure under 5 minutes, else two).",
        )

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
            self,
            request,
            queryset,
            form,
            "donation_match_bonus",
            "Set up and pay",
            "Each completed participant with a P4G donation gets it (times the factor) as a bonus, "
            "once per study.",
        )

    @admin.display(description="Kind")
    def kind(self, participant):
        """Previews and bots are marked: they count in no assignment, export or analysis."""
        if participant.is_preview:
            return "preview"
        return "bot" if participant.is_bot else "person"

    @admin.display(description="Withdrawal")
    def withdrawn(self, participant):
        """When they stopped from inside the study, and what they said about their data."""
        withdrawal = getattr(participant, "withdrawal", None)
        if withdrawal is None:
            return "-"
        answer = {None: "not answered yet", True: "data kept", False: "asked to erase it"}
        return (
            f"stopped at {withdrawal.get_stage_display().lower()} on "
            f"{withdrawal.at:%Y-%m-%d %H:%M} UTC; {answer[withdrawal.data_kept]}"
            + ("; paid (completion code)" if withdrawal.paid else "")
        )

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
    # The participant by number, for staff without the participants permission.
    PSEUDONYMS = {"participant": "participant_number"}

    @admin.display(description="participant")
    def participant_number(self, problem):
        return f"#{problem.participant_id}" if problem.participant_id else "-"

    def get_list_display(self, request):
        return identified(request, super().get_list_display(request), self.PSEUDONYMS)

    def get_fields(self, request, obj=None):
        return identified(request, super().get_fields(request, obj), self.PSEUDONYMS)

    def get_readonly_fields(self, request, obj=None):
        return identified(request, super().get_readonly_fields(request, obj), self.PSEUDONYMS)

    def get_search_fields(self, request):
        fields = super().get_search_fields(request)
        if can_read_participants(request):
            return fields
        return [field for field in fields if "prolific_pid" not in field]

    def has_add_permission(self, request):
        return False  # recorded by the participant pages only

    def has_change_permission(self, request, obj=None):
        return False


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
