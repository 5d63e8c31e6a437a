"""tau2 task versions: v0.2.0's and v1.0.0's task files load under their own version only, and a
task whose reward basis names NL_ASSERTION is scored by a judge model over HTTP, or left
unjudged (out of the reward, named, never a success) without one; a run refuses to start
without a judge when its tasks need one."""

import json
import shutil

import pytest

from agents.domains.base import Scenario
from agents.domains.tau2 import AirlineDomain, RetailDomain
from agents.domains.tau2.judge import LLMJudge, read_verdicts
from agents.domains.tau2.replay import gold_conversation
from agents.domains.tau2.taskset import BUNDLED_DIR
from agents.domains.tau2.versions import DEFAULT_VERSION, judged_tasks
from tests.support.processes import official_tau2_dir
from tests.support.scripted_server import ScriptedServer
from training.config import load_config
from training.config_keys import ConfigError

MODEL = "judge-model"


def v1_folder(tmp_path, source, domain="retail"):
    """`source`'s task files in v1.0.0's shape, as tau2-bench v1.0.0 writes them: every task
    names its reward basis; retail's are DB x NL_ASSERTION with assertions on some tasks and
    an empty list on others (met without a judge), and DB alone on one."""
    folder = tmp_path / "v1" / domain
    folder.mkdir(parents=True)
    for name in ("policy.md", "split_tasks.json", "db.json"):
        if (source / domain / name).is_file():
            shutil.copy(source / domain / name, folder / name)
    if (source / domain / "tau-bench-v1").is_dir():
        shutil.copytree(source / domain / "tau-bench-v1", folder / "tau-bench-v1")
    tasks = json.loads((source / domain / "tasks.json").read_text())
    for n, task in enumerate(tasks):
        criteria = task.setdefault("evaluation_criteria", {})
        if domain == "airline":
            criteria["reward_basis"] = ["DB", "COMMUNICATE"]
        elif n == 1:
            criteria["reward_basis"] = ["DB"]
        else:
            criteria["reward_basis"] = ["DB", "NL_ASSERTION"]
            criteria["nl_assertions"] = (
                ["Agent tells the customer the outcome of their request."] if n % 2 == 0 else []
            )
    (folder / "tasks.json").write_text(json.dumps(tasks))
    return folder.parent


def test_default_is_v020_and_unknown_versions_are_refused():
    assert DEFAULT_VERSION == "v0.2.0" and RetailDomain().version.name == "v0.2.0"
    with pytest.raises(ValueError, match="unknown tau2 task version 'v2'.*v0.2.0, v1.0.0"):
        RetailDomain(version="v2")


def test_official_v020_tasks_load_with_their_ids_and_splits():
    folder = official_tau2_dir()
    retail, airline = RetailDomain(folder), AirlineDomain(folder)
    assert [len(d.scenarios()) for d in (retail, airline)] == [114, 50]
    assert [len(retail.scenarios(s)) for s in ("train", "test")] == [74, 40]
    assert [len(airline.scenarios(s)) for s in ("train", "test")] == [30, 20]
    scenario = retail.scenarios()[0]
    assert scenario.id == "0" and scenario.payload["tau2_version"] == "v0.2.0"
    # v0.2.0's basis is DB x COMMUNICATE everywhere: nothing for a judge
    assert judged_tasks(retail.task_set.tasks) == judged_tasks(airline.task_set.tasks) == []
    assert "get_item_details" not in {t["function"]["name"] for t in retail.tools(scenario)}


@pytest.mark.parametrize("domain_class", [RetailDomain, AirlineDomain])
def test_tasks_of_the_other_version_are_refused(domain_class, tmp_path):
    folder = official_tau2_dir()
    with pytest.raises(
        ValueError, match=r"not tau2 v1\.0\.0 tasks: \d+ of \d+ name no reward_basis"
    ):
        domain_class(folder, version="v1.0.0").scenarios()
    v1 = v1_folder(tmp_path, folder, domain_class.name)
    with pytest.raises(
        ValueError, match=r"not tau2 v0\.2\.0 tasks: \d+ of \d+ name a reward_basis"
    ):
        domain_class(v1).scenarios()
    with pytest.raises(ValueError, match="not tau2 v1.0.0 tasks"):  # the bundled data is v0.2.0's
        domain_class(version="v1.0.0").scenarios()


def test_v1_tasks_load_with_their_ids_splits_and_tools(tmp_path):
    folder = official_tau2_dir()
    retail = RetailDomain(v1_folder(tmp_path, folder), version="v1.0.0")
    v0 = RetailDomain(folder)
    assert [s.id for s in retail.scenarios("test")] == [s.id for s in v0.scenarios("test")]
    scenario = retail.scenarios()[0]
    assert scenario.payload["tau2_version"] == "v1.0.0"
    names = {t["function"]["name"] for t in retail.tools(scenario)}
    assert "get_item_details" in names
    state = retail.new_state(scenario)
    product = next(iter(retail.task_set.db["products"].values()))
    item_id, variant = next(iter(product["variants"].items()))
    assert json.loads(retail.execute_tool(state, "get_item_details", {"item_id": item_id})) == (
        json.loads(json.dumps(variant, default=str))
    )
    assert retail.execute_tool(state, "get_item_details", {"item_id": "0"}) == (
        "Error: Item not found"
    )
    # a scenario keeps its version: one stored under v0.2.0 is not scored as v1.0.0's
    older = Scenario(scenario.id, "retail", {**scenario.payload, "tau2_version": "v0.2.0"})
    with pytest.raises(ValueError, match="is a tau2 v0.2.0 task but this retail domain scores"):
        retail.new_state(older)


def nl_task(domain):
    """A bundled task whose gold actions change the DB, scored as v1.0.0 scores retail: DB x
    NL_ASSERTION, with two assertions."""
    scenario = next(
        s
        for s in domain.scenarios()
        if any(
            a["name"].startswith(("cancel", "modify"))
            for a in s.payload["evaluation_criteria"]["actions"]
        )
    )
    payload = json.loads(json.dumps(scenario.payload))
    payload["evaluation_criteria"]["reward_basis"] = ["DB", "NL_ASSERTION"]
    payload["evaluation_criteria"]["nl_assertions"] = [
        "Agent confirms the change with the customer before making it.",
        "Agent does not offer a refund to a gift card.",
    ]
    return Scenario(scenario.id, domain.name, payload)


def verdicts(assertions, met):
    results = [
        {"expectedOutcome": a, "reasoning": "r", "metExpectation": m}
        for a, m in zip(assertions, met, strict=True)
    ]
    return {"content": "```json\n" + json.dumps({"results": results}) + "\n```"}


def test_nl_assertions_are_judged_by_a_model_over_http():
    scenario = nl_task(RetailDomain())
    assertions = scenario.payload["evaluation_criteria"]["nl_assertions"]
    with ScriptedServer(
        [
            verdicts(assertions, [True] * len(assertions)),
            verdicts(assertions, [False] + [True] * (len(assertions) - 1)),
            {"content": "I think so."},
        ],
        models=(MODEL,),
    ) as server:
        domain = RetailDomain(nl_judge=LLMJudge(server.url, MODEL))
        state = domain.new_state(scenario)
        conversation, _ = gold_conversation(domain, scenario, state)
        met = domain.score(conversation, state, "user_stop")
        failed = domain.score(conversation, state, "user_stop")
        garbled = domain.score(conversation, state, "user_stop")
    assert (met.reward, met.success, met.components["NL_ASSERTION"]) == (1.0, True, 1.0)
    assert [c["met"] for c in met.details["nl_assertions"]] == [True] * len(assertions)
    assert (failed.reward, failed.success, failed.components["NL_ASSERTION"]) == (0.0, False, 0.0)
    # a reply that is not the verdicts: unjudged, out of the reward, named
    assert (garbled.success, garbled.components["NL_ASSERTION"]) == (False, "unjudged")
    assert "not the results JSON" in garbled.details["unjudged"]["NL_ASSERTION"]
    request = server.requests[0]
    assert request["model"] == MODEL and request["temperature"] == 0.0
    asked = request["messages"][-1]["content"]
    assert all(a in asked for a in assertions)
    assert "[tool calls: " in asked and "user: ###STOP###" in asked  # the whole transcript


def test_without_a_judge_nl_is_left_out_and_labelled_never_counted():
    domain = RetailDomain()
    scenario = nl_task(domain)
    state = domain.new_state(scenario)
    conversation, _ = gold_conversation(domain, scenario, state)
    outcome = domain.score(conversation, state, "user_stop")
    assert outcome.success is False and outcome.components["NL_ASSERTION"] == "unjudged"
    assert outcome.reward == outcome.components["DB"] == 1.0  # the DB part alone
    assert "NL_ASSERTION unjudged" in outcome.details["note"]
    # the DB part still decides: a conversation that changed nothing is not rewarded
    empty = domain.score(
        conversation[:1] + conversation[-1:], domain.new_state(scenario), "user_stop"
    )
    assert empty.reward == 0.0 and not empty.success


def test_read_verdicts_matches_by_outcome_and_refuses_gaps():
    reply = json.dumps(
        {
            "results": [
                {"expectedOutcome": "B  is done", "metExpectation": False},
                {"expectedOutcome": "A is done", "metExpectation": True},
            ]
        }
    )
    assert read_verdicts(reply, ["A is done", "B is done"]) == [True, False]
    with pytest.raises(ValueError, match="not a true/false verdict on each"):
        read_verdicts(json.dumps({"results": [{"expectedOutcome": "A is done"}]}), ["A is done"])


RUN = """name = "v"
domain = "{domain}"
{extra}
"""


def config(tmp_path, domain="retail", **settings):
    extra = "\n".join(
        f"{k} = {json.dumps(v)}"
        if not isinstance(v, dict)
        else f"[{k}]\n" + "\n".join(f"{a} = {json.dumps(b)}" for a, b in v.items())
        for k, v in settings.items()
    )
    path = tmp_path / "run.toml"
    path.write_text(RUN.format(domain=domain, extra=extra))
    return path


def test_a_run_without_a_judge_refuses_to_start(tmp_path):
    with pytest.raises(
        ConfigError, match=r"nl_judge\.endpoint.*must name a judge: tau2 v1\.0\.0 retail"
    ):
        load_config(config(tmp_path, tau2_version="v1.0.0"))
    with pytest.raises(ConfigError, match="tau2_version.*unknown tau2 task version"):
        load_config(config(tmp_path, tau2_version="v9"))
    with pytest.raises(ConfigError, match="tau2_version.*is for tau2 domains, not p4g"):
        load_config(config(tmp_path, domain="p4g", tau2_version="v1.0.0"))
    # airline v1.0.0 is DB x COMMUNICATE: no judge needed
    assert (
        load_config(config(tmp_path, domain="airline", tau2_version="v1.0.0")).tau2_version
        == "v1.0.0"
    )


def test_the_run_start_reads_the_files_and_refuses_judged_tasks_without_a_judge(tmp_path):
    folder = v1_folder(tmp_path, BUNDLED_DIR)
    judge = {"endpoint": "http://127.0.0.1:9/v1", "model": MODEL}
    run = load_config(
        config(tmp_path, tau2_version="v1.0.0", domain_data=str(folder), nl_judge=judge)
    )
    domain = run.build_domain()
    assert isinstance(domain.nl_judge, LLMJudge) and domain.version.name == "v1.0.0"
    with pytest.raises(
        ValueError, match=r"tau2 v1\.0\.0 retail tasks score NL assertions.*set nl_judge\.endpoint"
    ):
        RetailDomain(folder, version="v1.0.0").check_judge()
    RetailDomain(folder, version="v1.0.0", nl_judge=domain.nl_judge).check_judge()


def test_the_offline_dry_run_names_the_judge_setting(tmp_path):
    from training.tools.dryrun import dry_run

    result = dry_run(str(config(tmp_path, tau2_version="v1.0.0")), offline=True)
    check = result["checks"][0]
    assert not result["ok"] and check["name"] == "config" and not check["ok"]
    assert "nl_judge.endpoint must name a judge" in check["detail"]
