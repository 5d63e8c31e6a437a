"""Checkpoints as the studies app sees them: attach one to arms."""

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_permission_codename
from django.core.exceptions import ValidationError
from django.http import HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse

from agents.models import ModelEndpoint
from studies.models import (
    Arm,
    PlanFrozen,
)
from studies.setup import arm_adapters, arm_endpoints


class AttachCheckpointForm(forms.Form):
    arms = forms.ModelMultipleChoiceField(
        queryset=Arm.objects.select_related("study"),
        help_text="Each arm will ask for this checkpoint.",
    )
    endpoint = forms.ModelChoiceField(
        queryset=ModelEndpoint.objects.all(), help_text="The endpoint that serves the checkpoint."
    )


class AttachToArms:
    """The Checkpoint admin's action that points study arms at a checkpoint. The project composes
    it with agents' admin and training's column in one place (platform/parley/admin.py)."""

    def has_attach_permission(self, request) -> bool:
        """Attaching rewrites the arms: it needs the permission to change arms."""
        return request.user.has_perm(
            f"{Arm._meta.app_label}.{get_permission_codename('change', Arm._meta)}"
        )

    @admin.action(permissions=["attach"], description="Attach to study arm(s)")
    def attach_to_arm(self, request, queryset):
        if queryset.count() != 1:
            self.message_user(request, "Choose exactly one checkpoint to attach.", messages.ERROR)
            return None
        checkpoint = queryset.get()
        form = AttachCheckpointForm(
            request.POST if "apply" in request.POST else None,
            initial={"endpoint": ModelEndpoint.default()},
        )
        if form.is_valid():
            arms, endpoint = form.cleaned_data["arms"], form.cleaned_data["endpoint"]
            # vLLM serves a new checkpoint once asked (the embedded engine finds it by itself);
            # first, so that the check of the arms' model sees it served
            for problem in arm_adapters.load_checkpoint(endpoint, checkpoint):
                self.message_user(request, problem, messages.WARNING)
            try:
                warnings = arm_endpoints.repoint(arms, endpoint, checkpoint.name)
            except PlanFrozen as frozen:  # an arm of a pre-registered study: nothing attached
                self.message_user(request, " ".join(frozen.messages), messages.ERROR)
                return HttpResponseRedirect(reverse("admin:agents_checkpoint_changelist"))
            except ValidationError as refused:  # a model no healthy replica serves
                for problem in refused.messages:
                    form.add_error(None, problem)
            else:
                for warning in warnings:
                    self.message_user(request, warning, messages.WARNING)
                self.message_user(
                    request,
                    # the admin capitalises a message's first letter: a checkpoint's name
                    # (p4g-single-step6) must not come first, or it reads P4g-single-step6
                    f"Attached {checkpoint} to {', '.join(map(str, arms))}.",
                    messages.SUCCESS,
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
        return render(request, "admin/studies/attach_checkpoint.html", context)
