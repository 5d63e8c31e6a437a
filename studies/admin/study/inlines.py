"""The study page's forms and inlines: arms, completion codes, scenarios."""

from django import forms
from django.contrib import admin
from django.utils.html import format_html

from agents.models import Checkpoint
from studies.models import (
    Arm,
    CompletionCode,
    Scenario,
    frozen_changes,
)
from studies.setup import arm_adapters


class ArmForm(forms.ModelForm):
    def clean(self):
        # An arm newly asking a vLLM endpoint for a registered checkpoint: the replicas load
        # it first, as "Attach to study arm(s)" does, so that Arm.clean finds it served.
        cleaned = super().clean()
        endpoint, name = cleaned.get("endpoint"), cleaned.get("model_name")
        if endpoint and name and {"endpoint", "model_name"} & set(self.changed_data):
            checkpoint = Checkpoint.objects.filter(name=name).first()
            if checkpoint is not None and name not in endpoint.served_models():
                arm_adapters.load_checkpoint(endpoint, checkpoint)  # Arm.clean says if none did
        return cleaned


class ArmInline(admin.StackedInline):
    model = Arm
    form = ArmForm
    extra = 0
    fields = [
        ("name", "order", "active"),
        ("endpoint", "model_name"),
        ("temperature", "top_p", "max_tokens"),
        ("tool_format", "tool_choice"),
        "system_prompt",
        "greeting",
        "extra_params",
    ]


def repeated(formset: forms.BaseInlineFormSet, field: str) -> list[str]:
    """The values of `field` that more than one kept row of `formset` gives (blanks aside)."""
    values = [
        form.cleaned_data.get(field)
        for form in formset.forms
        if form.cleaned_data and not form.cleaned_data.get("DELETE")
    ]
    return sorted({v for v in values if v and values.count(v) > 1})


class CompletionCodeFormSet(forms.BaseInlineFormSet):
    def clean(self):
        super().clean()
        if twice := repeated(self, "ending"):
            raise forms.ValidationError(f"One code per ending: {', '.join(twice)} is given twice.")


class CompletionCodeInline(admin.TabularInline):
    model = CompletionCode
    formset = CompletionCodeFormSet
    extra = 0
    fields = ["code_type", "code", "ending", "action", "redirect"]
    readonly_fields = ["redirect"]

    @admin.display(description="Redirect")
    def redirect(self, code):
        return format_html("<code>{}</code>", code.redirect_url) if code.pk else "-"


class ScenarioInline(admin.TabularInline):
    model = Scenario
    extra = 0
    fields = ["key", "title", "domain", "active", "instructions"]
    show_change_link = True


class StudyForm(forms.ModelForm):
    golive_problems: list[str] = []  # set by StudyAdmin.get_form on the second pass

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        field = self.fields.get("control_arm")
        if field is None:
            return
        # only this study's arms; a new study has none until it is saved with them
        study = self.instance
        field.queryset = study.arms.all() if study.pk else Arm.objects.none()
        if not study.pk or not field.queryset.exists():
            field.help_text = "Save the study with its arms first, then choose its control arm."

    def clean(self):
        cleaned = super().clean()
        for problem in self.golive_problems:
            self.add_error("status", f"Cannot go live: {problem}")
        return cleaned


def frozen_plan_formset(formset_class):
    """An inline formset of arms or items that refuses, with the field named, what a study's
    frozen plan does not allow (the models refuse it too; this says it on the form)."""

    class FrozenPlanFormSet(formset_class):
        def clean(self):
            super().clean()
            refused = []
            for form in self.forms:
                if not form.is_bound or form.instance.pk is None and not form.has_changed():
                    continue
                if self.can_delete and self._should_delete_form(form):
                    if form.instance.pk is not None:
                        refused += frozen_changes(form.instance, deleting=True).values()
                    continue
                for field, message in frozen_changes(form.instance).items():
                    form.add_error(field if field in form.fields else None, message)
            if refused:
                raise forms.ValidationError(refused)

    return FrozenPlanFormSet


class FrozenPlanInlines:
    """Inlines of arms or items whose forms refuse what a frozen plan holds."""

    def get_formsets_with_inlines(self, request, obj=None):
        for formset, inline in super().get_formsets_with_inlines(request, obj):
            yield frozen_plan_formset(formset), inline
