import json
from datetime import timedelta
from pathlib import Path

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Q
from django.http import FileResponse, Http404, JsonResponse
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from . import tasks
from .measures.breaker import read_events as read_breaker_events
from .measures.metrics import run_summary
from .models import CONFIG_FIELDS, TrainingRun, preset_choices, preset_values


class TrainingRunForm(forms.ModelForm):
    preset = forms.ChoiceField(choices=lambda: [("", "(none)")] + preset_choices(), required=False)
    # The preset whose values the page's script loaded into the fields: they are then what the
    # researcher saw and kept. Otherwise (no script, or the preset changed after) the server
    # fills in every field the researcher left at the form's default.
    loaded_preset = forms.CharField(required=False, widget=forms.HiddenInput)

    class Meta:
        model = TrainingRun
        # start from a preset, then change it; processes: data-parallel ranks (blank: the preset's)
        fields = ["preset", *CONFIG_FIELDS, "processes", "settings"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if "name" in self.fields:
            self.fields["name"].required = False  # blank: the preset's name
            self.fields["name"].help_text += " Blank: the preset's name."

    def clean(self):
        data = super().clean()
        preset = data.get("preset")
        if preset and data.get("loaded_preset") != preset:
            try:
                values = preset_values(preset)
            except ValidationError as error:
                self.add_error(None, error)
                return data
            for key, value in values.items():
                if key != "name" and key not in self.changed_data and key not in self.errors:
                    data[key] = value
        if not data.get("name") and "name" not in self.errors:
            if not preset:
                self.add_error("name", "Give the run a name, or choose a preset.")
            else:
                data["name"] = free_name(preset_values(preset)["name"])
        return data


def free_name(name: str) -> str:
    """`name`, or `name-2`, `name-3`... when a run already has it (a run's folder is its name)."""
    taken = set(TrainingRun.objects.filter(name__startswith=name).values_list("name", flat=True))
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{name}-{n}"
    return candidate


def collapse_warnings_of(run: TrainingRun) -> list[dict]:
    return [w for w in (run.progress or {}).get("warnings") or [] if isinstance(w, dict)]


@admin.register(TrainingRun)
class TrainingRunAdmin(admin.ModelAdmin):
    form = TrainingRunForm
    list_display = [
        "name",
        "domain",
        "regime",
        "state",
        "step",
        "reward",
        "heldout",
        "collapse",
        "eta",
        "created_at",
    ]
    list_filter = ["status", "domain", "regime"]
    actions = ["cancel", "resume"]
    readonly_fields = [
        "state",
        "live_progress",
        "collapse_warnings",
        "breaker",
        "behaviour",
        "optimizer_steps",
        "plots",
        "samples",
        "checkpoint_list",
        "configuration",
        "output_dir",
        "error",
        "created_at",
        "started_at",
        "finished_at",
    ]

    class Media:
        js = ["training/training_run.js"]  # the preset loader and the live progress (CSP: a file)
        css = {"all": ["training/training_run.css"]}

    def get_fields(self, request, obj=None):
        if obj is None:  # starting a run: only what shapes it, and what it will run
            return [*TrainingRunForm.Meta.fields, "loaded_preset", "what_will_run"]
        return ["name", "domain", "regime", "processes", *self.readonly_fields]

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return ["what_will_run"]
        return ["name", "domain", "regime", "processes", *self.readonly_fields]

    @admin.display(description="What will run")
    def what_will_run(self, run):
        url = reverse("admin:training_trainingrun_preview")
        return format_html(
            '<pre id="run-config" data-preview-url="{}">Choose a preset to see its settings; '
            "the fields above change them.</pre>",
            url,
        )

    @admin.display(description="Configuration")
    def configuration(self, run):
        try:
            config = run.config().to_dict()
        except ValidationError as error:
            return f"not valid: {error}"
        return format_html("<pre>{}</pre>", json.dumps(config, indent=2, default=str))

    def summary(self, run) -> dict:
        return run_summary(run.output_dir) if run.output_dir else run_summary("", samples=0)

    @admin.display(description="Optimizer steps")
    def optimizer_steps(self, run):
        summary = self.summary(run)
        if not summary["steps_logged"]:
            return "-"
        taken = summary["optimizer_steps"]
        if taken == 0:
            return format_html(
                '<strong class="errornote" id="no-optimizer-step">This run took no optimizer '
                "step in {} logged step(s): every group's rewards were equal, so its checkpoints "
                "are the base model under another name.</strong>",
                summary["steps_logged"],
            )
        return f"{taken} of {summary['steps_logged']} logged step(s)"

    @admin.display(description="Collapse")
    def collapse(self, run):
        """The list's column: which runs to open before trusting their checkpoints."""
        keys = sorted({str(w.get("key", "?")) for w in collapse_warnings_of(run)})
        if not keys:
            return "-"
        return format_html('<strong class="collapse-flag">{}</strong>', ", ".join(keys))

    @admin.display(description="Collapse warnings")
    def collapse_warnings(self, run):
        """The thresholds of the run's [collapse] table its steps crossed, each at the first
        step it did (stored by the task's progress callback)."""
        warnings = collapse_warnings_of(run)
        if not warnings:
            return "-"
        return format_html(
            '<div class="errornote" id="collapse-warnings"><strong>Signs of collapse:</strong>'
            "<ul>{}</ul>Thresholds: the run's [collapse] table (docs/training.md, "
            '"Collapse warnings"); the measures are in diversity.png and metrics.jsonl.</div>',
            format_html_join("", "<li>{}</li>", ((w.get("message", w),) for w in warnings)),
        )

    @admin.display(description="Breaker")
    def breaker(self, run):
        """COLLAPSE-AWARE's breaker ([breaker]): why it stopped the run, when it did, and every
        transition so far with the measures that caused it (<run>/breaker.jsonl)."""
        events = read_breaker_events(run.output_dir) if run.output_dir else []
        said = [e.get("message", "") for e in events if e.get("event") != "fit"]
        stopped = ""
        if run.status == TrainingRun.Status.STOPPED:
            stopped = format_html(
                '<div class="errornote" id="breaker-stop"><strong>Stopped by the breaker:'
                '</strong> {}. Select the run in the list and use "Resume the selected runs"'
                " to continue from its checkpoint; the simulators are re-diversified before"
                " the next step.</div>",
                run.stop_reason or "red",
            )
        if not said and not stopped:
            return "-"
        return format_html(
            '{}<ul id="breaker-events">{}</ul>',
            stopped,
            format_html_join("", "<li>{}</li>", ((m,) for m in said)),
        )

    @admin.display(description="Behaviour profile")
    def behaviour(self, run):
        """COLLAPSE-AWARE's measures at their last logged step (docs/training.md, "Behaviour
        profiles"); every step's are in metrics.jsonl and behaviour.png."""
        found = self.summary(run).get("behaviour") or []
        if not found:
            return "-"
        return format_html(
            '<table id="behaviour-profile">{}</table>',
            format_html_join("", "<tr><th>{}</th><td>{}</td></tr>", found),
        )

    @admin.display(description="Plots")
    def plots(self, run):
        names = self.summary(run)["plots"]
        if not names:
            return "-"
        return format_html_join(
            "",
            '<figure class="training-plot"><img src="{}" alt="{}" '
            'width="480"><figcaption>{}</figcaption></figure>',
            (
                (reverse("admin:training_trainingrun_plot", args=[run.pk, name]), name, name)
                for name in names
            ),
        )

    @admin.display(description="Samples (latest)")
    def samples(self, run):
        rows = self.summary(run)["samples"]
        if not rows:
            return "-"
        return format_html_join(
            "",
            "<details><summary>step {} · task {} · reward {} · {}</summary><pre>{}</pre></details>",
            (
                (
                    row.get("step", "?"),
                    row.get("task", "?"),
                    row.get("reward", "?"),
                    row.get("end_reason") or "",
                    "\n\n".join(
                        f"{m.get('role', '?')}: {m.get('content') or m.get('tool_calls') or ''}"
                        for m in row.get("conversation") or []
                        if isinstance(m, dict)
                    ),
                )
                for row in rows
            ),
        )

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if not change:
            tasks.start(obj)
            messages.info(request, f"Training run {obj} queued on the `training` queue.")

    @admin.display(description="Status")
    def state(self, run):
        """The stored status, or that the run's worker is gone (its heartbeat stopped)."""
        if run.worker_lost():
            return f"{run.get_status_display()}: worker lost"
        return run.get_status_display()

    @admin.display(description="Step")
    def step(self, run):
        p = run.progress or {}
        current = p.get("current") or {}
        if "step" not in p and not current:
            return "-"
        # the run's own count so far (training/trainer/loop.py): 0 means the adapter is still the base
        still_base = (p.get("metrics") or {}).get("optimizer_steps") == 0
        done = f"{p.get('step', 0)}/{p.get('total_steps', '?')}"
        done += " (no optimizer step)" if still_base and "step" in p else ""
        if not current or run.status not in (run.Status.RUNNING, run.Status.CANCELLING):
            return done
        return f"{done}; step {current.get('step', '?')}: {self.phase(current)}"

    @staticmethod
    def phase(current: dict) -> str:
        """Where the step in progress is (training/trainer/loop.py's `current`)."""
        if current.get("phase") == "rollouts":
            done = f"rollouts {current.get('rollouts_done', 0)} of {current.get('rollouts_total')}"
            turns = current.get("turns_done")  # moves every turn: a group's rollouts end together
            return f"{done}, {turns} turn{'s' * (turns != 1)} taken" if turns else done
        if current.get("phase") == "evaluation":
            return "held-out evaluation"
        return "updating the policy"

    def progress_text(self, run) -> str:
        text = (
            f"{self.state(run)} · step {self.step(run)} · reward {self.reward(run)} · "
            f"held-out {self.heldout(run)} · ETA {self.eta(run)}"
        )
        if run.worker_lost():
            text += f" · {worker_lost_help(run)}"
        return text

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
            '<div id="run-progress" data-url="{}" class="{}">{}</div>',
            url,
            "errornote" if run.worker_lost() else "",
            self.progress_text(run),
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
        text = self.progress_text(run)
        active = run.status in (
            TrainingRun.Status.QUEUED,
            TrainingRun.Status.RUNNING,
            TrainingRun.Status.CANCELLING,
        )
        return JsonResponse(
            {"text": text, "active": active, "progress": run.progress, "status": run.status}
        )

    def plot_file(self, request, pk, name):
        """One PNG of the run's folder (only those the run page lists)."""
        run = get_object_or_404(TrainingRun, pk=pk)
        if not self.has_view_permission(request, run):
            raise PermissionDenied
        if not run.output_dir or name not in self.summary(run)["plots"]:
            raise Http404("No such plot in this run's folder.")
        return FileResponse(open(Path(run.output_dir) / name, "rb"), content_type="image/png")

    def preview_json(self, request):
        """A preset's field values (to fill the form) and the whole configuration a run with
        the form's current values would train, or the error that stops it."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        preset = request.GET.get("preset", "")
        fields = {}
        if preset:
            try:
                fields = preset_values(preset)
            except ValidationError as error:
                return JsonResponse({"error": " ".join(error.messages)}, status=400)
            fields["name"] = free_name(fields["name"])
        form = TrainingRunForm({**fields, **request.GET.dict(), "loaded_preset": preset})
        form.is_valid()  # the errors are shown; a preview never saves
        run = form.instance
        for key, value in form.cleaned_data.items():
            if key in CONFIG_FIELDS or key in ("preset", "settings"):
                setattr(run, key, value)
        try:
            config = run.config().to_dict()
        except ValidationError as error:
            return JsonResponse({"fields": fields, "error": " ".join(error.messages)})
        errors = {k: v for k, v in form.errors.items() if k != "name"}
        return JsonResponse(
            {"fields": fields, "config": config, "error": " ".join(map(str, errors.values()))},
            json_dumps_params={"default": str},
        )

    def get_urls(self):
        own = [
            path(
                "<int:pk>/progress.json",
                self.admin_site.admin_view(self.progress_json),
                name="training_trainingrun_progress",
            ),
            path(
                "<int:pk>/plot/<str:name>",
                self.admin_site.admin_view(self.plot_file),
                name="training_trainingrun_plot",
            ),
            path(
                "preview.json",
                self.admin_site.admin_view(self.preview_json),
                name="training_trainingrun_preview",
            ),
        ]
        return own + super().get_urls()

    @admin.action(
        permissions=["change"], description="Cancel the selected runs (after their current step)"
    )
    def cancel(self, request, queryset):
        # a run whose worker is gone has nobody to see CANCELLING: it is cancelled now
        lost = [run.pk for run in queryset if run.worker_lost()]
        n = queryset.filter(pk__in=lost).update(
            status=TrainingRun.Status.CANCELLED, finished_at=timezone.now()
        )
        n += queryset.filter(status=TrainingRun.Status.RUNNING).update(
            status=TrainingRun.Status.CANCELLING
        )
        n += queryset.filter(status=TrainingRun.Status.QUEUED).update(
            status=TrainingRun.Status.CANCELLED
        )
        self.message_user(request, f"{n} run(s) cancelled.")

    @admin.action(
        permissions=["change"],
        description="Resume the selected runs whose worker was lost or that the breaker stopped"
        " (from their last checkpoint)",
    )
    def resume(self, request, queryset):
        resumed, skipped = [], []
        for run in queryset:
            # the same check in the UPDATE: a run whose worker beat meanwhile is left alone
            lost_since = timezone.now() - timedelta(seconds=settings.PARLEY_TRAINING_LOST_AFTER)
            claimed = run.worker_lost() and (
                TrainingRun.objects.filter(pk=run.pk, status=TrainingRun.Status.RUNNING)
                .filter(Q(heartbeat_at__lt=lost_since) | Q(heartbeat_at=None))
                .update(status=TrainingRun.Status.QUEUED, heartbeat_at=None)
            )
            # stopped red: the resumed run re-diversifies its simulators before its next step
            claimed = claimed or TrainingRun.objects.filter(
                pk=run.pk, status=TrainingRun.Status.STOPPED
            ).update(status=TrainingRun.Status.QUEUED, stop_reason="", heartbeat_at=None)
            if claimed:
                tasks.start(run)
                resumed.append(run.name)
            else:
                skipped.append(run.name)
        if resumed:
            self.message_user(
                request,
                f"Resumed {', '.join(resumed)}: queued on the `training` queue, to continue from "
                "the last checkpoint in the run's folder.",
            )
        if skipped:
            self.message_user(
                request,
                f"Not resumed (neither running with its worker lost nor stopped by the breaker):"
                f" {', '.join(skipped)}.",
                messages.WARNING,
            )


def worker_lost_help(run: TrainingRun) -> str:
    """What happened to a run whose heartbeat stopped, and what to do."""
    since = run.heartbeat_at or run.started_at
    minutes = int((timezone.now() - since).total_seconds() // 60)
    return (
        f"Worker lost: no heartbeat from the Celery worker running this run for {minutes} min "
        "(it was stopped or killed, or its machine went down). Start a worker on the `training` "
        'queue, then select the run in the list and use "Resume the selected runs whose worker '
        'was lost or that the breaker stopped": it continues from the last checkpoint in its '
        'folder (or "Cancel" it).'
    )


class TrainingRunColumn:
    """The Checkpoint admin's column for the run that wrote each checkpoint. agents' registry
    knows no runs (agents installs alone); training owns the link. The project composes this
    with agents' admin and studies' part in one place (platform/parley/admin.py)."""

    def get_list_display(self, request):
        return [*super().get_list_display(request), "training_run"]

    def get_readonly_fields(self, request, obj=None):
        return [*super().get_readonly_fields(request, obj), "training_run"]

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("training_link__run")

    @admin.display(description="Training run")
    def training_run(self, checkpoint):
        link = getattr(checkpoint, "training_link", None)  # None: not written by a run
        if link is None:
            return "-"
        url = reverse("admin:training_trainingrun_change", args=[link.run_id])
        return format_html('<a href="{}">{}</a>', url, link.run)
