"""B then W gives exactly the fused backward's gradients, without falling back to a
second full walk, with and without recomputation."""

from __future__ import annotations

import pytest
import torch

from executor.dropout import DropoutKey
from executor.model import GPTShape, ModelOptions, build_stage, init_full_weights
from executor.split_backward import backward_input, backward_weight

SHAPE = GPTShape(
    vocab_size=64, seq_length=16, hidden_size=32, num_heads=4, ffn_hidden_size=128, num_layers=4
)
KEY = DropoutKey(seed=1, step=0, first_row=0)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("head", [False, True])
def test_split_equals_the_fused_backward(head, recompute):
    stage = build_stage(
        SHAPE,
        init_full_weights(SHAPE),
        1,
        3,
        embed=False,
        head=head,
        options=ModelOptions(dropout=0.1),
        recompute=[recompute] * 2,
    )
    params = list(stage.parameters())
    x = torch.randn(16, 2, 32, requires_grad=True)
    targets = torch.randint(0, 64, (2, 16))
    upstream = torch.tensor(1.0) if head else torch.randn(16, 2, 32)

    def run():
        return stage(x, KEY, targets) if head else stage(x, KEY)

    out = run()
    (expected_dx,) = torch.autograd.grad(out, x, upstream, retain_graph=True)
    torch.autograd.backward(out, upstream, inputs=params)
    expected = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    dx, pending = backward_input(run(), upstream, x, params)
    assert not pending.fallback and pending.groups
    backward_weight(pending)
    torch.testing.assert_close(dx, expected_dx, rtol=0, atol=0)
    for p, e in zip(params, expected, strict=True):
        torch.testing.assert_close(p.grad, e, rtol=1e-6, atol=1e-7)
