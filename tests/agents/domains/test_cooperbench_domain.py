"""The CooperBench Domain on parley's bundled task, played through training's own rollout loop by
scripted speakers whose replies are tool calls in the JSON text format: gold patches score
both_passed, a wrong or missing patch follows the reward rule, messages reach the other side and
nothing else does, and a runaway command is ended and reported at its limit."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from agents.domains import STUDY_DOMAINS, get_domain
from agents.domains.cooperbench import CooperBenchDomain, read_task
from agents.domains.cooperbench.domain import BUNDLED
from agents.domains.cooperbench.workspace import prepare_checkout
from agents.sandbox import Limits
from tests.support.cooperbench import LIMITS, Scripted, apply_gold, call, needs_bwrap, scenario
from training.rollouts.rollout import play


@pytest.fixture
def domain(tmp_path):
    return CooperBenchDomain(cache_dir=tmp_path, limits=LIMITS)


def episode(domain, first, second, agent_steps, partner_steps, max_turns=40):
    agent, partner = Scripted("agent", agent_steps), Scripted("user", partner_steps)
    (rollout,) = play(
        domain, [scenario(domain, first, second)], agent, partner, max_turns=max_turns
    )
    return rollout


def test_every_pair_of_the_bundled_task_is_a_scenario_and_it_is_training_only(domain):
    ids = [s.id for s in domain.scenarios()]
    assert len(ids) == 10 and "tinycalc_task/task1/f1_f2" in ids  # 5 features, every two
    assert domain.scenarios("all") == domain.scenarios()
    with pytest.raises(ValueError, match="no split 'dev'"):
        domain.scenarios("dev")
    with pytest.raises(ValueError, match="reads train_pairs.json"):
        domain.scenarios("train")  # the bundled task has no pair lists
    assert "cooperbench" not in STUDY_DOMAINS
    assert isinstance(get_domain("cooperbench"), CooperBenchDomain)
    with pytest.raises(FileNotFoundError):
        CooperBenchDomain(data_dir="/nonexistent/cooperbench")
    with pytest.raises(ValueError, match="backend"):
        CooperBenchDomain(backend="modal")


@needs_bwrap
def test_gold_patches_submitted_by_both_score_both_passed_and_the_partner_is_recorded(domain):
    r = episode(
        domain,
        1,
        2,
        [call("send_message", content="I add subtract to ops.py."), apply_gold(1), call("submit")],
        [call("bash", command="ls tinycalc"), apply_gold(2), call("submit")],
    )
    assert r.end_reason == "submitted"
    assert r.outcome.success and r.reward == 1.0
    assert r.outcome.components["merge_status"] == "clean"
    assert r.outcome.details["submitted"] == {"agent": True, "user": True}
    # the partner's steps are user messages with tool calls, its results tool messages for "user"
    partner_steps = [m for m in r.conversation if m["role"] == "user"]
    assert [m["tool_calls"][0]["function"]["name"] for m in partner_steps] == [
        "bash",
        "bash",
        "submit",
    ]
    results = [m for m in r.conversation if m.get("requestor") == "user"]
    assert len(results) == 3 and "ops.py" in results[0]["content"]
    # they took steps in turn, the agent first
    roles = [m["role"] for m in r.conversation if m["role"] != "tool"]
    assert roles == ["assistant", "user"] * 3


@needs_bwrap
def test_each_side_sees_the_others_messages_and_nothing_else_of_its_work(domain):
    r = episode(
        domain,
        1,
        2,
        [
            call("send_message", content="I take subtract."),
            call("bash", command="echo SECRET-A"),
            call("submit"),
        ],
        [
            call("bash", command="echo SECRET-B"),
            call("send_message", content="I take shout."),
            call("submit"),
        ],
    )
    agent_side = json.dumps(domain.agent_view(r.conversation))
    partner_side = json.dumps(domain.user_view(r.conversation))
    assert "[Message from agent2]: I take shout." in agent_side
    assert "[Message from agent1]: I take subtract." in partner_side
    assert "SECRET-A" in agent_side and "SECRET-A" not in partner_side
    assert "SECRET-B" in partner_side and "SECRET-B" not in agent_side
    # the partner reads its own calls as it wrote them and its results as user messages
    partner = domain.user_view(r.conversation)
    assert partner[0]["role"] == "user" and "[Message from agent1]" in partner[0]["content"]
    assert partner[1]["role"] == "assistant" and '"name": "bash"' in partner[1]["content"]
    assert partner[2]["content"].startswith("[Tool result: bash]")


@needs_bwrap
def test_the_agents_feature_alone_earns_the_partial_reward_and_a_wrong_patch_nothing(domain):
    alone = episode(domain, 1, 2, [apply_gold(1), call("submit")], [call("submit")])
    assert not alone.outcome.success and alone.reward == 0.5  # the release's partial reward
    assert alone.outcome.details["partner_patch"] == ""
    broken = call(
        "write_file", path="tinycalc/ops.py", content="def add(a, b):\n    return a - b\n"
    )
    bad = episode(domain, 1, 2, [broken, call("submit")], [apply_gold(2), call("submit")])
    assert bad.reward == 0.0 and "return a - b" in bad.outcome.details["agent_patch"]


@needs_bwrap
def test_a_conflicting_pair_follows_the_benchmarks_rule(domain):
    r = episode(domain, 1, 3, [apply_gold(1), call("submit")], [apply_gold(3), call("submit")])
    assert r.outcome.components["merge_status"] == "conflicts"
    assert r.outcome.details["merge_strategy"] == "union" and r.reward == 1.0


@needs_bwrap
def test_without_submitting_the_episode_ends_at_the_step_limit_and_the_copies_are_scored(tmp_path):
    domain = CooperBenchDomain(cache_dir=tmp_path, limits=LIMITS)
    domain.max_steps = 2
    r = episode(domain, 1, 2, [apply_gold(1)], [apply_gold(2)])
    assert r.end_reason == "max_steps"
    assert r.outcome.details["submitted"] == {"agent": False, "user": False}
    assert r.reward == 1.0  # what each copy held at the end, as the release reads it


@needs_bwrap
def test_a_speaker_who_submitted_is_skipped(domain):
    r = episode(
        domain,
        1,
        2,
        [call("submit")],
        [call("bash", command="true"), call("bash", command="true"), apply_gold(2), call("submit")],
    )
    roles = [m["role"] for m in r.conversation if m["role"] != "tool"]
    assert roles == ["assistant", "user", "user", "user", "user"]
    assert r.end_reason == "submitted" and r.reward == 0.0  # the agent submitted nothing


@needs_bwrap
def test_the_file_tools_work_inside_the_copy_and_refuse_to_leave_it(domain):
    state = domain.new_state(scenario(domain, 1, 2))
    run = lambda name, **args: domain.execute_tool(state, name, args)  # noqa: E731
    assert "def add" in run("read_file", path="tinycalc/ops.py")
    assert run("read_file", path="tinycalc/ops.py", start_line=1, end_line=1).startswith("     1\t")
    assert "outside the repository" in run("read_file", path="../../etc/passwd")
    assert "outside the repository" in run("write_file", path="/tmp/escape.txt", content="x")
    assert run("write_file", path="notes/plan.md", content="a\nb\n").startswith("Wrote")
    assert "appears 2 times" in run("edit_file", path="notes/plan.md", old_text="\n", new_text="")
    assert "does not appear" in run("edit_file", path="notes/plan.md", old_text="zz", new_text="")
    assert (
        run("edit_file", path="notes/plan.md", old_text="a\n", new_text="A\n")
        == "Edited notes/plan.md."
    )
    assert "A\nb" in run("bash", command="cat notes/plan.md")
    assert "unknown tool" in run("rm_rf")
    assert "not valid JSON" in domain.execute_tool(state, "bash", "{not json")
    patch = domain.score([], state).details["agent_patch"]
    assert "+A" in patch and "notes/plan.md" in patch
    assert state.workspaces["agent"].sandbox is None  # closed once scored


@needs_bwrap
def test_a_runaway_command_is_ended_at_its_limit_and_reported(tmp_path):
    quick = Limits(cpu_seconds=5, memory_bytes=2 * 1024**3, wall_seconds=2, output_bytes=10_000)
    domain = CooperBenchDomain(cache_dir=tmp_path, limits=quick)
    state = domain.new_state(scenario(domain, 1, 2))
    hung = domain.execute_tool(state, "bash", {"command": "sleep 60"})
    assert "ended by the sandbox: wall limit" in hung
    flood = domain.execute_tool(state, "bash", {"command": "yes"})
    assert "output limit" in flood and len(flood) <= 4100
    offline = domain.execute_tool(
        state,
        "bash",
        {"command": "python -c \"import socket; socket.create_connection(('1.1.1.1', 53), 3)\""},
    )
    assert "exit code: 1" in offline and "OSError" in offline  # no network inside
    escaped = Path.home() / "parley-sandbox-escape"
    outside = domain.execute_tool(state, "bash", {"command": f"touch {escaped}"})
    assert "exit code: 1" in outside and not escaped.exists()  # the host is read-only inside
    domain.score([], state)


def test_the_repository_is_prepared_once_per_task_at_its_base_commit(tmp_path):
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    repos = tmp_path / "repos"
    shutil.copytree(BUNDLED / "repos" / "tinycalc", repos / "tinycalc")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
        subprocess.run([*git, *args], cwd=repos / "tinycalc", check=True)
    base = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repos / "tinycalc", capture_output=True, text=True
    ).stdout.strip()
    (repos / "tinycalc" / "LATER.md").write_text("after the base commit\n")
    subprocess.run([*git, "add", "-A"], cwd=repos / "tinycalc", check=True)
    subprocess.run([*git, "commit", "-qm", "later"], cwd=repos / "tinycalc", check=True)
    task_dir = tmp_path / "tinycalc_task" / "task1"
    shutil.copytree(BUNDLED / "tinycalc_task" / "task1", task_dir)
    (task_dir / "setup.sh").write_text(f'REPO_NAME="tinycalc"\nBASE_COMMIT="{base}"\n')
    task = read_task(task_dir)

    first = prepare_checkout(task, repos, tmp_path / "cache")
    assert not (first / "LATER.md").exists()  # checked out at BASE_COMMIT, not at the tip
    (first / "marker").write_text("kept")  # a second episode reuses the prepared copy
    assert prepare_checkout(task, repos, tmp_path / "cache") == first
    assert (first / "marker").read_text() == "kept"
    assert len(list((tmp_path / "cache").iterdir())) == 1
    with pytest.raises(FileNotFoundError, match="no checkout"):
        prepare_checkout(task, tmp_path / "elsewhere", tmp_path / "cache")


def test_the_releases_train_and_test_pair_lists_split_the_pairs(tmp_path):
    """The release trains on data/cooperbench/train_pairs.json and holds out test_pairs.json: a
    list of {"id": ...} records, read beside the dataset folder or in it; "all" stays every
    pair; a listed pair missing from the dataset is an error, not a silent drop."""
    dataset = tmp_path / "dataset"
    shutil.copytree(BUNDLED, dataset)
    domain = CooperBenchDomain(data_dir=dataset, cache_dir=tmp_path / "cache", limits=LIMITS)
    every = [s.id for s in domain.scenarios("all")]
    train, test = every[3:], every[:3]
    (tmp_path / "train_pairs.json").write_text(json.dumps([{"id": i} for i in train]))
    (dataset / "test_pairs.json").write_text(json.dumps([{"id": i, "repo": "x"} for i in test]))
    assert [s.id for s in domain.scenarios("train")] == train
    assert [s.id for s in domain.scenarios("test")] == test
    assert len(domain.scenarios("all")) == 10
    (dataset / "test_pairs.json").write_text(json.dumps([{"id": "tinycalc_task/task9/f1_f2"}]))
    with pytest.raises(ValueError, match="1 pair.*not in"):
        domain.scenarios("test")
