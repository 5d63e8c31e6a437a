"""domain_replay: gold actions replayed through the tools score 1.0 on every task, on the bundled
data always and on the official tau2-bench data when ../shared/reference is there (always in CI)."""

import io
import json
import shutil

import pytest

from agents.domains.tau2 import replay
from agents.domains.tau2.airline import AIRLINE_DB
from agents.domains.tau2.data import make_data
from agents.domains.tau2.retail import RETAIL_DB
from agents.domains.tau2.taskset import BUNDLED_DIR
from tests.support.processes import official_tau2_dir


def run(*args, **kwargs):
    out = io.StringIO()
    status = replay.run(*args, out=out, **kwargs)
    return status, out.getvalue().splitlines()


@pytest.mark.parametrize("domain", ["retail", "airline"])
def test_bundled_data_replays_to_full_reward(domain, tmp_path):
    status, lines = run(domain, dump_dir=tmp_path)
    tasks = json.loads((BUNDLED_DIR / domain / "tasks.json").read_text())
    assert status == 0 and lines[-1] == f"{len(tasks)} passed, 0 failed"
    assert len(lines) == len(tasks) + 1 and all("reward 1.0" in line for line in lines[:-1])
    shape = {"retail": RETAIL_DB, "airline": AIRLINE_DB}[domain]
    for task in tasks:
        dumped = json.loads((tmp_path / f"{task['id']}.json").read_text())
        assert shape(dumped) == dumped  # already in the official schema's canonical form


def test_json_lines_and_tool_error_count():
    status, lines = run("retail", as_json=True)
    rows = [json.loads(line) for line in lines[:-1]]
    assert status == 0 and lines[-1] == f"{len(rows)} passed, 0 failed"
    assert all(row["passed"] and row["reward"] == 1.0 for row in rows)
    # Bundled retail task 10 first asks for a refund to a card that is not the original one.
    assert {row["task_id"]: row["tool_errors"] for row in rows if row["tool_errors"]} == {"10": 1}


def test_a_failing_task_fails_the_run(tmp_path):
    folder = tmp_path / "retail"
    shutil.copytree(BUNDLED_DIR / "retail", folder)
    tasks = json.loads((folder / "tasks.json").read_text())[:2]
    # tau2 removes commas from the message only, so info with a comma can never be found.
    tasks[1]["evaluation_criteria"]["communicate_info"] = ["1,000"]
    (folder / "tasks.json").write_text(json.dumps(tasks))
    status, lines = run("retail", data_dir=tmp_path)
    assert status == 1 and lines[-1] == "1 passed, 1 failed"
    assert lines[1].startswith(f"task {tasks[1]['id']}: reward 0.0")


def test_bad_data_dir_is_a_clear_error(tmp_path):
    assert replay.main(["--domain", "retail", "--data-dir", str(tmp_path)]) == 2
    (tmp_path / "retail").mkdir()
    (tmp_path / "retail" / "tasks.json").write_text("[{")
    with pytest.raises(ValueError, match="not valid JSON"):
        run("retail", data_dir=tmp_path)


def test_bundled_files_match_their_generator():
    assert make_data.main(["--check"]) == 0


def test_management_command(tmp_path):
    from django.core.management import call_command

    out = io.StringIO()
    call_command(
        "domain_replay", "--domain", "airline", "--json", "--dump-db", str(tmp_path), stdout=out
    )
    lines = out.getvalue().splitlines()
    assert lines[-1].endswith("passed, 0 failed") and json.loads(lines[0])["reward"] == 1.0
    assert (tmp_path / "0.json").is_file()


@pytest.mark.parametrize("domain, count", [("retail", 114), ("airline", 50)])
def test_official_data_replays_to_full_reward(domain, count):
    status, lines = run(domain, data_dir=official_tau2_dir(), as_json=True)
    rows = [json.loads(line) for line in lines[:-1]]
    failed = [row for row in rows if not row["passed"]]
    assert not failed, failed[:3]
    assert status == 0 and lines[-1] == f"{count} passed, 0 failed"
    with_errors = {row["task_id"] for row in rows if row["tool_errors"]}
    # Some official gold actions fail on the official tools too (unknown product id, a return
    # to a non-original card, ...): 18 retail tasks, no airline task.
    assert len(with_errors) == {"retail": 18, "airline": 0}[domain]
    if domain == "retail":
        assert {"2", "12", "105"} <= with_errors


def test_official_splits():
    from agents.domains.tau2 import AirlineDomain, RetailDomain

    folder = official_tau2_dir()
    for cls, train, test in ((RetailDomain, 74, 40), (AirlineDomain, 30, 20)):
        domain = cls(data_dir=folder)
        assert (len(domain.scenarios("train")), len(domain.scenarios("test"))) == (train, test)
        assert domain.task_set.policy.startswith("# ")
