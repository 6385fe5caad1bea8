"""The fused operations of SGD (``sgd_step``) and Adafactor (its sweeps) of optim/backends/: the C++
and Triton kernels against the torch reference, call by call from the same inputs, in each dtype
they take; a set ``skip`` flag writes nothing. (The optimizers themselves: tests/test_sgd.py
against torch.optim.SGD, tests/test_adafactor.py against the authors' optax composition.)

SGD's kernels are the reference bitwise in float32 and float64: each of their operations is
torch's, the fused multiply-add of torch's ``add(..., alpha=)`` included. In bfloat16 they are
torch's vectorised loop, whose scalar tails round otherwise (kernels/csrc/sgd.cpp): within
bfloat16's rounding. Adafactor's element-wise results are the
reference's bitwise too (v, and p from the same factors, divisor and scale); its sums (the row
means and column sums of g*g + 1e-30, the sums of u*u and p*p) are taken in another order (the C++
kernels in double, Triton's in blocks, torch's its own way): within 1e-5 relative in float32 (sums
of up to 70,001 terms; measured below 1e-6), 1e-12 in float64.
"""
import pytest
import torch

from helpers import BACKENDS_TRITON_SLOW, bitwise_but_in_bfloat16, require_backend
from optim import backends
from optim.backends import common, reference

DTYPES = [torch.float32, torch.bfloat16, torch.float64]
SUM_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-5, torch.float64: 1e-12}
LRS = [0.2, 0.15, 0.3, 0.05]  # a changing lr, as a schedule's
# Longer than a C++ thread's share and a SIMD width, with a tail; for Triton's interpreter (slow), a
# few of its blocks and a masked tail.
SHAPES = {"cpp": [(67, 45), (70001,), (5,)], "triton": [(67, 45), (5,)]}
# Factored matrices: rows the shorter side (the rows' factor first), columns the shorter one.
FACTORED = [(130, 140), (150, 130)]
KERNELS = BACKENDS_TRITON_SLOW[:2]  # (not the reference itself)


def _loaded(kernel: str):
    require_backend(kernel)
    module = backends.BY_NAME[kernel]
    module.load(required=True)
    return module


def _randn(shape, gen, dtype, scale=1.0) -> torch.Tensor:
    return (scale * torch.randn(shape, generator=gen, dtype=torch.float64)).to(dtype)


@pytest.mark.parametrize("wd", [0.0, 0.125])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kernel", KERNELS)
def test_sgd_kernels_are_the_reference_bitwise(kernel, dtype, momentum, wd):
    module = _loaded(kernel)
    same = bitwise_but_in_bfloat16(dtype)
    gen = torch.Generator().manual_seed(0)
    for shape in SHAPES[kernel]:
        p = _randn(shape, gen, dtype)
        ours, theirs = p.clone(), p.clone()
        buffers = [torch.zeros_like(p), torch.zeros_like(p)] if momentum else [None, None]
        for lr in LRS:
            g = _randn(shape, gen, dtype)
            module.sgd_step(ours, g.clone(), buffers[0], lr=lr, momentum=momentum, wd=wd)
            reference.sgd_step(theirs, g.clone(), buffers[1], lr=lr, momentum=momentum, wd=wd)
            same(ours, theirs, (shape, lr))
            if momentum:
                same(*buffers, (shape, lr))
        assert not torch.equal(ours, p)


def _factors(shape, gen) -> tuple[torch.Tensor, torch.Tensor]:
    """A factored matrix's row and column factors as the optimizer makes them (rsqrt of positive
    statistics), in float32 (also for bfloat16 parameters: the state's dtype) or float64."""
    return (torch.rand(shape[0], generator=gen, dtype=torch.float64) + 0.5,
            torch.rand(shape[1], generator=gen, dtype=torch.float64) + 0.5)


def _close(ours: torch.Tensor, theirs: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    torch.testing.assert_close(ours.double(), theirs.double(), rtol=SUM_TOLERANCE[dtype], atol=0, msg=what)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kernel", KERNELS)
def test_adafactor_factored_sweeps_match_the_reference(kernel, dtype):
    module, gen, compute = _loaded(kernel), torch.Generator().manual_seed(1), common.compute_dtype(dtype)
    for shape in FACTORED:
        p, g = _randn(shape, gen, dtype, 0.05), _randn(shape, gen, dtype)
        g[0].zero_()  # (a zero row: its squares are epsilon's)
        for ours, theirs, what in zip(module.adafactor_statistics(g), reference.adafactor_statistics(g),
                                      ("row means", "column sums")):
            assert ours.dtype == theirs.dtype == compute and ours.shape == theirs.shape
            _close(ours, theirs, dtype, f"{what} of {shape}")
        row, col = (f.to(compute) for f in _factors(shape, gen))
        for rows_first in (True, False):
            sums = module.adafactor_factored_sums(p, g, row, col, rows_first=rows_first)
            _close(sums, reference.adafactor_factored_sums(p, g, row, col, rows_first=rows_first), dtype,
                   f"sums of {shape}")
            for divisor in (None, torch.tensor(1.75, dtype=compute)):
                ours, theirs = p.clone(), p.clone()
                scale = torch.tensor(0.03, dtype=compute)
                module.adafactor_factored_apply(ours, g, row, col, rows_first=rows_first, divisor=divisor, lr=0.1,
                                                scale=scale)
                reference.adafactor_factored_apply(theirs, g, row, col, rows_first=rows_first, divisor=divisor,
                                                   lr=0.1, scale=scale)
                assert torch.equal(ours, theirs) and not torch.equal(ours, p), (shape, rows_first, divisor)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kernel", KERNELS)
def test_adafactor_unfactored_sweeps_match_the_reference(kernel, dtype):
    module, gen, compute = _loaded(kernel), torch.Generator().manual_seed(2), common.compute_dtype(dtype)
    for shape in SHAPES[kernel]:
        p, v = _randn(shape, gen, dtype, 0.05), torch.rand(shape, generator=gen, dtype=compute)
        for beta, w in ((0.0, 1.0), (0.75, 0.25)):  # (the first step: v is g*g + eps)
            g = _randn(shape, gen, dtype)
            ours_v, theirs_v = v.clone(), v.clone()
            sums = module.adafactor_unfactored_sums(p, g, ours_v, beta=beta, w=w)
            _close(sums, reference.adafactor_unfactored_sums(p, g, theirs_v, beta=beta, w=w), dtype, f"sums of {shape}")
            assert torch.equal(ours_v, theirs_v) and not torch.equal(ours_v, v), shape
            ours, theirs = p.clone(), p.clone()
            for apply, into in ((module, ours), (reference, theirs)):
                apply.adafactor_unfactored_apply(into, g, ours_v, divisor=torch.tensor(1.5, dtype=compute), lr=0.1,
                                                 scale=torch.tensor(0.02, dtype=compute))
            assert torch.equal(ours, theirs) and not torch.equal(ours, p), shape
            v = ours_v


@pytest.mark.parametrize("kernel", BACKENDS_TRITON_SLOW)
def test_a_set_skip_flag_writes_nothing_and_a_clear_one_is_the_plain_call(kernel):
    module = _loaded(kernel) if kernel != "torch" else reference
    gen = torch.Generator().manual_seed(3)
    shape = (130, 140)
    p, g, buf, v = (_randn(shape, gen, torch.float32) for _ in range(4))
    v = v.abs()
    row, col = (f.float() for f in _factors(shape, gen))
    one = torch.tensor(1.0)
    calls = {
        "sgd": lambda t, skip: module.sgd_step(t["p"], g, t["buf"], lr=0.1, momentum=0.9, wd=0.1, skip=skip),
        "unfactored": lambda t, skip: module.adafactor_unfactored_sums(t["p"], g, t["v"], beta=0.5, w=0.5, skip=skip),
        "unfactored apply": lambda t, skip: module.adafactor_unfactored_apply(t["p"], g, t["v"], divisor=one, lr=0.1,
                                                                              scale=one, skip=skip),
        "factored apply": lambda t, skip: module.adafactor_factored_apply(t["p"], g, row, col, rows_first=True,
                                                                          divisor=None, lr=0.1, scale=one, skip=skip),
    }
    for name, call in calls.items():
        start = {"p": p, "buf": buf, "v": v}
        flagged, plain, cleared = ({k: t.clone() for k, t in start.items()} for _ in range(3))
        call(flagged, torch.tensor(1.0))
        assert all(torch.equal(flagged[k], start[k]) for k in start), name
        call(plain, None)
        call(cleared, torch.tensor(0.0))
        assert all(torch.equal(cleared[k], plain[k]) for k in start), name
        assert any(not torch.equal(plain[k], start[k]) for k in start), name
