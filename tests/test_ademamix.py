"""optim/ademamix.py: AdEMAMix against a naive float64 transcription of the rule and the authors'
warmup schedules (apple/ml-ademamix) on each backend of its fused step, against the reference
package ``pytorch_optimizer.AdEMAMix``, its schedules at hand-computed steps, state round trips,
refusals and build(). (A step dropped on the device: tests/test_optim_skip.py; the update
statistics: tests/test_instruments.py.)

Where ``pytorch_optimizer.AdEMAMix`` (4.1) differs from the authors' code:
* weight decay: L2 (added to the gradient before the moments) by default; with
  ``weight_decouple=True`` it is ``p *= 1 - lr*wd`` before the update, the authors' ``+ wd*p``
  inside the update (with p before the step) up to rounding;
* one warmup length ``t_alpha_beta3`` for both alpha and b3 (the authors: two);
* its b3 schedule is the authors' half-life interpolation in closed form, without the 1e-8 the
  authors add inside ln(b) (1e-7 relative in ln 0.9, 1e-5 in ln 0.999), and fails for b1 = 0;
* alpha defaults to 5 (the authors: 2), the step counter is per group (the authors': per
  parameter), and the operations' order differs (lerp, addcdiv): rounding only.
"""
import copy
import io
import math

import numpy as np
import pytest
import torch
from pytorch_optimizer import AdEMAMix as PackageAdEMAMix
from torch import nn

import optim
from optim import AdEMAMix
from optim import ademamix as ademamix_module

STEPS = 20


class NaiveAdEMAMix:
    """AdEMAMix element by element in float64, written from the rule and the authors' schedules."""

    def __init__(self, p, lr, betas, alpha, alpha_warmup, beta3_warmup, wd, eps=1e-8):
        self.p = np.array(p, dtype=np.float64)
        self.m1, self.m2, self.v = np.zeros_like(self.p), np.zeros_like(self.p), np.zeros_like(self.p)
        self.lr, (self.b1, self.b2, self.b3), self.alpha, self.wd, self.eps = lr, betas, alpha, wd, eps
        self.alpha_warmup, self.beta3_warmup, self.t = alpha_warmup, beta3_warmup, 0

    def schedules(self, t):
        alpha = self.alpha * min(t / self.alpha_warmup, 1.0) if self.alpha_warmup else self.alpha
        if t >= self.beta3_warmup:
            return alpha, self.b3
        # Linear in half-life: the number of steps h with b^h = 1/2 (the authors' f(b) = h - 1).
        half_life = lambda b: math.log(0.5) / math.log(b + 1e-8)  # noqa: E731
        a = t / self.beta3_warmup
        return alpha, 0.5 ** (1 / ((1 - a) * half_life(self.b1) + a * half_life(self.b3)))

    def step(self, g):
        self.t += 1
        alpha, b3 = self.schedules(self.t)
        p, m1, m2, v = self.p, self.m1, self.m2, self.v
        for i in np.ndindex(p.shape):
            m1[i] = self.b1 * m1[i] + (1 - self.b1) * g[i]
            m2[i] = b3 * m2[i] + (1 - b3) * g[i]
            v[i] = self.b2 * v[i] + (1 - self.b2) * g[i] * g[i]
            m1_hat = m1[i] / (1 - self.b1 ** self.t)
            denom = math.sqrt(v[i] / (1 - self.b2 ** self.t)) + self.eps
            p[i] = p[i] - self.lr * ((m1_hat + alpha * m2[i]) / denom + self.wd * p[i])


def _data(seed):
    """A (6, 5) matrix with a zero row and a zero column, a vector, and STEPS gradients of each
    (zero in the matrix's row 1, its zero row, and in its column 4), in float64."""
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)  # noqa: E731
    matrix = rand(6, 5)
    matrix[1], matrix[:, 2] = 0.0, 0.0
    grads = []
    for k in range(STEPS):
        g = rand(6, 5) * (1 + k % 3)
        g[1], g[:, 4] = 0.0, 0.0
        grads.append((g, rand(4) * 1e-3))  # (small: eps matters)
    return (matrix, rand(4)), grads


def test_matches_naive_reference_with_both_warmups_ending_inside_the_run(backend):
    (pa, pb), grads = _data(0)
    a, b = nn.Parameter(pa.clone()), nn.Parameter(pb.clone())
    # Group b: b1 = 0 (the authors' 1e-8 keeps its half-life finite), the run's steps as warmup.
    opt = AdEMAMix([{"params": [a], "weight_decay": 0.1, "alpha_warmup": 5, "beta3_warmup": 12},
                    {"params": [b], "lr": 0.02, "betas": (0.0, 0.95), "beta3": 0.99, "alpha": 3.0,
                     "alpha_warmup": 0, "beta3_warmup": None}],
                   lr=0.05, betas=(0.9, 0.99), beta3=0.999, alpha=5.0, run_steps=15, backend=backend)
    refs = (NaiveAdEMAMix(pa.numpy(), 0.05, (0.9, 0.99, 0.999), 5.0, 5, 12, 0.1),
            NaiveAdEMAMix(pb.numpy(), 0.02, (0.0, 0.95, 0.99), 3.0, 0, 15, 0.0))
    for gs in grads:
        a.grad, b.grad = (g.clone() for g in gs)
        opt.step()
        for p, ref, g in zip((a, b), refs, gs):
            ref.step(g.numpy())
            state = opt.state[p]
            for ours, theirs in ((p, ref.p), (state["exp_avg_fast"], ref.m1), (state["exp_avg_slow"], ref.m2),
                                 (state["exp_avg_sq"], ref.v)):
                assert np.abs(ours.detach().numpy() - theirs).max() <= 1e-10
    assert opt.state[a]["step"].item() == STEPS
    assert (a[1] == 0).all()  # zero weights with zero gradients stay zero
    assert (a[:, 2] != 0).any()  # a zero column with gradients moves


def _against_package(seed, warmup):
    """Ours (torch backend) and the package with matching options, float64, STEPS steps."""
    gen = torch.Generator().manual_seed(seed)
    shapes = [(5, 7), (7,)]
    p0 = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
    ours_p, theirs_p = [nn.Parameter(t.clone()) for t in p0], [nn.Parameter(t.clone()) for t in p0]
    ours = AdEMAMix(ours_p, lr=0.01, betas=(0.9, 0.99), beta3=0.999, alpha=5.0, alpha_warmup=warmup or 0,
                    beta3_warmup=warmup or 0, weight_decay=0.1, backend="torch")
    theirs = PackageAdEMAMix(theirs_p, lr=0.01, betas=(0.9, 0.99, 0.999), alpha=5.0, t_alpha_beta3=warmup,
                             weight_decay=0.1, weight_decouple=True, foreach=False)
    for _ in range(STEPS):
        for p, q in zip(ours_p, theirs_p):
            p.grad = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            q.grad = p.grad.clone()
        ours.step()
        theirs.step()
    return ours, theirs, ours_p, theirs_p


def _assert_same_up_to_rounding(ours, theirs, ours_p, theirs_p):
    # float64: the two orders of the same operations differ by a few ulps over 20 steps (measured
    # 1e-15 on |p| ~ 2); 1e-13 leaves room and is far below any difference of the rule.
    for p, q in zip(ours_p, theirs_p):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-13)
        for key, their_key in (("exp_avg_fast", "exp_avg"), ("exp_avg_slow", "exp_avg_slow"),
                               ("exp_avg_sq", "exp_avg_sq")):
            torch.testing.assert_close(ours.state[p][key], theirs.state[q][their_key], rtol=0, atol=1e-13)


def test_matches_the_package_without_warmups():
    _assert_same_up_to_rounding(*_against_package(1, None))


def test_matches_the_package_with_warmups_given_its_schedules(monkeypatch):
    # With warmups the package's b3 schedule lacks the authors' 1e-8 inside ln (measured: 1e-7 in p
    # after 20 steps), so the update rule is held against it with the package's own schedules...
    monkeypatch.setattr(ademamix_module, "beta3_at", lambda t, b1, b3, warmup: PackageAdEMAMix.schedule_beta3(
        warmup, t, b1, b3))
    monkeypatch.setattr(ademamix_module, "alpha_at", lambda t, alpha, warmup: PackageAdEMAMix.schedule_alpha(
        warmup, t, alpha))
    _assert_same_up_to_rounding(*_against_package(2, 8))


@pytest.mark.parametrize("step", [1, 2, 5, 7, 8, 9])
def test_schedules_differ_from_the_package_s_only_by_the_authors_1e8(step):
    # ... and the schedules against each other: alpha to rounding (t*alpha/T against t/T*alpha),
    # b3 by the 1e-8: it moves ln(0.999) by 1e-8/0.999, 1e-5 of it, so the half-life ln 0.5 / ln(b3_t)
    # by at most 1e-5 relative (measured 7e-8 in b3_t at t = 1).
    half_life = lambda b: math.log(0.5) / math.log(b)  # noqa: E731
    ours, theirs = ademamix_module.beta3_at(step, 0.9, 0.999, 8), PackageAdEMAMix.schedule_beta3(8, step, 0.9, 0.999)
    assert half_life(ours) == pytest.approx(half_life(theirs), rel=1.1e-5)
    assert ademamix_module.alpha_at(step, 5.0, 8) == pytest.approx(PackageAdEMAMix.schedule_alpha(8, step, 5.0),
                                                                   rel=1e-15)


def test_schedules_at_hand_computed_steps():
    alpha_at, beta3_at = ademamix_module.alpha_at, ademamix_module.beta3_at
    assert [alpha_at(t, 8.0, 4) for t in range(1, 7)] == [2.0, 4.0, 6.0, 8.0, 8.0, 8.0]
    assert alpha_at(1, 8.0, 0) == 8.0 and beta3_at(1, 0.9, 0.999, 0) == 0.999  # 0: no warmup
    # Half-lives h(b) = ln 0.5 / ln(b + 1e-8): h(0.9) = 6.578814173, h(0.999) = 692.8074807. Over
    # T = 4 steps the half-life at t is (1 - t/4) h(0.9) + t/4 h(0.999), and b3 = 0.5^(1/h):
    # t = 1: h = 178.1359808, b3 = 0.9961164479; t = 2: 349.6931474, 0.9980198049;
    # t = 3: 521.2503141, 0.9986711058; t >= 4: b3 = 0.999.
    assert [beta3_at(t, 0.9, 0.999, 4) for t in (1, 2, 3)] == pytest.approx(
        [0.9961164479, 0.9980198049, 0.9986711058], rel=0, abs=1e-10)
    assert beta3_at(4, 0.9, 0.999, 4) == beta3_at(50, 0.9, 0.999, 4) == 0.999
    # From b1 = 0: h(0) = 0.0376287495 (the 1e-8 keeps it finite); t = 1 of 10 towards 0.99
    # (h = 68.96756...): h = 0.9 * 0.0376287495 + 0.1 * 68.967563 = 6.930623, b3 = 0.9048264174.
    assert beta3_at(1, 0.0, 0.99, 10) == pytest.approx(0.9048264174, rel=0, abs=1e-10)


def _run(params, grads, opt, steps):
    for k in steps:
        for p, g in zip(params, grads[k]):
            p.grad = g.clone()
        opt.step()


def _make(params, backend="auto"):
    # Both warmups (over the run's 8 steps) are still going at the save.
    return AdEMAMix([{"params": params[:1], "weight_decay": 0.1}, {"params": params[1:], "alpha_warmup": 3}],
                    lr=0.01, beta3=0.999, alpha=8.0, alpha_warmup=None, beta3_warmup=None, run_steps=8,
                    backend=backend)


@pytest.mark.parametrize("through", ["torch.save", "deepcopy"])
def test_state_dict_round_trip_continues_bitwise(through):
    gen = torch.Generator().manual_seed(3)
    shapes = [(5, 7), (7,), (3, 4, 2)]
    params = [nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]
    grads = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(10)]
    opt = _make(params)
    _run(params, grads, opt, range(5))
    clones = [nn.Parameter(p.detach().clone()) for p in params]
    if through == "torch.save":  # as a checkpoint would, so nothing is shared
        buf = io.BytesIO()
        torch.save(opt.state_dict(), buf)
        resumed = _make(clones)
        resumed.load_state_dict(torch.load(io.BytesIO(buf.getvalue())))
    else:
        resumed = copy.deepcopy(opt)  # unpickling skips __init__: run_steps must survive
        clones = [p for group in resumed.param_groups for p in group["params"]]
        assert resumed.run_steps == 8
    _run(params, grads, opt, range(5, 10))
    _run(clones, grads, resumed, range(5, 10))
    keys = {"step", "exp_avg_fast", "exp_avg_slow", "exp_avg_sq"}
    for p, q in zip(params, clones):
        assert torch.equal(p, q)
        assert opt.state[p].keys() == resumed.state[q].keys() == keys
        for key in keys:
            assert torch.equal(opt.state[p][key], resumed.state[q][key])


COMMON_INVALID = [({"lr": -0.1}, "-0.1"), ({"lr": float("nan")}, "nan"), ({"betas": (1.0, 0.99)}, "1.0"),
                  ({"betas": (0.9, -0.5)}, "-0.5"), ({"weight_decay": -0.01}, "-0.01"), ({"eps": -1e-8}, "-1e-08")]


@pytest.mark.parametrize("kwargs, bad", [
    *COMMON_INVALID,
    ({"beta3": 1.0}, "beta3: 1.0"), ({"beta3": -0.1}, "beta3: -0.1"), ({"beta3": float("nan")}, "beta3: nan"),
    ({"alpha": -1.0}, "alpha: -1.0"), ({"alpha": float("nan")}, "alpha: nan"),
    ({"alpha_warmup": -1}, "alpha_warmup: -1"), ({"alpha_warmup": 2.5}, "alpha_warmup.* 2.5"),
    ({"beta3_warmup": True}, "beta3_warmup.* True"), ({"beta3_warmup": "10"}, "beta3_warmup.* '10'"),
])
def test_invalid_hyperparameters_raise_naming_the_value(kwargs, bad):
    """The constructor refuses each (a ValueError); so does optim.build, a value of another type than the
    constructor declares already in optim.settings (a TypeError: tests/test_optim_options.py)."""
    p = nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match=bad):
        AdEMAMix([p], **{"run_steps": 10, **kwargs})
    with pytest.raises(ValueError, match=bad):  # a param group's own value is checked too
        AdEMAMix([{"params": [p], **kwargs}], run_steps=10)
    with pytest.raises((ValueError, TypeError), match=bad):
        optim.build("ademamix", [p], **{"lr": 1e-3, **kwargs}, run_steps=10)


@pytest.mark.parametrize("kwargs, match", [
    ({"run_steps": 0}, "run_steps: 0"), ({"run_steps": -3}, "run_steps: -3"), ({"run_steps": 2.5}, "run_steps: 2.5"),
    ({}, "alpha_warmup=None .* pass run_steps"),  # (the default: the warmups over the run)
    ({"alpha_warmup": 0}, "beta3_warmup=None .* pass run_steps"),
])
def test_invalid_run_steps_and_a_warmup_over_an_unknown_run_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AdEMAMix([nn.Parameter(torch.zeros(3))], **kwargs)


def test_a_group_s_warmup_over_an_unknown_run_raises():
    with pytest.raises(ValueError, match="beta3_warmup=None .* pass run_steps"):
        AdEMAMix([{"params": [nn.Parameter(torch.zeros(3))], "beta3_warmup": None}], alpha_warmup=0, beta3_warmup=0)


def test_build_resolves_the_benchmark_s_settings_with_warmups_over_the_run():
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8))
    assert "ademamix" in optim.available()
    settings = optim.settings("ademamix", lr=1e-3)
    assert {key: settings[key] for key in ("betas", "beta3", "alpha", "alpha_warmup", "beta3_warmup",
                                           "weight_decay", "eps")} == {
        "betas": ((0.9, 0.999), "published"), "beta3": (0.999, "published"), "alpha": (8.0, "published"),
        "alpha_warmup": (None, "published"), "beta3_warmup": (None, "published"),
        "weight_decay": (0.1, "published"), "eps": (1e-8, "published")}
    opt = optim.build("ademamix", model, lr=1e-3, run_steps=1000)
    assert isinstance(opt, AdEMAMix) and opt.run_steps == 1000
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    assert (opt.defaults["betas"], opt.defaults["beta3"], opt.defaults["alpha"]) == ((0.9, 0.999), 0.999, 8.0)
    assert opt._warmup(opt.defaults["alpha_warmup"]) == opt._warmup(opt.defaults["beta3_warmup"]) == 1000
    with pytest.raises(ValueError, match="pass run_steps"):
        optim.build("ademamix", model, lr=1e-3)
    # The constructor's defaults: the authors', but the warmups, over the run here (0 is the authors' none).
    authors = optim.build("ademamix", model, lr=1e-3, defaults="constructor", alpha_warmup=0, beta3_warmup=0)
    assert (authors.defaults["beta3"], authors.defaults["alpha"], authors.defaults["weight_decay"]) == (0.9999, 2.0, 0)
    assert optim.settings("ademamix", "constructor")["alpha_warmup"] == (None, "default")
