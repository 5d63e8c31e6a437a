"""The training run admin: a preset fills domain, regime and every field (server side, and in the
form through preview.json) unless the researcher changed them; the run page shows the run's
plots, a few samples, and warns when the run took no optimizer step."""

import json

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from training.config import load_config
from training.models import CONFIGS_DIR, TrainingRun

ADD = "admin:training_trainingrun_add"
# What a browser posts when the researcher only picks the preset: the form's own defaults.
UNTOUCHED = {
    "name": "",
    "domain": "p4g",
    "regime": "single",
    "base_model": "",
    "steps": "",
    "group_size": "",
    "lr": "",
    "beta": "",
    "temperature": "",
    "settings": "{}",
    "loaded_preset": "",
}


def preset(name):
    return load_config(CONFIGS_DIR / f"{name}.toml")


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["retail-single-cpu", "p4g-verbalized-cpu", "retail-cotrain-cpu"])
def test_a_preset_wins_over_the_forms_defaults(admin_client, name):
    response = admin_client.post(reverse(ADD), {**UNTOUCHED, "preset": name})
    assert response.status_code == 302, response.content.decode()[:3000]
    run = TrainingRun.objects.get()
    config = preset(name)
    assert (run.name, run.domain, run.regime) == (config.name, config.domain, config.regime)
    assert (run.steps, run.group_size, run.lr, run.beta, run.temperature) == (
        config.steps,
        config.group_size,
        config.lr,
        config.beta,
        config.temperature,
    )
    assert run.config().domain == config.domain and run.config().regime == config.regime


@pytest.mark.django_db
def test_what_the_researcher_changed_wins_over_the_preset(admin_client):
    changed = {**UNTOUCHED, "preset": "retail-single-cpu", "regime": "verbalized", "steps": "5"}
    assert admin_client.post(reverse(ADD), {**changed, "name": "mine"}).status_code == 302
    run = TrainingRun.objects.get()
    assert (run.name, run.domain, run.regime, run.steps) == ("mine", "retail", "verbalized", 5)
    assert run.group_size == preset("retail-single-cpu").group_size
    # a second run from the same preset gets a name of its own (its folder is its name)
    assert (
        admin_client.post(reverse(ADD), {**UNTOUCHED, "preset": "retail-single-cpu"}).status_code
        == 302
    )
    assert (
        admin_client.post(reverse(ADD), {**UNTOUCHED, "preset": "retail-single-cpu"}).status_code
        == 302
    )
    names = set(TrainingRun.objects.values_list("name", flat=True))
    assert names == {"mine", "retail-single-cpu", "retail-single-cpu-2"}


@pytest.mark.django_db
def test_fields_the_page_loaded_from_the_preset_are_kept_as_posted(admin_client):
    # the script filled the fields from the preset; the researcher then set the domain to p4g,
    # the form's default: that choice stands
    loaded = {**UNTOUCHED, "preset": "retail-single-cpu", "loaded_preset": "retail-single-cpu"}
    values = {**loaded, "name": "back-to-p4g", "domain": "p4g", "regime": "single", "steps": "2"}
    assert admin_client.post(reverse(ADD), values).status_code == 302
    assert TrainingRun.objects.get().domain == "p4g"


@pytest.mark.django_db
def test_no_preset_and_no_name_is_a_clear_error(admin_client):
    response = admin_client.post(reverse(ADD), {**UNTOUCHED, "preset": ""})
    assert response.status_code == 200 and "Give the run a name" in response.content.decode()
    assert not TrainingRun.objects.exists()


@pytest.mark.django_db
def test_the_form_shows_what_will_run(admin_client):
    page = admin_client.get(reverse(ADD)).content.decode()
    assert 'id="run-config"' in page and "training/training_run.js" in page
    assert 'name="loaded_preset"' in page
    url = reverse("admin:training_trainingrun_preview")
    data = admin_client.get(url, {"preset": "retail-single-cpu"}).json()
    assert data["fields"]["domain"] == "retail" and data["fields"]["steps"] == 2
    assert data["config"]["domain"] == "retail" and data["config"]["max_tool_rounds"] == 2
    changed = admin_client.get(
        url, {**UNTOUCHED, "preset": "retail-single-cpu", "domain": "retail", "steps": "7"}
    ).json()
    assert changed["config"]["steps"] == 7 and changed["config"]["tasks"]["max_train"] == 4
    bad = admin_client.get(url, {**UNTOUCHED, "preset": "retail-single-cpu", "steps": "-1"}).json()
    assert "steps" in bad["error"]
    assert admin_client.get(url, {"preset": "../../etc/passwd"}).status_code == 400


@pytest.mark.django_db
def test_the_preview_needs_the_add_permission(client):
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_trainingrun"))
    client.force_login(viewer)
    url = reverse("admin:training_trainingrun_preview")
    assert client.get(url, {"preset": "retail-single-cpu"}).status_code == 403


PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16


def run_folder(tmp_path, optimizer_steps):
    folder = tmp_path / "run"
    folder.mkdir()
    rows = [
        {"step": i + 1, "reward_mean": 0.0, "optimizer_step": float(i < optimizer_steps)}
        for i in range(2)
    ]
    (folder / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows) + '{"step": 3, "rew'
    )
    samples = [
        {
            "step": s,
            "task": "t1",
            "reward": 0.0,
            "end_reason": "max_turns",
            "conversation": [{"role": "assistant", "content": f"hello from step {s}"}],
        }
        for s in range(1, 6)
    ]
    (folder / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in samples))
    for name in ("train_reward.png", "entropy.png"):
        (folder / name).write_bytes(PNG)
    return folder


@pytest.mark.django_db
def test_the_run_page_shows_plots_samples_and_warns_of_no_optimizer_step(admin_client, tmp_path):
    folder = run_folder(tmp_path, optimizer_steps=0)
    run = TrainingRun.objects.create(
        name="flat",
        preset="retail-single-cpu",
        domain="retail",
        status="done",
        output_dir=str(folder),
    )
    page = admin_client.get(reverse("admin:training_trainingrun_change", args=[run.pk]))
    page = page.content.decode()
    assert 'id="no-optimizer-step"' in page and "took no optimizer step in 2" in page
    # live progress from the static script (the site's CSP refuses inline scripts)
    assert 'id="run-progress" data-url="' in page and "training/training_run.js" in page
    # the plots' layout from the stylesheet: the CSP refuses style attributes too
    assert "training/training_run.css" in page and " style=" not in page
    for name in ("train_reward.png", "entropy.png"):
        url = reverse("admin:training_trainingrun_plot", args=[run.pk, name])
        assert f'src="{url}"' in page
        response = admin_client.get(url)
        assert response.status_code == 200 and response["Content-Type"] == "image/png"
        assert b"".join(response.streaming_content) == PNG
    assert "hello from step 5" in page and "hello from step 3" in page
    assert "hello from step 2" not in page  # only the latest few samples
    assert "&quot;max_tool_rounds&quot;: 2" in page or '"max_tool_rounds": 2' in page
    missing = reverse("admin:training_trainingrun_plot", args=[run.pk, "metrics.jsonl"])
    assert admin_client.get(missing).status_code == 404


@pytest.mark.django_db
def test_a_run_that_stepped_has_no_warning(admin_client, tmp_path):
    run = TrainingRun.objects.create(
        name="stepped",
        preset="p4g-single-cpu",
        status="done",
        output_dir=str(run_folder(tmp_path, optimizer_steps=2)),
    )
    page = admin_client.get(reverse("admin:training_trainingrun_change", args=[run.pk]))
    page = page.content.decode()
    assert "no-optimizer-step" not in page and "2 of 2 logged step(s)" in page
    assert "collapse-warnings" not in page  # its progress holds no collapse warning


@pytest.mark.django_db
def test_the_runs_list_marks_a_run_still_at_the_base_model(admin_client):
    progress = {"step": 2, "total_steps": 2, "metrics": {"optimizer_steps": 0}}
    TrainingRun.objects.create(name="flat", preset="retail-single-cpu", progress=progress)
    stepped = {"step": 2, "total_steps": 2, "metrics": {"optimizer_steps": 2}}
    TrainingRun.objects.create(name="stepped", preset="p4g-single-cpu", progress=stepped)
    page = admin_client.get(reverse("admin:training_trainingrun_changelist")).content.decode()
    assert page.count("(no optimizer step)") == 1
