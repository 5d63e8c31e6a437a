"""The checkpoint registry. Putting a checkpoint on a study's arm is studies' business: its admin
extends this one with that action (studies/admin.py), so agents never imports studies."""

from django.contrib import admin

from .models import Checkpoint


@admin.register(Checkpoint)
class CheckpointAdmin(admin.ModelAdmin):
    list_display = ["name", "domain", "regime", "step", "created_at"]
    list_filter = ["domain", "regime"]
    search_fields = ["name"]
    readonly_fields = [
        "name",
        "path",
        "base_model",
        "domain",
        "regime",
        "step",
        "metrics",
        "manifest",
        "created_at",
    ]

    def has_add_permission(self, request):
        return False  # checkpoints are registered by training runs
