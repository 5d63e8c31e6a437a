"""The paper configs against the release's launchers, number by number. The launchers' flags are
data, committed with their file, line and commit (training/tools/release_launchers.csv, read from
CHATS-lab/scope_usim cmd/slime/ at the commit paper.py cites); a config that drifts from its
launcher, or a launcher value copied wrong, fails here. Where parley differs on purpose the rule
below says how, and paper.py says why.

Every paper result is covered, P4G's too; PENDING names what a domain's configs do not carry yet."""

from __future__ import annotations

import csv
from collections import defaultdict

import pytest

from training.config import load_config
from training.tools.paper import RELEASE_COMMIT, RESULTS, Result
from training.tools.paper import REPO as ROOT

TABLE = ROOT / "training" / "tools" / "release_launchers.csv"


def table() -> dict[str, dict[str, tuple[str, int, str]]]:
    """launcher path (under cmd/slime/) -> flag -> (value, line, commit)."""
    out: dict[str, dict[str, tuple[str, int, str]]] = defaultdict(dict)
    with TABLE.open() as f:
        for row in csv.DictReader(f):
            flags = out[row["launcher"]]
            assert row["flag"] not in flags, f"{row['launcher']}: {row['flag']} twice"
            flags[row["flag"]] = (row["value"], int(row["line"]), row["commit"])
    return out


def launcher(result: Result) -> tuple[str, str]:
    """(path under cmd/slime/, commit) of the launcher a result follows (airline: retail's)."""
    cited = result.launcher.split("cmd/slime/", 1)[1]
    path, commit = cited.split("@")
    return path, commit


# Fields a domain's configs do not carry yet, each with whose work sets it: the P4G configs are
# issue 38 point 1's (h/p4g); they add loss_reduction = "sample", then this entry goes.
PENDING: dict[str, set[str]] = {}


def test_the_table_holds_every_results_launcher_at_the_cited_commit():
    rows = table()
    for result in RESULTS:
        path, commit = launcher(result)
        assert path in rows, f"{result.key}: {path} is not in {TABLE.name}"
        assert {c for _, _, c in rows[path].values()} == {commit} == {RELEASE_COMMIT}
    # two rows against the values the reference README states for these launchers
    assert rows["tau2/rl_single_gpt5mini.sh"]["--lr"][:2] == ("5e-7", 124)
    assert rows["tau2/self_play.sh"]["--kl-loss-coef"][:2] == ("0.005", 104)


def expected(result: Result, flags: dict[str, tuple[str, int, str]]) -> dict[str, object]:
    """The config values the launcher's flags give, with (value, line) kept for the message."""

    def num(flag: str) -> float:
        return float(flags[flag][0])

    config = load_config(result.config)
    out: dict[str, object] = {
        "batch_tasks": int(num("--rollout-batch-size")),
        "group_size": int(num("--n-samples-per-prompt")),
        "temperature": num("--rollout-temperature"),
        # LoRA's best rate is about 10x full fine-tuning's (CooperBench's 27B trains an adapter:
        # paper.py says why)
        "lr": num("--lr") * (10 if config.finetune == "lora" else 1),
        "weight_decay": num("--weight-decay"),
        "adam_betas": [num("--adam-beta1"), num("--adam-beta2")],
        "eps": num("--eps-clip"),
        "eps_high": num("--eps-clip-high"),
        "beta": 0.0 if "--no-agent-kl" in flags else num("--kl-loss-coef"),
        "kl_estimator": {"low_var_kl": "k3"}[flags["--kl-loss-type"][0]],
        "scale_std": "--disable-grpo-std-normalization" not in flags,
        "center_rewards": "--disable-rewards-normalization" not in flags,
    }
    assert out["batch_tasks"] * out["group_size"] == num("--global-batch-size")
    if config.steps == 0:  # Base: the evaluation at rollout 0 of a job started for it
        assert num("--eval-interval") == 1 and "--skip-eval-before-train" not in flags
    else:  # a base evaluation takes no update: its loss reduction does not matter
        out["loss_reduction"] = "token" if "--calculate-per-token-loss" in flags else "sample"
        out["steps"] = int(num("--num-rollout"))
        out["save_every"] = int(num("--save-interval"))
        out["eval_every"] = int(num("--eval-interval")) if "--eval-interval" in flags else 0
    if config.trains_simulator:  # the co-trained user's KL: the same coefficient
        out["simulator_beta"] = num("--kl-loss-coef")
    if "--max-turns" in flags:
        out["max_turns"] = int(num("--max-turns"))
    if "--pool-size" in flags:
        out["pool_size"] = int(num("--pool-size"))
        out["pool_every"] = int(num("--pool-save-interval"))
    if "--usim-vs-num-samples" in flags:
        out["simulator.k"] = int(num("--usim-vs-num-samples"))
        method = flags["--usim-vs-method"][0]
        if result.key.endswith("verbalized-prob"):  # the ablation: vs_gpt5mini.sh with prob
            method = "prob"
        out["simulator.draw"] = {"random": "uniform", "prob": "probability"}[method]
    return out


def actual(config, key: str) -> object:
    value = config
    for part in key.split("."):
        value = getattr(value, part)
    return value


@pytest.mark.parametrize("result", RESULTS, ids=lambda r: r.key)
def test_every_paper_config_has_its_launchers_numbers(result):
    path, _ = launcher(result)
    flags = table()[path]
    config = load_config(result.config)
    drift = {
        key: (actual(config, key), want)
        for key, want in expected(result, flags).items()
        if key not in PENDING.get(result.domain, ()) and actual(config, key) != pytest.approx(want)
    }
    assert not drift, f"{result.key} differs from cmd/slime/{path}: {drift}"
