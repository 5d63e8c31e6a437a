"""The study's Prolific side: its status there, syncing, the bonus CSV."""

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils.html import format_html

from studies import tasks
from studies.admin.action_forms import (
    BonusCSVForm,
)
from studies.admin.participants import report_bonuses
from studies.admin.permissions import can_change_participants
from studies.models import (
    Study,
)
from studies.prolific import api as prolific_api
from studies.prolific import sync as prolific_sync


class ProlificActions:
    """StudyAdmin's Prolific column, sync action and bonus CSV."""

    @admin.display(description="Prolific")
    def prolific(self, study):
        return self.prolific_summary(study, identities=True)

    @admin.display(description="Prolific")
    def prolific_without_ids(self, study):
        """For staff without the participants permission: who may be rejected, by number."""
        return self.prolific_summary(study, identities=False)

    def prolific_summary(self, study, identities: bool):
        if not study.pk or not study.prolific_study_id:
            return "Not linked: set the Prolific study id."
        states = dict(
            study.participants.exclude(prolific_status="")
            .values_list("prolific_status")
            .annotate(n=Count("pk"))
        )
        awaiting = study.participants.filter(prolific_status=prolific_api.AWAITING_REVIEW)
        suggested = [
            f"{p.prolific_pid if identities else f'#{p.pk}'} ({category})"
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
