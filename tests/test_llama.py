"""The Llama family of model.py (and the soft-caps) against a reference written out here in float64:
RMSNorm, rotary positions as explicit rotations of each (i, i + head_dim/2) pair, SwiGLU, the
untied head; what the instruments, QK-Clip and the optimizers' parameter split see of it."""

import math

import pytest
import torch
import torch.nn.functional as F

import model as model_module
from model import GPT, GPTConfig
from optim import param_groups
from training.distributed import Distributed
from training.qk_clip import QKClip

ONE_PROCESS = Distributed(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def tiny_llama(seed=0, **overrides):
    """A float64 Llama whose every parameter (the RMSNorm gains too) is random."""
    fields = dict(arch="llama", block_size=16, vocab_size=101, n_layer=2, n_head=2, n_embd=12, intermediate_size=20)
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**{**fields, **overrides})).double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


def tokens(model, B, T, seed=1):
    return torch.randint(0, model.config.vocab_size, (B, T), generator=torch.Generator().manual_seed(seed))


# ---- the reference ----

def rms_norm(x, weight, eps):
    return x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + eps) * weight


def rotary(x, positions, theta):
    """Each head's pair (x_i, x_{i + d/2}) rotated by positions * theta ** (-2i / d), one pair at a time."""
    d = x.size(-1)
    out = x.clone()
    for i in range(d // 2):
        angle = positions.double() * theta ** (-2 * i / d)
        cos, sin = torch.cos(angle), torch.sin(angle)
        a, b = x[..., i], x[..., i + d // 2]
        out[..., i], out[..., i + d // 2] = a * cos - b * sin, a * sin + b * cos
    return out


def cap(x, c):
    return x if c is None else c * torch.tanh(x / c)


def reference(model, idx, positions=None):
    """(logits, raw and capped output logits, each layer's masked raw attention logits (B, H, T, T))."""
    cfg, (B, T) = model.config, idx.shape
    C, H = cfg.n_embd, cfg.n_head
    positions = torch.arange(T) if positions is None else positions
    x = model.transformer.wte.weight[idx]
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    layers = []
    for block in model.transformer.h:
        a = rms_norm(x, block.ln_1.weight, cfg.norm_eps)
        q, k, v = ((a @ w.weight.T).view(B, T, H, C // H).transpose(1, 2)
                   for w in (block.attn.q_proj, block.attn.k_proj, block.attn.v_proj))
        if cfg.qk_norm == "rmsnorm":
            q = rms_norm(q, block.attn.q_norm.weight, torch.finfo(q.dtype).eps)
            k = rms_norm(k, block.attn.k_norm.weight, torch.finfo(k.dtype).eps)
        q, k = rotary(q, positions, cfg.rope_theta), rotary(k, positions, cfg.rope_theta)
        logits = (q @ k.transpose(-2, -1) / math.sqrt(C // H)).masked_fill(future, -math.inf)
        layers.append(logits)
        y = torch.softmax(cap(logits, cfg.attn_logit_softcap).masked_fill(future, -math.inf), dim=-1) @ v
        x = x + y.transpose(1, 2).reshape(B, T, C) @ block.attn.o_proj.weight.T
        h = rms_norm(x, block.ln_2.weight, cfg.norm_eps)
        mlp = block.mlp
        x = x + (F.silu(h @ mlp.gate_proj.weight.T) * (h @ mlp.up_proj.weight.T)) @ mlp.down_proj.weight.T
    raw = rms_norm(x, model.transformer.ln_f.weight, cfg.norm_eps) @ model.lm_head.weight.T
    return cap(raw, cfg.final_logit_softcap), raw, layers


CAPS = [dict(), dict(attn_logit_softcap=1.0, final_logit_softcap=1.0)]  # small caps: they bind here


@pytest.mark.parametrize("caps", CAPS)
@pytest.mark.parametrize("qk_norm", [None, "rmsnorm"])
def test_the_llama_forward_and_its_gradients_match_the_written_out_reference(qk_norm, caps):
    model = tiny_llama(qk_norm=qk_norm, **caps)
    idx, targets = tokens(model, 2, 11), tokens(model, 2, 11, seed=2)
    logits, loss = model(idx, targets)
    expected, raw, layers = reference(model, idx)
    torch.testing.assert_close(logits, expected, rtol=1e-12, atol=1e-12)
    if caps:  # the caps bind
        assert raw.abs().max() > 2 * caps["final_logit_softcap"]
        assert max(logits[torch.isfinite(logits)].max() for logits in layers) > 2 * caps["attn_logit_softcap"]
    grads = torch.autograd.grad(loss, list(model.parameters()))
    expected_loss = F.cross_entropy(expected.flatten(0, 1), targets.flatten())
    expected_grads = torch.autograd.grad(expected_loss, list(model.parameters()))
    torch.testing.assert_close(loss, expected_loss, rtol=1e-12, atol=0)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_the_soft_cap_s_gradient_is_its_derivative():
    """softcap'(x) = 1 - tanh(x / c)^2: autograd's gradient against finite differences (gradcheck)."""
    x = torch.linspace(-9, 9, 37, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: model_module.softcap(t, 2.5), (x,))
    (grad,) = torch.autograd.grad(model_module.softcap(x, 2.5).sum(), x)
    torch.testing.assert_close(grad, 1 - torch.tanh(x.detach() / 2.5) ** 2, rtol=1e-14, atol=1e-16)
    assert model_module.softcap(x, None) is x


def test_capped_attention_gradients_pass_gradcheck():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 5, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    assert torch.autograd.gradcheck(
        lambda q, k, v: model_module.capped_attention(q, k, v, None, 0.9, 1.3, 0.0), (q, k, v))


def test_positions_are_relative_and_packed_rows_see_their_own_positions():
    """Rotary logits depend only on position differences: a sequence placed at positions 5.. gives the
    same hidden states as at 0.., and equals the reference at those positions."""
    model = tiny_llama()
    idx = tokens(model, 2, 9)
    shifted = model.hidden_states(idx, positions=torch.arange(5, 14), attn_mask=torch.ones(9, 9).tril().bool())
    torch.testing.assert_close(shifted, model.hidden_states(idx), rtol=1e-10, atol=1e-12)
    expected, _, _ = reference(model, idx, positions=torch.arange(5, 14))
    torch.testing.assert_close(model.output_logits(shifted), expected, rtol=1e-10, atol=1e-12)


def test_the_probe_reports_post_rotary_raw_and_capped_maxima():
    model = tiny_llama(attn_logit_softcap=1.5, final_logit_softcap=2.0)
    idx = tokens(model, 2, 11)
    stats = model.probe(idx, chunk_size=4)
    _, raw, layers = reference(model, idx)
    max_logit = torch.stack([logits.amax(dim=(0, 2, 3)) for logits in layers])
    torch.testing.assert_close(stats["max_logit"], max_logit, rtol=1e-12, atol=0)
    torch.testing.assert_close(stats["max_logit_capped"], 1.5 * torch.tanh(max_logit / 1.5), rtol=1e-12, atol=0)
    entropy = []
    for logits in layers:  # the entropy of what the softmax sees: the capped logits
        p = torch.softmax(cap(logits, 1.5).masked_fill(logits == -math.inf, -math.inf), dim=-1)
        entropy.append(-torch.where(p > 0, p * p.log(), torch.zeros_like(p)).sum(-1).mean(dim=(0, 2)))
    torch.testing.assert_close(stats["attn_entropy"], torch.stack(entropy), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(stats["max_abs_logit"], raw.abs().max(), rtol=1e-12, atol=0)
    torch.testing.assert_close(stats["max_abs_logit_capped"], 2.0 * torch.tanh(raw.abs().max() / 2.0))
    torch.testing.assert_close(stats["log_z"], torch.logsumexp(cap(raw, 2.0), dim=-1).mean(), rtol=1e-12, atol=0)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_the_chunked_loss_with_a_final_cap_is_the_whole_loss_and_gradient(arch, monkeypatch):
    overrides = dict(arch=arch, final_logit_softcap=2.0, **({"bias": False} if arch == "gpt2" else {}))
    model = tiny_llama(**overrides)
    assert model.chunks_loss()
    monkeypatch.setattr(model_module, "LOSS_CHUNK", 5)  # 22 positions: 5 chunks, the last partial
    idx, targets = tokens(model, 2, 11), tokens(model, 2, 11, seed=2)
    targets[0, 3] = -1
    _, chunked = model(idx, targets, logits=False)
    chunked_grads = torch.autograd.grad(chunked, list(model.parameters()))
    logits, whole = model(idx, targets)
    whole_grads = torch.autograd.grad(whole, list(model.parameters()))
    torch.testing.assert_close(chunked, whole, rtol=1e-13, atol=0)
    for got, want in zip(chunked_grads, whole_grads):
        torch.testing.assert_close(got, want, rtol=1e-11, atol=1e-14)


def test_qk_clip_holds_a_clipped_head_s_post_rotary_logit_at_tau():
    """Scaling a head's W_q and W_k rows by sqrt(gamma) scales its post-rotary logits by gamma (rotary
    rotates each (q, k) pair): after the clip, the clipped heads' largest logit on the batch is tau."""
    model = tiny_llama()
    idx, targets = tokens(model, 3, 12), tokens(model, 3, 12, seed=2)
    clip = QKClip(model, tau=math.inf, ctx=ONE_PROCESS)
    with clip.measuring():
        model(idx, targets)[1].backward()
    _, _, layers = reference(model, idx)
    expected = torch.stack([logits.amax(dim=(0, 2, 3)) for logits in layers])
    torch.testing.assert_close(clip.max_logits, expected, rtol=1e-12, atol=0)
    measured = clip.max_logits.clone()
    clip.tau = tau = measured.flatten().sort().values[1].item()  # 2 of 4 heads above it
    above = measured > tau
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    clip.apply(torch.tensor(True))
    head_dim = model.config.n_embd // model.config.n_head
    for name, p in model.named_parameters():
        if not name.endswith(("q_proj.weight", "k_proj.weight")):
            assert torch.equal(p, before[name]), name
            continue
        layer = int(name.split(".")[2])
        for head in range(model.config.n_head):
            rows = slice(head * head_dim, (head + 1) * head_dim)
            factor = math.sqrt(tau / measured[layer, head].item()) if above[layer, head] else 1.0
            torch.testing.assert_close(p[rows], before[name][rows] * factor, rtol=1e-15, atol=0)
    after = torch.stack([logits.amax(dim=(0, 2, 3)) for logits in reference(model, idx)[2]])[0]
    torch.testing.assert_close(after[above[0]], torch.full_like(after[above[0]], tau), rtol=1e-12, atol=0)
    assert torch.equal(after[~above[0]], expected[0][~above[0]])


def test_every_block_matrix_is_a_hidden_matrix_and_the_untied_head_is_not():
    model = tiny_llama()
    hidden, no_decay, decayed_rest = param_groups(model, 0.1, hidden_matrices_apart=True)
    block = {"attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
             "mlp.down_proj"}
    assert sorted(hidden["names"]) == sorted(f"transformer.h.{i}.{m}.weight" for i in range(2) for m in block)
    assert {"transformer.wte.weight", "lm_head.weight"} <= set(no_decay["names"])
    assert not decayed_rest["params"]
    assert model.lm_head.weight is not model.transformer.wte.weight  # untied
    matrices = [name for block in model.transformer.h for name, _, _ in block.matrices()]
    assert matrices == 2 * ["attn_q", "attn_k", "attn_v", "attn_proj", "mlp_gate", "mlp_up", "mlp_proj"]


def test_llama_130m_counts_its_parameters_and_flops_by_hand():
    config = GPTConfig.preset("llama_130m", vocab_size=32128, block_size=256)
    with torch.device("meta"):
        model = GPT(config)
    C, I, L, V = 768, 2048, 12, 32128
    per_block = 4 * C * C + 3 * C * I + 2 * C  # q, k, v, o; gate, up, down; two RMSNorm gains
    total = V * C + L * per_block + C + V * C  # wte, blocks, final norm, the untied head
    assert model.num_params(non_embedding=False) == total
    assert model.num_params() == total - V * C  # the input lookup does no matmul; the head does
    assert model.flops_per_token() == 6 * (total - V * C) + 12 * L * 12 * 64 * 256
    assert config.norm_eps == 1e-6 and config.intermediate_size == 2048
    assert GPTConfig.preset("llama_350m").intermediate_size == model_module.llama_width(1024) == 2736


@pytest.mark.parametrize("fields, message", [
    (dict(arch="t5"), "arch must be one of"),
    (dict(arch="llama", bias=True), "the Llama family has neither"),
    (dict(attn_logit_softcap=0.0), "attn_logit_softcap must be a positive number"),
    (dict(final_logit_softcap="30"), "final_logit_softcap must be a positive number"),
])
def test_invalid_llama_and_soft_cap_configs_raise(fields, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(**fields)


def test_the_logged_probe_has_the_capped_maxima_beside_the_raw_ones():
    from training.instruments import probe_record
    model = tiny_llama(attn_logit_softcap=1.5, final_logit_softcap=2.0)
    record = probe_record(model, tokens(model, 2, 11))
    for layer in range(2):
        raw = record[f"max_logit/layer_{layer:02d}"]
        assert record[f"max_logit_capped/layer_{layer:02d}"] == pytest.approx(1.5 * math.tanh(raw / 1.5), rel=1e-12)
    raw = record["output/max_abs_logit"]
    assert record["output/max_abs_logit_capped"] == pytest.approx(2.0 * math.tanh(raw / 2.0), rel=1e-12)
    assert not any("capped" in key for key in probe_record(tiny_llama(), tokens(model, 2, 11)))


def test_the_noise_scale_s_qk_group_is_every_block_s_q_and_k_projection():
    from training.noise_scale import gpt_groups
    model = tiny_llama()
    qk = gpt_groups(model)["attn_qk"]
    expected = [w for block in model.transformer.h for w in (block.attn.q_proj.weight, block.attn.k_proj.weight)]
    assert [p for p, _ in qk] == expected and all(rows == slice(None) for _, rows in qk)
