"""Bonus payments and the webhook events Prolific delivered."""

from django.contrib import admin
from django.utils.html import format_html_join

from studies.admin.permissions import NamesParticipants
from studies.models import (
    BonusPayment,
    ProlificEvent,
)


@admin.register(BonusPayment)
class BonusPaymentAdmin(NamesParticipants, admin.ModelAdmin):
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
        # An erased participant's bonus keeps its submission id (the payment record), no name.
        paid = [
            (b.participant or f"erased (submission {b.submission_id})", b.amount)
            for b in payment.bonuses.all()
        ]
        return format_html_join(", ", "{}: {}", paid + payment.refused_lines)


@admin.register(ProlificEvent)
class ProlificEventAdmin(NamesParticipants, admin.ModelAdmin):
    list_display = ["event_id", "event_type", "resource_id", "result", "received_at"]
    list_filter = ["event_type"]
    readonly_fields = ["event_id", "event_type", "resource_id", "payload", "result", "received_at"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
