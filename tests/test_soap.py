"""optim/soap.py: SOAP against a naive float64 transcription of docs/optimizers.md's rule, against
``pytorch_optimizer.SOAP`` in float32, GPT-2's fused c_attn as three matrices, its state round trip,
diagnostics and refusals. (The parameters under ZeRO-1 and FSDP2, and an FSDP2 sharded checkpoint of
its whole-on-every-rank state resumed on 2 ranks and on 1: tests/test_sharded.py; a flagged step:
tests/test_optim_skip.py.)"""
import io
import math

import numpy as np
import pytest
import torch
from torch import nn

import optim
from optim import SOAP

STEPS = 20


class NaiveSOAP:
    """docs/optimizers.md's SOAP for one matrix (or vector) in float64, written from the spec: plain
    matrix products for the rotations, Adam element by element. The spec prescribes eigh and QR, so
    the reference calls numpy's (LAPACK's, as torch's): the sign and order of eigenvectors are
    conventions, and the update does not depend on them (an eigenvector's sign flips its coordinate
    in m and in the rotation back; Adam treats coordinates alike whatever their order)."""

    def __init__(self, p, lr, betas, shampoo_beta, eps, wd, frequency, max_dim):
        self.p = np.array(p, dtype=np.float64)
        self.m, self.v = np.zeros_like(self.p), np.zeros_like(self.p)
        self.lr, (self.b1, self.b2), self.eps, self.wd, self.frequency = lr, betas, eps, wd, frequency
        self.sb = shampoo_beta if shampoo_beta >= 0 else self.b2
        self.calls = 0
        rows, cols = self.p.shape if self.p.ndim == 2 else (math.inf, math.inf)  # a vector: Adam
        self.L = np.zeros((rows, rows)) if rows <= max_dim else None
        self.R = np.zeros((cols, cols)) if cols <= max_dim else None

    def rotate(self, x):  # Q_L^T x Q_R
        x = x if self.L is None else self.QL.T @ x
        return x if self.R is None else x @ self.QR

    def rotate_back(self, x):  # Q_L x Q_R^T
        x = x if self.L is None else self.QL @ x
        return x if self.R is None else x @ self.QR.T

    def accumulate(self, g):
        if self.L is not None:
            self.L = self.sb * self.L + (1 - self.sb) * g @ g.T
        if self.R is not None:
            self.R = self.sb * self.R + (1 - self.sb) * g.T @ g

    def step(self, g):
        self.calls += 1
        if self.calls == 1:  # statistics and eigenbases, no update
            self.accumulate(g)
            self.QL = None if self.L is None else np.linalg.eigh(self.L)[1][:, ::-1]  # eigenvalues descending
            self.QR = None if self.R is None else np.linalg.eigh(self.R)[1][:, ::-1]
            return
        t = self.calls - 1
        rotated, normalised = self.rotate(g), np.zeros_like(self.p)
        for i in np.ndindex(self.p.shape):
            self.m[i] = self.b1 * self.m[i] + (1 - self.b1) * rotated[i]
            self.v[i] = self.b2 * self.v[i] + (1 - self.b2) * rotated[i] ** 2
            normalised[i] = self.m[i] / (math.sqrt(self.v[i]) + self.eps)
        self.p = self.p - self.lr * math.sqrt(1 - self.b2 ** t) / (1 - self.b1 ** t) * self.rotate_back(normalised)
        self.p = self.p - self.lr * self.wd * self.p
        self.accumulate(g)
        if t % self.frequency == 0:
            m = self.rotate_back(self.m)  # in the parameter's basis
            if self.L is not None:
                order = np.argsort(-np.diag(self.QL.T @ self.L @ self.QL))
                self.v = self.v[order, :]
                self.QL = np.linalg.qr(self.L @ self.QL[:, order])[0]
            if self.R is not None:
                order = np.argsort(-np.diag(self.QR.T @ self.R @ self.QR))
                self.v = self.v[:, order]
                self.QR = np.linalg.qr(self.R @ self.QR[:, order])[0]
            self.m = self.rotate(m)


def _same_basis(ours, theirs):
    """The largest difference of two eigenbases up to the sign of each column."""
    signs = np.sign(np.sum(ours * theirs, axis=0))
    return np.abs(ours * signs - theirs).max()


# Square matrices, or one side over max_precond_dim: a first gradient of a non-square matrix has rank
# min(rows, cols), so the longer side's statistic starts with a repeated eigenvalue 0, whose eigenvectors
# any basis of the null space are; two eigh calls on inputs apart by rounding pick different ones, and
# Adam's per-coordinate normalisation depends on the pick.
SHAPES = {"square": (6, 6), "h.0.attn.c_attn.weight": (12, 4), "tall": (12, 5), "vector": (5,)}


def _gradient(name, shape, step, gen):
    g = torch.randn(shape, generator=gen, dtype=torch.float64) * (1 + step % 3)
    if name == "square":
        g[2], g[:, 4] = 0.0, 0.0  # a zero row and a zero column, every step
    elif name == "tall":
        g[:, 3], g[7] = 0.0, 0.0  # (its rows side is over max_precond_dim: Q_L the identity)
    elif g.ndim == 2:
        g[5] = 0.0  # a zero row of k
    return g


def test_soap_is_the_naive_reference_in_float64():
    """20 steps, the eigenbases refreshed at t = 5, 10 and 15, to 1e-10: the parameters, L, R, v, m
    (rotated back to the parameter's basis) and the eigenbases up to sign (measured: 1.2e-11). The
    matrices' eps is 1e-3: in a direction of exactly zero gradient (the zero rows and columns) the
    rotated gradient is the eigenbasis's rounding noise (up to 3e-13 here), which Adam divides by
    sqrt(v) + eps, with sqrt(v) of the same noise: two float64 implementations are apart there by
    about lr * noise / eps each step (measured with eps 1e-8: 2e-9 after the first update, 2e-8 after
    20 steps; with 1e-4: 1.2e-10; with 1e-3: 1.2e-11)."""
    gen = torch.Generator().manual_seed(0)
    start = {name: torch.randn(shape, generator=gen, dtype=torch.float64) for name, shape in SHAPES.items()}
    params = {name: nn.Parameter(t.clone()) for name, t in start.items()}
    matrices = [name for name in SHAPES if name != "vector"]
    opt = SOAP([{"params": [params[n] for n in matrices], "names": matrices, "weight_decay": 0.1, "eps": 1e-3},
                {"params": [params["vector"]], "names": ["vector"], "lr": 0.05, "betas": (0.8, 0.99)}],
               lr=0.02, betas=(0.9, 0.95), weight_decay=0.0, precondition_frequency=5, max_precond_dim=8)
    # The fused c_attn weight as three matrices q, k, v of 4 x 4.
    refs = {"square": [NaiveSOAP(start["square"].numpy(), 0.02, (0.9, 0.95), -1, 1e-3, 0.1, 5, 8)],
            "h.0.attn.c_attn.weight": [NaiveSOAP(part.numpy(), 0.02, (0.9, 0.95), -1, 1e-3, 0.1, 5, 8)
                                       for part in start["h.0.attn.c_attn.weight"].chunk(3)],
            "tall": [NaiveSOAP(start["tall"].numpy(), 0.02, (0.9, 0.95), -1, 1e-3, 0.1, 5, 8)],
            "vector": [NaiveSOAP(start["vector"].numpy(), 0.05, (0.8, 0.99), -1, 1e-8, 0.0, 5, 8)]}
    for step in range(STEPS):
        for name, shape in SHAPES.items():
            params[name].grad = _gradient(name, shape, step, gen)
            for ref, g in zip(refs[name], params[name].grad.chunk(len(refs[name]))):
                ref.step(g.numpy())
        opt.step()
        if step == 0:  # the first step moves nothing
            assert all(torch.equal(params[name], start[name]) for name in SHAPES)
        for name, p in params.items():
            state = opt.state[p]
            blocks = len(refs[name])
            assert np.abs(p.detach().numpy() - np.concatenate([ref.p for ref in refs[name]])).max() <= 1e-10, name
            assert np.abs(state["exp_avg_sq"].numpy() - np.concatenate([ref.v for ref in refs[name]])).max() <= 1e-10
            m = state["exp_avg"].view(blocks, -1, *p.shape[1:])
            for k, ref in enumerate(refs[name]):
                basis = {key: value[k] for key, value in state.items() if key.startswith("Q_")}
                rotated_back = optim.soap.from_eigenbasis(m[k], basis).numpy()
                assert np.abs(rotated_back - ref.rotate_back(ref.m)).max() <= 1e-10, name
                for key, ours in (("L", ref.L), ("R", ref.R)):
                    assert (key in state) == (ours is not None)
                    if ours is not None:
                        assert np.abs(state[key][k].numpy() - ours).max() <= 1e-10
                        assert _same_basis(state[f"Q_{key}"][k].numpy(), getattr(ref, f"Q{key}")) <= 1e-10
    assert opt.state[params["vector"]]["step"].item() == STEPS
    assert {key for key in opt.state[params["tall"]] if key[0] in "LQR"} == {"R", "Q_R"}  # rows over max_precond_dim


def test_soap_is_pytorch_optimizer_s_soap_within_float32_rounding():
    """Against the reference package with the same options, float32, 20 steps, two refreshes: the
    parameters within 2e-6 of their size (measured 6e-7). Not bitwise: the package keeps m in the
    parameter's basis and projects it every step (the authors' earlier version of their code, the one
    the 2025 benchmark ships; the authors' current code and this one keep m in the eigenbasis),
    updates m and v with lerp_, and estimates the eigenvalues as sum(Q * (S Q)) rather than
    diag(Q^T S Q), so the statistics differ by float32 rounding, and so do the eigh and QR of them.
    No zero rows here: in float32 a direction of zero gradient carries the eigenbasis's rounding noise
    (~1e-7 |G|, above eps), which Adam normalises to O(1) steps, different in every implementation
    (measured: 8e-3 apart)."""
    import pytorch_optimizer  # (requirements-dev.txt)
    gen = torch.Generator().manual_seed(1)
    shapes = [(6, 6), (12, 5), (8, 8), (5,)]
    start = [torch.randn(shape, generator=gen) for shape in shapes]
    c_attn = torch.randn(12, 4, generator=gen)
    ours = [nn.Parameter(t.clone()) for t in start] + [nn.Parameter(c_attn.clone())]
    theirs = [nn.Parameter(t.clone()) for t in start] + [nn.Parameter(t.clone()) for t in c_attn.chunk(3)]
    options = dict(lr=0.01, betas=(0.9, 0.95), shampoo_beta=0.9, eps=1e-8, precondition_frequency=7)
    opt = SOAP([{"params": ours[:3] + ours[4:], "names": ["a", "b", "c", "attn.c_attn.weight"], "weight_decay": 0.1},
                {"params": ours[3:4], "names": ["vector"], "weight_decay": 0.0}], max_precond_dim=8, **options)
    ref = pytorch_optimizer.SOAP([{"params": theirs[:3] + theirs[4:], "weight_decay": 0.1},
                                  {"params": theirs[3:4], "weight_decay": 0.0}], max_precondition_dim=8, **options)
    for step in range(STEPS):
        grads = [torch.randn(p.shape, generator=gen) for p in ours]
        for p, g in zip(ours, grads):
            p.grad = g.clone()
        for p, g in zip(theirs, grads[:4] + list(grads[4].chunk(3))):
            p.grad = g.clone()
        opt.step()
        ref.step()
    expected = [q.detach() for q in theirs[:4]] + [torch.cat([q.detach() for q in theirs[4:]])]
    for p, q in zip(ours, expected):
        assert ((p.detach() - q).abs().max() / q.abs().max()).item() <= 2e-6


def test_fused_c_attn_is_three_matrices():
    """In a GPT, each of q, k and v has its own statistics: a block's update is that of the block
    stepped alone (and not that of the fused matrix)."""
    from model import GPT, GPTConfig
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=8, vocab_size=32, n_layer=1, n_head=2, n_embd=8)).double()
    opt = optim.build("soap", model, lr=0.01, precondition_frequency=2)
    fused = model.transformer.h[0].attn.c_attn.weight
    parts = [nn.Parameter(t.detach().clone()) for t in fused.chunk(3)]
    whole = nn.Parameter(fused.detach().clone())
    separate = SOAP(parts, lr=0.01, betas=(0.9, 0.999), weight_decay=0.1, precondition_frequency=2)
    together = SOAP([whole], lr=0.01, betas=(0.9, 0.999), weight_decay=0.1, precondition_frequency=2)
    gen = torch.Generator().manual_seed(1)
    for _ in range(5):
        x, y = (torch.randint(0, 32, (2, 8), generator=gen) for _ in range(2))
        model(x, y)[1].backward()
        for part, grad in zip(parts, fused.grad.chunk(3)):
            part.grad = grad.clone()
        whole.grad = fused.grad.clone()
        for o in (opt, separate, together):
            o.step()
        opt.zero_grad()
    assert torch.equal(fused.detach(), torch.cat([p.detach() for p in parts]))
    assert not torch.allclose(fused.detach(), whole.detach(), atol=1e-4)
    assert opt.state[fused]["L"].shape == (3, 8, 8) and opt.state[fused]["R"].shape == (3, 8, 8)


def test_the_eigenbasis_is_by_eigenvalue_descending_and_eigh_failing_in_float32_is_retried_in_float64(monkeypatch):
    gen = torch.Generator().manual_seed(5)
    g = torch.randn(2, 4, 4, generator=gen)
    statistic = g @ g.mT
    basis = optim.soap.eigenbasis(statistic)
    eigenvalues = (basis.mT @ statistic @ basis).diagonal(dim1=-2, dim2=-1)
    assert torch.equal(eigenvalues, eigenvalues.sort(dim=-1, descending=True).values)
    eigh = torch.linalg.eigh

    def float32_does_not_converge(x):
        if x.dtype == torch.float32:
            raise torch.linalg.LinAlgError("linalg.eigh: The algorithm failed to converge")
        return eigh(x)

    monkeypatch.setattr(torch.linalg, "eigh", float32_does_not_converge)
    retried = optim.soap.eigenbasis(statistic)
    expected = eigh((statistic + 1e-30 * torch.eye(4)).double()).eigenvectors.flip(-1).float()
    assert retried.dtype == torch.float32 and torch.equal(retried, expected)


def _make(params):
    return SOAP([{"params": params[:2], "weight_decay": 0.1}, {"params": params[2:]}], lr=0.01,
                precondition_frequency=3, max_precond_dim=6)


def test_state_dict_round_trip_continues_bitwise():
    gen = torch.Generator().manual_seed(3)
    shapes = [(5, 5), (9, 4), (7,)]
    params = [nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]
    grads = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(12)]

    def step(opt, ps, k):
        for p, g in zip(ps, grads[k]):
            p.grad = g.clone()
        opt.step()

    opt = _make(params)
    for k in range(5):  # a refresh at t = 3, and the next at t = 6 after the resume
        step(opt, params, k)
    buf = io.BytesIO()  # through torch.save, as a checkpoint would, so nothing is shared
    torch.save(opt.state_dict(), buf)
    clones = [nn.Parameter(p.detach().clone()) for p in params]
    resumed = _make(clones)
    resumed.load_state_dict(torch.load(io.BytesIO(buf.getvalue())))
    for k in range(5, 12):
        step(opt, params, k)
        step(resumed, clones, k)
    keys = [{"step", "exp_avg", "exp_avg_sq", "L", "Q_L", "R", "Q_R"}, {"step", "exp_avg", "exp_avg_sq", "R", "Q_R"},
            {"step", "exp_avg", "exp_avg_sq"}]
    for p, q, expected_keys in zip(params, clones, keys):
        assert torch.equal(p, q)
        assert opt.state[p].keys() == resumed.state[q].keys() == expected_keys
        for key in expected_keys:
            assert torch.equal(opt.state[p][key], resumed.state[q][key]), key


def test_update_rms_is_the_step_s_rms_per_unit_lr():
    gen = torch.Generator().manual_seed(4)
    params = [nn.Parameter(torch.randn(s, generator=gen, dtype=torch.float64)) for s in ((5, 5), (9, 4), (7,))]
    opt = SOAP([{"params": params, "names": ["a", "b", "c"]}], lr=0.01, weight_decay=0.0, max_precond_dim=6)
    for step in range(4):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen, dtype=torch.float64)
        before = [p.detach().clone() for p in params]
        opt.request_diagnostics()
        opt.step()
        diagnostics = opt.pop_diagnostics()
        assert diagnostics.keys() == {"update_rms/a", "update_rms/b", "update_rms/c"}
        for name, p, b in zip("abc", params, before):
            expected = ((p.detach() - b).square().mean().sqrt() / 0.01).item()
            assert diagnostics[f"update_rms/{name}"] == pytest.approx(expected, rel=1e-6, abs=1e-12)
            assert (diagnostics[f"update_rms/{name}"] > 0) == (step > 0)


def test_build_gets_the_benchmark_s_settings():
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8))
    opt = optim.build("soap", model, lr=1e-3)
    assert isinstance(opt, SOAP)
    assert {key: opt.defaults[key] for key in ("betas", "weight_decay", "shampoo_beta", "precondition_frequency",
                                               "max_precond_dim", "eps", "correct_bias")} == \
        {"betas": (0.9, 0.999), "weight_decay": 0.1, "shampoo_beta": -1.0, "precondition_frequency": 10,
         "max_precond_dim": 10000, "eps": 1e-8, "correct_bias": True}
    authors = optim.build("soap", model, lr=3e-3, defaults="constructor")
    assert (authors.defaults["betas"], authors.defaults["weight_decay"]) == ((0.95, 0.95), 0.01)


@pytest.mark.parametrize("kwargs, bad", [
    ({"lr": -0.1}, "-0.1"), ({"betas": (1.0, 0.99)}, "1.0"), ({"betas": (0.9, float("nan"))}, "nan"),
    ({"weight_decay": -0.01}, "-0.01"), ({"eps": -1e-8}, "-1e-08"), ({"shampoo_beta": 1.0}, "shampoo_beta: 1.0"),
    ({"shampoo_beta": float("nan")}, "shampoo_beta: nan"), ({"precondition_frequency": 0}, "precondition_frequency: 0"),
    ({"precondition_frequency": 2.5}, "precondition_frequency: 2.5"), ({"max_precond_dim": 0}, "max_precond_dim: 0"),
    ({"correct_bias": "yes"}, "correct_bias: 'yes'"),
])
def test_rejects_invalid_hyperparameters(kwargs, bad):
    p = nn.Parameter(torch.zeros(3, 2))
    with pytest.raises(ValueError, match=bad):
        SOAP([p], **kwargs)
    with pytest.raises(ValueError, match=bad):  # a param group's own value is checked too
        SOAP([{"params": [p], **kwargs}])


@pytest.mark.parametrize("shape, dtype, bad", [((2, 3, 4), torch.float32, r"\(2, 3, 4\)"),
                                               ((3, 4), torch.bfloat16, "bfloat16")])
def test_refuses_parameters_it_cannot_step(shape, dtype, bad):
    with pytest.raises(ValueError, match=bad):
        SOAP([nn.Parameter(torch.zeros(shape, dtype=dtype))])

