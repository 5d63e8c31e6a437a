"""The optimisation settings the paper's launchers set (issue 22): the KL estimator, Adam's betas
and weight decay for both learning roles, LoRA's learning-rate scale, and Population Self-Play
without the agent's KL."""

import json
import math
import typing

import pytest
import torch

from training.config import load_config, parse_config
from training.config_schema import RunConfig
from training.regimes.regime import CoTrain, ModelCache
from training.rl.grpo import KL_ESTIMATORS, grpo_loss
from training.rl.policy import Policy
from training.trainer.loop import train

LN2 = math.log(2.0)


def kl_batch():
    """Two sequences of three tokens; the last token is not the policy's (mask 0) and carries
    an absurd reference value. d = ref - logp is ln 2 on the first token, -ln 2 on the second."""
    logp = torch.full((2, 3), math.log(0.5))
    old = logp.clone()
    ref = logp + torch.tensor([[LN2, -LN2, 40.0], [LN2, -LN2, -40.0]])
    adv = torch.zeros(2)  # no policy-gradient term: the loss is beta * the mean KL
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    return logp, old, ref, adv, mask


# by hand, per token at d = ln 2 and d = -ln 2, then the mean over the 4 policy tokens
HAND = {
    # k1 = -d: -ln 2 and +ln 2, mean 0
    "k1": ((-LN2, LN2), 0.0),
    # k2 = d^2 / 2: (ln 2)^2 / 2 on both
    "k2": ((LN2**2 / 2, LN2**2 / 2), LN2**2 / 2),
    # k3 = e^d - d - 1: 2 - ln 2 - 1 = 1 - ln 2, and 1/2 + ln 2 - 1 = ln 2 - 1/2
    "k3": ((1 - LN2, LN2 - 0.5), ((1 - LN2) + (LN2 - 0.5)) / 2),
}
# d(KL)/d(logp) per token (d = ref - logp, so d' = -1): k1: 1, k2: -d, k3: 1 - e^d
GRADIENT = {"k1": (1.0, 1.0), "k2": (-LN2, LN2), "k3": (-1.0, 0.5)}


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_estimators_equal_hand_computed_values(estimator):
    (first, second), mean = HAND[estimator]
    assert float(KL_ESTIMATORS[estimator](torch.tensor(LN2))) == pytest.approx(first)
    assert float(KL_ESTIMATORS[estimator](torch.tensor(-LN2))) == pytest.approx(second)
    logp, old, ref, adv, mask = kl_batch()
    logp.requires_grad_(True)
    loss, stats = grpo_loss(logp, old, ref, adv, mask, eps=0.2, beta=0.1, kl_estimator=estimator)
    assert stats["kl"] == pytest.approx(mean, abs=1e-7)
    assert float(loss) == pytest.approx(0.1 * mean, abs=1e-7)
    loss.backward()
    per_token = torch.tensor([GRADIENT[estimator]] * 2) * 0.1 / 4  # beta / policy tokens
    torch.testing.assert_close(logp.grad[:, :2], per_token)
    assert torch.all(logp.grad[:, 2] == 0)  # the absurd reference value never enters


def test_the_default_estimator_is_k3_and_a_typo_is_refused():
    logp, old, ref, adv, mask = kl_batch()
    default = grpo_loss(logp, old, ref, adv, mask, beta=0.1)[1]["kl"]
    assert default == pytest.approx(HAND["k3"][1])
    with pytest.raises(ValueError, match="kl_estimator must be one of k1, k2, k3"):
        grpo_loss(logp, old, ref, adv, mask, beta=0.1, kl_estimator="low_var_kl")


def test_kl_clamp_bounds_each_tokens_k3_as_slime_does():
    """Slime clamps low_var_kl to [-10, 10]: a token at d = 15 (its probability e^15 times lower
    than the reference's) counts 10, not e^15 - 16, and gets no KL gradient; the other token is
    untouched. Unclamped (0, the default) it counts in full."""
    logp = torch.full((1, 2), math.log(0.5), requires_grad=True)
    ref = logp.detach() + torch.tensor([[15.0, LN2]])
    args = (logp, logp.detach(), ref, torch.zeros(1), torch.ones(1, 2))
    loss, stats = grpo_loss(*args, beta=1.0, kl_clamp=10.0)
    assert stats["kl"] == pytest.approx((10.0 + 1 - LN2) / 2)
    loss.backward()
    assert float(logp.grad[0, 0]) == 0.0 and float(logp.grad[0, 1]) == pytest.approx(-0.5)
    unclamped = grpo_loss(*args, beta=1.0)[1]["kl"]
    assert unclamped == pytest.approx((math.exp(15) - 16 + 1 - LN2) / 2, rel=1e-5)
    assert RunConfig(name="r", domain="p4g").kl_clamp == 0.0


def test_the_config_offers_exactly_the_estimators_grpo_computes():
    annotation = RunConfig.__pydantic_fields__["kl_estimator"].annotation
    assert set(typing.get_args(annotation)) == set(KL_ESTIMATORS)
    assert RunConfig(name="r", domain="p4g").kl_estimator == "k3"


def config(model, **fields) -> RunConfig:
    settings = {"name": "opt", "domain": "p4g-decision", "base_model": str(model)}
    return parse_config({**settings, **fields})


@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_the_optimizer_settings_reach_the_agent_and_the_co_trained_simulator(
    tiny_model, tmp_path, finetune
):
    """adam_betas, weight_decay and the learning rates (LoRA: lr x lora.lr_scale; full: lr) in
    both roles' AdamW, as the trainer builds them."""
    cfg = config(
        tiny_model,
        regime="cotrain",
        finetune=finetune,
        lr=1e-6,
        simulator_lr=2e-6,
        adam_betas=[0.8, 0.95],
        weight_decay=0.1,
        lora={"lr_scale": 10.0},
    )
    agent = Policy.for_run(cfg, lr=cfg.agent_lr)
    simulator = CoTrain(cfg, tmp_path, ModelCache(cfg)).policy
    scale = 10.0 if finetune == "lora" else 1.0
    for policy, lr in ((agent, 1e-6 * scale), (simulator, 2e-6 * scale)):
        [group] = policy.optimizer.param_groups
        assert group["betas"] == (0.8, 0.95)
        assert group["weight_decay"] == 0.1
        assert group["lr"] == pytest.approx(lr)
        assert policy.finetune == finetune  # `finetune` applies to both learning roles
    trained = sum(p.numel() for p in agent.optimizer.param_groups[0]["params"])
    everything = sum(p.numel() for p in agent.model.parameters())
    assert (trained == everything) == (finetune == "full")


def test_weight_decay_skips_biases_and_norms_as_megatron_does(tiny_model):
    """weight_decay_skip_1d: one AdamW step with zero gradients moves a parameter only by its
    decay, so the 2-D matrices shrink by (1 - lr x weight_decay) and the norms keep their
    values; without the setting the norms shrink too. The optimizer's state round-trips through
    a checkpoint's numbering (the model's order) into a fresh Policy."""
    cfg = config(tiny_model, finetune="full", lr=0.5, weight_decay=0.2, weight_decay_skip_1d=True)
    for skip in (True, False):
        policy = Policy.for_run(
            config(
                tiny_model, finetune="full", lr=0.5, weight_decay=0.2, weight_decay_skip_1d=skip
            ),
            lr=0.5,
        )
        weights = policy._weights()
        norms = [n for n, p in weights.items() if p.ndim == 1]
        assert norms and all("norm" in n for n in norms)  # SmolLM2: no biases, 1-D = norms
        before = {n: p.detach().clone() for n, p in weights.items()}
        for p in weights.values():
            p.grad = torch.zeros_like(p)
        policy.optimizer.step()
        for name, p in weights.items():
            shrunk = before[name] * (1 - 0.5 * 0.2)
            want = before[name] if skip and name in norms else shrunk
            torch.testing.assert_close(p.detach(), want)
        if skip:
            state = policy.optimizer_state()
            assert [len(g["params"]) for g in state["param_groups"]] == [
                len(weights) - len(norms),
                len(norms),
            ]
            fresh = Policy.for_run(cfg, lr=0.5)
            fresh.load_optimizer_state(state)
            assert fresh.optimizer_state()["state"].keys() == state["state"].keys()
            first_norm = list(weights).index(norms[0])  # model order, not the groups' order
            assert state["param_groups"][1]["params"][0] == first_norm


def test_lr_scale_scales_lora_only():
    lora = RunConfig(name="r", domain="p4g", lr=1e-6, lora={"lr_scale": 10.0})
    assert lora.agent_lr == pytest.approx(1e-5) and lora.sim_lr == pytest.approx(1e-5)
    full = RunConfig(name="r", domain="p4g", lr=1e-6, finetune="full", lora={"lr_scale": 10.0})
    assert full.agent_lr == 1e-6 and full.sim_lr == 1e-6
    assert RunConfig(name="r", domain="p4g", lr=1e-6).agent_lr == 1e-6  # default scale 1
    defaults = RunConfig(name="r", domain="p4g")
    assert defaults.adam_betas == [0.9, 0.999] and defaults.lora.lr_scale == 1.0


POPULATION = """
name = "population-no-agent-kl"
domain = "p4g-decision"
regime = "population"
base_model = "{model}"
finetune = "full"
steps = 2
group_size = 4
batch_tasks = 1
lr = 1e-3
beta = 0.0
simulator_beta = 0.1
kl_estimator = "k2"
pool_every = 1
temperature = 1.0
max_new_tokens = 8
max_turns = 2
threads = 1
seed = 3  # step 1's rewards differ within the group, so the simulator moves
heldout = []
[tasks]
max_train = 2
[simulator]
name = "persuadee"
temperature = 1.0
max_new_tokens = 8
"""


def test_population_without_the_agents_kl_skips_its_reference(tiny_model, tmp_path, monkeypatch):
    """Population Self-Play as released: beta = 0 for the agent, simulator_beta > 0 for the
    simulator. Full fine-tuning: the agent holds no reference copy and makes no reference pass,
    the simulator does both; the metrics carry the optimizers' learning rates."""
    path = tmp_path / "population.toml"
    path.write_text(POPULATION.format(model=tiny_model))
    calls = []
    original = Policy.reference_logprobs

    def spy(self, batch, temperature=1.0):
        calls.append(self)
        return original(self, batch, temperature)

    monkeypatch.setattr(Policy, "reference_logprobs", spy)
    policies = []
    monkeypatch.setattr(Policy, "__init__", _recording(Policy.__init__, policies))
    train(load_config(path, {"output_dir": str(tmp_path / "run")}), show_progress=False)

    agent, simulator = policies  # the trainer builds the agent first
    assert agent.reference_model is None and simulator.reference_model is not None
    assert calls and all(policy is simulator for policy in calls)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert [r["kl"] for r in rows] == [0.0, 0.0]
    assert rows[1]["sim/kl"] > 0  # the simulator moved from its base in step 1 (k2 > 0)
    assert rows[0]["lr"] == 1e-3 and rows[0]["sim/lr"] == 1e-3


def _recording(init, into):
    def record(self, *args, **kwargs):
        init(self, *args, **kwargs)
        into.append(self)

    return record


def test_full_fine_tuning_is_allowed_under_fsdp():
    cfg = RunConfig(
        name="r", domain="p4g", finetune="full", distributed={"strategy": "fsdp", "processes": 8}
    )
    assert cfg.finetune == "full" and cfg.distributed.strategy == "fsdp"
