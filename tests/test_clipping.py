"""The loop's gradient clip (training/clipping.py) is torch's ``clip_grad_norm_`` bitwise: the norm and
the clipped gradients, in each dtype, clipping or not, with no clipping at all (max_norm 0: the norm
only, the gradients untouched), skipping parameters without a gradient; and what it does not take
as one group (several dtypes) goes to torch's function itself. A step that asks no exact norm
leaves the gradients and the finite verdict torch's at every norm, the threshold's neighbourhood
and overflow included, its norm within the stated bound of torch's, and takes the one-call sum
where the bound allows."""
import math

import pytest
import torch

import kernels
from configs import load_config
from helpers import TINY_RUN, read_metrics
from train import Trainer
from training.clipping import GradientClip, bound
from training.run_config import resolve_config

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


def scaled_twins(dtype, sizes, norm, seed=0):
    """Two lists of parameters with the same gradients, of ``sizes`` elements, scaled to about ``norm``."""
    gen = torch.Generator().manual_seed(seed)
    grads = [torch.randn(n, generator=gen, dtype=torch.float64) for n in sizes]
    scale = norm / math.sqrt(sum((g * g).sum().item() for g in grads))
    twins = [[torch.nn.Parameter(torch.zeros(n, dtype=dtype)) for n in sizes] for _ in range(2)]
    for params in twins:
        for p, g in zip(params, grads):
            p.grad = (g * scale).to(dtype)
    return twins


def counting_foreach_norm(monkeypatch) -> list:
    """torch._foreach_norm wrapped to count its calls: the exact way's."""
    calls, foreach_norm = [], torch._foreach_norm
    monkeypatch.setattr(torch, "_foreach_norm", lambda *args: calls.append(1) or foreach_norm(*args))
    return calls


SIZES = [65536, 4096, 300, 128, 1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("ratio", [0.0, 0.5, 0.99, 0.9985, 0.99999, 1.0, 1.00001, 1.5, 1e30, math.inf, math.nan])
def test_a_step_without_an_exact_norm_leaves_torch_s_gradients_and_verdict(dtype, ratio, monkeypatch):
    # The norm at ``ratio`` times max_norm 1: under the threshold by more or less than the bound
    # (2e-3 in float32 for these sizes), at it, over it, overflowing float32's sum of squares (1e30
    # in float32), inf, NaN; and max_norm 0 (no clipping) at each.
    calls = counting_foreach_norm(monkeypatch)
    for max_norm in (1.0, 0.0):
        ours, theirs = scaled_twins(dtype, SIZES, 1.0 if math.isnan(ratio) else min(ratio, 1e300))
        if not math.isfinite(ratio):
            ours[1].grad[7] = theirs[1].grad[7] = ratio
        expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm or math.inf)
        calls.clear()
        clip = GradientClip(ours, max_norm)
        before = [p.grad.clone() for p in ours]
        norm = clip(exact=False)
        # (Without clipping torch multiplies the gradients by NaN where the norm is not finite; they
        # are left as they are here: the loop takes no step with them either way.)
        left = not max_norm and not expected.isfinite()
        for p, q, b in zip(ours, theirs, before, strict=True):  # (bitwise; NaN where clipping by inf made it)
            torch.testing.assert_close(p.grad, b if left else q.grad, rtol=0, atol=0, equal_nan=True)
        assert norm.dtype == dtype and bool(norm.isfinite()) == bool(expected.isfinite())
        if calls:  # the exact way: torch's norm
            torch.testing.assert_close(norm, expected, rtol=0, atol=0, equal_nan=True)
        else:
            assert abs(norm.double() - expected.double()) <= clip.bound * expected.double()
        # The one-call sum decides wherever the bound leaves no doubt, and only there.
        short = (ratio * (1 + clip.bound) < (1 - 2e-5) - 1e-6 if max_norm else
                 math.isfinite(ratio) and (ratio < 1e19 if dtype == torch.float32 else True))
        assert short == (not calls), (max_norm, ratio)


def test_the_bound_holds_and_is_of_use():
    # torch's float32 norm against the float64 one of the same gradients, over sizes from one
    # element to a million, and how tight the bound is (the docstring's figure).
    for seed, sizes in enumerate([[1], [7, 9], SIZES, [1 << 20, 33], [65536] * 8]):
        grads = [g.grad for g in scaled_twins(torch.float32, sizes, 3.0, seed)[0]]
        exact = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0).double()
        estimate = math.sqrt(sum((g.double() ** 2).sum().item() for g in grads))
        assert abs(exact - estimate) <= bound(sizes, torch.float32) * estimate
    assert 1.9e-3 < bound([65536] + [10] * 26, torch.float32) < 2.1e-3
    assert bound([38_597_376], torch.float32) == math.inf  # (GPT-2's wte: the exact way always)
    assert bound([64], torch.bfloat16) == math.inf  # (no bound stated)


def test_other_gradients_take_the_exact_way(monkeypatch):
    # A bfloat16 one (no bound stated), and no kernels built; a non-contiguous one takes the short
    # way as a contiguous one does.
    calls = counting_foreach_norm(monkeypatch)
    for dtype, transposed, built in [(torch.bfloat16, False, True), (torch.float32, False, False),
                                     (torch.float32, True, True)]:
        ours, theirs = scaled_twins(dtype, [64, 16], 0.5)
        if transposed:
            for params in (ours, theirs):
                grad, params[0].grad = params[0].grad, None
                params[0].data = params[0].data.view(8, 8).t()
                params[0].grad = grad.view(8, 8).t()
        with monkeypatch.context() as patched:
            if not built:
                patched.setattr(kernels, "build", lambda: RuntimeError("no compiler"))
            calls.clear()
            clip = GradientClip(ours, 1.0)
            norm = clip(exact=False)
            exact_way = bool(calls)
        expected = torch.nn.utils.clip_grad_norm_(theirs, 1.0)
        assert exact_way != transposed
        assert torch.equal(norm, expected) if exact_way else abs(norm - expected) <= clip.bound * expected
        assert all(torch.equal(p.grad, q.grad) for p, q in zip(ours, theirs))



def test_the_loop_records_torch_s_norm_and_takes_the_short_way_between_log_steps(byte_shards, tmp_path, monkeypatch):
    # Six steps, a log every third: the clip is asked for an exact norm on the log steps only, and the
    # recorded norm is clip_grad_norm_'s of that step's gradients.
    asked, torch_norms, clip = [], [], GradientClip.__call__

    def recording(self, exact=True):
        grads = [p.grad.clone() for p in self.parameters if p.grad is not None]
        twins = [torch.nn.Parameter(g.clone()) for g in grads]
        for twin, g in zip(twins, grads):
            twin.grad = g
        torch_norms.append(torch.nn.utils.clip_grad_norm_(twins, self.max_norm).item())
        asked.append(exact)
        return clip(self, exact)

    monkeypatch.setattr(GradientClip, "__call__", recording)
    trainer = Trainer(resolve_config(load_config(None, [
        *TINY_RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path}", "--batch_size=2", "--micro_batch_size=2",
        "--optimizer=adamw", "--grad_clip=1e9", "--max_steps=6", "--log_interval=3", "--eval_interval=100"])))
    try:
        trainer.train()
    finally:
        trainer.close()
    logged = [r["grad_norm"] for r in read_metrics(tmp_path / "default") if "grad_norm" in r]
    assert asked == [False, False, True, False, False, True]
    assert logged == [torch_norms[2], torch_norms[5]]
