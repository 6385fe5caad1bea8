"""optim/muon.py: Muon and its AdamW part against torch's own ``torch.optim.Muon`` and
``torch.optim.AdamW`` (bitwise: the same operations in bfloat16), its float32 Newton-Schulz
against a float64 transcription of the rule, GPT-2's fused c_attn as three matrices, the groups
the shared builder makes for it, its diagnostics, state round trip and refusals. (Its layouts:
tests/test_sharded.py; a step dropped on the device: tests/test_optim_skip.py; published
settings: tests/test_config.py.)"""
import copy
import math

import numpy as np
import pytest
import torch
from torch import nn

import optim
from model import GPT, GPTConfig
from optim import Muon
from optim.muon import NS_COEFFICIENTS

STEPS = 20
SHAPES = [(8, 24), (24, 8), (12, 12)]  # wide, tall (transposed for the iteration), square


def _gradients(shapes, step, dtype=torch.float32):
    gen = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype) for shape in shapes]


@pytest.mark.parametrize("adjust_lr", ["original", "match_rms_adamw"])
def test_muon_and_its_adamw_part_are_torch_s_optimizers_bitwise(adjust_lr):
    gen = torch.Generator().manual_seed(0)
    matrices = [torch.randn(shape, generator=gen) for shape in SHAPES]
    vectors = [torch.randn(5, generator=gen), torch.randn(7, 3, generator=gen)]  # (a decayed embedding-like matrix)
    ours_m, ours_v = [nn.Parameter(t.clone()) for t in matrices], [nn.Parameter(t.clone()) for t in vectors]
    ref_m, ref_v = [nn.Parameter(t.clone()) for t in matrices], [nn.Parameter(t.clone()) for t in vectors]
    ours = Muon([{"params": ours_m, "hidden_matrix": True},
                 {"params": ours_v[:1], "hidden_matrix": False, "weight_decay": 0.0},
                 {"params": ours_v[1:], "hidden_matrix": False}],
                lr=0.02, weight_decay=0.1, adjust_lr=adjust_lr, ns_dtype="bfloat16", betas=(0.9, 0.95), eps=1e-8,
                adamw_lr=0.005, adamw_weight_decay=0.3)  # (0.005 = 0.02 / 4: the ratio is exact)
    muon = torch.optim.Muon(ref_m, lr=0.02, weight_decay=0.1, adjust_lr_fn=adjust_lr)
    adamw = torch.optim.AdamW([{"params": ref_v[:1], "weight_decay": 0.0}, {"params": ref_v[1:], "weight_decay": 0.3}],
                              lr=0.005, betas=(0.9, 0.95), eps=1e-8, fused=True)
    for step in range(STEPS):
        grads = _gradients(SHAPES + [(5,), (7, 3)], step)
        for p, q, g in zip(ours_m + ours_v, ref_m + ref_v, grads):
            p.grad, q.grad = g.clone(), g.clone()
        ours.step()
        muon.step()
        adamw.step()
    for p, q in zip(ours_m + ours_v, ref_m + ref_v):
        assert torch.equal(p, q)
    for p, q in zip(ours_m, ref_m):
        assert torch.equal(ours.state[p]["momentum_buffer"], muon.state[q]["momentum_buffer"])
    for p, q in zip(ours_v, ref_v):
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(ours.state[p][key], adamw.state[q][key]), key


def naive_newton_schulz(update: np.ndarray, steps: int = 5, eps: float = 1e-7, eps_added: bool = False) -> np.ndarray:
    """docs/optimizers.md's iteration in float64, written from the formulas; ``eps_added``: normalised by
    ||U||_F + eps, as Keller Jordan's muon.py does, not by max(||U||_F, eps)."""
    a, b, c = NS_COEFFICIENTS
    x = update.T if update.shape[0] > update.shape[1] else update
    x = x / (np.linalg.norm(x) + eps if eps_added else max(np.linalg.norm(x), eps))
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if update.shape[0] > update.shape[1] else x


def test_float32_newton_schulz_is_the_rule_within_float32_rounding():
    """Muon in float32 (ns_dtype, nesterov off) against the rule in float64: after 20 steps apart by
    no more than float32's rounding of the weights each step, 20 x 2^-24 of their norm (measured:
    2^-24 x 9 to 10, on torch's AVX-512, AVX2 and default kernels alike)."""
    gen = torch.Generator().manual_seed(0)
    start = [torch.randn(shape, generator=gen) for shape in SHAPES]
    params = [nn.Parameter(t.clone()) for t in start]
    lr, wd, mu = 0.02, 0.1, 0.95
    opt = Muon([{"params": params, "hidden_matrix": True}], lr=lr, weight_decay=wd, momentum=mu, nesterov=False,
               adjust_lr="match_rms_adamw", ns_dtype="float32")
    weights = [t.double().numpy() for t in start]
    buffers = [np.zeros(shape) for shape in SHAPES]
    for step in range(STEPS):
        grads = _gradients(SHAPES, step)
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt.step()
        for i, g in enumerate(grads):
            buffers[i] = mu * buffers[i] + (1 - mu) * g.double().numpy()
            rows, cols = SHAPES[i]
            weights[i] = weights[i] * (1 - lr * wd) - lr * 0.2 * math.sqrt(max(rows, cols)) * naive_newton_schulz(buffers[i])
    for p, w in zip(params, weights):
        assert np.linalg.norm(p.detach().double().numpy() - w) <= STEPS * 2.0 ** -24 * np.linalg.norm(w)


@pytest.mark.parametrize("shape", [(768, 768), (64, 192), (12, 12)])
def test_keller_jordan_s_norm_plus_1e7_moves_the_update_by_about_1e7_over_the_norm(shape):
    """Keller Jordan's muon.py (and the 2025 benchmark's DistributedMuon) divides U by ||U||_F + 1e-7, this
    code (torch's Muon) by max(||U||_F, 1e-7): X starts 1e-7/||U||_F smaller, and after the iteration the
    update is 1 to 2 times that from ours, in float64 (measured 1.08 to 1.56 times)."""
    gen = torch.Generator().manual_seed(0)
    update = torch.randn(shape, generator=gen, dtype=torch.float64)
    norm = 0.05
    update *= norm / update.norm()
    ours = optim.muon.newton_schulz(update, NS_COEFFICIENTS, 5, 1e-7, torch.float64).numpy()
    theirs = naive_newton_schulz(update.numpy(), eps_added=True)
    relative = np.linalg.norm(ours - theirs) / np.linalg.norm(ours)
    assert 1.0 <= relative / (1e-7 / norm) <= 2.0


def products_apart_newton_schulz(update: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """The iteration with each product and sum rounded on its own (B = b*A + c*A@A; X = a*X + B@X), in
    ``update``'s dtype: another operation order than torch's two addmm a step."""
    a, b, c = NS_COEFFICIENTS
    x = update.T if update.shape[0] > update.shape[1] else update
    x = x / x.norm().clamp(min=1e-7)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if update.shape[0] > update.shape[1] else x


@pytest.mark.parametrize("shape", SHAPES + [(64, 192), (256, 256)])
def test_in_bfloat16_another_operation_order_moves_the_update_by_a_few_percent(shape):
    """bfloat16's rounding through five iterations leaves X a few percent from the exact one, and two
    orders as far from each other; in float32 the orders agree to rounding (1e-6). The bounds are in
    bfloat16's unit roundoff u = 2^-8: each iteration rounds three results (the products apart: five),
    16 to 26 roundings in all, so within 20 u of the exact X (the iteration shrinks an error in the
    directions it has converged: measured 3 to 11 u, on this project's Intel CPU); the products apart round
    where ours does not, so the two part by more than 2.5 u (measured 6.5 to 10.5 u)."""
    gen = torch.Generator().manual_seed(0)
    update = torch.randn(shape, generator=gen) * 0.01
    exact = naive_newton_schulz(update.double().numpy())
    ours = optim.muon.newton_schulz(update, NS_COEFFICIENTS, 5, 1e-7, torch.bfloat16).double().numpy()
    apart = products_apart_newton_schulz(update.bfloat16()).double().numpy()
    distance = lambda x, y: np.linalg.norm(x - y) / np.linalg.norm(y)  # noqa: E731
    u = 2.0 ** -8
    assert distance(ours, exact) < 20 * u and distance(apart, exact) < 20 * u
    assert 2.5 * u < distance(ours, apart) < 20 * u
    ours32 = optim.muon.newton_schulz(update, NS_COEFFICIENTS, 5, 1e-7, torch.float32).double().numpy()
    assert distance(ours32, products_apart_newton_schulz(update).double().numpy()) < 1e-5


def tiny_gpt(**overrides):
    torch.manual_seed(0)
    return GPT(GPTConfig(**{**dict(block_size=8, vocab_size=32, n_layer=2, n_head=2, n_embd=8), **overrides}))


def test_fused_c_attn_steps_as_three_separate_matrices():
    """The update of GPT-2's fused q, k, v weight is torch's Muon on the three matrices apart (and
    not Muon on the fused one: orthogonalising the stack would mix them)."""
    model = tiny_gpt()
    ours = optim.build("muon", model, lr=0.02, weight_decay=0.1, adjust_lr="original", ns_dtype="bfloat16")
    fused = model.transformer.h[0].attn.c_attn.weight
    parts = [nn.Parameter(t.detach().clone()) for t in fused.chunk(3)]
    whole = nn.Parameter(fused.detach().clone())
    separate, together = torch.optim.Muon(parts, lr=0.02, weight_decay=0.1), torch.optim.Muon([whole], lr=0.02, weight_decay=0.1)
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        x, y = (torch.randint(0, 32, (2, 8), generator=gen) for _ in range(2))
        model(x, y)[1].backward()
        for part, grad in zip(parts, fused.grad.chunk(3)):
            part.grad = grad.clone()
        whole.grad = fused.grad.clone()
        ours.step()
        ours.zero_grad()
        separate.step()
        together.step()
    assert torch.equal(fused.detach(), torch.cat([p.detach() for p in parts]))
    assert not torch.allclose(fused.detach(), whole.detach(), atol=1e-4)


def test_the_shared_builder_gives_muon_the_hidden_matrices_and_adamw_the_rest():
    model = tiny_gpt(bias=True)
    opt = optim.build("muon", model, lr=0.01, weight_decay=0.1, decay_embeddings=True)
    hidden, rest, embeddings = opt.param_groups
    assert [g["hidden_matrix"] for g in opt.param_groups] == [True, False, False]
    assert hidden["names"] == [f"transformer.h.{i}.{name}" for i in range(2) for name in
                               ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")]
    assert embeddings["names"] == ["transformer.wte.weight", "transformer.wpe.weight"]  # (the tied LM head once)
    assert rest["weight_decay"] == 0.0 and all(p.ndim == 1 for p in rest["params"])
    assert hidden["weight_decay"] == embeddings["weight_decay"] == 0.1
    assert len(rest["params"]) + 8 + 2 == len(list(model.parameters()))
    assert "Newton-Schulz in" in opt.describe() and "AdamW, fused" in opt.describe()


def test_diagnostics_are_the_update_s_rms_and_the_orthogonalised_spectrum():
    model = tiny_gpt().double()
    lr, wd = 0.05, 0.1
    opt = optim.build("muon", model, lr=lr, weight_decay=wd, adjust_lr="match_rms_adamw", ns_dtype="float32")
    gen = torch.Generator().manual_seed(2)
    x, y = (torch.randint(0, 32, (2, 8), generator=gen) for _ in range(2))
    model(x, y)[1].backward()
    opt.step()
    assert opt.pop_diagnostics() == {}  # nothing unless requested
    model.zero_grad()
    model(x, y)[1].backward()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    opt.request_diagnostics()
    opt.step()
    got = opt.pop_diagnostics()
    hidden = opt.param_groups[0]["names"]
    assert {k.split("/")[0] for k in got} == {"update_rms", "ns_singular_max", "ns_singular_median"}
    params = dict(model.named_parameters())
    for name in hidden:
        step = before[name] * (1 - lr * wd) - params[name].detach()  # lr_adj * X, part by part
        assert got[f"update_rms/{name}"] == pytest.approx(step.square().mean().sqrt().item() / lr, rel=1e-6)
        if name.endswith("attn.c_proj.weight"):
            singular = torch.linalg.svdvals(step / (lr * 0.2 * math.sqrt(8)))
            for stat, value in (("max", singular[0]), ("median", singular.median())):
                assert got[f"ns_singular_{stat}/{name}"] == pytest.approx(value.item(), rel=1e-5)
            # The quintic iteration takes the gradient's large singular values near 1, not to 1 (a
            # direction the gradient hardly has keeps a small one).
            assert 0.6 < singular[0] < 1.3
    assert got[f"update_rms/{hidden[0]}"] == pytest.approx(0.2, rel=0.3)  # Moonlight's rule: AdamW's RMS


@pytest.mark.parametrize("name", ["muon", "dmuon", "mars"])  # (the hybrids of optim/hybrid.py)
def test_state_dict_round_trip_continues_bitwise(name):
    straight_model, split_model = tiny_gpt(), tiny_gpt()
    straight = optim.build(name, straight_model, lr=0.02, weight_decay=0.1)
    split = optim.build(name, split_model, lr=0.02, weight_decay=0.1)
    gen = torch.Generator().manual_seed(3)
    batches = [tuple(torch.randint(0, 32, (2, 8), generator=gen) for _ in range(2)) for _ in range(6)]

    def run(model, opt, steps):
        for x, y in steps:
            model(x, y)[1].backward()
            opt.step()
            opt.zero_grad()
    run(straight_model, straight, batches)
    run(split_model, split, batches[:3])
    saved, weights = copy.deepcopy(split.state_dict()), copy.deepcopy(split_model.state_dict())
    resumed_model = tiny_gpt()
    resumed_model.load_state_dict(weights)
    resumed = optim.build(name, resumed_model, lr=0.02, weight_decay=0.1)
    resumed.load_state_dict(saved)
    run(resumed_model, resumed, batches[3:])
    for (name, a), b in zip(straight_model.named_parameters(), resumed_model.parameters()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("kwargs, bad", [
    ({"momentum": 1.0}, "momentum"), ({"ns_steps": 0}, "ns_steps"), ({"ns_steps": 2.5}, "ns_steps"),
    ({"adjust_lr": "spectral"}, "adjust_lr"), ({"ns_dtype": "float8"}, "ns_dtype"), ({"ns_eps": 0.0}, "ns_eps"),
    ({"ns_coefficients": (1.0, 2.0)}, "ns_coefficients"), ({"betas": (0.9, 1.0)}, "beta"), ({"lr": -1.0}, "learning rate"),
    ({"adamw_lr": -1e-3}, "adamw_lr"), ({"adamw_weight_decay": -0.1}, "adamw_weight_decay"), ({"nesterov": 1}, "nesterov"),
])
def test_rejects_invalid_hyperparameters(kwargs, bad):
    """The constructor refuses each (a ValueError); so does optim.build, a value of another type than the
    constructor declares already in optim.settings (a TypeError: tests/test_optim_options.py)."""
    with pytest.raises(ValueError, match=bad):
        Muon(optim.param_groups(tiny_gpt(), 0.1, hidden_matrices_apart=True), **{"lr": 0.02, **kwargs})
    with pytest.raises((ValueError, TypeError), match=bad):
        optim.build("muon", tiny_gpt(), **{"lr": 0.02, **kwargs})


def test_refuses_groups_it_cannot_step():
    with pytest.raises(ValueError, match="hidden_matrix"):
        Muon([nn.Parameter(torch.zeros(3, 3))], lr=0.02)  # plain tensors: which are Muon's?
    with pytest.raises(ValueError, match="2-D"):
        Muon([{"params": [nn.Parameter(torch.zeros(3))], "hidden_matrix": True}], lr=0.02)


def test_auto_picks_bfloat16_where_the_cpu_has_bfloat16_units(monkeypatch):
    from optim import muon
    opt = optim.build("muon", tiny_gpt(), lr=0.02)
    for flags, expected in (({"avx512f"}, torch.float32), ({"avx512f", "amx_bf16"}, torch.bfloat16),
                            ({"avx512_bf16"}, torch.bfloat16)):
        monkeypatch.setattr(muon, "_cpu_flags", lambda flags=flags: flags)
        assert opt.ns_dtype(opt.param_groups[0], torch.device("cpu")) == expected
    assert opt.ns_dtype(opt.param_groups[0], torch.device("cuda")) == torch.bfloat16
    assert opt.ns_dtype({**opt.param_groups[0], "ns_dtype": "float32"}, torch.device("cuda")) == torch.float32


def test_d_muon_is_moonlight_s_muon_with_every_parameter_decayed_at_one_lr():
    """D-Muon built from a model: torch's Muon with Moonlight's lr rule on the hidden matrices, torch's
    AdamW at the same lr and weight decay on every other parameter, biases and gains included. (The
    fused c_attn, three matrices to Muon, is held above; torch's Muon does not step it here.)"""
    model = tiny_gpt(bias=True)
    ours = optim.build("dmuon", model, lr=0.01, ns_dtype="bfloat16")
    settings = optim.settings("dmuon")
    wd, betas, eps = settings["weight_decay"][0], settings["betas"][0], settings["eps"][0]
    assert (wd, betas, settings["adjust_lr"][0]) == (0.1, (0.8, 0.999), "match_rms_adamw")
    hidden = {id(p) for p in ours.param_groups[0]["params"]}
    matrices_group, no_decay, rest_group = ours.param_groups
    assert no_decay["params"] == [] and matrices_group["weight_decay"] == rest_group["weight_decay"] == wd
    twin = copy.deepcopy(model)
    matrices = [q for p, q in zip(model.parameters(), twin.parameters()) if id(p) in hidden and q.shape[0] != 24]
    rest = [q for p, q in zip(model.parameters(), twin.parameters()) if id(p) not in hidden]
    assert {p.ndim for p in rest} == {1, 2} and len(matrices) == 6  # (biases, gains, the embeddings)
    muon = torch.optim.Muon(matrices, lr=0.01, weight_decay=wd, adjust_lr_fn="match_rms_adamw")
    adamw = torch.optim.AdamW(rest, lr=0.01, betas=betas, eps=eps, weight_decay=wd, fused=True)
    for step in range(5):
        for p, q, g in zip(model.parameters(), twin.parameters(), _gradients([p.shape for p in model.parameters()], step)):
            p.grad, q.grad = g.clone(), g.clone()
        ours.step()
        muon.step()
        adamw.step()
    stepped = {id(q) for q in matrices + rest}
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), twin.parameters()) if id(q) in stepped)


def test_d_muon_refuses_keller_jordan_s_lr_rule():
    with pytest.raises(ValueError, match="optimizer='muon'"):
        optim.build("dmuon", tiny_gpt(), lr=0.01, adjust_lr="original")
