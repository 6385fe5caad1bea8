"""Tests of optim/: MERIT (and its ablations) and LAMB against naive float64 transcriptions of
docs/optimizers.md, on each backend of their passes (the C++ kernels, the Triton kernels in
Triton's interpreter, the torch reference), their diagnostics, the shared param groups, the AdamW wiring and the registry."""
import io
import math

import numpy as np
import pytest
import torch
from torch import nn

import kernels
import optim
from configs import load_config
from helpers import require_backend
from optim import LAMB, MERIT, param_groups
from training.run_config import resolve_config

STEPS = 20
# Triton's interpreter runs a launch in milliseconds of Python, so its kernels step through the
# first TRITON_STEPS of a case's gradients (the state still carried five times); the C++ kernels and
# the torch reference, which the Triton kernels round like, take all STEPS.
TRITON_STEPS = 6


class NaiveMERIT:
    """docs/optimizers.md's MERIT (and the ablations of MERIT's docstring) element by element in float64.

    After each step, ``s`` holds that step's ratio per element and ``clipped`` the number of
    elements with |s * u| > 1.
    """

    def __init__(self, p, lr, betas, eps, wd, maxlamb=False, elementwise_clip=True,
                 weightwise_lower_bound=True, norm="max"):
        self.p = np.array(p, dtype=np.float64)
        self.m = np.zeros_like(self.p)
        self.v = np.zeros_like(self.p)
        self.lr, (self.b1, self.b2), self.eps, self.wd = lr, betas, eps, wd
        self.maxlamb, self.clip, self.lower_bound = maxlamb, elementwise_clip, weightwise_lower_bound
        self.norm = (lambda xs: max(abs(x) for x in xs)) if norm == "max" else \
            (lambda xs: math.sqrt(sum(x * x for x in xs)))
        self.clipped = self.total_clipped = self.total = 0

    def step(self, g):
        p, m, v, shape = self.p, self.m, self.v, self.p.shape
        u = np.zeros_like(p)
        for i in np.ndindex(shape):
            m[i] = self.b1 * m[i] + (1 - self.b1) * g[i]
            v[i] = self.b2 * v[i] + (1 - self.b2) * g[i] * g[i]
            u[i] = m[i] / (math.sqrt(v[i]) + self.eps) + self.wd * p[i]
        p_all, u_all = self.norm(p.flat), self.norm(u.flat)
        self.s, self.clipped = np.zeros_like(p), 0
        new_p = p.copy()  # every ratio below reads p before this step's update
        for idx in np.ndindex(shape):
            if p.ndim >= 2 and not self.maxlamb:
                i, j, rest = idx[0], idx[1], idx[2:]
                row_p = self.norm(p[(i, jj) + rest] for jj in range(shape[1]))
                row_u = self.norm(u[(i, jj) + rest] for jj in range(shape[1]))
                col_p = self.norm(p[(ii, j) + rest] for ii in range(shape[0]))
                col_u = self.norm(u[(ii, j) + rest] for ii in range(shape[0]))
                if 0 in (row_p, row_u, col_p, col_u):
                    s = 1.0
                else:
                    s = max(row_p / row_u, col_p / col_u, *([p_all / u_all] if self.lower_bound else []))
            else:
                s = 1.0 if p_all == 0 or u_all == 0 else p_all / u_all
            x = s * u[idx]
            self.s[idx] = s
            self.clipped += abs(x) > 1
            if self.clip and not self.maxlamb:
                x = min(max(x, -1.0), 1.0)
            new_p[idx] = p[idx] - self.lr * x
        self.total_clipped, self.total = self.total_clipped + self.clipped, self.total + p.size
        self.p = new_p


class NaiveLAMB:
    """docs/optimizers.md's LAMB (pytorch-lamb style) and LAMB's two options, in float64."""

    def __init__(self, p, lr, betas, eps, wd, bias_correction=False, ratio_only_with_decay=False):
        self.p = np.array(p, dtype=np.float64)
        self.m = np.zeros_like(self.p)
        self.v = np.zeros_like(self.p)
        self.lr, (self.b1, self.b2), self.eps, self.wd = lr, betas, eps, wd
        self.bias_correction, self.ratio_only_with_decay = bias_correction, ratio_only_with_decay
        self.t = 0

    def step(self, g):
        p, m, v = self.p, self.m, self.v
        self.t += 1
        c1, c2 = (1 - self.b1 ** self.t, 1 - self.b2 ** self.t) if self.bias_correction else (1.0, 1.0)
        u = np.zeros_like(p)
        for i in np.ndindex(p.shape):
            m[i] = self.b1 * m[i] + (1 - self.b1) * g[i]
            v[i] = self.b2 * v[i] + (1 - self.b2) * g[i] * g[i]
            u[i] = (m[i] / c1) / (math.sqrt(v[i] / c2) + self.eps) + self.wd * p[i]
        w_norm = min(math.sqrt(sum(x * x for x in p.flat)), 10.0)
        u_norm = math.sqrt(sum(x * x for x in u.flat))
        if (self.ratio_only_with_decay and self.wd == 0) or w_norm == 0 or u_norm == 0:
            self.ratio = 1.0
        else:
            self.ratio = w_norm / u_norm
        self.p = p - self.lr * self.ratio * u


def _case(name, gen):
    """(p0, grads, wd) for one named case; grads is a list of STEPS float64 tensors."""
    rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)  # noqa: E731
    if name == "matrix":  # |s*u| <= |p|_max, so |p|_max > 1 is needed for the clip to act
        return 1.5 * rand(5, 7), [rand(5, 7) * (1 + k % 3) for k in range(STEPS)], 0.1
    if name == "big_matrix":  # ||p||_2 > 10: LAMB's clamp of the weight norm acts
        return 4 * rand(5, 7), [rand(5, 7) for _ in range(STEPS)], 0.1
    if name == "tall_matrix":
        return rand(6, 3), [rand(6, 3) for _ in range(STEPS)], 0.0
    if name == "vector":
        return rand(4), [rand(4) for _ in range(STEPS)], 0.1
    if name == "scalar":
        return rand(()), [rand(()) for _ in range(STEPS)], 0.1
    if name == "zero_row_in_p_and_grad":
        # Row 1 of p and of every grad is 0 -> u's row 1 is 0 forever (wd*p adds 0), so the row
        # guard holds on every step; column 3 of p starts at 0 (column guard on step 1 only).
        p = rand(5, 7)
        p[1] = 0
        p[:, 3] = 0
        grads = [rand(5, 7) for _ in range(STEPS)]
        for g in grads:
            g[1] = 0
        return p, grads, 0.1
    if name == "zero_col_in_grad":
        # wd = 0 and column 4 of every grad is 0 -> u's column 4 is 0 while p's is not.
        grads = [rand(5, 7) for _ in range(STEPS)]
        for g in grads:
            g[:, 4] = 0
        return rand(5, 7), grads, 0.0
    if name == "zero_matrix":
        return torch.zeros(4, 3, dtype=torch.float64), [rand(4, 3) for _ in range(STEPS)], 0.1
    if name == "zero_bias":
        return torch.zeros(4, dtype=torch.float64), [rand(4) for _ in range(STEPS)], 0.1
    if name == "tensor_3d":
        # dims 0 and 1 are reduced, dim 2 is not: the zero "row" (i=1, k=0) is guarded alone.
        p = rand(3, 4, 2)
        p[1, :, 0] = 0
        grads = [rand(3, 4, 2) for _ in range(STEPS)]
        for g in grads:
            g[1, :, 0] = 0
        return p, grads, 0.1
    raise KeyError(name)


CASES = ["matrix", "big_matrix", "tall_matrix", "vector", "scalar", "zero_row_in_p_and_grad",
         "zero_col_in_grad", "zero_matrix", "zero_bias", "tensor_3d"]
# The cases that the reference tests run on the triton backend in the quick tier (`-m "not slow"`;
# conftest.py marks the others slow there): the clip acting both ways, a guarded row of a 3-D tensor.
QUICK_TRITON_CASES = ("matrix", "tensor_3d")
MERIT_ABLATIONS = {
    "merit": {},
    "maxlamb": {"maxlamb": True},
    "no_clip": {"elementwise_clip": False},
    "no_lower_bound": {"weightwise_lower_bound": False},
    "l2": {"norm": "l2"},
    "l2_no_lower_bound_no_clip": {"norm": "l2", "weightwise_lower_bound": False, "elementwise_clip": False},
    "maxlamb_l2": {"maxlamb": True, "norm": "l2"},
}
LAMB_OPTIONS = {
    "lamb": {},
    "bias_correction": {"bias_correction": True},
    "ratio_only_with_decay": {"ratio_only_with_decay": True},
}


def _run_against_reference(make_opt, ref, p0, grads, every_step=None):
    """Step the optimizer and the reference with the same gradients; compare p, m, v each step."""
    p = nn.Parameter(p0.clone())
    opt = make_opt([p])
    if opt.backend == "triton":
        grads = grads[:TRITON_STEPS]
    for g in grads:
        p.grad = g.clone()
        opt.step()
        ref.step(g.numpy())
        state = opt.state[p]
        for ours, theirs in ((p, ref.p), (state["exp_avg"], ref.m), (state["exp_avg_sq"], ref.v)):
            assert np.abs(ours.detach().numpy() - theirs).max() <= 1e-10
    assert state["step"].item() == len(grads)


@pytest.mark.parametrize("ablation", MERIT_ABLATIONS)
@pytest.mark.parametrize("name", CASES)
def test_merit_and_ablations_match_naive_reference(name, ablation, backend):
    gen = torch.Generator().manual_seed(CASES.index(name))
    p0, grads, wd = _case(name, gen)
    lr, betas, eps, options = 0.05, (0.9, 0.95), 1e-6, MERIT_ABLATIONS[ablation]
    ref = NaiveMERIT(p0.numpy(), lr, betas, eps, wd, **options)
    _run_against_reference(lambda ps: MERIT(ps, lr=lr, betas=betas, eps=eps, weight_decay=wd, backend=backend,
                                            **options),
                           ref, p0, grads)
    if name == "matrix" and ablation == "merit":  # the clip must have been exercised both ways
        assert 0 < ref.total_clipped < ref.total


@pytest.mark.parametrize("option", LAMB_OPTIONS)
@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("wd", [None, 0.0])  # None: the case's own weight decay
def test_lamb_matches_naive_reference(name, option, wd, backend):
    gen = torch.Generator().manual_seed(CASES.index(name))
    p0, grads, case_wd = _case(name, gen)
    wd = case_wd if wd is None else wd
    lr, betas, eps, options = 0.05, (0.9, 0.95), 1e-6, LAMB_OPTIONS[option]
    ref = NaiveLAMB(p0.numpy(), lr, betas, eps, wd, **options)
    _run_against_reference(lambda ps: LAMB(ps, lr=lr, betas=betas, eps=eps, weight_decay=wd, backend=backend,
                                           **options),
                           ref, p0, grads)


def test_lamb_defaults_and_zero_bias_moves():
    opt = LAMB([nn.Parameter(torch.zeros(3))])
    assert opt.defaults == {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-6, "weight_decay": 0.0,
                            "bias_correction": False, "ratio_only_with_decay": False}
    # The zero guard: a zero-initialised bias gets ratio 1, so it does not stay frozen.
    bias = opt.param_groups[0]["params"][0]
    bias.grad = torch.ones(3)
    opt.step()
    assert torch.all(bias != 0)


@pytest.mark.parametrize("cls", [MERIT, LAMB])
def test_param_groups_use_their_own_hyperparameters(cls, backend):
    gen = torch.Generator().manual_seed(100)
    (pa, ga, _), (pb, gb, _) = _case("matrix", gen), _case("vector", gen)
    a, b = nn.Parameter(pa.clone()), nn.Parameter(pb.clone())
    naive = NaiveMERIT if cls is MERIT else NaiveLAMB
    opt = cls([{"params": [a], "weight_decay": 0.2, "lr": 0.03},
               {"params": [b], "betas": (0.8, 0.99), "eps": 1e-3}], lr=0.07, betas=(0.9, 0.95), backend=backend)
    ref_a = naive(pa.numpy(), 0.03, (0.9, 0.95), 1e-6, 0.2)
    ref_b = naive(pb.numpy(), 0.07, (0.8, 0.99), 1e-3, 0.0)
    for k in range(STEPS):
        a.grad, b.grad = ga[k].clone(), gb[k].clone()
        opt.step()
        ref_a.step(ga[k].numpy())
        ref_b.step(gb[k].numpy())
    assert np.abs(a.detach().numpy() - ref_a.p).max() <= 1e-10
    assert np.abs(b.detach().numpy() - ref_b.p).max() <= 1e-10


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_merit_update_is_symmetric_under_transposition(dtype, backend):
    gen = torch.Generator().manual_seed(7)
    p0, grads, _ = _case("zero_row_in_p_and_grad", gen)
    p = nn.Parameter(p0.to(dtype))
    pt = nn.Parameter(p0.T.contiguous().to(dtype))
    opt = MERIT([p, pt], lr=0.05, betas=(0.9, 0.95), weight_decay=0.1, backend=backend)
    for g in grads:
        p.grad, pt.grad = g.to(dtype).clone(), g.T.contiguous().to(dtype)
        opt.step()
        assert torch.equal(pt, p.T)


# The kernels against the torch reference in the dtypes they serve, on shapes larger than a SIMD width
# and than a Triton tile (40 x 300: two column chunks, Triton programs sweeping two row blocks),
# with guarded rows / columns: equal up to float rounding (a few ulp after several steps).
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("cls, options", [(MERIT, o) for o in MERIT_ABLATIONS.values()]
                         + [(LAMB, o) for o in LAMB_OPTIONS.values()])
@pytest.mark.parametrize("kernel", ["cpp", pytest.param("triton", marks=pytest.mark.slow)])  # (Triton's interpreter: seconds a case)
def test_kernels_match_the_torch_reference(kernel, cls, options, dtype, tol):
    require_backend(kernel)
    gen = torch.Generator().manual_seed(11)
    shapes = [(67, 45), (45, 67), (300,), (5,), (), (40, 300), (5000,)]
    p0 = [torch.randn(s, generator=gen) for s in shapes]
    p0[0][3], p0[0][:, 7], p0[2][:50] = 0, 0, 0
    # (Triton's interpreter takes seconds a step here: three steps, the state carried twice.)
    steps = 3 if kernel == "triton" else 5
    grads = [[torch.randn(s, generator=gen) * (1 + k) for s in shapes] for k in range(steps)]
    for gs in grads:
        gs[0][5] = 0  # with wd = 0 below: u's row 5 is 0
        gs[1][:, 9] = 0
    results = []
    for backend in (kernel, "torch"):
        params = [nn.Parameter(p.to(dtype)) for p in p0]
        opt = cls([{"params": params[:1], "weight_decay": 0.0}, {"params": params[1:], "weight_decay": 0.1}],
                  lr=0.1, backend=backend, **options)
        for gs in grads:
            for p, g in zip(params, gs):
                p.grad = g.to(dtype, copy=True)  # the step consumes the gradient
            opt.step()
        results.append([(p, opt.state[p]["exp_avg"], opt.state[p]["exp_avg_sq"]) for p in params])
    for fast, slow in zip(*results):
        for x, y in zip(fast, slow):
            torch.testing.assert_close(x.float(), y.float(), rtol=tol, atol=tol * y.float().abs().max().item())


def _stats(values):
    """min, lower median (torch.median's), max."""
    flat = np.sort(np.asarray(values, dtype=np.float64).ravel())
    return flat[0], flat[(flat.size - 1) // 2], flat[-1]


@pytest.mark.parametrize("ablation", ["merit", "maxlamb", "no_lower_bound", "l2"])
def test_merit_diagnostics_are_hand_computed_and_only_when_requested(ablation, backend):
    gen = torch.Generator().manual_seed(5)
    names = ["zero_row_in_p_and_grad", "matrix", "tensor_3d", "vector", "zero_matrix"]
    cases = [_case(name, gen) for name in names]
    params = [nn.Parameter(p0.clone()) for p0, _, _ in cases]
    options = MERIT_ABLATIONS[ablation]
    opt = MERIT([{"params": [p], "names": [n], "weight_decay": wd} for p, n, (_, _, wd) in zip(params, names, cases)],
                lr=0.05, betas=(0.9, 0.95), backend=backend, **options)
    refs = [NaiveMERIT(p0.numpy(), 0.05, (0.9, 0.95), 1e-6, wd, **options) for p0, _, wd in cases]
    for k in range(3):
        for p, (_, grads, _) in zip(params, cases):
            p.grad = grads[k].clone()
        if k == 2:
            opt.request_diagnostics()
        opt.step()
        for ref, (_, grads, _) in zip(refs, cases):
            ref.step(grads[k].numpy())
        diagnostics = opt.pop_diagnostics()
        if k < 2:
            assert diagnostics == {}
    assert len(diagnostics) == 4 * len(names)
    for name, ref in zip(names, refs):
        expected = dict(zip(["trust_ratio_min", "trust_ratio_median", "trust_ratio_max"], _stats(ref.s)))
        expected["clip_fraction"] = ref.clipped / ref.p.size
        for stat, value in expected.items():
            # pop_diagnostics returns float32 values
            assert diagnostics[f"{stat}/{name}"] == pytest.approx(value, rel=1e-6), (stat, name)


def test_merit_diagnostics_median_of_many_elements(backend):
    """s = max(r_i, c_j) over a larger matrix with ties and guards, against torch.median of s."""
    gen = torch.Generator().manual_seed(9)
    p = nn.Parameter(torch.randn(40, 30, generator=gen, dtype=torch.float64))
    with torch.no_grad():
        p[4], p[:, 6] = 0, 0
    opt = MERIT([p], lr=0.01, weight_decay=0.0, backend=backend)
    p.grad = torch.randn(40, 30, generator=gen, dtype=torch.float64)
    p.grad[:, 11] = 0
    ref = NaiveMERIT(p.detach().numpy(), 0.01, (0.9, 0.999), 1e-6, 0.0)
    ref.step(p.grad.numpy())
    opt.request_diagnostics()
    opt.step()
    got = opt.pop_diagnostics()
    s = torch.from_numpy(ref.s)
    assert got["trust_ratio_median/group0.0"] == pytest.approx(s.median().item(), rel=1e-6)  # float32 values
    assert got["trust_ratio_min/group0.0"] == pytest.approx(s.min().item(), rel=1e-6)
    assert got["trust_ratio_max/group0.0"] == pytest.approx(s.max().item(), rel=1e-6)


@pytest.mark.parametrize("option", ["lamb", "ratio_only_with_decay"])
def test_lamb_diagnostics_are_the_trust_ratio(option, backend):
    gen = torch.Generator().manual_seed(6)
    names = ["big_matrix", "vector", "zero_bias"]
    cases = [_case(name, gen) for name in names]
    params = [nn.Parameter(p0.clone()) for p0, _, _ in cases]
    wds = [0.1, 0.0, 0.0]
    opt = LAMB([{"params": [p], "names": [n], "weight_decay": wd} for p, n, wd in zip(params, names, wds)],
               lr=0.05, backend=backend, **LAMB_OPTIONS[option])
    refs = [NaiveLAMB(p0.numpy(), 0.05, (0.9, 0.999), 1e-6, wd, **LAMB_OPTIONS[option])
            for (p0, _, _), wd in zip(cases, wds)]
    for p, ref, (_, grads, _) in zip(params, refs, cases):
        p.grad = grads[0].clone()
        ref.step(grads[0].numpy())
    opt.request_diagnostics()
    opt.step()
    diagnostics = opt.pop_diagnostics()
    expected = {f"trust_ratio/{n}": ref.ratio for n, ref in zip(names, refs)}
    assert diagnostics == pytest.approx(expected, rel=1e-6)  # float32 values
    assert refs[2].ratio == 1.0  # the zero-initialised bias is guarded


@pytest.mark.parametrize("cls, options", [(MERIT, {}), (MERIT, {"norm": "l2", "maxlamb": True}),
                                          (LAMB, {}), (LAMB, {"bias_correction": True})])
def test_state_dict_round_trip_continues_bitwise(cls, options):
    gen = torch.Generator().manual_seed(3)
    shapes = [(5, 7), (7,), (3, 4, 2)]
    params = [nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]
    grads = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(10)]

    def make(ps):
        return cls([{"params": ps[:1], "weight_decay": 0.1}, {"params": ps[1:]}], lr=0.01, **options)

    def step(opt, ps, gs):
        for p, g in zip(ps, gs):
            p.grad = g.clone()
        opt.step()

    opt = make(params)
    for gs in grads[:5]:
        step(opt, params, gs)
    buf = io.BytesIO()  # through torch.save, as a checkpoint would, so nothing is shared
    torch.save(opt.state_dict(), buf)
    clones = [nn.Parameter(p.detach().clone()) for p in params]
    resumed = make(clones)
    resumed.load_state_dict(torch.load(io.BytesIO(buf.getvalue())))
    assert all(resumed.param_groups[1][key] == value for key, value in options.items())
    for gs in grads[5:]:
        step(opt, params, gs)
        step(resumed, clones, gs)
    for p, q in zip(params, clones):
        assert torch.equal(p, q)
        assert opt.state[p].keys() == resumed.state[q].keys() == {"step", "exp_avg", "exp_avg_sq"}
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(opt.state[p][key], resumed.state[q][key])
        assert resumed.state[q]["step"].item() == 10


def test_merit_loads_a_checkpoint_saved_before_the_ablation_options():
    p = nn.Parameter(torch.ones(2, 3))
    opt = MERIT([p], lr=0.1, norm="l2")
    saved = opt.state_dict()
    for option in ("maxlamb", "elementwise_clip", "weightwise_lower_bound", "norm"):
        del saved["param_groups"][0][option]
    opt.load_state_dict(saved)
    assert opt.param_groups[0]["norm"] == "l2" and opt.param_groups[0]["maxlamb"] is False


@pytest.mark.parametrize("cls", [MERIT, LAMB])
@pytest.mark.parametrize("kwargs, bad", [
    ({"lr": -0.1}, "-0.1"),
    ({"lr": float("nan")}, "nan"),
    ({"betas": (1.0, 0.999)}, "1.0"),
    ({"betas": (0.9, -0.5)}, "-0.5"),
    ({"eps": -1e-8}, "-1e-08"),
    ({"weight_decay": -0.01}, "-0.01"),
])
def test_rejects_invalid_hyperparameters(cls, kwargs, bad):
    p = nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match=bad):
        cls([p], **kwargs)
    with pytest.raises(ValueError, match=bad):  # a param group's own value is checked too
        cls([{"params": [p], **kwargs}])
    with pytest.raises(ValueError, match=bad):
        optim.build(cls.__name__.lower(), [p], **{"lr": 1e-3, **kwargs})


@pytest.mark.parametrize("cls, kwargs, bad", [
    (MERIT, {"norm": "l1"}, "'l1'"),
    (MERIT, {"maxlamb": "yes"}, "maxlamb.* 'yes'"),
    (MERIT, {"elementwise_clip": 0}, "elementwise_clip.* 0"),
    (MERIT, {"maxlamb": True, "weightwise_lower_bound": False}, "weightwise_lower_bound"),
    (LAMB, {"bias_correction": None}, "bias_correction: None"),
    (LAMB, {"ratio_only_with_decay": 1}, "ratio_only_with_decay.* 1"),
])
def test_rejects_invalid_options(cls, kwargs, bad):
    """The constructor refuses each (a ValueError); so does optim.build, a flag that is not a bool already
    in optim.settings (a TypeError: tests/test_optim_options.py)."""
    p = nn.Parameter(torch.zeros(3))
    if None not in kwargs.values():  # (build reads None as unset: the published or default value)
        with pytest.raises((ValueError, TypeError), match=bad):
            optim.build(cls.__name__.lower(), [p], lr=1e-3, **kwargs)
    with pytest.raises(ValueError, match=bad):
        cls([{"params": [p], **kwargs}])


@pytest.mark.parametrize("cls", [MERIT, LAMB])
def test_skips_params_without_grad_and_rejects_sparse_grads(cls):
    a, b = nn.Parameter(torch.ones(2, 3)), nn.Parameter(torch.ones(3))
    opt = cls([a, b], lr=0.1)
    b.grad = torch.ones(3)
    opt.step()
    assert torch.equal(a, torch.ones(2, 3)) and a not in opt.state
    assert not torch.equal(b, torch.ones(3))
    a.grad = torch.ones(2, 3).to_sparse()
    with pytest.raises(RuntimeError, match="sparse"):
        opt.step()


def test_failed_build_falls_back_with_one_warning(monkeypatch):
    from torch.utils import cpp_extension

    def no_compiler(*args, **kwargs):
        raise RuntimeError("long build log\n...\nError building extension 'nanomerit'")

    monkeypatch.setattr(cpp_extension, "load", no_compiler)
    kernels.build.cache_clear()
    optim.backends.common.warn_once.cache_clear()
    try:
        p = nn.Parameter(torch.ones(3, 4))
        with pytest.warns(RuntimeWarning, match="could not be built.*Error building extension") as record:
            for opt in (MERIT([p], lr=0.1), LAMB([p], lr=0.1)):  # building is part of creating an optimizer
                p.grad = torch.ones(3, 4)
                opt.step()
        assert len([w for w in record if "could not be built" in str(w.message)]) == 1
        assert torch.all(p < 1) and opt.backends() == {"group0": "torch"}
        with pytest.raises(RuntimeError, match="could not be built.*use optim_backend='auto' or 'torch'"):
            MERIT([p], lr=0.1, backend="cpp")
    finally:
        kernels.build.cache_clear()  # later tests build (load) the kernels again
        optim.backends.common.warn_once.cache_clear()


class TinyGPT(nn.Module):
    """Embeddings, a Linear, a LayerNorm and an LM head tied to the token embedding."""

    def __init__(self, head_first=False):
        super().__init__()
        if head_first:  # then named_parameters() reports the tied weight as "lm_head.weight"
            self.lm_head = nn.Linear(4, 11, bias=False)
        self.wte = nn.Embedding(11, 4)
        self.wpe = nn.Embedding(8, 4)
        self.fc = nn.Linear(4, 8)
        self.ln = nn.LayerNorm(4)
        if not head_first:
            self.lm_head = nn.Linear(4, 11, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        x = self.ln(self.wte(idx) + self.wpe(torch.arange(idx.shape[-1])))
        return self.lm_head(x) + self.fc(x).sum(-1, keepdim=True)


@pytest.mark.parametrize("head_first", [False, True])
def test_param_groups_tied_embedding_once_and_membership(head_first):
    model = TinyGPT(head_first)
    tied = "lm_head.weight" if head_first else "wte.weight"
    decay, no_decay = param_groups(model, 0.1)
    assert decay["names"] == ["fc.weight"]
    assert sorted(no_decay["names"]) == sorted(
        [tied, "wpe.weight", "fc.bias", "ln.weight", "ln.bias"])
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0)
    all_params = decay["params"] + no_decay["params"]
    assert len({id(p) for p in all_params}) == len(all_params) == len(list(model.parameters()))
    for group in (decay, no_decay):
        assert [dict(model.named_parameters())[n] for n in group["names"]] == group["params"]

    decay, no_decay = param_groups(model, 0.1, decay_embeddings=True)
    assert sorted(decay["names"]) == sorted(["fc.weight", tied, "wpe.weight"])
    assert sorted(no_decay["names"]) == ["fc.bias", "ln.bias", "ln.weight"]


@pytest.mark.parametrize("name", ["adamw", "lamb", "merit"])
def test_both_groups_exist_even_when_one_is_empty(name):
    model = nn.LayerNorm(4)  # no matrix: the decay group is empty
    opt = optim.build(name, model, lr=1e-3, weight_decay=0.1)
    assert [g["names"] for g in opt.param_groups] == [[], ["weight", "bias"]]
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    optim.build(name, model, lr=1e-3, weight_decay=0.1).load_state_dict(opt.state_dict())


def test_param_groups_leave_out_frozen_params():
    model = TinyGPT()
    model.wpe.weight.requires_grad_(False)
    names = [n for g in param_groups(model, 0.1) for n in g["names"]]
    assert "wpe.weight" not in names and "wte.weight" in names


@pytest.mark.parametrize("name", ["adamw", "lamb", "merit"])
def test_built_optimizer_keeps_names_through_state_dict(name):
    model = TinyGPT()
    opt = optim.build(name, model, lr=1e-3, weight_decay=0.1)
    model(torch.tensor([[1, 2, 3]])).sum().backward()
    opt.step()
    saved = opt.state_dict()
    expected = [g["names"] for g in param_groups(model, 0.1)]
    assert [g["names"] for g in saved["param_groups"]] == expected
    resumed = optim.build(name, model, lr=1e-3, weight_decay=0.1)
    resumed.load_state_dict(saved)
    assert [g["names"] for g in resumed.param_groups] == [g["names"] for g in opt.param_groups]


def test_build_adamw_matches_torch_adamw_stepped_by_hand():
    torch.manual_seed(0)
    model = TinyGPT().double()
    twin = TinyGPT().double()
    twin.load_state_dict(model.state_dict())
    opt = optim.build("adamw", model, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95))
    assert opt.defaults["fused"] is True  # CPU fp64/fp32 have torch's fused kernel
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    by_hand = torch.optim.AdamW(
        [{"params": [twin.fc.weight], "weight_decay": 0.1},
         {"params": [twin.wte.weight, twin.wpe.weight, twin.fc.bias, twin.ln.weight, twin.ln.bias],
          "weight_decay": 0.0}],
        lr=1e-2, betas=(0.9, 0.95), eps=1e-8, fused=True)
    for _ in range(5):
        idx = torch.randint(0, 8, (2, 5))
        for m, o in ((model, opt), (twin, by_hand)):
            o.zero_grad()
            m(idx).square().mean().backward()
            o.step()
    for (n, p), (_, q) in zip(model.named_parameters(), twin.named_parameters()):
        assert torch.equal(p, q), n


def test_build_adamw_falls_back_to_foreach_without_fused_kernel():
    opt = optim.build("adamw", [nn.Parameter(torch.empty(2, 2, device="meta"))], lr=1e-3)
    assert opt.defaults["foreach"] is True and not opt.defaults["fused"]


def test_build_gets_the_published_settings_unless_told_otherwise():
    """A library call resolves as train.py does: what it sets, else the published GPT-2 values
    (the numbers in docs/optimizers.md), else the constructor's; defaults="constructor" skips the
    published ones."""
    model = TinyGPT()
    merit = optim.build("MERIT", model, lr=2e-4)
    assert isinstance(merit, MERIT)
    assert (merit.defaults["betas"], merit.defaults["eps"], merit.param_groups[0]["weight_decay"]) == (
        (0.9, 0.95), 1e-6, 1e-2)
    adamw = optim.build("adamw", model, lr=2e-4)
    assert (adamw.defaults["betas"], adamw.defaults["eps"], adamw.param_groups[0]["weight_decay"]) == (
        (0.9, 0.95), 1e-8, 0.1)
    # Muon: Moonlight's recipe (AdamW's lr rule, decay 0.1, betas (0.9, 0.95)), as a config gets it.
    muon = optim.build("muon", model, lr=2e-4)
    assert (muon.defaults["adjust_lr"], muon.defaults["weight_decay"], muon.defaults["betas"]) == (
        "match_rms_adamw", 0.1, (0.9, 0.95))
    config = resolve_config(load_config(None, ["--optimizer=muon", "--lr=2e-4", "--max_steps=1"]))
    assert optim.build(config.optimizer_settings, model).defaults == muon.defaults
    constructor = optim.build("merit", model, lr=2e-4, defaults="constructor")
    assert (constructor.defaults["betas"], constructor.param_groups[0]["weight_decay"]) == ((0.9, 0.999), 0.0)
    merit = optim.build("merit", model, lr=2e-4, betas=[0.9, 0.95], eps=1e-8)
    assert (merit.defaults["betas"], merit.defaults["eps"]) == ((0.9, 0.95), 1e-8)
    lamb = optim.build("lamb", model, lr=2e-4, weight_decay=0.1, bias_correction=True)
    assert isinstance(lamb, LAMB) and lamb.defaults["bias_correction"] is True
    assert (lamb.defaults["betas"], lamb.defaults["eps"]) == ((0.9, 0.95), 1e-6)
    # A config's optimizer_options select the ablations; every group gets them.
    merit = optim.build("merit", model, lr=2e-4, maxlamb=True, norm="l2")
    assert all(g["maxlamb"] is True and g["norm"] == "l2" for g in merit.param_groups)
    with pytest.raises(TypeError, match="needs lr"):
        optim.build("merit", model)
    with pytest.raises(TypeError, match="Settings or hyper-parameters, not both"):
        optim.build(config.optimizer_settings, model, lr=1.0)


def test_build_rejects_unknown_names_and_options():
    model = TinyGPT()
    with pytest.raises(ValueError, match="'unknown'.*valid names: adafactor, adamw, adamw_schedulefree, .*merit"):
        optim.build("unknown", model, lr=1e-3)
    with pytest.raises(ValueError, match="did you mean 'merit'"):
        optim.build("merti", model, lr=1e-3)
    with pytest.raises(TypeError, match="'betaz'.*did you mean 'betas'"):
        optim.build("merit", model, lr=1e-3, betaz=(0.9, 0.95))
    with pytest.raises(ValueError, match="decay_embeddings"):
        optim.build("merit", list(model.parameters()), lr=1e-3, decay_embeddings=True)
