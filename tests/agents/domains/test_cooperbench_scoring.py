"""CooperBench's scoring on parley's own task (agents/domains/cooperbench/data), in the
bubblewrap sandbox: gold pairs pass, the conflict rule (a union merge, then the tests), a wrong
patch fails, and an agent's edits to test files never reach the hidden tests."""

import os
import shutil
import subprocess
import time

import pytest

from agents.domains.cooperbench import (
    discover_tasks,
    feature_pairs,
    filter_test_files,
    read_task,
    score_pair,
)
from agents.domains.cooperbench.domain import BUNDLED
from agents.domains.cooperbench.scoring import parse_test_counts
from agents.sandbox import Limits, LocalSandbox

TASK = read_task(BUNDLED / "tinycalc_task" / "task1")
LIMITS = Limits(cpu_seconds=60, memory_bytes=2 * 1024**3, wall_seconds=60, output_bytes=200_000)

needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None and not os.environ.get("PARLEY_CI"),
    reason="bubblewrap is not installed",
)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """The fixture repository as a git repository at its base commit (a nested .git cannot be committed)."""
    repo = tmp_path_factory.mktemp("tinycalc") / "repo"
    shutil.copytree(BUNDLED / "repos" / "tinycalc", repo)
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
        subprocess.run(
            ["git", "-c", "user.email=fixture@parley", "-c", "user.name=fixture", *args],
            cwd=repo,
            check=True,
            capture_output=True,
        )
    return repo


def score(checkout, tmp_path, first, second, patch1=None, patch2=None):
    patch1 = TASK.features[first].gold_patch if patch1 is None else patch1
    patch2 = TASK.features[second].gold_patch if patch2 is None else patch2
    with LocalSandbox(checkout, LIMITS, scratch=tmp_path) as sandbox:
        return score_pair(TASK, first, second, patch1, patch2, sandbox)


def test_the_fixture_is_read_in_the_official_layout():
    assert TASK.repo_name == "tinycalc_task" and TASK.task_id == 1
    assert sorted(TASK.features) == [1, 2, 3, 4, 5]
    assert "subtract" in TASK.features[1].request
    assert TASK.features[1].tests_patch.startswith("diff --git a/tests/test_subtract.py")
    assert TASK.base_commit == "fixture"
    assert [t.task_id for t in discover_tasks(BUNDLED)] == [1]
    assert (1, 2) in feature_pairs(TASK) and len(feature_pairs(TASK)) == 10


@needs_bwrap
def test_gold_patches_that_merge_cleanly_both_pass(checkout, tmp_path):
    result = score(checkout, tmp_path, 1, 2)
    assert result.error is None
    assert (result.merge_status, result.merge_strategy) == ("clean", "naive")
    assert result.apply_status == {"agent1": "applied", "agent2": "applied"}
    assert result.feature1.passed and result.feature2.passed
    assert result.both_passed
    assert "def subtract" in result.merged_patch and "def shout" in result.merged_patch


@needs_bwrap
def test_a_conflict_is_merged_with_the_union_driver_and_then_tested(checkout, tmp_path):
    # both append to ops.py: git conflicts; the union merge keeps both functions, and both pass
    result = score(checkout, tmp_path, 1, 3)
    assert (result.merge_status, result.merge_strategy) == ("conflicts", "union")
    assert result.both_passed, (result.feature1.output, result.feature2.output)


@needs_bwrap
def test_a_conflict_on_one_line_keeps_the_second_agents_line_first(checkout, tmp_path):
    # both rewrite add()'s return: union keeps both lines, agent 2's (ours) first, so it wins
    result = score(checkout, tmp_path, 4, 5)
    assert (result.merge_status, result.merge_strategy) == ("conflicts", "union")
    assert not result.feature1.passed and result.feature1.tests_failed == 1
    assert result.feature2.passed
    assert not result.both_passed


@needs_bwrap
def test_a_wrong_patch_fails_its_feature(checkout, tmp_path):
    wrong = TASK.features[1].gold_patch.replace("return a - b", "return a + b")
    assert wrong != TASK.features[1].gold_patch
    result = score(checkout, tmp_path, 1, 2, patch1=wrong)
    assert result.merge_status == "clean"
    assert not result.feature1.passed and result.feature2.passed
    assert not result.both_passed


@needs_bwrap
def test_an_agent_cannot_pass_by_editing_the_tests(checkout, tmp_path):
    # a wrong implementation plus a rewritten hidden test: the test file is dropped before the merge
    tests = TASK.features[1].tests_patch
    rewritten = tests.replace("subtract(5, 3) == 2", "True").replace("subtract(3, 5) == -2", "True")
    assert rewritten != tests
    cheat = TASK.features[1].gold_patch.replace("return a - b", "return 0") + rewritten
    result = score(checkout, tmp_path, 1, 2, patch1=cheat)
    assert "test_subtract" not in result.merged_patch
    assert not result.feature1.passed


@needs_bwrap
def test_a_patch_whose_tests_hang_fails_at_the_wall_limit(checkout, tmp_path):
    hanging = TASK.features[1].gold_patch.replace("return a - b", "while True: pass")
    assert hanging != TASK.features[1].gold_patch
    limits = Limits(cpu_seconds=60, memory_bytes=2 * 1024**3, wall_seconds=4, output_bytes=200_000)
    started = time.monotonic()
    with LocalSandbox(checkout, limits, scratch=tmp_path) as sandbox:
        result = score_pair(TASK, 1, 2, hanging, TASK.features[2].gold_patch, sandbox)
    assert time.monotonic() - started < 30
    assert result.feature1.killed == "wall" and not result.feature1.passed
    assert result.feature2.passed and not result.both_passed


@needs_bwrap
def test_empty_patches_are_skipped_and_fail(checkout, tmp_path):
    result = score(checkout, tmp_path, 1, 2, patch1="", patch2="")
    assert result.apply_status == {"agent1": "skipped", "agent2": "skipped"}
    assert not result.both_passed


@needs_bwrap
def test_a_patch_that_does_not_apply_is_missing_input(checkout, tmp_path):
    broken = TASK.features[4].gold_patch.replace("return a + b", "return a ** b")
    result = score(checkout, tmp_path, 4, 2, patch1=broken)
    assert result.apply_status["agent1"] == "failed"
    assert result.merge_status == "missing_input"
    assert not result.both_passed


def test_test_files_are_filtered_from_a_patch():
    patch = TASK.features[1].gold_patch + TASK.features[1].tests_patch
    kept = filter_test_files(patch)
    assert kept == TASK.features[1].gold_patch
    for name in ("pkg/tests/x.py", "pkg/test_x.py", "x_test.py", "a/test/b.go", "app/tests.py"):
        assert filter_test_files(f"diff --git a/{name} b/{name}\n+x\n") == ""


def test_test_counts_are_read_from_the_runners_output():
    assert parse_test_counts("==== 3 passed, 1 failed in 0.1s ====") == (3, 1)
    assert parse_test_counts("Tests:       2 failed, 15 passed, 17 total") == (15, 2)
    # jest's own line first: its suite line's "failed" is not a failed test
    assert parse_test_counts("Test Suites: 1 failed, 1 total\nTests:       3 passed, 3 total") == (
        3,
        0,
    )
    assert parse_test_counts("--- PASS: A\n--- FAIL: B\n--- PASS: C") == (2, 1)
    assert parse_test_counts("nothing ran") == (0, 0)
