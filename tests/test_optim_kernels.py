"""The fused steps of AdEMAMix and Schedule-Free AdamW (``ademamix_step``, ``schedulefree_step`` of
optim/backends/) and MARS's correction (``mars_correction``): the C++ and Triton kernels against the
torch reference, call by call from the same inputs, in each dtype they take; a ``skip`` flag writes
nothing (MARS's correction: keeps g_prev); tensors the kernels do not take run the reference. (The
optimizers' own tests hold every backend to naive float64 rules written from the spec; here the
kernels are held to the reference's roundings.)

Tolerances, relative to each tensor's largest element: float64 1e-12, float32 4 ulps (torch's CPU
kernels contract some products and sums into FMAs, the kernels never do, so an intermediate
differs in its last bit), bfloat16 2 of its ulps; and in bfloat16 at most 1 element in 1,000
differs at all (such a last float bit moves a rounding to bfloat16 that rarely), which holds the
kernels to the reference's roundings to bfloat16, intermediates included. For that the scalars
are exact in bfloat16 where torch's CPU kernels round them to it: the ``alpha`` of
``add(..., alpha=)`` (1 - b1, 1 - b3, wd, lr, y_lr) and a scalar added (eps), which the kernels
keep in float32 (with b1 = 0.9, 1 - b1 rounded to bfloat16 is 1e-3 off). MARS's sum of c^2, against
its float64 sum: float64 1e-12 relative, else 2e-5 (float32 sums of up to 10^5 terms in three orders:
the C++ kernel sums float32 c^2 in double and bfloat16's in float spans of 16,384, the Triton kernel
in float blocks of 1,024, torch's vector_norm its own way; measured 4e-7 for the kernels, 6e-6 for torch's).
"""
import inspect

import pytest
import torch
from torch import nn

import optim
from helpers import require_backend
from optim import backends
from optim.backends import common, cpp, reference, triton

TOLERANCES = {torch.float64: 1e-12, torch.float32: 4 * 2.0**-23, torch.bfloat16: 2 * 2.0**-7}


def _schedulefree(lr: float, ckp1: float, wd: float, bias_correction2: float) -> dict:
    """schedulefree_step's scalars as the optimizer computes them (b1 0.875, b2 0.999)."""
    return {"lr": lr, "y_lr": lr * (0.875 * (1 - ckp1) - 1), "ckp1": ckp1, "wd": wd, "beta2": 0.999,
            "bias_correction2": bias_correction2, "eps": 2.0**-27}


# Per operation: the names of the tensors it takes after (p, g), and the scalars of the calls a
# test makes in turn: a first step and later ones, with decay and without; AdEMAMix's b3 and alpha
# warming up; Schedule-Free's lerp weight ckp1 = 1 (the first step: y = z), 1/2 and 1/4, both
# forms of torch's lerp. The scalars that torch's CPU add takes as alpha (1 - b1, 1 - b3, wd, lr,
# y_lr) are exact in bfloat16.
OPS = {
    "ademamix": (("m1", "m2", "v"), [
        {"lr": 0.1, "wd": 0.125, "beta1": 0.875, "beta2": 0.999, "beta3": 0.9375, "alpha": 0.5,
         "bias_correction1": 0.125, "bias_correction2": 0.001, "eps": 2.0**-27},
        {"lr": 0.1, "wd": 0.0, "beta1": 0.875, "beta2": 0.999, "beta3": 1 - 2**-8, "alpha": 1.0,
         "bias_correction1": 1 - 0.875**2, "bias_correction2": 1 - 0.999**2, "eps": 2.0**-27},
        {"lr": 0.05, "wd": 0.125, "beta1": 0.25, "beta2": 0.9, "beta3": 1 - 2**-10, "alpha": 8.0,
         "bias_correction1": 1 - 0.25**3, "bias_correction2": 1 - 0.9**3, "eps": 2.0**-20},
    ]),
    "schedulefree": (("z", "v"), [_schedulefree(0.125, 1.0, 0.125, 0.001), _schedulefree(0.125, 0.5, 0.0, 0.001999),
                                  _schedulefree(0.0625, 0.25, 0.125, 0.002997)]),
}


def _gradient(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Elements of magnitudes 1 down to 1e-6 (where eps counts), and a zero leading row."""
    g = torch.randn(shape, generator=gen, dtype=torch.float64) * 10 ** (-6 * torch.rand(shape, generator=gen))
    return g.index_fill_(0, torch.tensor([0]), 0)


def _tensors(op: str, shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """p, g and the operation's state, with a zero leading row (zero gradient and state: g = v = 0,
    where the update must be 0, not 0/0)."""
    names = ("p", "g", *OPS[op][0])
    tensors = {name: torch.randn(shape, generator=gen, dtype=torch.float64) for name in names}
    tensors["g"] = _gradient(shape, gen)
    tensors["v"] = tensors["g"] ** 2 * torch.rand(shape, generator=gen, dtype=torch.float64)
    for name in names[2:]:
        tensors[name][:1].zero_()
    return {name: t.to(dtype) for name, t in tensors.items()}


def _call(module, op: str, tensors: dict[str, torch.Tensor], scalars: dict, skip: torch.Tensor | None = None):
    getattr(module, f"{op}_step")(*tensors.values(), **scalars, skip=skip)


# Longer than the C++ kernels' share per thread and than a SIMD width, with a tail; for Triton's
# interpreter (slow), a few of its blocks and a masked tail.
SHAPES = {"cpp": [(67, 45), (70001,), (5,)], "triton": [(67, 45), (5,)]}


def _loaded(kernel: str):
    """The kernel backend ``kernel``, loaded (the test skipped where it cannot run here)."""
    require_backend(kernel)
    module = backends.BY_NAME[kernel]
    module.load(required=True)
    return module


def _cloned(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: t.clone() for name, t in tensors.items()}


@pytest.mark.parametrize("dtype", TOLERANCES, ids=lambda dtype: str(dtype).removeprefix("torch."))
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("kernel", ["cpp", pytest.param("triton", marks=pytest.mark.slow)])  # (the interpreter)
def test_kernels_match_the_torch_reference(kernel, op, dtype):
    module = _loaded(kernel)
    gen = torch.Generator().manual_seed(0)
    shapes = SHAPES[kernel]
    differ = total = 0
    for shape in shapes:
        tensors = _tensors(op, shape, dtype, gen)
        for scalars in OPS[op][1]:
            ours, theirs = _cloned(tensors), _cloned(tensors)
            _call(module, op, ours, scalars)
            _call(reference, op, theirs, scalars)
            for name in ours.keys() - {"g"}:  # (the reference may consume the gradient)
                expected = theirs[name].double()
                torch.testing.assert_close(ours[name].double(), expected, rtol=0,
                                           atol=TOLERANCES[dtype] * expected.abs().max().item(),
                                           msg=lambda m: f"{name} of {shape}, {scalars}: {m}")
                differ += ours[name].ne(theirs[name]).sum().item()
                total += expected.numel()
            tensors = {**theirs, "g": _gradient(shape, gen).to(dtype)}
    if dtype == torch.bfloat16:
        assert differ <= total / 1000, f"{differ} of {total} elements differ"


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("kernel", ["cpp", "triton"])
def test_a_set_skip_flag_writes_nothing_and_a_clear_one_is_the_plain_call(kernel, op):
    module = _loaded(kernel)
    tensors = _tensors(op, (3, 7), torch.float32, torch.Generator().manual_seed(1))
    scalars = OPS[op][1][0]
    flagged = _cloned(tensors)
    _call(module, op, flagged, scalars, skip=torch.tensor(1.0))
    for name in tensors.keys() - {"g"}:
        assert torch.equal(flagged[name], tensors[name]), name
    plain, cleared = _cloned(tensors), _cloned(tensors)
    _call(module, op, plain, scalars)
    _call(module, op, cleared, scalars, skip=torch.tensor(0.0))
    for name in tensors.keys() - {"g"}:
        assert torch.equal(cleared[name], plain[name]) and not torch.equal(plain[name], tensors[name]), name


@pytest.mark.parametrize("op", OPS)
def test_tensors_the_kernels_do_not_take_run_the_reference(op):
    require_backend("cpp")
    cpp.load(required=True)
    tensors = list(_tensors(op, (6, 5), torch.float32, torch.Generator().manual_seed(2)).values())
    assert backends.select("cpp", tensors) is cpp
    assert backends.select("cpp", [t.half() for t in tensors]) is reference  # a dtype the kernels do not take
    transposed = [tensors[0], *(t.t().contiguous().t() for t in tensors[1:])]  # state laid out column-major
    assert backends.select("cpp", transposed) is reference
    # Called anyway, the C++ kernel refuses them rather than reading them as contiguous.
    with pytest.raises(RuntimeError, match="contiguous CPU tensors of p's dtype"):
        _call(cpp, op, dict(zip(("p", "g", *OPS[op][0]), transposed)), OPS[op][1][0])


@pytest.mark.parametrize("name", ["ademamix", "adamw_schedulefree"])
def test_the_optimizers_step_what_the_kernels_do_not_take_with_the_reference(name):
    require_backend("cpp")
    gen = torch.Generator().manual_seed(3)
    # A float16 parameter, one laid out column-major (its gradient and state alike), a plain one.
    params = [nn.Parameter(torch.randn(4, 3, generator=gen).half()), nn.Parameter(torch.randn(3, 4, generator=gen).t()),
              nn.Parameter(torch.randn(4, 3, generator=gen))]
    twins = [nn.Parameter(p.detach().clone(memory_format=torch.preserve_format)) for p in params]
    opts = [optim.build(name, ps, lr=0.01, weight_decay=0.1, run_steps=10, backend=backend)
            for ps, backend in ((params, "cpp"), (twins, "torch"))]
    assert opts[0].backends() == {"group0": "torch x2, cpp x1"}
    for _ in range(3):
        grads = [torch.randn(p.shape, generator=gen).to(p.dtype) for p in params]
        for opt, ps in zip(opts, (params, twins)):
            for p, g in zip(ps, grads):
                p.grad = g.clone(memory_format=torch.contiguous_format) if p.is_contiguous() else g.t().contiguous().t()
            opt.step()
    assert torch.equal(params[0], twins[0]) and torch.equal(params[1], twins[1])  # the reference, both
    torch.testing.assert_close(params[2], twins[2], rtol=0, atol=1e-6)


# MARS's correction: its scale gamma*b1/(1-b1) at the authors' gamma 0.025 and b1 0.95, none, and a large one.
MARS_SCALES = [0.025 * 0.95 / 0.05, 0.0, 4.0]
MARS_SUM_TOLERANCES = {torch.float64: 1e-12, torch.float32: 2e-5, torch.bfloat16: 2e-5}


def _mars_tensors(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """g and g_prev, both with the zero leading row of ``_gradient``; g_prev a gradient of its own."""
    return {"g": _gradient(shape, gen).to(dtype), "g_prev": _gradient(shape, gen).to(dtype)}


def _mars(module, tensors: dict[str, torch.Tensor], scale: float, skip: torch.Tensor | None = None) -> torch.Tensor:
    return module.mars_correction(tensors["g"], tensors["g_prev"], scale=scale, skip=skip)


@pytest.mark.parametrize("dtype", TOLERANCES, ids=lambda dtype: str(dtype).removeprefix("torch."))
@pytest.mark.parametrize("kernel", ["cpp", pytest.param("triton", marks=pytest.mark.slow)])  # (the interpreter)
def test_mars_correction_kernels_match_the_torch_reference(kernel, dtype):
    """c (in g's storage) and g_prev as the reference rounds them; the sum of c^2 up to summation order."""
    module = _loaded(kernel)
    gen = torch.Generator().manual_seed(4)
    shapes = SHAPES[kernel]
    differ = total = 0
    for shape in shapes:
        for scale in MARS_SCALES:
            tensors = _mars_tensors(shape, dtype, gen)
            ours, theirs = _cloned(tensors), _cloned(tensors)
            ours_sum, theirs_sum = _mars(module, ours, scale), _mars(reference, theirs, scale)
            assert torch.equal(ours["g_prev"], tensors["g"]) and torch.equal(theirs["g_prev"], tensors["g"])
            expected = theirs["g"].double()
            torch.testing.assert_close(ours["g"].double(), expected, rtol=0,
                                       atol=TOLERANCES[dtype] * expected.abs().max().item(),
                                       msg=lambda m: f"c of {shape}, scale {scale}: {m}")
            assert ours_sum.dtype == theirs_sum.dtype == common.compute_dtype(dtype) and ours_sum.dim() == 0
            assert ours_sum.item() == pytest.approx(expected.square().sum().item(), rel=MARS_SUM_TOLERANCES[dtype])
            assert theirs_sum.item() == pytest.approx(expected.square().sum().item(), rel=MARS_SUM_TOLERANCES[dtype])
            differ += ours["g"].ne(theirs["g"]).sum().item()
            total += expected.numel()
    if dtype == torch.bfloat16:
        assert differ <= total / 1000, f"{differ} of {total} elements differ"


@pytest.mark.parametrize("kernel", ["cpp", "triton"])
def test_mars_correction_under_a_set_skip_flag_keeps_g_prev_and_a_clear_one_is_the_plain_call(kernel):
    module = _loaded(kernel)
    tensors = _mars_tensors((3, 7), torch.float32, torch.Generator().manual_seed(5))
    plain, flagged, cleared = _cloned(tensors), _cloned(tensors), _cloned(tensors)
    plain_sum = _mars(module, plain, MARS_SCALES[0])
    flagged_sum = _mars(module, flagged, MARS_SCALES[0], skip=torch.tensor(1.0))
    cleared_sum = _mars(module, cleared, MARS_SCALES[0], skip=torch.tensor(0.0))
    assert torch.equal(flagged["g_prev"], tensors["g_prev"]) and torch.equal(plain["g_prev"], tensors["g"])
    # c and its sum are computed all the same (the optimizer's AdamW drops them under its own flag).
    for ours, ours_sum in ((flagged, flagged_sum), (cleared, cleared_sum)):
        assert torch.equal(ours["g"], plain["g"]) and torch.equal(ours_sum, plain_sum)
    assert torch.equal(cleared["g_prev"], plain["g_prev"]) and not torch.equal(plain["g"], tensors["g"])


def test_mars_correction_of_tensors_the_kernels_do_not_take_runs_the_reference():
    require_backend("cpp")
    cpp.load(required=True)
    tensors = list(_mars_tensors((6, 5), torch.float32, torch.Generator().manual_seed(6)).values())
    assert backends.select("cpp", tensors) is cpp
    assert backends.select("cpp", [t.half() for t in tensors]) is reference
    transposed = [tensors[0], tensors[1].t().contiguous().t()]  # g_prev laid out column-major
    assert backends.select("cpp", transposed) is reference
    with pytest.raises(RuntimeError, match="contiguous CPU tensors of p's dtype"):
        cpp.mars_correction(*transposed, scale=1.0)


def test_mars_steps_what_the_kernels_do_not_take_with_the_reference():
    require_backend("cpp")
    gen = torch.Generator().manual_seed(7)
    # A bfloat16 matrix laid out column-major (its gradient and state alike), a plain one.
    params = [nn.Parameter(torch.randn(3, 4, generator=gen).bfloat16().t()),
              nn.Parameter(torch.randn(4, 3, generator=gen))]
    twins = [nn.Parameter(p.detach().clone(memory_format=torch.preserve_format)) for p in params]
    opts = [optim.build("mars", [{"params": ps, "hidden_matrix": True}], lr=0.01, weight_decay=0.1, backend=backend)
            for ps, backend in ((params, "cpp"), (twins, "torch"))]
    assert opts[0].backends()["group0"] == "torch x1, cpp x1 (MARS's correction), torch (fused AdamW)"
    for _ in range(3):
        grads = [torch.randn(p.shape, generator=gen).to(p.dtype) for p in params]
        for opt, ps in zip(opts, (params, twins)):
            for p, g in zip(ps, grads):
                p.grad = g.clone(memory_format=torch.contiguous_format) if p.is_contiguous() else g.t().contiguous().t()
            opt.step()
    assert torch.equal(params[0], twins[0])  # the reference, both
    torch.testing.assert_close(params[1], twins[1], rtol=0, atol=1e-6)


@pytest.mark.parametrize("op", [*(f"{op}_step" for op in OPS), "mars_correction", "sgd_step", "adafactor_statistics",
                                "adafactor_factored_sums", "adafactor_factored_apply", "adafactor_unfactored_sums",
                                "adafactor_unfactored_apply"])
def test_every_backend_implements_the_declared_signature(op):
    declared = inspect.signature(getattr(backends.Backend, op), eval_str=True)
    declared = declared.replace(parameters=list(declared.parameters.values())[1:])  # without self
    for module in (reference, cpp, triton):
        assert inspect.signature(getattr(module, op), eval_str=True) == declared, module.NAME
