"""CooperBench's scoring of a cooperative pair: two agents' patches merged with git, both
features' hidden tests run on the merged tree, success when both pass (`both_passed`).

Ported in parley's words from cooperbench/CooperBench at 44b4a7a,
src/cooperbench/eval/sandbox.py (test_merged, _setup_branches, _merge_naive, _merge_union,
_run_tests, _parse_results, _filter_test_files, _sanitize_patch) and
src/cooperbench/eval/evaluate.py (the eval.json fields). The steps:

1. Test files are dropped from each agent's patch, so an agent cannot edit the hidden tests.
2. The first feature's patch is committed on branch agent1 and the second's on agent2, each
   from the base commit (`git apply`, else `git apply --3way`; an empty patch is "skipped").
3. agent1 is merged into agent2 (`--no-ff`). The conflict rule in the source: on a conflict the
   merge is tried again with git's union driver (`* merge=union`: both sides' lines are kept,
   ours first); only when that fails too is the pair an error, with both_passed false. (The
   issue's "only the lead's patch is tested" is not what the runner does; this follows the runner.)
   merge status: "clean", "conflicts" (union was used), or "missing_input" when a patch failed
   to apply.
4. Each feature's tests.patch and the merged diff (against the base) go to the task's runner.sh
   from a clean base; a feature passes when runner.sh exits 0 and its output counts at least
   one passing test.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from agents.domains.cooperbench.task import Task
from agents.sandbox import CommandResult, Sandbox

# a `diff --git` header naming any of these starts a test file's section, which is dropped
TEST_FILE_MARKS = ("/test_", "/tests/", "_test.py", "/test/", "tests.py")
OUTPUT_KEPT = 20_000  # characters of test output kept in a result


@dataclass
class FeatureResult:
    feature: int
    passed: bool = False
    exit_code: int | None = None
    tests_passed: int = 0
    tests_failed: int = 0
    output: str = ""
    killed: str | None = None  # the sandbox ended the run (wall, cpu, output)


@dataclass
class PairScore:
    features: tuple[int, int]
    apply_status: dict[str, str] = field(
        default_factory=dict
    )  # agent1/agent2: applied, skipped, failed
    merge_status: str = "error"  # clean, conflicts, missing_input or error
    merge_strategy: str | None = None  # naive or union
    merged_patch: str = ""
    feature1: FeatureResult | None = None
    feature2: FeatureResult | None = None
    error: str | None = None

    @property
    def both_passed(self) -> bool:
        return bool(
            self.feature1 and self.feature2 and self.feature1.passed and self.feature2.passed
        )


def sanitize_patch(patch: str) -> str:
    """Undo shell-escaped quotes and end with a newline, as git wants."""
    if not patch:
        return patch
    patch = patch.replace("'\\''", "'")
    return patch if patch.endswith("\n") else patch + "\n"


def filter_test_files(patch: str) -> str:
    """The patch without the sections of files that look like tests (TEST_FILE_MARKS)."""
    if not patch:
        return patch
    kept, skipping = [], False
    for line in patch.split("\n"):
        if line.startswith("diff --git"):
            skipping = any(mark in line for mark in TEST_FILE_MARKS)
        if not skipping:
            kept.append(line)
    text = "\n".join(kept)
    return text if not text or text.endswith("\n") else text + "\n"


def parse_test_counts(output: str) -> tuple[int, int]:
    """(passed, failed) from a test run's output: jest/vitest, pytest, go test or cargo test."""
    jest = re.search(r"Tests:\s*(?:(\d+)\s*failed,\s*)?(\d+)\s*passed", output)
    if jest:
        return int(jest.group(2)), int(jest.group(1) or 0)
    passed = re.search(r"(\d+) passed", output)
    failed = re.search(r"(\d+) failed", output)
    errors = re.search(r"(\d+) error", output)
    counts = (
        int(passed.group(1)) if passed else 0,
        (int(failed.group(1)) if failed else 0) + (int(errors.group(1)) if errors else 0),
    )
    if any(counts):
        return counts
    go = len(re.findall(r"--- PASS:", output)), len(re.findall(r"--- FAIL:", output))
    if any(go):
        return go
    ok_packages = len(re.findall(r"^ok\s+\S+", output, re.MULTILINE))
    failed_packages = len(re.findall(r"^FAIL\s+\S+", output, re.MULTILINE))
    if ok_packages or failed_packages:
        return (ok_packages if not failed_packages else 0), failed_packages
    cargo = re.search(r"test result:.*?(\d+) passed.*?(\d+) failed", output)
    if cargo:
        return int(cargo.group(1)), int(cargo.group(2))
    return 0, 0


SETUP_BRANCHES = """
git config user.email eval@cooperbench.local && git config user.name 'CooperBench Eval' || exit 1
base=$(git rev-parse HEAD) || exit 1
echo "BASE_SHA=$base"
apply() {  # $1: the agent's number, $2: its patch
    if [ ! -s "$2" ]; then echo "PATCH$1_SKIPPED"
    elif git apply "$2" || git apply --3way "$2"; then echo "PATCH$1_APPLIED"
    else echo "PATCH$1_FAILED"; fi
}
git checkout -q -b agent1 && apply 1 {patch1} && git add -A && git commit -q --allow-empty -m 'agent 1' || exit 1
git checkout -q "$base" && git checkout -q -b agent2 && apply 2 {patch2} && git add -A \
    && git commit -q --allow-empty -m 'agent 2' || exit 1
echo SETUP_COMPLETE
"""

MERGE = """
git checkout -q agent2 && git reset -q --hard HEAD || exit 1
{prepare}
if git merge --no-commit --no-ff agent1; then git commit -q -m merged && echo MERGED_CLEAN
else git merge --abort; echo MERGED_CONFLICTS; fi
git checkout -q -- .gitattributes 2>/dev/null || rm -f .gitattributes
"""

RUN_TESTS = """
rm -f .git/index.lock
git checkout -q --force {base} && git reset -q --hard {base} && git clean -fdxq || exit 1
COOPERBENCH_REPO={repo} COOPERBENCH_PATCHES={inputs} bash {runner} {tests} merged.patch
"""


def score_pair(
    task: Task, first: int, second: int, patch1: str, patch2: str, sandbox: Sandbox
) -> PairScore:
    """Score two agents' patches (for features `first` and `second`) in a sandbox whose workdir is
    the task's repository at its base commit. Never raises for what the patches or tests do."""
    score = PairScore(features=(first, second))
    q = shlex.quote
    try:
        patches = {
            n: filter_test_files(sanitize_patch(p or "")) for n, p in ((1, patch1), (2, patch2))
        }
        paths = {n: sandbox.write_input(f"patch{n}.patch", text) for n, text in patches.items()}
        tests = {
            n: sandbox.write_input(f"tests{n}.patch", sanitize_patch(task.features[f].tests_patch))
            for n, f in ((1, first), (2, second))
        }
        runner = sandbox.write_input("runner.sh", task.runner.read_text())

        setup = sandbox.run(
            SETUP_BRANCHES.replace("{patch1}", q(paths[1])).replace("{patch2}", q(paths[2]))
        )
        base = re.search(r"^BASE_SHA=(\w+)", setup.stdout, re.MULTILINE)
        if "SETUP_COMPLETE" not in setup.stdout or base is None:
            score.error = f"branch setup failed: {_tail(setup)}"
            return score
        base_sha = base.group(1)
        score.apply_status = {
            f"agent{n}": next(
                (s for s in ("applied", "skipped") if f"PATCH{n}_{s.upper()}" in setup.stdout),
                "failed",
            )
            for n in (1, 2)
        }

        merge = sandbox.run(MERGE.replace("{prepare}", ""))
        score.merge_strategy = "naive"
        if "MERGED_CLEAN" not in merge.stdout:
            union = sandbox.run(
                MERGE.replace("{prepare}", "echo '* merge=union' >> .gitattributes")
            )
            if "MERGED_CLEAN" not in union.stdout:
                score.error = f"naive and union merges both conflict: {_tail(union)}"
                return score
            score.merge_strategy = "union"
        if "failed" in score.apply_status.values():
            score.merge_status = (
                "missing_input"  # a merge with a patch missing is not the agents' joint work
            )
        else:
            score.merge_status = "clean" if score.merge_strategy == "naive" else "conflicts"

        diff = sandbox.run(["git", "diff", base_sha, "HEAD"])
        if not diff.ok or diff.stdout_truncated:
            score.error = f"the merged diff could not be read: {_tail(diff)}"
            return score
        score.merged_patch = diff.stdout
        sandbox.write_input("merged.patch", diff.stdout)

        inputs = str(PurePosixPath(runner).parent)
        results = []
        for n, feature in ((1, first), (2, second)):
            run = sandbox.run(
                RUN_TESTS.format(
                    base=q(base_sha),
                    repo=q(sandbox.workdir),
                    inputs=q(inputs),
                    runner=q(runner),
                    tests=q(PurePosixPath(tests[n]).name),
                )
            )
            passed, failed = parse_test_counts(run.output)
            results.append(
                FeatureResult(
                    feature=feature,
                    passed=run.ok and passed > 0,
                    exit_code=run.exit_code,
                    tests_passed=passed,
                    tests_failed=failed,
                    output=run.output[-OUTPUT_KEPT:],
                    killed=run.killed,
                )
            )
        score.feature1, score.feature2 = results
        score.error = None
        return score
    except Exception as error:  # a broken sandbox is a scored error, never a crash of the trainer
        score.error = f"{type(error).__name__}: {error}"
        return score


def _tail(result: CommandResult) -> str:
    return result.output[-2000:]
