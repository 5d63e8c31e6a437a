"""Questionnaires and their items, and the scenario pool's own list."""

from django import forms
from django.contrib import admin

from studies.admin.study.inlines import FrozenPlanInlines, repeated
from studies.models import (
    Item,
    Questionnaire,
    Scenario,
)


class ItemFormSet(forms.BaseInlineFormSet):
    """The answers the study's Domain reads are offered for its items, each to one item only."""

    def add_fields(self, form, index):  # every form, the empty one (added rows) included
        super().add_fields(form, index)
        study = self.instance.study if self.instance.study_id else None
        if study is not None and "domain_input" in form.fields:  # else: checked at go-live
            needs = [(need.name, need.describe()) for need in study.domain_inputs()]
            form.fields["domain_input"].choices = [("", "---------"), *needs]

    def clean(self):
        super().clean()
        if twice := repeated(self, "domain_input"):
            raise forms.ValidationError(
                f"One item per answer the task reads: {', '.join(twice)} is given twice."
            )


class ItemInline(admin.TabularInline):
    model = Item
    formset = ItemFormSet
    extra = 0
    fields = [
        "order",
        "key",
        "kind",
        "prompt",
        "scale_points",
        "anchor_low",
        "anchor_high",
        "reverse_coded",
        "min_value",
        "max_value",
        "required",
        "expected_answer",
        "domain_input",
        "identifying",
    ]


@admin.register(Questionnaire)
class QuestionnaireAdmin(FrozenPlanInlines, admin.ModelAdmin):
    list_display = ["study", "title", "item_count"]
    inlines = [ItemInline]

    @admin.display(description="Items")
    def item_count(self, questionnaire):
        return questionnaire.items.count()

    def has_delete_permission(self, request, obj=None):
        # Its items are a frozen plan's measures and attention checks.
        if obj is not None and obj.study.preregistered() is not None:
            return False
        return super().has_delete_permission(request, obj)


@admin.register(Scenario)
class ScenarioAdmin(admin.ModelAdmin):
    list_display = ["key", "title", "study", "domain", "active"]
    list_filter = ["study", "domain", "active"]
    search_fields = ["key", "title"]
