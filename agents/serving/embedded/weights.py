"""The embedded engine's linear layers, laid out for the products a decoding step makes.

A step multiplies a few rows (one per running request) by every weight. Every linear layer
keeps its weight stored transposed (the same values and shape, as F.linear reads it: MKL
multiplies a few rows by a contiguous [in, out] matrix faster than by [out, in]) and, where
oneDNN is built in, also a copy packed once in oneDNN's blocked layout
(`torch.ops.mkldnn._reorder_linear_weight`, what Inductor's weight prepacking does), used for
two rows and more. One packing serves every row count. For one row, which is faster differs
between CPUs, so it is timed when the weights are laid out and the faster one is kept
(`bench/linear_layouts.py`, SmolLM2-135M's 30 layers + head, one thread):

| rows | A: transposed | A: packed | B: transposed | B: packed |
|---|---|---|---|---|
| 1 | 28.6 + 4.7 ms | 36.4 + 5.7 ms | 19.7 + 4.1 ms | 14.9 + 3.0 ms |
| 8 | 61.0 + 15.9 ms | 49.4 + 10.1 ms | 41.8 + 12.9 ms | 19.8 + 4.5 ms |
| 32 | 76.9 + 25.4 ms | 72.2 + 19.7 ms | 88.4 + 26.0 ms | 40.7 + 9.9 ms |
| 320 (a prefill) | 383.3 + 124.4 ms | 411.2 + 138.2 ms | 651.2 + 232.7 ms | 289.4 + 104.5 ms |

A: a 2-core machine, 2026-12-04 22:06 UTC, load 0.2-0.3, commit 56d902b; B: a 2-core AMD EPYC
(Zen 5, AVX-512), 2026-12-04 23:22 UTC, load 0.9, commit f3aaed1. ([out, in] as loaded was
slower than transposed at every row count on both.)

The cost is a second copy of the linear weights (about 0.55 GB for SmolLM2-135M). The output
head is tied to the embedding, which still looks its rows up by index in the transposed
storage. The results differ from F.linear's by float rounding (6e-5 on outputs of magnitude
20), as MKL's own one-row and many-row kernels do.

The layers stay `torch.nn.Linear` (their class becomes a subclass), so peft still wraps them
for LoRA adapters and calls them for the base part of each product.
"""

import logging
import time

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

PACK_HINT = 8  # the row count oneDNN picks its blocked layout for; any count runs on it


class PackedLinear(torch.nn.Linear):
    """A Linear whose products of two rows or more use its oneDNN-packed weight, and of one
    row too where that was timed faster (`one_row_packed`)."""

    packed: torch.Tensor
    one_row_packed = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.one_row_packed and x.numel() // self.in_features < 2:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def can_pack() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def lay_out_linear_weights(model: torch.nn.Module, pack: bool = True) -> int:
    """Store each linear weight transposed and, with `pack` and oneDNN, give each a packed
    copy and time one row both ways to choose the layout one row takes; the number of
    layers packed."""
    pack = pack and can_pack()
    layers, laid_out = [], set()
    with torch.no_grad():
        for module in model.modules():
            if type(module) is not torch.nn.Linear:
                continue
            weight = module.weight
            if pack:
                packed_weight = torch.ops.mkldnn._reorder_linear_weight(
                    weight.data.contiguous(), PACK_HINT
                )
            if weight.is_contiguous():  # a tied head's: the embedding still looks rows up
                weight.data = weight.data.t().contiguous().t()
            laid_out.add(weight.data_ptr())
            if pack:
                module.__class__ = PackedLinear
                module.packed = packed_weight  # a plain attribute: not in the state dict
                layers.append(module)
    own_copies(model, laid_out)
    if layers:
        transposed, packed = one_row_ms(layers)
        for layer in layers:
            layer.one_row_packed = packed < transposed
        log.info(
            "One row's products: %.1f ms transposed, %.1f ms packed; using %s",
            transposed,
            packed,
            "packed" if packed < transposed else "transposed",
        )
    return len(layers)


def own_copies(model: torch.nn.Module, laid_out: set[int] = frozenset()):
    """Give each parameter and buffer still read from the loaded file (norms, rotary tables)
    a copy of its own. transformers loads a safetensors file as views of one memory mapping,
    which stays mapped, every page of it resident once the layout has read it, as long as one
    view is left: 0.5 GB beside the laid-out weights for SmolLM2-135M (issue 36). Tensors
    whose data starts at an address in `laid_out` are copies made already."""
    with torch.no_grad():
        for tensor in (*model.parameters(), *model.buffers()):
            if tensor.data_ptr() not in laid_out:
                tensor.data = tensor.data.clone()


def one_row_ms(layers: list[PackedLinear], rounds: int = 5) -> tuple[float, float]:
    """Milliseconds for one row through every layer, transposed and packed: the best of
    `rounds` alternating rounds each, so that a busy moment weighs on both alike."""
    inputs = {layer.in_features: torch.randn(1, layer.in_features) for layer in layers}

    def transposed():
        for layer in layers:
            F.linear(inputs[layer.in_features], layer.weight, layer.bias)

    def packed():
        for layer in layers:
            torch.ops.mkldnn._linear_pointwise(
                inputs[layer.in_features], layer.packed, layer.bias, "none", [], ""
            )

    best = {transposed: float("inf"), packed: float("inf")}
    with torch.inference_mode():
        for way in best:
            way()  # first touch: page faults and oneDNN's primitive set-up, not counted
        for _ in range(rounds):
            for way in best:
                started = time.perf_counter()
                way()
                best[way] = min(best[way], 1000 * (time.perf_counter() - started))
    return best[transposed], best[packed]
