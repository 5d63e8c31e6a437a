from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import JsonResponse
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from agents.models import Checkpoint

from . import tasks
from .models import CONFIG_FIELDS, TrainingRun, preset_choices


class TrainingRunForm(forms.ModelForm):
    preset = forms.ChoiceField(choices=lambda: [("", "(none)")] + preset_choices(), required=False)

    class Meta:
        model = TrainingRun
        fields = ["preset", *CONFIG_FIELDS, "settings"]  # start from a preset, then change it


@admin.register(TrainingRun)
class TrainingRunAdmin(admin.ModelAdmin):
    form = TrainingRunForm
    list_display = [
        "name",
        "domain",
        "regime",
        "status",
        "step",
        "reward",
        "heldout",
        "eta",
        "created_at",
    ]
    list_filter = ["status", "domain", "regime"]
    actions = ["cancel"]
    readonly_fields = [
        "status",
        "live_progress",
        "checkpoint_list",
        "output_dir",
        "error",
        "created_at",
        "started_at",
        "finished_at",
    ]

    def get_fields(self, request, obj=None):
        if obj is None:  # starting a run: only what shapes it
            return TrainingRunForm.Meta.fields
        return ["name", "domain", "regime", *self.readonly_fields]

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return []
        return ["name", "domain", "regime", *self.readonly_fields]

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if not change:
            tasks.start(obj)
            messages.info(request, f"Training run {obj} queued on the `training` queue.")

    @admin.display(description="Step")
    def step(self, run):
        p = run.progress or {}
        return f"{p['step']}/{p['total_steps']}" if "step" in p else "-"

    @admin.display(description="Reward")
    def reward(self, run):
        value = (run.progress or {}).get("reward")
        return "-" if value is None else f"{value:.3f}"

    @admin.display(description="Held-out success")
    def heldout(self, run):
        value = (run.progress or {}).get("heldout_success")
        if not value:
            return "-"
        return (
            ", ".join(f"{k}: {v:.2f}" for k, v in value.items())
            if isinstance(value, dict)
            else value
        )

    @admin.display(description="ETA")
    def eta(self, run):
        seconds = (run.progress or {}).get("eta_seconds")
        if seconds is None or run.status != TrainingRun.Status.RUNNING:
            return "-"
        return f"{int(seconds) // 60} min {int(seconds) % 60:02d} s"

    @admin.display(description="Progress")
    def live_progress(self, run):
        url = reverse("admin:training_trainingrun_progress", args=[run.pk])
        return format_html(
            '<div id="run-progress">{} · step {} · reward {} · held-out {} · ETA {}</div>'
            "<script>(function(){{const el=document.getElementById('run-progress');"
            "async function poll(){{const r=await fetch('{}');const d=await r.json();el.textContent=d.text;"
            "if(d.active)setTimeout(poll,2000);}}setTimeout(poll,2000);}})();</script>",
            run.get_status_display(),
            self.step(run),
            self.reward(run),
            self.heldout(run),
            self.eta(run),
            url,
        )

    @admin.display(description="Checkpoints")
    def checkpoint_list(self, run):
        links = format_html_join(
            ", ",
            '<a href="{}">{}</a>',
            (
                (reverse("admin:agents_checkpoint_change", args=[c.pk]), c.name)
                for c in run.checkpoints.order_by("step")
            ),
        )
        return links or "-"

    def progress_json(self, request, pk):
        run = get_object_or_404(TrainingRun, pk=pk)
        if not self.has_view_permission(request, run):
            raise PermissionDenied
        text = (
            f"{run.get_status_display()} · step {self.step(run)} · reward {self.reward(run)} · "
            f"held-out {self.heldout(run)} · ETA {self.eta(run)}"
        )
        active = run.status in (
            TrainingRun.Status.QUEUED,
            TrainingRun.Status.RUNNING,
            TrainingRun.Status.CANCELLING,
        )
        return JsonResponse(
            {"text": text, "active": active, "progress": run.progress, "status": run.status}
        )

    def get_urls(self):
        own = [
            path(
                "<int:pk>/progress.json",
                self.admin_site.admin_view(self.progress_json),
                name="training_trainingrun_progress",
            )
        ]
        return own + super().get_urls()

    @admin.action(
        permissions=["change"], description="Cancel the selected runs (after their current step)"
    )
    def cancel(self, request, queryset):
        n = queryset.filter(status=TrainingRun.Status.RUNNING).update(
            status=TrainingRun.Status.CANCELLING
        )
        n += queryset.filter(status=TrainingRun.Status.QUEUED).update(
            status=TrainingRun.Status.CANCELLED
        )
        self.message_user(request, f"{n} run(s) cancelled.")


# agents' checkpoint registry knows no runs (agents installs alone); training owns the link, so
# its admin extends agents' one with the run that wrote each checkpoint.
_CheckpointAdmin = type(admin.site.get_model_admin(Checkpoint))
admin.site.unregister(Checkpoint)


@admin.register(Checkpoint)
class CheckpointWithRunAdmin(_CheckpointAdmin):
    list_display = [*_CheckpointAdmin.list_display, "training_run"]
    readonly_fields = [*_CheckpointAdmin.readonly_fields, "training_run"]

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("training_link__run")

    @admin.display(description="Training run")
    def training_run(self, checkpoint):
        link = getattr(checkpoint, "training_link", None)  # None: not written by a run
        if link is None:
            return "-"
        url = reverse("admin:training_trainingrun_change", args=[link.run_id])
        return format_html('<a href="{}">{}</a>', url, link.run)
