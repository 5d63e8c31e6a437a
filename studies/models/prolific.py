"""What Prolific tells and is told: webhook events, review decisions, bonuses (studies/prolific/sync.py)."""

from django.db import models

from studies.models.participant import Participant
from studies.models.study import Study

# --- Prolific: webhook events, review decisions, bonuses (studies/prolific/sync.py) ------------


class ProlificEvent(models.Model):
    """A webhook Prolific delivered, kept by its X-Event-ID so a redelivery is acknowledged
    without acting twice, and by its digest (the signed timestamp and body) so a replay of the
    same signed request under another X-Event-ID, or none, is refused."""

    event_id = models.CharField(max_length=128, unique=True)
    digest = models.CharField(
        max_length=64,
        unique=True,
        null=True,
        blank=True,
        help_text="SHA-256 of the signed timestamp and body (none on events kept before it).",
    )
    event_type = models.CharField(max_length=64)
    resource_id = models.CharField(max_length=64, blank=True)
    payload = models.JSONField(default=dict, blank=True)
    result = models.CharField(max_length=200, blank=True)
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-received_at"]

    def __str__(self) -> str:
        return f"{self.event_type} {self.event_id}"


class Review(models.Model):
    """A researcher's decision on a submission, sent to Prolific by a task (an outbox: the
    transitions are idempotent on Prolific's side, so sending again after a crash is safe)."""

    class Action(models.TextChoices):
        APPROVE = "APPROVE", "Approve"
        REJECT = "REJECT", "Reject"

    class State(models.TextChoices):
        PENDING = "pending", "Waiting to be sent"
        SENT = "sent", "Sent to Prolific"
        FAILED = "failed", "Refused by Prolific"

    participant = models.OneToOneField(Participant, on_delete=models.CASCADE, related_name="review")
    action = models.CharField(max_length=10, choices=Action.choices)
    message = models.TextField(blank=True)
    rejection_category = models.CharField(max_length=24, blank=True)
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.action} {self.participant}"


class BonusPayment(models.Model):
    """One batch of bonuses: set up on Prolific (its id stored before paying), then paid once."""

    class State(models.TextChoices):
        NEW = "new", "Not set up yet"
        SET_UP = "set_up", "Set up, not paid"
        PAYING = "paying", "Pay sent, not confirmed"
        PAID = "paid", "Paid"
        FAILED = "failed", "Refused by Prolific"

    study = models.ForeignKey(Study, on_delete=models.CASCADE, related_name="bonus_payments")
    source = models.CharField(max_length=200, help_text="The rule or the CSV file it came from.")
    state = models.CharField(max_length=10, choices=State.choices, default=State.NEW)
    setup_id = models.CharField(max_length=64, blank=True)
    # A set-up Prolific refused leaves its participants free to be bonused by a corrected file;
    # its lines are kept here, [participant id, amount], for the record.
    refused_lines = models.JSONField(default=list, blank=True)
    total_amount = models.PositiveIntegerField(null=True, blank=True, help_text="pence/cents")
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    set_up_at = models.DateTimeField(null=True, blank=True)
    pay_sent_at = models.DateTimeField(null=True, blank=True)
    paid_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"bonuses #{self.pk} of {self.study.slug}"


class Bonus(models.Model):
    """One participant's bonus: at most one per (study, participant), whatever is uploaded."""

    payment = models.ForeignKey(BonusPayment, on_delete=models.CASCADE, related_name="bonuses")
    study = models.ForeignKey(Study, on_delete=models.CASCADE, related_name="+")
    # PROTECT: only an erasure (studies/privacy) lets a bonused participant go, keeping the
    # submission id below; null after it.
    participant = models.ForeignKey(
        Participant, null=True, blank=True, on_delete=models.PROTECT, related_name="bonuses"
    )
    submission_id = models.CharField(
        max_length=64,
        blank=True,
        help_text="The Prolific submission paid, kept when its participant is erased (what the "
        "payment record needs by law, with the amount and the payment's date).",
    )
    amount = models.DecimalField(max_digits=8, decimal_places=2, help_text="pounds/dollars")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["study", "participant"], name="one_bonus_per_participant"
            )
        ]

    def __str__(self) -> str:
        if self.participant_id is None:
            return f"erased participant (submission {self.submission_id}): {self.amount}"
        return f"{self.participant}: {self.amount}"
