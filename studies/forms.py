from django import forms

from agents.domains import STUDY_DOMAINS
from agents.paths import reference_dir


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
