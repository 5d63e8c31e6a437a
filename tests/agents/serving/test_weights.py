"""The embedded engine's linear layers laid out for a decoding step's few rows
(agents.serving.embedded.weights): the same products as the plain layers, for one row and for many,
with peft's LoRA wrapped around them as around any Linear. A tiny random Llama, no weights
read from disk."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from agents.serving.embedded.weights import PackedLinear, can_pack, lay_out_linear_weights

pytestmark = pytest.mark.skipif(not can_pack(), reason="this torch has no oneDNN")


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("rows", [1, 2, 8, 33])
def test_a_laid_out_model_gives_the_plain_models_logits(rows):
    plain, laid_out = tiny_llama(), tiny_llama()
    linears = sum(isinstance(m, torch.nn.Linear) for m in laid_out.modules())
    assert lay_out_linear_weights(laid_out) == linears  # every projection and the head
    assert all(
        type(m) is PackedLinear for m in laid_out.modules() if isinstance(m, torch.nn.Linear)
    )
    # the tied head still shares the embedding, which looks the same rows up
    assert laid_out.lm_head.weight is laid_out.model.embed_tokens.weight
    ids = torch.randint(0, 97, (rows, 5))
    with torch.no_grad():
        expected, got = plain(ids).logits, laid_out(ids).logits
        step = laid_out(ids[:, :1]).logits  # one position per row: a decoding step's shape
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(step, plain(ids[:, :1]).logits, rtol=1e-4, atol=1e-4)


def test_each_layer_multiplies_by_its_own_weight():
    model = tiny_llama()
    lay_out_linear_weights(model)
    layer = model.model.layers[0].self_attn.q_proj
    x = torch.randn(4, 64)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), x @ layer.weight.T, rtol=1e-4, atol=1e-4)
        layer.weight.mul_(2)  # the packed copy is what rows of two or more use
        assert not torch.allclose(layer(x), x @ layer.weight.T, rtol=1e-4, atol=1e-4)


def test_peft_wraps_a_laid_out_layer_and_its_adapter_counts():
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    plain = get_peft_model(tiny_llama(), config)
    torch.manual_seed(1)
    laid_out_base = tiny_llama()
    lay_out_linear_weights(laid_out_base)
    laid_out = get_peft_model(laid_out_base, config)
    laid_out.load_state_dict(plain.state_dict())
    ids = torch.randint(0, 97, (3, 6))
    with torch.no_grad():
        with_adapter = laid_out(ids).logits
        torch.testing.assert_close(with_adapter, plain(ids).logits, rtol=1e-4, atol=1e-4)
        with laid_out.disable_adapter():
            assert not torch.allclose(laid_out(ids).logits, with_adapter, atol=1e-3)


@pytest.mark.parametrize("packed_faster", [True, False])
def test_one_row_takes_the_layout_timed_faster(monkeypatch, packed_faster):
    from agents.serving.embedded import weights

    timings = (2.0, 1.0) if packed_faster else (1.0, 2.0)  # (transposed, packed) ms
    monkeypatch.setattr(weights, "one_row_ms", lambda layers: timings)
    plain, model = tiny_llama(), tiny_llama()
    lay_out_linear_weights(model)
    layer = model.model.layers[0].self_attn.q_proj
    assert layer.one_row_packed is packed_faster
    x = torch.randn(1, 64)
    with torch.no_grad():
        ids = torch.randint(0, 97, (1, 1))
        torch.testing.assert_close(model(ids).logits, plain(ids).logits, rtol=1e-4, atol=1e-4)
        before = layer(x)
        layer.weight.mul_(2)  # the packed copy keeps the old values: it shows which one ran
        assert torch.allclose(layer(x), before, rtol=1e-4, atol=1e-4) is packed_faster


def test_the_one_row_timing_measures_both_layouts():
    from agents.serving.embedded import weights

    model = tiny_llama()
    lay_out_linear_weights(model)
    layers = [m for m in model.modules() if type(m) is PackedLinear]
    transposed, packed = weights.one_row_ms(layers, rounds=2)
    assert 0 < transposed < 1000 and 0 < packed < 1000
