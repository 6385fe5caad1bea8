"""model.py against references written here by hand (float64 where numerics matter)."""

import math

import pytest
import torch

from model import GPT, GPTConfig, PRESETS


def tiny_config(**overrides):
    fields = dict(block_size=16, vocab_size=37, n_layer=3, n_head=2, n_embd=12, bias=True)
    return GPTConfig(**{**fields, **overrides})


def tiny_model(seed=0, **overrides):
    """A float64 model whose every parameter (biases and LayerNorm too) is random, so that no
    term of the forward is trivially zero or one and every weight is exercised."""
    torch.manual_seed(seed)
    model = GPT(tiny_config(**overrides)).double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


def random_tokens(model, B, T, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (B, T), generator=g)


# ---- the reference: GPT-2 written out with plain tensor algebra ----

def layer_norm(x, ln):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    y = (x - mean) / torch.sqrt(var + ln.eps) * ln.weight
    return y if ln.bias is None else y + ln.bias


def linear(x, lin):
    y = x @ lin.weight.T
    return y if lin.bias is None else y + lin.bias


def gelu_tanh(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def heads(t, n_head):
    B, T, C = t.shape
    return t.reshape(B, T, n_head, C // n_head).permute(0, 2, 1, 3)


def rms_norm(x, norm):
    return x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + torch.finfo(x.dtype).eps) * norm.weight


def qk_normed(t, norm, kind):
    return {None: lambda: t, "layernorm": lambda: layer_norm(t, norm), "rmsnorm": lambda: rms_norm(t, norm)}[kind]()


def reference_attention(x, attn, n_head, layer_idx, inverse_layer_scaling, qk_norm=None, softcap=None):
    """Manual causal softmax attention, of the logits soft-capped (cap * tanh(logit / cap)) where softcap
    is set; returns the output and the full masked (B, H, T, T) raw logits."""
    B, T, C = x.shape
    qkv = linear(x, attn.c_attn)
    q, k, v = (heads(qkv[..., i * C:(i + 1) * C], n_head) for i in range(3))
    q, k = qk_normed(q, attn.q_norm, qk_norm), qk_normed(k, attn.k_norm, qk_norm)
    logits = q @ k.transpose(-2, -1) / math.sqrt(C // n_head)
    if inverse_layer_scaling:
        logits = logits / (layer_idx + 1)
    future = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)
    capped = logits if softcap is None else softcap * torch.tanh(logits / softcap)
    logits = logits.masked_fill(future, float("-inf"))
    y = torch.softmax(capped.masked_fill(future, float("-inf")), dim=-1) @ v
    y = y.permute(0, 2, 1, 3).reshape(B, T, C)
    return linear(y, attn.c_proj), logits


def reference_forward(model, idx):
    """Logits (B, T, V) and each layer's full masked logit matrix, computed without the model's forward."""
    cfg = model.config
    T = idx.size(1)
    x = model.transformer.wte.weight[idx] + model.transformer.wpe.weight[:T]
    layer_logits = []
    for i, block in enumerate(model.transformer.h):
        attn_out, logits = reference_attention(
            layer_norm(x, block.ln_1), block.attn, cfg.n_head, i, cfg.scale_attn_by_inverse_layer_idx, cfg.qk_norm
        )
        layer_logits.append(logits)
        x = x + attn_out
        h = layer_norm(x, block.ln_2)
        x = x + linear(gelu_tanh(linear(h, block.mlp.c_fc)), block.mlp.c_proj)
    x = layer_norm(x, model.transformer.ln_f)
    return x @ model.transformer.wte.weight.T, layer_logits


# ---- forward and attention ----

@pytest.mark.parametrize("qk_norm", [None, "layernorm", "rmsnorm"])
def test_forward_matches_reference(qk_norm):
    model = tiny_model(qk_norm=qk_norm)
    idx = random_tokens(model, 2, 11)
    logits, loss = model(idx)
    expected, _ = reference_forward(model, idx)
    assert loss is None
    assert logits.shape == (2, 11, model.config.vocab_size)
    torch.testing.assert_close(logits, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("softcap", [None, 0.5])  # 0.5: below these logits, so the cap binds
@pytest.mark.parametrize("inverse_layer_scaling", [False, True])
def test_sdpa_attention_matches_manual_softmax_attention(inverse_layer_scaling, softcap):
    model = tiny_model(scale_attn_by_inverse_layer_idx=inverse_layer_scaling, attn_logit_softcap=softcap)
    x = torch.randn(3, 9, model.config.n_embd, dtype=torch.float64)
    for i, block in enumerate(model.transformer.h):
        expected, logits = reference_attention(x, block.attn, model.config.n_head, i, inverse_layer_scaling,
                                               softcap=softcap)
        assert softcap is None or logits.max() > 2 * softcap
        torch.testing.assert_close(block.attn(x), expected, rtol=1e-10, atol=1e-10)


def test_loss_is_mean_negative_log_likelihood_ignoring_minus_one():
    model = tiny_model()
    idx = random_tokens(model, 2, 10)
    targets = random_tokens(model, 2, 10, seed=2)
    targets[0, :3] = -1
    targets[1, 7] = -1
    logits, loss = model(idx, targets)
    log_probs = logits - logits.exp().sum(-1, keepdim=True).log()
    keep = targets != -1
    picked = log_probs[keep].gather(1, targets[keep].unsqueeze(1))
    torch.testing.assert_close(loss, -picked.mean(), rtol=1e-12, atol=1e-12)


def test_sequence_longer_than_block_size_raises():
    model = tiny_model()
    idx = random_tokens(model, 1, model.config.block_size + 1)
    with pytest.raises(ValueError, match="block_size"):
        model(idx)
    with pytest.raises(ValueError, match="block_size"):
        model.probe(idx)


def test_future_token_never_changes_earlier_logits():
    model = tiny_model()
    idx = random_tokens(model, 2, 12)
    t = 7
    changed = idx.clone()
    changed[:, t] = (changed[:, t] + 1) % model.config.vocab_size
    logits, _ = model(idx)
    changed_logits, _ = model(changed)
    torch.testing.assert_close(changed_logits[:, :t], logits[:, :t], rtol=0, atol=1e-12)
    assert not torch.allclose(changed_logits[:, t], logits[:, t])  # the change is visible at t


# ---- the probe: per-head max logits and entropies, output-logit growth ----

def reference_probe(model, idx):
    """The probe's statistics from the fully materialised masked logits and the full LM-head logits."""
    logits, layer_logits = reference_forward(model, idx)
    max_logit = torch.stack([layer.amax(dim=(0, 2, 3)) for layer in layer_logits])
    entropies = []
    for layer in layer_logits:
        p = torch.softmax(layer, dim=-1)
        p_log_p = torch.where(p > 0, p * p.log(), torch.zeros_like(p))
        entropies.append(-p_log_p.sum(-1).mean(dim=(0, 2)))  # over keys, then batch and queries
    return {"max_logit": max_logit, "attn_entropy": torch.stack(entropies), "max_abs_logit": logits.abs().max(),
            "log_z": torch.logsumexp(logits, dim=-1).mean()}


@pytest.mark.parametrize("inverse_layer_scaling,qk_norm", [(False, None), (True, None), (True, "layernorm"),
                                                           (False, "rmsnorm")])
@pytest.mark.parametrize("chunk_size", [1, 4, 11, 64])  # 4 does not divide T = 11
@pytest.mark.parametrize("T", [1, 11])  # T = 1: the only causal logit is the diagonal one, entropy 0
def test_probe_matches_full_logit_matrices(inverse_layer_scaling, qk_norm, chunk_size, T):
    model = tiny_model(scale_attn_by_inverse_layer_idx=inverse_layer_scaling, qk_norm=qk_norm)
    idx = random_tokens(model, 2, T)
    expected = reference_probe(model, idx)
    got = model.probe(idx, chunk_size=chunk_size)
    assert got.keys() == expected.keys()
    assert got["max_logit"].shape == got["attn_entropy"].shape == (model.config.n_layer, model.config.n_head)
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-10, atol=1e-10)
    if T == 1:
        assert (got["attn_entropy"] == 0).all()
    else:  # a query attends to at most its T keys
        assert (got["attn_entropy"] > 0).all() and (got["attn_entropy"] <= math.log(T)).all()


def test_probe_of_a_prefix_ignores_later_tokens():
    model = tiny_model()
    t = 6
    idx = random_tokens(model, 2, 12)
    other = idx.clone()
    other[:, t:] = random_tokens(model, 2, 12 - t, seed=5)
    prefix_max = model.probe(idx[:, :t], chunk_size=4)["max_logit"]
    for full in (idx, other):
        _, layer_logits = reference_forward(model, full)
        # rows are queries: those before t only see the shared prefix
        expected = torch.stack([logits[:, :, :t].amax(dim=(0, 2, 3)) for logits in layer_logits])
        torch.testing.assert_close(prefix_max, expected, rtol=1e-10, atol=1e-10)
        assert (model.probe(full)["max_logit"] >= prefix_max - 1e-10).all()


def test_probe_runs_without_dropout_and_restores_training_mode():
    model = tiny_model(dropout=0.5)
    idx = random_tokens(model, 2, 11)
    model.train()
    got = model.probe(idx, chunk_size=3)
    assert model.training and all(m.training for m in model.modules())
    expected = reference_probe(model, idx)  # the reference has no dropout
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-10, atol=1e-10)
    model.eval()
    model.probe(idx)
    assert not model.training


def test_probe_under_autocast_is_float32():
    model = tiny_model().float()
    idx = random_tokens(model, 2, 11)
    exact = model.probe(idx, chunk_size=4)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        got = model.probe(idx, chunk_size=4)
    for key in exact:
        assert got[key].dtype == torch.float32
        torch.testing.assert_close(got[key], exact[key], rtol=0.05, atol=0.05)  # bf16 residual stream


def test_probe_rejects_bad_chunk_size():
    model = tiny_model()
    with pytest.raises(ValueError, match="chunk_size"):
        model.probe(random_tokens(model, 1, 4), chunk_size=0)


# ---- z-loss ----

@pytest.mark.parametrize("z_loss", [0.0, 1e-4, 0.3])
def test_z_loss_and_its_gradient_match_a_hand_written_reference(z_loss):
    model = tiny_model()
    idx = random_tokens(model, 2, 10)
    targets = random_tokens(model, 2, 10, seed=2)
    targets[0, :3] = -1  # ignored positions count in neither term
    _, loss = model(idx, targets, z_loss=z_loss)
    assert_loss_and_gradients_are_the_reference(model, idx, targets, z_loss, loss)


def assert_loss_and_gradients_are_the_reference(model, idx, targets, z_loss, loss):
    """``loss`` (of ``model``, not yet backpropagated) and its gradients against the loss written out
    from reference_forward's logits: the mean NLL over targets != -1 plus z_loss * mean(log Z^2)."""
    loss.backward()
    got_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    logits, _ = reference_forward(model, idx)
    keep = targets != -1
    log_z = logits.exp().sum(-1).log()  # log of the softmax normaliser, written out
    nll = (log_z - logits.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1))[keep].mean()
    expected = nll + z_loss * (log_z[keep] ** 2).mean()
    expected.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)
    for got, p in zip(got_grads, model.parameters()):
        torch.testing.assert_close(got, p.grad, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("z_loss", [0.0, 1e-2])
def test_training_loss_without_logits_is_the_loss_and_its_gradient(z_loss, monkeypatch):
    # A vocabulary of 8 x n_embd: the training forward takes torch's chunked linear_cross_entropy
    # (chunks of 8 positions here, so that 40 positions make several and a partial one); with
    # z-loss it needs every log Z and takes the whole logits. Loss and gradients against the
    # written-out reference, float64.
    import model as model_module
    monkeypatch.setattr(model_module, "LOSS_CHUNK", 8)
    model = tiny_model(vocab_size=96, bias=False)
    idx = random_tokens(model, 4, 10)
    targets = random_tokens(model, 4, 10, seed=2)
    targets[0, :3] = -1
    chunked = []  # the options of each call of the chunked op
    linear_cross_entropy = torch.nn.functional.linear_cross_entropy

    def recorded(*args, **kwargs):
        chunked.append(kwargs["options"])
        return linear_cross_entropy(*args, **kwargs)
    monkeypatch.setattr(torch.nn.functional, "linear_cross_entropy", recorded)
    logits, loss = model(idx, targets, z_loss=z_loss, logits=False)
    assert logits is None and len(chunked) == (0 if z_loss else 1)
    assert not chunked or chunked[0].batch_chunk_size == 8
    assert_loss_and_gradients_are_the_reference(model, idx, targets, z_loss, loss)


def test_a_small_vocabulary_keeps_the_whole_logits():
    model = tiny_model(vocab_size=95)  # < 8 x n_embd (96)
    assert not model.chunks_loss() and tiny_model(vocab_size=96).chunks_loss()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not tiny_model(vocab_size=96).chunks_loss()  # under autocast the logits are bf16's


# ---- weights, init, sizes ----

def test_embeddings_are_tied():
    model = GPT(tiny_config())
    assert model.lm_head.weight is model.transformer.wte.weight
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
    assert "lm_head.weight" not in dict(model.named_parameters())  # counted once


def test_gpt2_init():
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=64, vocab_size=512, n_layer=8, n_head=4, n_embd=256, bias=True)
    model = GPT(cfg)
    residual_std = 0.02 / math.sqrt(2 * cfg.n_layer)
    for i, block in enumerate(model.transformer.h):
        assert block.attn.c_proj.weight.std().item() == pytest.approx(residual_std, rel=0.05)
        assert block.mlp.c_proj.weight.std().item() == pytest.approx(residual_std, rel=0.05)
        assert block.attn.c_attn.weight.std().item() == pytest.approx(0.02, rel=0.05)
        assert block.mlp.c_fc.weight.std().item() == pytest.approx(0.02, rel=0.05)
        assert torch.all(block.ln_1.weight == 1) and torch.all(block.ln_1.bias == 0)
    for emb in (model.transformer.wte, model.transformer.wpe):
        assert emb.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert all(torch.all(p == 0) for name, p in model.named_parameters() if name.endswith(".bias"))


def gpt2_param_count(vocab, block, n_layer, C, bias):
    """Counted from GPT-2's architecture: tied wte, wpe, per block two LayerNorms, c_attn, c_proj,
    c_fc and the MLP's c_proj; a final LayerNorm."""
    ln = C + (C if bias else 0)
    per_block = 2 * ln + (C * 3 * C + (3 * C if bias else 0)) + (C * C + (C if bias else 0))
    per_block += (C * 4 * C + (4 * C if bias else 0)) + (4 * C * C + (C if bias else 0))
    return vocab * C + block * C + n_layer * per_block + ln


@pytest.mark.parametrize("vocab, bias, total", [
    (50304, False, 124_373_760),
    (50304, True, 124_475_904),
    (50257, True, 124_439_808),  # Hugging Face's published count for "gpt2"
])
def test_gpt2_param_count(vocab, bias, total):
    with torch.device("meta"):  # shapes only: no memory, no init cost
        model = GPT(GPTConfig.preset("gpt2", vocab_size=vocab, bias=bias))
    assert gpt2_param_count(vocab, 1024, 12, 768, bias) == total
    assert model.num_params(non_embedding=False) == total
    assert model.num_params() == total - 1024 * 768


def test_flops_per_token_and_mfu():
    model = GPT(GPTConfig.preset("nano", block_size=32, vocab_size=100))
    n = model.num_params()
    expected = 6 * n + 12 * 4 * 4 * 32 * 32
    assert model.flops_per_token() == expected
    assert model.estimate_mfu(tokens_per_second=1000.0, peak_flops=expected * 4000.0) == pytest.approx(0.25)


# ---- config ----

def test_presets_and_overrides():
    cfg = GPTConfig.preset("gpt2-medium", scale_attn_by_inverse_layer_idx=True, dropout=0.1)
    assert (cfg.n_layer, cfg.n_head, cfg.n_embd) == (24, 16, 1024)
    assert cfg.scale_attn_by_inverse_layer_idx and cfg.dropout == 0.1
    assert (GPTConfig.preset("gpt2-large").n_embd, GPTConfig.preset("gpt2-xl").n_head) == (1280, 25)
    for name in PRESETS:
        GPTConfig.preset(name)  # every preset passes validation


def test_unknown_preset_names_the_valid_ones():
    with pytest.raises(ValueError) as err:
        GPTConfig.preset("gpt3")
    for name in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "nano", "micro", "mini"):
        assert name in str(err.value)


@pytest.mark.parametrize("fields, message", [
    (dict(n_embd=100, n_head=3), "divisible by n_head"),
    (dict(n_layer=0), "n_layer"),
    (dict(block_size=8.0), "block_size"),
    (dict(dropout=1.0), "dropout"),
    (dict(qk_norm="l2"), "qk_norm must be one of None, 'layernorm', 'rmsnorm'"),
])
def test_invalid_config_raises(fields, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(**fields)


# ---- generation ----

def test_generate_shape_determinism_and_cropping():
    model = tiny_model().eval()
    idx = random_tokens(model, 2, 5)
    n_new = 20  # 5 + 20 > block_size 16: the context must be cropped
    a = model.generate(idx, n_new, temperature=0.8, top_k=5, generator=torch.Generator().manual_seed(7))
    b = model.generate(idx, n_new, temperature=0.8, top_k=5, generator=torch.Generator().manual_seed(7))
    assert a.shape == (2, 5 + n_new)
    assert torch.equal(a, b)
    assert torch.equal(a[:, :5], idx)
    assert ((a >= 0) & (a < model.config.vocab_size)).all()


def test_generate_top_k_one_is_greedy():
    model = tiny_model().eval()
    idx = random_tokens(model, 2, 4)
    out = model.generate(idx, 6, top_k=1, generator=torch.Generator().manual_seed(0))
    expected = idx
    for _ in range(6):
        # The argmax of the model's own logits, as generate computes them: the reference's agree to
        # rounding (test_forward_matches_reference), which could flip an argmax between near-equal logits.
        logits, _ = model(expected[:, -model.config.block_size:])
        expected = torch.cat((expected, logits[:, -1].argmax(-1, keepdim=True)), dim=1)
    assert torch.equal(out, expected)


def test_generate_never_samples_vocabulary_padding():
    model = tiny_model().eval()
    with torch.no_grad():  # make the padding rows the most likely tokens
        model.lm_head.weight[-3:] = model.lm_head.weight[-3:] * 0 + 5.0
    idx = random_tokens(model, 4, 3)
    n_vocab = model.config.vocab_size - 3
    out = model.generate(idx, 10, generator=torch.Generator().manual_seed(0), n_vocab=n_vocab)
    assert (out[:, 3:] < n_vocab).all()
    assert (model.generate(idx, 10, generator=torch.Generator().manual_seed(0))[:, 3:] >= n_vocab).any()
