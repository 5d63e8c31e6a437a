"""Arms point at a model endpoint (agents.ModelEndpoint) instead of holding a URL and a key's
variable name: one endpoint is made per distinct (URL, key variable) of the existing arms, and
each arm points at its own, so nothing stored is lost. Agent messages record their replica."""

from urllib.parse import urlsplit

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def endpoint_name(url: str, key_env: str, taken: set[str]) -> str:
    if url.rstrip("/") == settings.PARLEY_ENGINE_URL.rstrip("/") and not key_env:
        name = "default"
    else:
        name = urlsplit(url).netloc or url[:80]
        name = f"{name} ({key_env})" if key_env else name
    unique, n = name, 2
    while unique in taken:
        unique, n = f"{name} #{n}", n + 1
    taken.add(unique)
    return unique


def kind_of(url: str, key_env: str) -> str:
    """A guess the researcher can correct in the admin: a key means a hosted API, the
    configured engine URL the embedded engine, anything else vLLM."""
    if key_env:
        return "hosted"
    if url.rstrip("/") == settings.PARLEY_ENGINE_URL.rstrip("/"):
        return "embedded"
    return "vllm"


def arms_to_endpoints(apps, schema_editor):
    Arm = apps.get_model("studies", "Arm")
    ModelEndpoint = apps.get_model("agents", "ModelEndpoint")
    Replica = apps.get_model("agents", "Replica")
    taken = set(ModelEndpoint.objects.values_list("name", flat=True))
    pairs = sorted(set(Arm.objects.values_list("endpoint_url", "api_key_env")))
    for url, key_env in pairs:
        url = url.rstrip("/")
        existing = ModelEndpoint.objects.filter(api_key_env=key_env, replicas__url=url).first()
        endpoint = existing or ModelEndpoint.objects.create(
            name=endpoint_name(url, key_env, taken), kind=kind_of(url, key_env), api_key_env=key_env
        )
        Replica.objects.get_or_create(endpoint=endpoint, url=url)
        Arm.objects.filter(api_key_env=key_env, endpoint_url__in=[url, url + "/"]).update(
            endpoint=endpoint
        )
    if schema_editor.connection.vendor == "postgresql":
        # the new foreign keys are checked now, so that the ALTERs below may follow
        schema_editor.execute("SET CONSTRAINTS ALL IMMEDIATE")


def endpoints_to_arms(apps, schema_editor):
    """Back: each arm takes its endpoint's first replica URL and key variable."""
    Arm = apps.get_model("studies", "Arm")
    for arm in Arm.objects.select_related("endpoint"):
        replica = arm.endpoint.replicas.order_by("position", "id").first()
        arm.endpoint_url = replica.url if replica else settings.PARLEY_ENGINE_URL
        arm.api_key_env = arm.endpoint.api_key_env
        arm.save(update_fields=["endpoint_url", "api_key_env"])
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("SET CONSTRAINTS ALL IMMEDIATE")


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0003_model_endpoints"),
        ("studies", "0008_prolific"),
    ]

    operations = [
        migrations.AddField(
            model_name="arm",
            name="endpoint",
            field=models.ForeignKey(
                null=True,
                blank=True,
                help_text="The model endpoint serving this arm; blank: the default "
                "(PARLEY_ENGINE_URL).",
                on_delete=django.db.models.deletion.PROTECT,
                related_name="arms",
                to="agents.modelendpoint",
            ),
        ),
        migrations.RunPython(arms_to_endpoints, endpoints_to_arms),
        migrations.AlterField(
            model_name="arm",
            name="endpoint",
            field=models.ForeignKey(
                blank=True,
                help_text="The model endpoint serving this arm; blank: the default "
                "(PARLEY_ENGINE_URL).",
                on_delete=django.db.models.deletion.PROTECT,
                related_name="arms",
                to="agents.modelendpoint",
            ),
        ),
        migrations.RemoveField(model_name="arm", name="endpoint_url"),
        migrations.RemoveField(model_name="arm", name="api_key_env"),
        migrations.AlterField(
            model_name="arm",
            name="model_name",
            field=models.CharField(
                help_text="Base model or LoRA adapter name, as the endpoint lists it.",
                max_length=200,
            ),
        ),
        migrations.AddField(
            model_name="message",
            name="replica",
            field=models.CharField(
                blank=True,
                help_text="Base URL of the replica that served this reply.",
                max_length=500,
            ),
        ),
    ]
