# The model endpoint registry: endpoints with their replicas and each replica's last health check.

import django.core.validators
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0002_remove_checkpoint_training_run"),
    ]

    operations = [
        migrations.CreateModel(
            name="ModelEndpoint",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "name",
                    models.CharField(
                        help_text="How arms and `serve_agents` refer to it.",
                        max_length=100,
                        unique=True,
                    ),
                ),
                (
                    "kind",
                    models.CharField(
                        choices=[
                            ("vllm", "vLLM"),
                            ("embedded", "Embedded engine"),
                            ("hosted", "Hosted API"),
                        ],
                        default="vllm",
                        help_text="Hosted APIs are not asked for GET /health, only for their "
                        "model list.",
                        max_length=10,
                    ),
                ),
                (
                    "api_key_env",
                    models.CharField(
                        blank=True,
                        help_text="NAME of the environment variable holding the API key (never "
                        "the key itself); blank: the servers need none.",
                        max_length=100,
                        validators=[
                            django.core.validators.RegexValidator(
                                "^[A-Za-z_][A-Za-z0-9_]*$",
                                "The NAME of an environment variable (letters, digits, _).",
                            )
                        ],
                    ),
                ),
                ("created_at", models.DateTimeField(auto_now_add=True)),
            ],
            options={
                "verbose_name": "model endpoint",
                "ordering": ["name"],
            },
        ),
        migrations.CreateModel(
            name="Replica",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "url",
                    models.URLField(
                        help_text="OpenAI-compatible base URL, e.g. http://host:8001/v1",
                        max_length=500,
                    ),
                ),
                (
                    "position",
                    models.PositiveSmallIntegerField(
                        default=0, help_text="Order among the replicas."
                    ),
                ),
                (
                    "status",
                    models.CharField(
                        choices=[("unknown", "Not checked yet"), ("up", "Up"), ("down", "Down")],
                        default="unknown",
                        editable=False,
                        max_length=10,
                    ),
                ),
                (
                    "served_models",
                    models.JSONField(
                        blank=True,
                        default=list,
                        editable=False,
                        help_text="GET /v1/models, when last up.",
                    ),
                ),
                ("last_error", models.TextField(blank=True, editable=False)),
                ("last_error_at", models.DateTimeField(blank=True, editable=False, null=True)),
                ("checked_at", models.DateTimeField(blank=True, editable=False, null=True)),
                (
                    "endpoint",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="replicas",
                        to="agents.modelendpoint",
                    ),
                ),
            ],
            options={
                "ordering": ["endpoint", "position", "id"],
                "constraints": [
                    models.UniqueConstraint(fields=("endpoint", "url"), name="unique_replica_url")
                ],
            },
        ),
    ]
