"""The checkpoint and model endpoint registries. Putting a checkpoint on a study's arm is
studies' business: the project composes this admin with that action and training's run column
(platform/parley/admin.py), so agents never imports studies or training."""

from django.contrib import admin, messages
from django.db import models
from django.utils.html import format_html, format_html_join

from .models import Checkpoint, ModelEndpoint, Replica


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


def badge(value: str, label: str):
    return format_html('<span class="health health-{}">{}</span>', value, label)


class ReplicaInline(admin.TabularInline):
    model = Replica
    extra = 0
    min_num = 1
    formfield_overrides = {models.URLField: {"assume_scheme": "http"}}  # lab engines: plain http
    fields = ["url", "position", "health", "served", "last_error", "last_error_at", "checked_at"]
    readonly_fields = ["health", "served", "last_error", "last_error_at", "checked_at"]

    @admin.display(description="Status")
    def health(self, replica):
        return badge(replica.status, replica.get_status_display())

    @admin.display(description="Served models")
    def served(self, replica):
        return ", ".join(replica.served_models) or "-"


@admin.register(ModelEndpoint)
class ModelEndpointAdmin(admin.ModelAdmin):
    list_display = ["name", "kind", "colour", "replica_states", "models", "api_key_env"]
    list_filter = ["kind"]
    search_fields = ["name", "replicas__url"]
    fields = ["name", "kind", "api_key_env"]
    inlines = [ReplicaInline]
    actions = ["check_now"]

    class Media:
        css = {"all": ["agents/endpoints.css"]}

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("replicas")

    @admin.display(description="Health")
    def colour(self, endpoint):
        health = ModelEndpoint.Health(endpoint.health())
        return badge(health.value, health.label)

    @admin.display(description="Replicas")
    def replica_states(self, endpoint):
        return format_html_join(
            " ",
            '<span class="health health-{}" title="{}">{}</span>',
            (
                (r.status, r.last_error if r.status != Replica.Status.UP else "", r.url)
                for r in endpoint.replica_list()
            ),
        )

    @admin.display(description="Served models (replicas up)")
    def models(self, endpoint):
        return ", ".join(endpoint.served_models()) or "-"

    @admin.action(permissions=["change"], description="Check the replicas now")
    def check_now(self, request, queryset):
        for endpoint in queryset.prefetch_related("replicas"):
            health = ModelEndpoint.Health(endpoint.refresh_health().health())
            level = {"green": messages.SUCCESS, "amber": messages.WARNING}.get(
                health.value, messages.ERROR
            )
            self.message_user(request, f"{endpoint}: {health.label}.", level)

    def save_related(self, request, form, formsets, change):
        # A replica added or moved is checked at once, so the list is not "unknown" until beat.
        super().save_related(request, form, formsets, change)
        endpoint = ModelEndpoint.objects.prefetch_related("replicas").get(pk=form.instance.pk)
        endpoint.refresh_health()
