"""optim/mars.py: MARS-AdamW and its AdamW part against a naive float64 transcription of
docs/optimizers.md ("MARS-AdamW", the authors' rule, AGI-Arena/MARS), and against
pytorch_optimizer's MARS, whose only difference in these options is where eps meets the bias
correction; its diagnostics, the groups the shared builder makes for it and refusals. (Its
layouts: tests/test_sharded.py; a step dropped on the device: tests/test_optim_skip.py; its state
round trip, with Muon's: tests/test_muon.py.)"""
import math

import numpy as np
import pytest
import torch
from torch import nn

import optim
from model import GPT, GPTConfig
from optim import MARS

STEPS = 20
LR, ADAMW_LR = 0.03, 0.01
BETAS, ADAMW_BETAS, GAMMA, EPS = (0.95, 0.99), (0.8, 0.999), 0.025, 1e-8
WD, ADAMW_WD = 0.1, 0.2


class NaiveMARS:
    """docs/optimizers.md's MARS-AdamW on a hidden matrix (``gamma`` given) or AdamW on another
    tensor (``gamma`` None), element by element in float64, written only from the spec.
    ``package_eps``: the denominator as pytorch_optimizer's MARS forms it instead,
    (sqrt(v + 1e-15) + eps) / sqrt(1 - b2^t), eps before the bias correction."""

    def __init__(self, p, betas, wd, gamma=None, package_eps=False):
        self.p = np.array(p, dtype=np.float64)
        self.m, self.v, self.g_prev = np.zeros_like(self.p), np.zeros_like(self.p), np.zeros_like(self.p)
        (self.b1, self.b2), self.wd, self.gamma, self.package_eps = betas, wd, gamma, package_eps
        self.t, self.norm = 0, None

    def step(self, g, lr):
        p, m, v, b1, b2 = self.p, self.m, self.v, self.b1, self.b2
        self.t += 1
        c = np.array(g, dtype=np.float64)
        if self.gamma is not None:
            for i in np.ndindex(p.shape):
                c[i] = g[i] + self.gamma * b1 / (1 - b1) * (g[i] - self.g_prev[i])
                self.g_prev[i] = g[i]
            self.norm = math.sqrt(sum(c[i] ** 2 for i in np.ndindex(p.shape)))
            if self.norm > 1:
                for i in np.ndindex(p.shape):
                    c[i] = c[i] / self.norm
        for i in np.ndindex(p.shape):
            m[i] = b1 * m[i] + (1 - b1) * c[i]
            v[i] = b2 * v[i] + (1 - b2) * c[i] * c[i]
            if self.package_eps:
                denom = (math.sqrt(v[i] + 1e-15) + EPS) / math.sqrt(1 - b2 ** self.t)
            else:
                denom = math.sqrt(v[i] / (1 - b2 ** self.t)) + EPS
            p[i] = p[i] * (1 - lr * self.wd) - lr * (m[i] / (1 - b1 ** self.t)) / denom


def _data(seed=0):
    """Initial tensors (a hidden matrix with a zero row and column, an undecayed vector and
    embedding-like matrix, a decayed vector) and STEPS gradients each, in float64. The matrix's
    gradient has the same zero row and column and a scale that varies, so that ||c|| > 1 on some
    steps and not on others."""
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)  # noqa: E731
    shapes = [(6, 5), (4,), (3, 4), (7,)]
    p0 = [rand(*shape) for shape in shapes]
    grads = [[rand(*shape) for shape in shapes] for _ in range(STEPS)]
    for tensor in [p0[0]] + [gs[0] for gs in grads]:
        tensor[2], tensor[:, 3] = 0.0, 0.0
    for k, gs in enumerate(grads):
        gs[0] *= (0.05, 0.1, 0.4, 1.0)[k % 4]
    return p0, grads


def _ours(params, **options):
    a, b, e, d = params
    return MARS([{"params": [a], "names": ["a"], "hidden_matrix": True, "weight_decay": WD},
                 {"params": [b, e], "names": ["b", "e"], "hidden_matrix": False, "weight_decay": 0.0},
                 {"params": [d], "names": ["d"], "hidden_matrix": False, "weight_decay": WD}],
                lr=LR, betas=BETAS, eps=EPS, gamma=GAMMA, adamw_lr=ADAMW_LR, adamw_betas=ADAMW_BETAS,
                adamw_weight_decay=ADAMW_WD, **options)


def _naive(p0, package_eps=False):
    a, b, e, d = (t.numpy() for t in p0)
    return [NaiveMARS(a, BETAS, WD, GAMMA, package_eps), NaiveMARS(b, ADAMW_BETAS, 0.0, package_eps=package_eps),
            NaiveMARS(e, ADAMW_BETAS, 0.0, package_eps=package_eps),
            NaiveMARS(d, ADAMW_BETAS, ADAMW_WD, package_eps=package_eps)]


def _schedule(step):
    """A decaying lr: the AdamW part's must follow it at adamw_lr / lr of it."""
    return LR * (1 - step / (2 * STEPS))


def _max_diff(ours, theirs):
    return np.abs(ours.detach().numpy() - theirs).max()


def test_matches_naive_reference_and_records_c_s_norm(backend):
    p0, grads = _data()
    params = [nn.Parameter(t.clone()) for t in p0]
    opt, refs = _ours(params, backend=backend), _naive(p0)
    assert opt.backends()["group0"].startswith(f"{backend} (MARS's correction)")
    clipped = []
    for step, gs in enumerate(grads):
        for group in opt.param_groups:
            group["lr"] = _schedule(step)
        for p, g in zip(params, gs):
            p.grad = g.clone()
        opt.request_diagnostics()
        opt.step()
        diagnostics = opt.pop_diagnostics()
        for i, (p, ref, g) in enumerate(zip(params, refs, gs)):
            ref.step(g.numpy(), _schedule(step) * (1 if i == 0 else ADAMW_LR / LR))
            state = opt.state[p]
            for ours, theirs in ((p, ref.p), (state["exp_avg"], ref.m), (state["exp_avg_sq"], ref.v)):
                assert _max_diff(ours, theirs) <= 1e-10
        assert _max_diff(opt.state[params[0]]["last_grad"], refs[0].g_prev) == 0
        assert diagnostics.keys() == {"correction_norm/a", "correction_clipped/a"}
        assert diagnostics["correction_norm/a"] == pytest.approx(refs[0].norm, rel=1e-7)  # (logged in float32)
        assert diagnostics["correction_clipped/a"] == float(refs[0].norm > 1)
        clipped.append(refs[0].norm > 1)
    assert 0 < sum(clipped) < STEPS  # the clip acted on some steps and not on others
    assert opt.state[params[0]]["step"].item() == STEPS
    assert not params[0][2].any() and not params[0][:, 3].any()  # a zero row and column without gradient stay 0


@pytest.mark.parametrize("foreach", [False, True])
def test_pytorch_optimizer_s_mars_differs_only_where_eps_meets_the_bias_correction(foreach):
    """pytorch_optimizer.MARS with the same options: the authors' rule but for its denominator
    (sqrt(v + 1e-15) + eps) / sqrt(1 - b2^t) against the authors' (and torch AdamW's)
    sqrt(v) / sqrt(1 - b2^t) + eps: its eps is 1/sqrt(1 - b2^t) times ours (10x at step 1 with
    b2 0.99, 32x with 0.999), and 1e-15 sits under its root. It matches the naive rule with its
    denominator to 1e-10 in float64; ours differs from it by that eps, about 1e-7 of a denominator
    |c| ~ 0.1-1, so the parameters' distance from the start agrees to 1e-5 (measured: 8.5e-7 at most).
    (Its other differences need options these groups do not have: docs/optimizers.md, "MARS-AdamW".)"""
    from pytorch_optimizer import MARS as PackageMARS
    p0, grads = _data(1)
    ours_params, theirs_params = [nn.Parameter(t.clone()) for t in p0], [nn.Parameter(t.clone()) for t in p0]
    a, b, e, d = theirs_params
    ours = _ours(ours_params)
    # The package's 1-D path: every parameter of fewer than 2 dims, decayed by the group's
    # weight_decay_1d (not by weight_decay, which it ignores there): so vectors only, each group its own.
    theirs = PackageMARS([{"params": [a], "weight_decay": WD}, {"params": [b], "weight_decay_1d": 0.0},
                          {"params": [d], "weight_decay_1d": ADAMW_WD}],
                         lr=LR, betas=BETAS, gamma=GAMMA, lr_1d=ADAMW_LR, betas_1d=ADAMW_BETAS, eps=EPS,
                         foreach=foreach)
    refs = _naive(p0, package_eps=True)
    for gs in grads:
        for p, q, g in zip(ours_params, theirs_params, gs):
            p.grad, q.grad = g.clone(), g.clone()  # (e: not the package's)
        ours.step()
        theirs.step()
        for i in (0, 1, 3):
            refs[i].step(gs[i].numpy(), LR if i == 0 else ADAMW_LR)
    for i in (0, 1, 3):
        ours_p, theirs_p, start = ours_params[i].detach(), theirs_params[i].detach(), p0[i]
        assert _max_diff(theirs_p, refs[i].p) <= 1e-10
        relative = ((ours_p - theirs_p).norm() / (theirs_p - start).norm()).item()
        assert 0 < relative <= 1e-5, i


def _tiny_gpt(**overrides):
    torch.manual_seed(0)
    return GPT(GPTConfig(**{**dict(block_size=8, vocab_size=32, n_layer=2, n_head=2, n_embd=8), **overrides}))


def test_constructor_defaults_are_the_authors_but_the_adamw_part_s_lr_and_weight_decay():
    """The authors' constructor defaults (lr 3e-3, betas (0.95, 0.99), eps 1e-8, wd 0, gamma 0.025, the
    1-D betas (0.9, 0.95)), but the AdamW part's lr is lr (their lr_1d: a fixed 3e-3) and its weight decay
    weight_decay (their weight_decay_1d: 0.1): at lr 6e-3 and wd 0.05 it steps as torch's AdamW at those."""
    assert MARS([{"params": [], "hidden_matrix": True}]).defaults == {
        "lr": 3e-3, "betas": (0.95, 0.99), "eps": 1e-8, "weight_decay": 0.0, "gamma": 0.025,
        "adamw_betas": (0.9, 0.95), "adamw_lr_ratio": 1.0, "adamw_weight_decay": 0.0}
    gen = torch.Generator().manual_seed(0)
    ours, reference = nn.Parameter(torch.randn(4, 3, generator=gen)), nn.Parameter(torch.zeros(4, 3))
    reference.data.copy_(ours.data)
    opt = MARS([{"params": [ours], "hidden_matrix": False}], lr=6e-3, weight_decay=0.05)
    adamw = torch.optim.AdamW([reference], lr=6e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.05, fused=True)
    for _ in range(3):
        grad = torch.randn(4, 3, generator=gen)
        ours.grad, reference.grad = grad.clone(), grad.clone()
        opt.step()
        adamw.step()
    assert torch.equal(ours, reference)


def test_the_shared_builder_gives_mars_the_hidden_matrices_and_adamw_the_rest():
    model = _tiny_gpt(bias=True)
    opt = optim.build("mars", model, lr=3e-3)
    hidden, rest, embeddings = opt.param_groups
    assert [g["hidden_matrix"] for g in opt.param_groups] == [True, False, False]
    assert hidden["names"] == [f"transformer.h.{i}.{name}" for i in range(2) for name in
                               ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")]
    assert {"transformer.wte.weight", "transformer.wpe.weight"} <= set(rest["names"]) and embeddings["params"] == []
    # The benchmark's recipe: MARS at the config's lr (3e-3 at 124M), its AdamW part at 1e-3.
    assert hidden["weight_decay"] == 0.1 and hidden["betas"] == (0.95, 0.99) and hidden["gamma"] == 0.025
    assert rest["adamw_lr_ratio"] == pytest.approx(1 / 3) and rest["adamw_betas"] == (0.8, 0.999)
    assert rest["adamw_weight_decay"] == 0.1 and rest["weight_decay"] == 0.0  # (so the rest is not decayed)
    assert "MARS" in opt.describe() and "AdamW, fused" in opt.describe()
    model(*(torch.randint(0, 32, (2, 8)) for _ in range(2)))[1].backward()
    opt.step()
    assert {frozenset(opt.state[p]) for p in hidden["params"]} == {frozenset({"step", "exp_avg", "exp_avg_sq",
                                                                              "last_grad"})}
    assert {frozenset(opt.state[p]) for p in rest["params"]} == {frozenset({"step", "exp_avg", "exp_avg_sq"})}


@pytest.mark.parametrize("kwargs, bad", [
    ({"gamma": -0.1}, "gamma"), ({"gamma": math.nan}, "gamma"), ({"gamma": math.inf}, "gamma"),
    ({"adamw_lr": -1e-3}, "adamw_lr"), ({"adamw_betas": (0.9, 1.0)}, "adamw_betas"),
    ({"adamw_betas": (0.9,)}, "adamw_betas"), ({"adamw_weight_decay": -0.1}, "adamw_weight_decay"),
    ({"betas": (1.0, 0.99)}, "beta"),
    ({"lr": -1.0}, "learning rate"), ({"eps": -1e-8}, "epsilon"), ({"weight_decay": math.nan}, "weight_decay"),
])
def test_rejects_invalid_hyperparameters(kwargs, bad):
    """The constructor refuses each (a ValueError); so does optim.build, a value of another type than the
    constructor declares already in optim.settings (a TypeError: tests/test_optim_options.py)."""
    with pytest.raises(ValueError, match=bad):
        MARS(optim.param_groups(_tiny_gpt(), 0.1, hidden_matrices_apart=True), **{"lr": 3e-3, **kwargs})
    with pytest.raises((ValueError, TypeError), match=bad):
        optim.build("mars", _tiny_gpt(), **{"lr": 3e-3, **kwargs})


def test_refuses_groups_it_cannot_step():
    with pytest.raises(ValueError, match="hidden_matrix"):
        MARS([nn.Parameter(torch.zeros(3, 3))])  # plain tensors: which are MARS's?
    with pytest.raises(ValueError, match="2-D"):
        MARS([{"params": [nn.Parameter(torch.zeros(3))], "hidden_matrix": True}])
