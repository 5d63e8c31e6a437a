"""The questions a study asks after the conversation."""

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from agents.domains import STUDY_DOMAINS, QuestionnaireInput, input_choices


def domain_input_choices() -> list[tuple[str, str]]:
    """Every answer a study's Domain may read from its questionnaire, from the one registry."""
    return input_choices(STUDY_DOMAINS)


class Questionnaire(models.Model):
    study = models.OneToOneField(
        "studies.Study", on_delete=models.CASCADE, related_name="questionnaire"
    )
    title = models.CharField(max_length=200, default="A few questions about the conversation")
    intro = models.TextField(blank=True)

    def __str__(self) -> str:
        return f"{self.study.slug}: {self.title}"


class Item(models.Model):
    class Kind(models.TextChoices):
        LIKERT = "likert", "Likert scale"
        NUMBER = "number", "Number"
        TEXT = "text", "Free text"
        ATTENTION = "attention", "Attention check"

    questionnaire = models.ForeignKey(Questionnaire, on_delete=models.CASCADE, related_name="items")
    order = models.PositiveSmallIntegerField(default=0)
    key = models.SlugField(max_length=64, help_text="Column name in exports and analysis.")
    kind = models.CharField(max_length=10, choices=Kind.choices, default=Kind.LIKERT)
    prompt = models.TextField()
    scale_points = models.PositiveSmallIntegerField(
        default=7, validators=[MinValueValidator(2), MaxValueValidator(11)]
    )
    anchor_low = models.CharField(max_length=100, blank=True, default="Strongly disagree")
    anchor_high = models.CharField(max_length=100, blank=True, default="Strongly agree")
    anchor_labels = models.JSONField(
        default=list, blank=True, help_text="Optional label for every point, low to high."
    )
    reverse_coded = models.BooleanField(default=False)
    min_value = models.FloatField(null=True, blank=True)
    max_value = models.FloatField(null=True, blank=True)
    required = models.BooleanField(default=True)
    expected_answer = models.CharField(
        max_length=100, blank=True, help_text="Attention check: the point (1..k) to choose."
    )
    identifying = models.BooleanField(
        default=False,
        help_text="Free text: its answers may name the person, so the study's retention period "
        "purges them.",
    )
    domain_input = models.CharField(
        "answers the task's",
        max_length=40,
        blank=True,
        choices=domain_input_choices,
        help_text="Which answer the study's task reads from this item (P4G: the donation, the "
        "participant's outcome). Going live checks that each one the task needs has an item.",
    )

    class Meta:
        ordering = ["questionnaire", "order", "id"]
        constraints = [
            models.UniqueConstraint(fields=["questionnaire", "key"], name="unique_item_key"),
            models.UniqueConstraint(
                fields=["questionnaire", "domain_input"],
                condition=~models.Q(domain_input=""),
                name="one_item_per_domain_input",
                violation_error_message="Another item already answers this for the task.",
            ),
        ]

    def __str__(self) -> str:
        return self.key

    @property
    def is_scale(self) -> bool:
        return self.kind in (self.Kind.LIKERT, self.Kind.ATTENTION)

    def clean(self):
        errors = {}
        if self.identifying and self.kind != self.Kind.TEXT:
            errors["identifying"] = (
                "Only free-text answers can name a person; numbers and scale points are kept."
            )
        if self.anchor_labels and (
            not isinstance(self.anchor_labels, list) or len(self.anchor_labels) != self.scale_points
        ):
            errors["anchor_labels"] = f"Give a list of exactly {self.scale_points} labels, or none."
        if self.kind == self.Kind.ATTENTION:
            try:
                expected = int(self.expected_answer)
            except ValueError:
                expected = 0
            if not 1 <= expected <= self.scale_points:
                errors["expected_answer"] = (
                    f"An attention check needs a point from 1 to {self.scale_points}."
                )
        if (
            self.min_value is not None
            and self.max_value is not None
            and self.min_value > self.max_value
        ):
            errors["min_value"] = "Must not exceed max_value."
        if self.domain_input and self.questionnaire_id and not errors:
            study = self.questionnaire.study
            need = {n.name: n for n in study.domain_inputs()}.get(self.domain_input)
            problem = (
                self.input_problem(need)
                if need
                else f"The study's task ({study.get_domain_display()}) reads no such answer."
            )
            if problem:
                errors["domain_input"] = problem
        if errors:
            raise ValidationError(errors)

    def answer_range(self) -> tuple[float | None, float | None]:
        """The lowest and highest answer this item accepts (None: no bound)."""
        if self.is_scale:
            return 1, self.scale_points
        return self.min_value, self.max_value

    def input_problem(self, need: QuestionnaireInput) -> str | None:
        """Why this item cannot supply the Domain's `need` (every answer it accepts must be one
        the Domain can use, and every participant must give one), or None."""
        if self.kind not in (self.Kind.NUMBER, self.Kind.LIKERT):
            return f"A {self.get_kind_display().lower()} item cannot hold {need.describe()}."
        low, high = self.answer_range()
        if low is None or high is None or low < need.min_value or high > need.max_value:
            shown = (
                f"{'-' if low is None else f'{low:g}'} to {'-' if high is None else f'{high:g}'}"
            )
            return (
                f"Its answers ({shown}) must lie within {need.min_value:g} to "
                f"{need.max_value:g}: it holds {need.describe()}. Set its min and max values."
            )
        if not self.required:
            return f"It must be required: it holds {need.describe()}."
        return None

    def labels(self) -> list[str]:
        """One label per point: the full list if given, else the anchors at the ends."""
        if self.anchor_labels:
            return list(self.anchor_labels)
        labels = [""] * self.scale_points
        labels[0], labels[-1] = self.anchor_low, self.anchor_high
        return labels


# Items a plan holds: the measures and the attention checks (an exclusion rule); free text is
# neither.
PLANNED_ITEM_KINDS = (Item.Kind.LIKERT, Item.Kind.NUMBER, Item.Kind.ATTENTION)
