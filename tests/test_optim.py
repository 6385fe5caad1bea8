"""Tests of optim/: MERIT against a naive transcription of optimizers.md, the shared param groups,
the AdamW wiring and the registry."""
import io
import math

import numpy as np
import pytest
import torch
from torch import nn

import optim
from optim import MERIT, param_groups

STEPS = 20


class NaiveMERIT:
    """optimizers.md's MERIT element by element in float64, written only from the spec."""

    def __init__(self, p, lr, betas, eps, wd):
        self.p = np.array(p, dtype=np.float64)
        self.m = np.zeros_like(self.p)
        self.v = np.zeros_like(self.p)
        self.lr, (self.b1, self.b2), self.eps, self.wd = lr, betas, eps, wd
        self.clipped = self.total = 0

    def step(self, g):
        p, m, v, shape = self.p, self.m, self.v, self.p.shape
        u = np.zeros_like(p)
        for i in np.ndindex(shape):
            m[i] = self.b1 * m[i] + (1 - self.b1) * g[i]
            v[i] = self.b2 * v[i] + (1 - self.b2) * g[i] * g[i]
            u[i] = m[i] / (math.sqrt(v[i]) + self.eps) + self.wd * p[i]
        p_max = max(abs(x) for x in p.flat)
        u_max = max(abs(x) for x in u.flat)
        new_p = p.copy()  # every ratio below reads p before this step's update
        for idx in np.ndindex(shape):
            if p.ndim >= 2:
                i, j, rest = idx[0], idx[1], idx[2:]
                row_p = max(abs(p[(i, jj) + rest]) for jj in range(shape[1]))
                row_u = max(abs(u[(i, jj) + rest]) for jj in range(shape[1]))
                col_p = max(abs(p[(ii, j) + rest]) for ii in range(shape[0]))
                col_u = max(abs(u[(ii, j) + rest]) for ii in range(shape[0]))
                if 0 in (row_p, row_u, col_p, col_u):
                    s = 1.0
                else:
                    s = max(row_p / row_u, col_p / col_u, p_max / u_max)
            else:
                s = 1.0 if p_max == 0 or u_max == 0 else p_max / u_max
            x = s * u[idx]
            self.clipped += abs(x) > 1
            self.total += 1
            new_p[idx] = p[idx] - self.lr * min(max(x, -1.0), 1.0)
        self.p = new_p


def _case(name, gen):
    """(p0, grads, wd) for one named case; grads is a list of STEPS float64 tensors."""
    rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)  # noqa: E731
    if name == "matrix":  # |s*u| <= |p|_max, so |p|_max > 1 is needed for the clip to act
        return 1.5 * rand(5, 7), [rand(5, 7) * (1 + k % 3) for k in range(STEPS)], 0.1
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


CASES = ["matrix", "tall_matrix", "vector", "scalar", "zero_row_in_p_and_grad",
         "zero_col_in_grad", "zero_matrix", "zero_bias", "tensor_3d"]


@pytest.mark.parametrize("name", CASES)
def test_merit_matches_naive_reference(name):
    gen = torch.Generator().manual_seed(CASES.index(name))
    p0, grads, wd = _case(name, gen)
    lr, betas, eps = 0.05, (0.9, 0.95), 1e-6
    p = nn.Parameter(p0.clone())
    opt = MERIT([p], lr=lr, betas=betas, eps=eps, weight_decay=wd)
    ref = NaiveMERIT(p0.numpy(), lr, betas, eps, wd)
    for g in grads:
        p.grad = g.clone()
        opt.step()
        ref.step(g.numpy())
        state = opt.state[p]
        for ours, theirs in ((p, ref.p), (state["exp_avg"], ref.m), (state["exp_avg_sq"], ref.v)):
            assert np.abs(ours.detach().numpy() - theirs).max() <= 1e-10
    assert state["step"].item() == STEPS
    if name == "matrix":  # the clip must have been exercised both ways
        assert 0 < ref.clipped < ref.total


def test_merit_param_groups_use_their_own_hyperparameters():
    gen = torch.Generator().manual_seed(100)
    (pa, ga, _), (pb, gb, _) = _case("matrix", gen), _case("vector", gen)
    a, b = nn.Parameter(pa.clone()), nn.Parameter(pb.clone())
    opt = MERIT([{"params": [a], "weight_decay": 0.2, "lr": 0.03},
                 {"params": [b], "betas": (0.8, 0.99), "eps": 1e-3}], lr=0.07, betas=(0.9, 0.95))
    ref_a = NaiveMERIT(pa.numpy(), 0.03, (0.9, 0.95), 1e-6, 0.2)
    ref_b = NaiveMERIT(pb.numpy(), 0.07, (0.8, 0.99), 1e-3, 0.0)
    for k in range(STEPS):
        a.grad, b.grad = ga[k].clone(), gb[k].clone()
        opt.step()
        ref_a.step(ga[k].numpy())
        ref_b.step(gb[k].numpy())
    assert np.abs(a.detach().numpy() - ref_a.p).max() <= 1e-10
    assert np.abs(b.detach().numpy() - ref_b.p).max() <= 1e-10


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_merit_update_is_symmetric_under_transposition(dtype):
    gen = torch.Generator().manual_seed(7)
    p0, grads, _ = _case("zero_row_in_p_and_grad", gen)
    p = nn.Parameter(p0.to(dtype))
    pt = nn.Parameter(p0.T.contiguous().to(dtype))
    opt = MERIT([p, pt], lr=0.05, betas=(0.9, 0.95), weight_decay=0.1)
    for g in grads:
        p.grad, pt.grad = g.to(dtype), g.T.contiguous().to(dtype)
        opt.step()
        assert torch.equal(pt, p.T)


def test_merit_state_dict_round_trip_continues_bitwise():
    gen = torch.Generator().manual_seed(3)
    shapes = [(5, 7), (7,), (3, 4, 2)]
    params = [nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]
    grads = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(10)]

    def make(ps):
        return MERIT([{"params": ps[:1], "weight_decay": 0.1}, {"params": ps[1:]}], lr=0.01)

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
    for gs in grads[5:]:
        step(opt, params, gs)
        step(resumed, clones, gs)
    for p, q in zip(params, clones):
        assert torch.equal(p, q)
        assert opt.state[p].keys() == resumed.state[q].keys() == {"step", "exp_avg", "exp_avg_sq"}
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(opt.state[p][key], resumed.state[q][key])
        assert resumed.state[q]["step"].item() == 10


@pytest.mark.parametrize("kwargs, bad", [
    ({"lr": -0.1}, "-0.1"),
    ({"lr": float("nan")}, "nan"),
    ({"betas": (1.0, 0.999)}, "1.0"),
    ({"betas": (0.9, -0.5)}, "-0.5"),
    ({"eps": -1e-8}, "-1e-08"),
    ({"weight_decay": -0.01}, "-0.01"),
])
def test_merit_rejects_invalid_hyperparameters(kwargs, bad):
    p = nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match=bad):
        MERIT([p], **kwargs)
    with pytest.raises(ValueError, match=bad):  # a param group's own value is checked too
        MERIT([{"params": [p], **kwargs}])
    with pytest.raises(ValueError, match=bad):
        optim.build("merit", [p], **{"lr": 1e-3, **kwargs})


def test_merit_skips_params_without_grad_and_rejects_sparse_grads():
    a, b = nn.Parameter(torch.ones(2, 3)), nn.Parameter(torch.ones(3))
    opt = MERIT([a, b], lr=0.1)
    b.grad = torch.ones(3)
    opt.step()
    assert torch.equal(a, torch.ones(2, 3)) and a not in opt.state
    assert not torch.equal(b, torch.ones(3))
    a.grad = torch.ones(2, 3).to_sparse()
    with pytest.raises(RuntimeError, match="sparse"):
        opt.step()


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


@pytest.mark.parametrize("name", ["adamw", "merit"])
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


@pytest.mark.parametrize("name", ["adamw", "merit"])
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


def test_build_defaults_and_overrides():
    model = TinyGPT()
    merit = optim.build("MERIT", model, lr=2e-4)
    assert isinstance(merit, MERIT)
    assert (merit.defaults["betas"], merit.defaults["eps"]) == ((0.9, 0.999), 1e-6)
    adamw = optim.build("adamw", model, lr=2e-4)
    assert (adamw.defaults["betas"], adamw.defaults["eps"]) == ((0.9, 0.999), 1e-8)
    merit = optim.build("merit", model, lr=2e-4, betas=[0.9, 0.95], eps=1e-8)
    assert (merit.defaults["betas"], merit.defaults["eps"]) == ((0.9, 0.95), 1e-8)


def test_build_rejects_unknown_names_and_options():
    model = TinyGPT()
    with pytest.raises(ValueError, match="'unknown'.*adamw, merit"):
        optim.build("unknown", model, lr=1e-3)
    with pytest.raises(ValueError, match="did you mean 'merit'"):
        optim.build("merti", model, lr=1e-3)
    with pytest.raises(TypeError, match="'betaz'.*did you mean 'betas'"):
        optim.build("merit", model, lr=1e-3, betaz=(0.9, 0.95))
    with pytest.raises(ValueError, match="decay_embeddings"):
        optim.build("merit", list(model.parameters()), lr=1e-3, decay_embeddings=True)
