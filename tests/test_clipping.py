"""The loop's gradient clip (training/clipping.py) is torch's ``clip_grad_norm_`` bitwise: the norm and
the clipped gradients, in each dtype, clipping or not, with no clipping at all (max_norm 0: the norm
only, the gradients untouched), skipping parameters without a gradient; and what it does not take
as one group (several dtypes) goes to torch's function itself."""
import math

import pytest
import torch

from training.clipping import GradientClip

SHAPES = [(5, 7), (7,), (3, 5, 2), (1,)]


def twins(dtypes, seed=0):
    """Two lists of parameters with the same values and gradients (one of them with no gradient)."""
    gen = torch.Generator().manual_seed(seed)
    ours, theirs = [], []
    for i, (shape, dtype) in enumerate(zip(SHAPES + [(4,)], dtypes)):
        value, grad = (torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype) for _ in range(2))
        for params in (ours, theirs):
            p = torch.nn.Parameter(value.clone())
            p.grad = None if i == len(SHAPES) else grad.clone()
            params.append(p)
    return ours, theirs


@pytest.mark.parametrize("max_norm", [0.0, 0.5, 1e9])  # none, clipping, a bound the norm stays under
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_the_clip_is_torch_s_clip_grad_norm_bitwise(dtype, max_norm, monkeypatch):
    ours, theirs = twins([dtype] * (len(SHAPES) + 1))
    before = [p.grad.clone() for p in ours if p.grad is not None]
    expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm or math.inf)
    with monkeypatch.context() as patched:  # (one group: torch's function is not called)
        patched.setattr(torch.nn.utils, "clip_grad_norm_", None)
        norm = GradientClip(ours, max_norm)()
    assert torch.equal(norm, expected) and norm.dtype == dtype
    after = [p.grad for p in ours if p.grad is not None]
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(ours, theirs) if p.grad is not None)
    assert ours[-1].grad is None
    clipped = max_norm and expected > max_norm
    assert clipped == any(not torch.equal(a, b) for a, b in zip(after, before))


def test_gradients_of_several_dtypes_go_to_torch_s_clip():
    dtypes = [torch.float32, torch.bfloat16, torch.float32, torch.float64, torch.float32]
    ours, theirs = twins(dtypes, seed=1)
    norm, expected = GradientClip(ours, 0.5)(), torch.nn.utils.clip_grad_norm_(theirs, 0.5)
    assert torch.equal(norm, expected) and expected > 0.5
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(ours, theirs) if p.grad is not None)
