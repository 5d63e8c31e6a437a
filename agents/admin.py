from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.http import HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse

from .models import Checkpoint


class AttachForm(forms.Form):
    arms = forms.ModelMultipleChoiceField(
        queryset=None, help_text="Each arm will ask for this checkpoint."
    )
    endpoint_url = forms.URLField(
        assume_scheme="http", help_text="The engine that serves the checkpoint."
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        from studies.models import Arm

        self.fields["arms"].queryset = Arm.objects.select_related("study")


@admin.register(Checkpoint)
class CheckpointAdmin(admin.ModelAdmin):
    list_display = ["name", "domain", "regime", "step", "training_run", "created_at"]
    list_filter = ["domain", "regime"]
    search_fields = ["name"]
    actions = ["attach_to_arm"]
    readonly_fields = [
        "name",
        "path",
        "base_model",
        "domain",
        "regime",
        "step",
        "metrics",
        "manifest",
        "training_run",
        "created_at",
    ]

    def has_add_permission(self, request):
        return False  # checkpoints are registered by training runs

    @admin.action(description="Attach to study arm(s)")
    def attach_to_arm(self, request, queryset):
        if queryset.count() != 1:
            self.message_user(request, "Choose exactly one checkpoint to attach.", messages.ERROR)
            return None
        checkpoint = queryset.get()
        form = AttachForm(
            request.POST if "apply" in request.POST else None,
            initial={"endpoint_url": settings.PARLEY_ENGINE_URL},
        )
        if form.is_valid():
            arms = form.cleaned_data["arms"]
            for arm in arms:
                arm.model_name = checkpoint.name
                arm.endpoint_url = form.cleaned_data["endpoint_url"]
                arm.save(update_fields=["model_name", "endpoint_url"])
            self.message_user(
                request, f"{checkpoint} attached to {', '.join(map(str, arms))}.", messages.SUCCESS
            )
            return HttpResponseRedirect(reverse("admin:agents_checkpoint_changelist"))
        context = {
            **self.admin_site.each_context(request),
            "title": f"Attach {checkpoint} to arms",
            "form": form,
            "checkpoint": checkpoint,
            "opts": self.model._meta,
            "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
        }
        return render(request, "admin/agents/attach.html", context)
