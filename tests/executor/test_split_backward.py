"""B then W gives exactly the fused backward's gradients, without falling back to a
second full walk."""

from __future__ import annotations

import pytest
import torch

from executor.model import GPTShape, build_stage, init_full_weights
from executor.split_backward import backward_input, backward_weight

SHAPE = GPTShape(
    vocab_size=64, seq_length=16, hidden_size=32, num_heads=4, ffn_hidden_size=128, num_layers=4
)


@pytest.mark.parametrize("head", [False, True])
def test_split_equals_the_fused_backward(head):
    stage = build_stage(SHAPE, init_full_weights(SHAPE), 1, 3, embed=False, head=head)
    params = list(stage.parameters())
    x = torch.randn(2, 16, 32, requires_grad=True)
    targets = torch.randint(0, 64, (2, 16))
    upstream = torch.tensor(1.0) if head else torch.randn(2, 16, 32)

    def run():
        return stage(x, targets) if head else stage(x)

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
