"""The embedded engine's linear layers, laid out for the products a decoding step makes.

A step multiplies a few rows (one per running request) by every weight.
`bench/linear_layouts.py` on this 2-core CPU, one thread, SmolLM2-135M's 30 layers + its
output head (2026-12-04 22:06 UTC, load 0.2-0.3, commit 56d902b):

| rows | [out, in] weights (as loaded) | stored transposed | oneDNN packed |
|---|---|---|---|
| 1 | 31.4 + 5.8 ms | 28.6 + 4.7 ms | 36.4 + 5.7 ms |
| 8 | 67.3 + 21.4 ms | 61.0 + 15.9 ms | 49.4 + 10.1 ms |
| 32 | 77.7 + 27.7 ms | 76.9 + 25.4 ms | 72.2 + 19.7 ms |
| 320 (a prefill) | 376.5 + 125.8 ms | 383.3 + 124.4 ms | 411.2 + 138.2 ms |

So every linear layer keeps its weight stored transposed (the same values and shape, as
F.linear reads it: MKL multiplies a few rows by a contiguous [in, out] matrix faster), and,
where oneDNN is built in, also a copy packed once in oneDNN's blocked layout
(`torch.ops.mkldnn._reorder_linear_weight`, what Inductor's weight prepacking does), used for
two rows and more; one row, where packing is slower, still takes the transposed weight. One
packing serves every row count (MKL's own packed GEMM serves one). The cost is a second copy
of the linear weights (about 0.55 GB for SmolLM2-135M). The output head is tied to the
embedding, which still looks its rows up by index in the transposed storage. The results
differ from F.linear's by float rounding (6e-5 on outputs of magnitude 20), as MKL's own
one-row and many-row kernels do. A prefill pass (hundreds of rows) takes the packed weight too,
though at 320 rows it ran 7% slower than the transposed one in the run above: not yet
routed apart.

The layers stay `torch.nn.Linear` (their class becomes a subclass), so peft still wraps them
for LoRA adapters and calls them for the base part of each product.
"""

import torch
import torch.nn.functional as F

PACK_HINT = 8  # the row count oneDNN picks its blocked layout for; any count runs on it


class PackedLinear(torch.nn.Linear):
    """A Linear whose products of two rows or more use its oneDNN-packed weight."""

    packed: torch.Tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() // self.in_features < 2:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def can_pack() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def lay_out_linear_weights(model: torch.nn.Module, pack: bool = True) -> int:
    """Store each linear weight transposed and, with `pack` and oneDNN, give each
    a packed copy; the number of layers packed."""
    pack = pack and can_pack()
    packed = 0
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
            if pack:
                module.__class__ = PackedLinear
                module.packed = packed_weight  # a plain attribute: not in the state dict
                packed += 1
    return packed
