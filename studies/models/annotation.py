"""Annotation studies: people rate conversations they were not in (issue 27).

A study with an AnnotationSetup is an annotation study. Its material is a pool of
RatedConversations drawn from finished studies and from stored simulated conversations; a
rater (a Participant of the annotation study) gets RatingAssignments, one per conversation,
balanced and capped in studies/annotation/assignment.py. What a rater sees is the transcript
alone: the source, the arm and the simulator are kept beside it for the analysis, never shown.
"""

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from studies.models.participant import Conversation, Participant
from studies.models.research import SimulatorEvaluation
from studies.models.study import Study


class AnnotationSetup(models.Model):
    """What makes a study an annotation study, and how its pool is shared out."""

    study = models.OneToOneField(Study, on_delete=models.CASCADE, related_name="annotation")
    raters_per_conversation = models.PositiveSmallIntegerField(
        "raters per conversation (k)",
        default=3,
        validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="Each conversation is rated by this many distinct raters, never more.",
    )
    conversations_per_rater = models.PositiveSmallIntegerField(
        "conversations per rater (n)",
        default=6,
        validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="Each rater rates this many conversations (gold ones not counted), balanced "
        "over the pool's sources and arms, in random order.",
    )
    gold_per_rater = models.PositiveSmallIntegerField(
        default=1,
        validators=[MaxValueValidator(10)],
        help_text="Gold conversations (known answers) mixed in as attention checks.",
    )
    ask_realism = models.BooleanField(
        default=True,
        help_text='Ask "Was the customer/persuadee a real person?" with a confidence, per '
        "conversation: each simulator's judged-human rate.",
    )

    def __str__(self) -> str:
        return f"annotation of {self.study.slug}"


class RatedConversation(models.Model):
    """One conversation of an annotation study's pool: a redacted transcript, where it came from
    (for the analysis only), and the known answers when it is a gold conversation."""

    class Source(models.TextChoices):
        PERSON = "person", "A person (a study's participant)"
        SIMULATOR = "simulator", "A user simulator"

    study = models.ForeignKey(Study, on_delete=models.CASCADE, related_name="rated_conversations")
    transcript = models.JSONField(
        help_text='What raters read: [{"speaker": "agent"|"user", "text": ...}], redacted.'
    )
    source = models.CharField(max_length=10, choices=Source.choices)
    arm = models.CharField(max_length=64, blank=True, help_text="The arm in its origin study.")
    simulator = models.CharField(max_length=100, blank=True, help_text="For a simulated user.")
    origin_study = models.ForeignKey(
        Study, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    origin_conversation = models.ForeignKey(
        Conversation, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    origin_evaluation = models.ForeignKey(
        SimulatorEvaluation, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    origin_sample = models.CharField(
        max_length=500,
        blank=True,
        help_text="A training run's sample: its samples.jsonl and line (file:line).",
    )
    gold = models.JSONField(
        null=True,
        blank=True,
        help_text="Known answers by item key: a gold conversation, an attention check.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["study", "pk"]
        indexes = [models.Index(fields=["study", "source", "arm"])]

    def __str__(self) -> str:
        return f"conversation {self.pk} of {self.study.slug}"

    @property
    def stratum(self) -> tuple[str, str, str]:
        """What assignment balances a rater's conversations over: source, arm and simulator."""
        return (self.source, self.arm, self.simulator)


class RatingAssignment(models.Model):
    """One conversation given to one rater, in their order; their answers once rated."""

    class Status(models.TextChoices):
        ASSIGNED = "assigned", "Assigned"
        RATED = "rated", "Rated"
        RELEASED = "released", "Released (the rater left)"

    participant = models.ForeignKey(
        Participant, on_delete=models.CASCADE, related_name="rating_assignments"
    )
    conversation = models.ForeignKey(
        RatedConversation, on_delete=models.PROTECT, related_name="assignments"
    )
    position = models.PositiveSmallIntegerField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.ASSIGNED)
    answers = models.JSONField(null=True, blank=True)
    rated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["participant", "position"]
        constraints = [
            models.UniqueConstraint(
                fields=["participant", "conversation"], name="one_rating_per_rater"
            ),
            models.UniqueConstraint(
                fields=["participant", "position"], name="one_conversation_per_position"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.participant} #{self.position}: {self.conversation_id}"
