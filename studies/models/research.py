"""Results kept for the researcher: analysis runs and simulator evaluations."""

from django.db import models

from agents.models import Checkpoint
from studies.models.study import Arm, Scenario, Study


class AnalysisRun(models.Model):
    """One computation of a study's analysis, kept with its inputs so it can be redone."""

    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"

    class Trigger(models.TextChoices):
        MANUAL = "manual", "Started by a researcher"
        TARGET = "target", "Study reached its target"

    study = models.ForeignKey(Study, on_delete=models.CASCADE, related_name="analysis_runs")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED)
    trigger = models.CharField(max_length=10, choices=Trigger.choices, default=Trigger.MANUAL)
    settings = models.JSONField(default=dict, blank=True)
    inputs = models.JSONField(default=dict, blank=True, help_text="The participant table analysed.")
    results = models.JSONField(null=True, blank=True)
    figures = models.JSONField(default=dict, blank=True, help_text="SVG figures by name.")
    error = models.TextField(blank=True)
    erased_participants = models.PositiveIntegerField(
        default=0,
        help_text="People erased on request after this run was computed: their rows are gone "
        "from its inputs, its results still count them.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            # One automatic analysis per study, however many last completions race to start it.
            models.UniqueConstraint(
                fields=["study"],
                condition=models.Q(trigger="target"),
                name="one_automatic_analysis_per_study",
            )
        ]

    def __str__(self) -> str:
        return f"analysis #{self.pk} of {self.study.slug}"


class SimulatorEvaluation(models.Model):
    """One conversation of an arm's checkpoint with one of its training run's held-out
    simulators on one scenario of the study's pool, scored by the Domain (the sim-to-real gap
    report, studies/research/simulator_evaluations.py). Kept so that a report never plays a conversation twice: the
    key is (arm, checkpoint, simulator, scenario, sample)."""

    arm = models.ForeignKey(Arm, on_delete=models.CASCADE, related_name="simulator_evaluations")
    checkpoint = models.ForeignKey(
        Checkpoint, on_delete=models.CASCADE, related_name="simulator_evaluations"
    )
    simulator = models.CharField(max_length=100, help_text="Its name in the run's held-out panel.")
    scenario = models.ForeignKey(
        Scenario, on_delete=models.CASCADE, related_name="simulator_evaluations"
    )
    sample = models.PositiveIntegerField(
        default=0, help_text="Which conversation of this scenario."
    )
    spec = models.JSONField(
        default=dict, help_text="The held-out simulator as the run declared it."
    )
    success = models.BooleanField()
    reward = models.FloatField()
    outcome = models.JSONField(default=dict, help_text="The Domain's score, in full.")
    end_reason = models.CharField(max_length=40, blank=True)
    conversation = models.JSONField(default=list, help_text="The messages, as the Domain saw them.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["arm", "simulator", "scenario", "sample"]
        constraints = [
            models.UniqueConstraint(
                fields=["arm", "checkpoint", "simulator", "scenario", "sample"],
                name="one_evaluation_per_conversation",
            )
        ]

    def __str__(self) -> str:
        return f"{self.arm} x {self.simulator} on {self.scenario_id}#{self.sample}"
