"""Tests of the sign-based optimizers (Lion, Sophia-G) against naive float64 transcriptions of
docs/optimizers.md on each backend of their steps (the C++ kernels, the Triton kernels in
Triton's interpreter, the torch reference), their diagnostics, state_dict round trips and build()."""
import copy
import io
import math

import numpy as np
import pytest
import torch
from torch import nn

import optim
from helpers import require_backend
from optim import Lion, SophiaG

STEPS = 20


def sign(x: float) -> int:
    return int(x > 0) - int(x < 0)


class NaiveLion:
    """docs/optimizers.md's Lion element by element in float64, written only from the spec."""

    def __init__(self, p, lr, betas, wd):
        self.p = np.array(p, dtype=np.float64)
        self.m = np.zeros_like(self.p)
        self.lr, (self.b1, self.b2), self.wd = lr, betas, wd

    def step(self, g):
        p, m = self.p, self.m
        for i in np.ndindex(p.shape):
            p[i] = p[i] * (1 - self.lr * self.wd)
            c = self.b1 * m[i] + (1 - self.b1) * g[i]
            p[i] = p[i] - self.lr * sign(c)
            m[i] = self.b2 * m[i] + (1 - self.b2) * g[i]


class NaiveSophiaG:
    """docs/optimizers.md's Sophia-G element by element in float64, written only from the spec."""

    def __init__(self, p, lr, betas, rho, wd, bs):
        self.p = np.array(p, dtype=np.float64)
        self.m = np.zeros_like(self.p)
        self.h = np.zeros_like(self.p)
        self.lr, (self.b1, self.b2), self.rho, self.wd, self.bs = lr, betas, rho, wd, bs
        self.wins = self.total = 0
        self.win_rate = None  # of the last step

    def step(self, g):
        p, m, h = self.p, self.m, self.h
        wins = 0
        for i in np.ndindex(p.shape):
            p[i] = p[i] * (1 - self.lr * self.wd)
            m[i] = self.b1 * m[i] + (1 - self.b1) * g[i]
            p[i] = p[i] - self.lr * sign(m[i]) * min(abs(m[i]) / (self.rho * self.bs * h[i] + 1e-15), 1)
            wins += abs(m[i]) < self.rho * self.bs * h[i]
        self.win_rate = wins / p.size
        self.wins += wins
        self.total += p.size

    def update_hessian(self, g):
        for i in np.ndindex(self.p.shape):
            self.h[i] = self.b2 * self.h[i] + (1 - self.b2) * g[i] * g[i]


def _data(seed):
    """Initial (matrix, vector) and STEPS gradients for each, in float64."""
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)  # noqa: E731
    p0 = (rand(5, 7), rand(4))
    grads = [(rand(5, 7) * (1 + k % 3), rand(4)) for k in range(STEPS)]
    return p0, grads


def _groups(a, b, **b_overrides):
    """Two groups: a matrix with decay and the defaults, a vector with its own hyper-parameters."""
    return [{"params": [a], "names": ["a"], "weight_decay": 0.1},
            {"params": [b], "names": ["b"], "lr": 0.02, "betas": (0.8, 0.95), **b_overrides}]


def _assert_close(ours, theirs):
    assert np.abs(ours.detach().numpy() - theirs).max() <= 1e-10


def test_lion_matches_naive_reference(backend):
    (pa, pb), grads = _data(0)
    a, b = nn.Parameter(pa.clone()), nn.Parameter(pb.clone())
    opt = Lion(_groups(a, b), lr=0.05, backend=backend)
    refs = (NaiveLion(pa.numpy(), 0.05, (0.9, 0.99), 0.1), NaiveLion(pb.numpy(), 0.02, (0.8, 0.95), 0.0))
    for gs in grads:
        a.grad, b.grad = (g.clone() for g in gs)
        opt.step()
        for p, ref, g in zip((a, b), refs, gs):
            ref.step(g.numpy())
            _assert_close(p, ref.p)
            _assert_close(opt.state[p]["exp_avg"], ref.m)


def _run_sophia(batch_tokens, backend, interval=3, seed=1, steps=STEPS):
    """Sophia-G and its naive references over ``steps`` steps with fake Hessian gradients."""
    (pa, pb), grads = _data(seed)
    gen = torch.Generator().manual_seed(seed + 100)
    hess_grads = [(torch.randn(5, 7, generator=gen, dtype=torch.float64),
                   torch.randn(4, generator=gen, dtype=torch.float64)) for _ in range(steps)]
    a, b = nn.Parameter(pa.clone()), nn.Parameter(pb.clone())
    opt = SophiaG(_groups(a, b, rho=0.08), lr=0.05, batch_tokens=batch_tokens,
                  hessian_interval=interval, backend=backend)
    refs = (NaiveSophiaG(pa.numpy(), 0.05, (0.965, 0.99), 0.04, 0.1, batch_tokens),
            NaiveSophiaG(pb.numpy(), 0.02, (0.8, 0.95), 0.08, 0.0, batch_tokens))
    for step in range(1, steps + 1):
        a.grad, b.grad = (g.clone() for g in grads[step - 1])
        opt.step()
        for ref, g in zip(refs, grads[step - 1]):
            ref.step(g.numpy())
        if opt.extra_pass_due(step):
            a.grad, b.grad = (g.clone() for g in hess_grads[step - 1])
            opt.update_hessian()
            for ref, g in zip(refs, hess_grads[step - 1]):
                ref.update_hessian(g.numpy())
        for p, ref in zip((a, b), refs):
            state = opt.state[p]
            for ours, theirs in ((p, ref.p), (state["exp_avg"], ref.m), (state["hessian"], ref.h)):
                _assert_close(ours, theirs)
    assert opt.state[a]["step"].item() == steps
    return opt, (a, b), refs


def test_sophia_matches_naive_reference_and_follows_batch_tokens(backend):
    finals = []
    for batch_tokens in (64, 512, 4096):
        _, (a, b), refs = _run_sophia(batch_tokens, backend)
        finals.append(torch.cat([a.detach().flatten(), b.detach().flatten()]))
        if batch_tokens == 512:  # the clip must have been exercised both ways
            assert all(0 < ref.wins < ref.total for ref in refs)
    # bs scales the Hessian term, so every batch size gives a different trajectory.
    assert not torch.equal(finals[0], finals[1]) and not torch.equal(finals[1], finals[2])


def test_sophia_before_first_hessian_update_is_clipped_sign_momentum(backend):
    p = nn.Parameter(torch.zeros(4, dtype=torch.float64))
    opt = SophiaG([p], lr=0.1, batch_tokens=1000, backend=backend)
    p.grad = torch.tensor([2.0, -3.0, 0.0, 1e-14], dtype=torch.float64)
    opt.step()
    # h = 0: sign-momentum steps, except where |m| is below the 1e-15 guard (m = 0.035e-14).
    expected = [-0.1, 0.1, 0.0, -0.1 * (1 - 0.965) * 1e-14 / 1e-15]
    assert np.abs(p.detach().numpy() - expected).max() <= 1e-15


@pytest.mark.parametrize("interval, expected", [(10, [10, 20, 30]), (7, [7, 14, 21, 28])])
def test_sophia_hessian_schedule(interval, expected):
    opt = SophiaG([nn.Parameter(torch.zeros(2))], batch_tokens=1, hessian_interval=interval)
    assert [s for s in range(1, 31) if opt.extra_pass_due(s)] == expected
    assert SophiaG([nn.Parameter(torch.zeros(2))], batch_tokens=1).hessian_interval == 10


def test_lion_has_no_diagnostics_of_its_own(backend):
    (pa, pb), grads = _data(2)
    a, b = nn.Parameter(pa.clone()), nn.Parameter(pb.clone())
    opt = Lion(_groups(a, b), lr=0.05, backend=backend)
    a.grad, b.grad = (g.clone() for g in grads[0])
    opt.request_diagnostics()
    opt.step()
    assert opt.pop_diagnostics() == {}  # update sizes are the training loop's (training/instruments.py)


def test_sophia_diagnostics_are_hand_computed(backend):
    opt, (a, b), refs = _run_sophia(512, backend, steps=7)
    gen = torch.Generator().manual_seed(5)
    gs = tuple(torch.randn(shape, generator=gen, dtype=torch.float64) for shape in ((5, 7), (4,)))
    a.grad, b.grad = (g.clone() for g in gs)
    opt.request_diagnostics()
    opt.step()
    for ref, g in zip(refs, gs):
        ref.step(g.numpy())
    diagnostics = opt.pop_diagnostics()
    assert diagnostics.keys() == {"win_rate/a", "win_rate/b", "hessian_norm/a", "hessian_norm/b"}
    for name, ref in zip("ab", refs):
        assert diagnostics[f"win_rate/{name}"] == pytest.approx(ref.win_rate, rel=1e-6)
        assert diagnostics[f"hessian_norm/{name}"] == pytest.approx(math.sqrt(np.sum(ref.h ** 2)), rel=1e-6)
    assert min(diagnostics["hessian_norm/a"], diagnostics["hessian_norm/b"]) > 0
    assert 0 < refs[0].win_rate < 1  # a value the hand count can get wrong


def test_adamw_runs_step_hooks_once():
    torch.optim.AdamW([nn.Parameter(torch.zeros(1))])  # torch hooks its own AdamW.step now
    p = nn.Parameter(torch.ones(3))
    opt = optim.build("adamw", [p], lr=0.1)
    calls = []
    opt.register_step_pre_hook(lambda *_: calls.append("pre"))
    opt.register_step_post_hook(lambda *_: calls.append("post"))
    for requested in (False, True):
        if requested:
            opt.request_diagnostics()
        p.grad = torch.ones(3)
        opt.step()
    assert calls == ["pre", "post"] * 2


# The kernels against the torch reference in the dtypes they serve, on tensors longer than a SIMD width
# and than one thread's share, with decay and without, b1 on both sides of torch's lerp switch.
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("name", ["lion", "sophiag"])
@pytest.mark.parametrize("kernel", ["cpp", pytest.param("triton", marks=pytest.mark.slow)])  # (Triton's interpreter: seconds a case)
def test_kernels_match_the_torch_reference(kernel, name, dtype, tol):
    require_backend(kernel)
    gen = torch.Generator().manual_seed(12)
    # (Longer than the C++ kernels' share per thread; for Triton's interpreter, slow per program, more
    # than four of its 1,024-element blocks.)
    shapes = [(67, 45), (70000,) if kernel == "cpp" else (5000,), (5,)]
    p0 = [torch.randn(s, generator=gen) for s in shapes]
    grads = [[torch.randn(s, generator=gen) * (1 + k) for s in shapes] for k in range(6)]
    results = []
    for backend in (kernel, "torch"):
        params = [nn.Parameter(p.to(dtype)) for p in p0]
        groups = [{"params": params[:2], "weight_decay": 0.1}, {"params": params[2:], "betas": (0.3, 0.9)}]
        opt = (Lion(groups, lr=0.01, backend=backend) if name == "lion"
               else SophiaG(groups, lr=0.01, batch_tokens=64, hessian_interval=2, backend=backend))
        for k, gs in enumerate(grads):
            for p, g in zip(params, gs):
                p.grad = g.to(dtype)
            opt.step()
            if name == "sophiag" and opt.extra_pass_due(k + 1):
                for p, g in zip(params, gs):
                    p.grad = g.to(dtype) * 0.1
                opt.update_hessian()
        results.append([(p, *(v for v in opt.state[p].values() if v.dim())) for p in params])
    for fast, slow in zip(*results):
        for x, y in zip(fast, slow):
            torch.testing.assert_close(x.float(), y.float(), rtol=tol, atol=tol * y.float().abs().max().item())


@pytest.mark.parametrize("name", ["sophiag"])  # AdamW and Lion have no diagnostics of their own
def test_diagnostics_do_not_change_the_update(name):
    gen = torch.Generator().manual_seed(4)
    params = [nn.Parameter(torch.randn(s, generator=gen)) for s in ((6, 5), (5,))]
    twins = [nn.Parameter(p.detach().clone()) for p in params]
    opts = [optim.build(name, ps, lr=0.01, weight_decay=0.1, batch_tokens=64) for ps in (params, twins)]
    for step in range(1, 7):
        grads = [torch.randn(p.shape, generator=gen) for p in params]
        opts[1].request_diagnostics()
        for opt, ps in zip(opts, (params, twins)):
            for p, g in zip(ps, grads):
                p.grad = g.clone()
            opt.step()
            if isinstance(opt, SophiaG) and opt.extra_pass_due(step):
                opt.update_hessian()
        assert opts[1].pop_diagnostics()
        for p, q in zip(params, twins):
            assert torch.equal(p, q)


def _make(name, ps):
    groups = [{"params": ps[:1], "weight_decay": 0.1}, {"params": ps[1:]}]
    if name == "lion":
        return Lion(groups, lr=0.01)
    return SophiaG(groups, lr=0.01, batch_tokens=256, hessian_interval=2)


@pytest.mark.parametrize("name, keys", [("lion", {"exp_avg"}), ("sophiag", {"step", "exp_avg", "hessian"})])
def test_state_dict_round_trip_continues_bitwise(name, keys):
    gen = torch.Generator().manual_seed(3)
    shapes = [(5, 7), (7,), (3, 4, 2)]
    params = [nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]
    grads = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(10)]

    def step(opt, ps, k):
        for p, g in zip(ps, grads[k]):
            p.grad = g.clone()
        opt.step()
        if isinstance(opt, SophiaG) and opt.extra_pass_due(k + 1):
            for p, g in zip(ps, grads[k]):
                p.grad = g.square()
            opt.update_hessian()

    opt = _make(name, params)
    for k in range(5):
        step(opt, params, k)
    buf = io.BytesIO()  # through torch.save, as a checkpoint would, so nothing is shared
    torch.save(opt.state_dict(), buf)
    clones = [nn.Parameter(p.detach().clone()) for p in params]
    resumed = _make(name, clones)
    resumed.load_state_dict(torch.load(io.BytesIO(buf.getvalue())))
    for k in range(5, 10):
        step(opt, params, k)
        step(resumed, clones, k)
    for p, q in zip(params, clones):
        assert torch.equal(p, q)
        assert opt.state[p].keys() == resumed.state[q].keys() == keys
        for key in keys:
            assert torch.equal(opt.state[p][key], resumed.state[q][key])


@pytest.mark.parametrize("name", ["lion", "sophiag"])
def test_skips_params_without_grad_rejects_sparse_grads_and_deepcopies(name):
    a, b = nn.Parameter(torch.ones(2, 3)), nn.Parameter(torch.ones(3))
    opt = _make(name, [a, b])
    b.grad = torch.ones(3)
    opt.step()
    assert torch.equal(a, torch.ones(2, 3)) and a not in opt.state
    assert not torch.equal(b, torch.ones(3))
    twin = copy.deepcopy(opt)  # unpickling skips __init__: its attributes must survive
    twin.param_groups[1]["params"][0].grad = torch.ones(3)
    twin.step()
    if name == "sophiag":
        assert (twin.batch_tokens, twin.hessian_interval) == (256, 2)
    a.grad = torch.ones(2, 3).to_sparse()
    with pytest.raises(RuntimeError, match="sparse"):
        opt.step()


COMMON_INVALID = [({"lr": -0.1}, "-0.1"), ({"lr": float("nan")}, "nan"), ({"betas": (1.0, 0.99)}, "1.0"),
                  ({"betas": (0.9, -0.5)}, "-0.5"), ({"weight_decay": -0.01}, "-0.01")]


@pytest.mark.parametrize("name, kwargs, bad", [
    *[("lion", kw, bad) for kw, bad in COMMON_INVALID],
    *[("sophiag", kw, bad) for kw, bad in COMMON_INVALID],
    ("sophiag", {"rho": -0.04}, "-0.04"),
    ("sophiag", {"eps": -1e-15}, "-1e-15"),
    ("sophiag", {"eps": 0.0}, "0.0"),
])
def test_invalid_hyperparameters_raise_naming_the_value(name, kwargs, bad):
    p = nn.Parameter(torch.zeros(3))
    context = {"batch_tokens": 64} if name == "sophiag" else {}
    cls = {"lion": Lion, "sophiag": SophiaG}[name]
    with pytest.raises(ValueError, match=bad):
        cls([p], **kwargs, **context)
    with pytest.raises(ValueError, match=bad):  # a param group's own value is checked too
        cls([{"params": [p], **kwargs}], **context)
    with pytest.raises(ValueError, match=bad):
        optim.build(name, [p], **{"lr": 1e-3, **kwargs}, **context)


@pytest.mark.parametrize("kwargs, match", [
    ({}, "batch_tokens=None"), ({"batch_tokens": 0}, "batch_tokens=0"),
    ({"batch_tokens": -5}, "batch_tokens=-5"),
    ({"batch_tokens": 64, "hessian_interval": 0}, "hessian_interval: 0"),
    ({"batch_tokens": 64, "hessian_interval": 2.5}, "hessian_interval: 2.5"),
])
def test_sophia_rejects_invalid_context(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SophiaG([nn.Parameter(torch.zeros(3))], **kwargs)


def test_build_registers_lion_and_sophia_with_batch_tokens_as_context():
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8))
    assert {"lion", "sophiag"} <= set(optim.available())
    lion = optim.build("Lion", model, lr=1e-4, weight_decay=0.5)
    assert isinstance(lion, Lion) and lion.defaults["betas"] == (0.9, 0.99)
    assert [g["weight_decay"] for g in lion.param_groups] == [0.5, 0.0]
    with pytest.raises(ValueError, match="batch_tokens"):
        optim.build("sophiag", model, lr=6e-4)
    sophia = optim.build("sophiag", model, lr=6e-4, batch_tokens=480 * 1024, rho=0.05, hessian_interval=5)
    assert isinstance(sophia, SophiaG) and sophia.batch_tokens == 480 * 1024
    assert (sophia.defaults["betas"], sophia.defaults["rho"]) == ((0.965, 0.99), 0.05)
    assert sophia.hessian_interval == 5
    for name in ("adamw", "merit"):  # context the optimizer does not take is ignored
        optim.build(name, model, lr=1e-3, batch_tokens=4096)
    with pytest.raises(TypeError, match="'rho'"):
        optim.build("lion", model, lr=1e-4, rho=0.05)
