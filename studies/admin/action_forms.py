from decimal import Decimal
from pathlib import Path

from django import forms
from django.conf import settings

from agents.domains import STUDY_DOMAINS
from agents.paths import reference_dir
from studies.models import Study
from studies.prolific.api import REJECTION_CATEGORIES, REJECTION_MESSAGE_MIN


def source_choices():
    choices = [("", "Bundled data (written for parley)")]
    reference = reference_dir()
    if reference:
        for name, folder in (
            ("retail", "tau2/retail"),
            ("airline", "tau2/airline"),
            ("p4g", "p4g"),
        ):
            if (reference / folder).is_dir():
                choices.append(
                    (str(reference / folder), f"Official {name} data ({reference / folder})")
                )
    return choices


class ImportPoolForm(forms.Form):
    domain = forms.ChoiceField(choices=[(name, name) for name in STUDY_DOMAINS])
    source = forms.ChoiceField(choices=source_choices, required=False)
    split = forms.ChoiceField(
        choices=[("", "all"), ("train", "train"), ("test", "test")], required=False
    )
    count = forms.IntegerField(min_value=1, required=False, help_text="Blank: every scenario.")
    seed = forms.IntegerField(initial=0, help_text="Which random sample of `count` scenarios.")


# --- an analysis other than the study's own (the study page's Explore, admin/study/frozen_plan.py) -------------------------


class ExploreForm(forms.Form):
    """Measures, comparisons, family and control of one analysis; in a pre-registered study
    anything but the plan's is labelled exploratory."""

    measures = forms.MultipleChoiceField(widget=forms.CheckboxSelectMultiple)
    pairs = forms.ChoiceField(label="comparisons", choices=Study.Comparisons.choices)
    family = forms.ChoiceField(label="Holm family", choices=Study.Family.choices)
    control = forms.ChoiceField(required=False, help_text="Blank: the first arm.")

    def __init__(self, *args, measures: list[str], arms: list[str], **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["measures"].choices = [(m, m) for m in measures]
        self.fields["control"].choices = [("", "-")] + [(a, a) for a in arms]


# --- Prolific decisions and bonuses (admin/participants.py, admin/study/prolific_actions.py) -------------------------------------------


class RejectForm(forms.Form):
    rejection_category = forms.ChoiceField(choices=list(REJECTION_CATEGORIES.items()))
    message = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 5, "cols": 80}),
        min_length=REJECTION_MESSAGE_MIN,
        strip=True,
        help_text=f"Shown to the participant; Prolific requires at least "
        f"{REJECTION_MESSAGE_MIN} characters.",
    )


class DonationMatchForm(forms.Form):
    factor = forms.DecimalField(
        initial=1,
        min_value=Decimal("0.01"),
        max_value=Decimal(100),
        decimal_places=2,
        help_text="Bonus = the participant's P4G donation x this factor (1: matched 1:1).",
    )


class BonusCSVForm(forms.Form):
    file = forms.FileField(
        help_text="Rows of 'participant id, amount' (PROLIFIC_PID or submission id; amount in "
        "pounds/dollars, e.g. 1.50); a header row is allowed."
    )
    max_bytes = 1_000_000

    def clean_file(self):
        upload = self.cleaned_data["file"]
        if upload.size > self.max_bytes:
            raise forms.ValidationError("The file is larger than 1 MB.")
        try:
            return upload.read().decode("utf-8-sig")
        except UnicodeDecodeError:
            raise forms.ValidationError("The file is not UTF-8 text.") from None


# --- an annotation study's pool (admin/study/annotation_pool.py) ----------------------------------


class AddConversationsForm(forms.Form):
    """Which conversations of another study go into an annotation study's pool."""

    origin = forms.ModelChoiceField(
        queryset=Study.objects.filter(annotation__isnull=True),
        label="from study",
        required=False,
        help_text="A chat study: its finished participants, and its stored sim-to-real ones.",
    )
    samples = forms.CharField(
        required=False,
        label="or a training run's samples",
        help_text="Its samples.jsonl, under the data folder (e.g. runs/NAME/samples.jsonl).",
    )
    samples_as = forms.CharField(
        required=False, label="their simulator", help_text="How the analysis names them."
    )
    people = forms.BooleanField(initial=True, required=False, help_text="Its participants'.")
    simulated = forms.BooleanField(
        initial=False, required=False, help_text="Its sim-to-real conversations (simulated users)."
    )
    arms = forms.CharField(required=False, help_text="Arm names, comma-separated; blank: all.")
    simulators = forms.CharField(
        required=False, help_text="Simulator names, comma-separated; blank: all."
    )
    success = forms.ChoiceField(
        choices=[("", "either"), ("yes", "succeeded"), ("no", "did not succeed")],
        required=False,
        help_text="By the Domain's score.",
    )
    min_user_turns = forms.IntegerField(min_value=0, initial=1)
    max_user_turns = forms.IntegerField(min_value=0, required=False)
    since = forms.DateTimeField(required=False, help_text="Had on or after (YYYY-MM-DD HH:MM).")
    until = forms.DateTimeField(required=False, help_text="Had on or before.")

    def clean(self):
        data = super().clean()
        if data.get("samples"):
            data["samples_path"] = self.samples_path(data["samples"])
            if not data.get("samples_as", "").strip():
                self.add_error("samples_as", "Name the simulator these conversations are from.")
            return data
        if not data.get("origin"):
            raise forms.ValidationError("Choose a study, or a training run's samples.")
        if not data.get("people") and not data.get("simulated"):
            raise forms.ValidationError("Choose people's conversations, simulated ones, or both.")
        low, high = data.get("min_user_turns"), data.get("max_user_turns")
        if low is not None and high is not None and high < low:
            self.add_error("max_user_turns", "Must be at least the minimum.")
        return data

    def samples_path(self, given: str) -> Path:
        """A samples.jsonl inside the data folder, and nothing else on the server."""
        root = Path(settings.DATA_DIR).resolve()
        path = (root / given.strip()).resolve()
        if not path.is_relative_to(root) or path.name != "samples.jsonl" or not path.is_file():
            raise forms.ValidationError(
                f"Not a training run's samples.jsonl under the data folder ({root}): {given}"
            )
        return path
