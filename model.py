"""GPT-2 and the Llama family in one file, nanoGPT style.

Two architectures share one model class and one block layout (transformer.wte, transformer.h[i].
{ln_1, attn, ln_2, mlp}, transformer.ln_f, lm_head), so every instrument, optimizer and layout
applies to both:

* ``arch="gpt2"``: LayerNorm, learned positions, a fused q/k/v projection ``c_attn``, a GELU MLP,
  the LM head tied to the token embedding. Module names match nanoGPT and Hugging Face's GPT-2.
* ``arch="llama"`` (the MERIT paper's second family, GaLore's Llama): RMSNorm, rotary positions on q
  and k, separate ``q_proj``/``k_proj``/``v_proj``/``o_proj``, a SwiGLU MLP (``gate_proj``,
  ``up_proj``, ``down_proj``), no biases, an untied LM head. Inside a block the names and every
  operation are Hugging Face's LlamaForCausalLM's, so an exported model computes the same floats.

Either can soft-cap its attention logits and its output logits (Gemma 2: cap * tanh(x / cap)).
Besides the usual forward/generate, the model has a no-grad probe, `probe`, that reports per layer
and head the largest pre-softmax attention logit (the quantity MERIT is designed to keep in check)
and the attention entropy, and the LM head's output-logit growth. hf.py converts to and from
Hugging Face's GPT2LMHeadModel and LlamaForCausalLM.
"""

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from torch.utils.hooks import RemovableHandle

import kernels

# Presets only fix the shape (n_layer, n_head, n_embd; for Llama its architecture and MLP width);
# every other field keeps its default unless overridden. The small ones are for CPU runs and tests.
# Comments: parameters in the transformer blocks (total at vocab 50304, block_size 1024, no biases;
# Llama: at vocab 32128, the T5 tokenizer's 32,100 padded to a multiple of 64).
PRESETS = {
    "nano": dict(n_layer=4, n_head=4, n_embd=128),  # 0.8M (7.4M)
    "micro": dict(n_layer=6, n_head=6, n_embd=192),  # 2.7M (12.5M)
    "mini": dict(n_layer=6, n_head=6, n_embd=384),  # 10.6M (30.3M)
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768),  # 85M (124M)
    "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024),  # 302M (355M)
    "gpt2-large": dict(n_layer=36, n_head=20, n_embd=1280),  # 708M (774M)
    "gpt2-xl": dict(n_layer=48, n_head=25, n_embd=1600),  # 1475M (1557M)
    # GaLore's Llama shapes (its configs/llama_130m.json and llama_350m.json)
    "llama_nano": dict(arch="llama", n_layer=4, n_head=4, n_embd=128),  # 0.8M (9.0M)
    "llama_130m": dict(arch="llama", n_layer=12, n_head=12, n_embd=768, intermediate_size=2048),  # 85M (134M)
    "llama_350m": dict(arch="llama", n_layer=24, n_head=16, n_embd=1024, intermediate_size=2736),  # 302M (368M)
}

ARCHS = ("gpt2", "llama")
HF_CLASSES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}  # what each exports as (hf.py)
FAMILIES = {"gpt2": "GPT-2", "llama": "Llama"}  # each arch's family, as hf_export_refusal names it
QK_NORMS = (None, "layernorm", "rmsnorm")
NORM_EPS = {"gpt2": 1e-5, "llama": 1e-6}  # torch's LayerNorm default; GaLore's Llama (rms_norm_eps)


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64 for faster matmuls
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = False  # biases in Linear and LayerNorm layers; GPT-2 had them
    scale_attn_by_inverse_layer_idx: bool = False  # divide layer i's logits by (i + 1), as HF GPT-2
    qk_norm: str | None = None  # "layernorm" or "rmsnorm" of each head's q and k (QK-Norm); None: off
    arch: str = "gpt2"  # "gpt2" or "llama" (the module docstring says what each is)
    intermediate_size: int | None = None  # the MLP's hidden width; None: 4 * n_embd (gpt2), llama_width
    norm_eps: float | None = None  # the block and final norms' epsilon; None: NORM_EPS[arch]
    rope_theta: float = 10000.0  # llama: the rotary base
    # Gemma 2's soft-capping, cap * tanh(x / cap), of the attention logits q.k * scale (before the mask
    # and softmax) and of the LM head's logits; None: off (Gemma 2 used 50.0 and 30.0)
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None

    def __post_init__(self):
        if self.arch not in ARCHS:
            raise ValueError(f"GPTConfig.arch must be one of {', '.join(map(repr, ARCHS))}, got {self.arch!r}")
        if self.arch == "llama" and (self.bias or self.scale_attn_by_inverse_layer_idx):
            raise ValueError("GPTConfig: bias and scale_attn_by_inverse_layer_idx are GPT-2's; the Llama "
                             "family has neither: leave them False with arch='llama'")
        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.n_embd if self.arch == "gpt2" else llama_width(self.n_embd)
        if self.norm_eps is None:
            self.norm_eps = NORM_EPS[self.arch]
        for name, meaning in (("norm_eps", "the norms' epsilon: GPT-2 1e-5, Llama 1e-6"),
                              ("rope_theta", "the rotary base: Llama 10000.0")):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ValueError(f"GPTConfig.{name} must be a finite number > 0 ({meaning}), got {value!r}")
        for name in ("attn_logit_softcap", "final_logit_softcap"):
            cap = getattr(self, name)
            if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0):
                raise ValueError(f"GPTConfig.{name} must be a positive number (Gemma 2 used 50.0 and 30.0) "
                                 f"or None (off), got {cap!r}")
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd", "intermediate_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GPTConfig.{name} must be a positive int, got {value!r}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(
                f"GPTConfig.n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout must be in [0, 1), got {self.dropout!r}")
        if self.qk_norm not in QK_NORMS:
            raise ValueError(f"GPTConfig.qk_norm must be one of {', '.join(map(repr, QK_NORMS))}, "
                             f"got {self.qk_norm!r}")

    @classmethod
    def preset(cls, name, **overrides):
        """A named model shape, e.g. GPTConfig.preset("gpt2-medium", scale_attn_by_inverse_layer_idx=True)."""
        if name not in PRESETS:
            raise ValueError(f"unknown model preset {name!r}; valid presets: {', '.join(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})


def hf_export_refusal(model_config: GPTConfig) -> str | None:
    """Why no Hugging Face class computes a model of ``model_config`` (None where its family's class,
    HF_CLASSES, does): what hf.py's export refuses, and what the run guide prints instead of it."""
    family, hf_class = FAMILIES[model_config.arch], HF_CLASSES[model_config.arch]
    if model_config.qk_norm is not None:
        return (f"a model with qk_norm={model_config.qk_norm!r} has no Hugging Face {family} equivalent ({hf_class} "
                f"normalises no q or k)")
    caps = {name: getattr(model_config, name) for name in ("attn_logit_softcap", "final_logit_softcap")
            if getattr(model_config, name) is not None}
    if caps:
        # (Gemma 2's classes soft-cap both, but add norms and scalings this model lacks: docs/evaluation.md
        # says which classes hold what.)
        return (f"a model with {', '.join(f'{k}={v!r}' for k, v in caps.items())} has no Hugging Face {family} "
                f"equivalent ({hf_class} soft-caps no logits)")
    return None


def llama_width(n_embd: int) -> int:
    """SwiGLU's hidden width for a residual width: 8/3 of it (the parameters of a 4x GELU MLP),
    rounded up to a multiple of 16; GaLore's 2048 at 768 and 2736 at 1024."""
    return -(-8 * n_embd // (3 * 16)) * 16


def softcap(logits, cap: float | None):
    """Gemma 2's logit soft-capping, cap * tanh(logits / cap): about the identity for |x| << cap,
    never beyond +-cap; monotonic, so the capped maximum is the cap of the maximum. None: logits."""
    return logits if cap is None else cap * torch.tanh(logits / cap)


class RMSNorm(nn.Module):
    """Llama's RMSNorm, x / sqrt(mean(x^2) + eps) * weight, computed in float32 and exactly as Hugging
    Face's LlamaRMSNorm computes it (so exported models agree to the last bit)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.promote_types(dtype, torch.float32))
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Rotary(nn.Module):
    """Rotary position embeddings (Su et al. 2021) in Llama's Hugging Face layout: in each head,
    dimension i and i + head_dim/2 form a pair rotated by the angle position * theta^(-2i/head_dim).
    The frequencies, angles, cos and sin are computed in float32 (float64 for a float64 model), as
    Hugging Face computes them in float32."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        self.head_dim, self.theta = head_dim, theta

    def forward(self, positions, dtype):
        """positions (T,) or (B, T) -> (cos, sin), each (1 or B, 1, T, head_dim) in dtype."""
        positions = positions if positions.dim() == 2 else positions.unsqueeze(0)
        precision = torch.promote_types(dtype, torch.float32)
        with torch.autocast(device_type=positions.device.type, enabled=False):
            exponents = torch.arange(0, self.head_dim, 2, dtype=precision, device=positions.device) / self.head_dim
            angles = positions[..., None].to(precision) * (1.0 / (self.theta ** exponents))
            angles = torch.cat((angles, angles), dim=-1).unsqueeze(1)
            return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x, rope):
    """x (B, H, T, head_dim) with each of its (i, i + head_dim/2) pairs rotated by rope's angles."""
    cos, sin = rope
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


LOGIT_CHUNK = 64  # queries per chunk of a training forward's logit maximum (QK-Clip)
# The training loss through torch's chunked linear_cross_entropy, LOSS_CHUNK positions at a time,
# where the vocabulary is at least CHUNKED_LOSS_VOCAB times the width: the (B*T, vocab) logits, their
# softmax and their gradient never exist whole. Measured on a 2-core CPU (fp32, forward and
# backward of the LM head and its loss, 50304 classes): 4096 positions x 256 dims 2.01 -> 1.41 s,
# x 768 dims 3.93 -> 3.40 s, 1024 x 768 1.05 -> 0.93 s; chunks of 128-512 were no faster; at a
# 320-byte vocabulary the whole logits are cheaper.
LOSS_CHUNK = 1024
CHUNKED_LOSS_VOCAB = 8


def logit_dtype(q):
    """The dtype attention logits are measured in: float32 (float64 for a float64 model), even
    under autocast, which would otherwise run the matmul in bf16/fp16."""
    return torch.promote_types(q.dtype, torch.float32)


def causal_logit_chunks(q, k, scale, chunk_size):
    """The causal pre-softmax logits q.k * scale of q, k (B, H, T, head_dim), chunk_size queries at
    a time, each against only the keys it may see, so the extra memory is O(B * H * chunk_size * T)
    instead of the full T x T matrix: yields (logits (B, H, chunk, keys) in logit_dtype with -inf at
    future keys, that future mask)."""
    T = q.size(2)
    dtype = logit_dtype(q)
    with torch.autocast(device_type=q.device.type, enabled=False):
        q, k = q.to(dtype), k.to(dtype)
        for start in range(0, T, chunk_size):
            end = min(start + chunk_size, T)
            logits = (q[:, :, start:end] @ k[:, :, :end].transpose(-2, -1)) * scale
            query_pos = torch.arange(start, end, device=q.device).unsqueeze(1)
            future = torch.arange(end, device=q.device).unsqueeze(0) > query_pos
            yield logits.masked_fill(future, float("-inf")), future


@torch.no_grad()
def causal_logit_max(q, k, scale, chunk_size):
    """Per head, the largest causal pre-softmax logit q.k * scale of q, k (B, H, T, head_dim), in
    logit_dtype: chunk_size queries at a time, the keys before the chunk (all visible) and the
    chunk's own triangle apart, so only that small block is masked and nothing of T x T is kept.
    (scale > 0: the max of the scaled logits is the scaled max.)"""
    B, H, T, _ = q.shape
    dtype = logit_dtype(q)
    best = torch.full((H,), float("-inf"), dtype=dtype, device=q.device)
    with torch.autocast(device_type=q.device.type, enabled=False):
        q, k = q.to(dtype), k.to(dtype)
        for start in range(0, T, chunk_size):
            end = min(start + chunk_size, T)
            queries = q[:, :, start:end]
            if start:
                best = torch.maximum(best, (queries @ k[:, :, :start].transpose(-2, -1)).amax(dim=(0, 2, 3)))
            own = queries @ k[:, :, start:end].transpose(-2, -1)
            future = torch.ones(end - start, end - start, dtype=torch.bool, device=q.device).triu(1)
            best = torch.maximum(best, own.masked_fill(future, float("-inf")).amax(dim=(0, 2, 3)))
    return best * scale


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention. GPT-2 projects q, k and v with one fused ``c_attn`` and
    writes back with ``c_proj``; Llama uses ``q_proj``, ``k_proj``, ``v_proj`` and ``o_proj`` and
    rotates q and k by their positions (``rope``, made once per forward by GPT.hidden_states)."""

    def __init__(self, config, layer_idx):
        super().__init__()
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.softcap = config.attn_logit_softcap
        head_dim = config.n_embd // config.n_head
        C = config.n_embd
        if config.arch == "gpt2":
            # The inverse-layer factor tames logit growth in deep GPT-2s (used for Medium and Large).
            layer_factor = layer_idx + 1 if config.scale_attn_by_inverse_layer_idx else 1
            self.scale = 1.0 / (math.sqrt(head_dim) * layer_factor)
            self.c_attn = nn.Linear(C, 3 * C, bias=config.bias)  # fused q, k, v
            self.c_proj = nn.Linear(C, C, bias=config.bias)
        else:
            self.scale = head_dim ** -0.5  # (Hugging Face's Llama's rounding of it)
            self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(C, C, bias=False) for _ in range(4))
        # QK-Norm (Dehghani et al. 2023; the MERIT paper's architectural baseline): each head's q
        # and k normalised over head_dim before the dot product (and before rotary), which bounds the
        # logits by the norms' gains. The probe sees the normalised q and k too (qkv below).
        if config.qk_norm is None:
            self.q_norm = self.k_norm = nn.Identity()
        elif config.qk_norm == "layernorm":
            self.q_norm, self.k_norm = (nn.LayerNorm(head_dim, bias=config.bias) for _ in range(2))
        else:
            self.q_norm, self.k_norm = nn.RMSNorm(head_dim), nn.RMSNorm(head_dim)
        self.resid_dropout = nn.Dropout(config.dropout)
        # register_logit_max_hook's (an OrderedDict, as torch's own hooks: RemovableHandle refers to it weakly)
        self._logit_max_hooks: OrderedDict[int, Callable[[torch.Tensor], None]] = OrderedDict()

    def projection_rows(self) -> dict[str, list[tuple[torch.Tensor, slice]]]:
        """Where q, k and v come from: for each, the (weight or bias, its rows) that compute it."""
        if hasattr(self, "c_attn"):
            C = self.c_attn.in_features
            return {name: [(t, slice(i * C, (i + 1) * C)) for t in self.c_attn.parameters()]
                    for i, name in enumerate("qkv")}
        return {name: [(t, slice(None)) for t in linear.parameters()]
                for name, linear in zip("qkv", (self.q_proj, self.k_proj, self.v_proj))}

    @property
    def out_proj(self) -> nn.Linear:
        return self.c_proj if hasattr(self, "c_attn") else self.o_proj

    def qkv(self, x, rope=None):
        """(B, T, C) -> q, k, v, each (B, n_head, T, head_dim); q and k normalised (QK-Norm) and
        rotated (rope)."""
        B, T, C = x.shape
        if hasattr(self, "c_attn"):
            projected = self.c_attn(x).split(C, dim=2)
        else:
            projected = (self.q_proj(x), self.k_proj(x), self.v_proj(x))
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in projected)
        q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = rotate(q, rope), rotate(k, rope)
        return q, k, v

    def register_logit_max_hook(self, hook: Callable[[torch.Tensor], None]) -> RemovableHandle:
        """Have every causal forward call ``hook(maxima)``, maxima (n_head,) each head's largest
        pre-softmax logit q.k * scale (before any soft-cap), computed from the forward's own q and k
        (``causal_logit_max``), until the returned handle's ``remove()`` (QK-Clip's measurement,
        training/qk_clip.py). Without a hook a forward computes nothing extra."""
        handle = RemovableHandle(self._logit_max_hooks)
        self._logit_max_hooks[handle.id] = hook
        return handle

    def forward(self, x, attn_mask=None, rope=None):
        """attn_mask: None for causal attention, else a bool mask broadcasting to (B, n_head, T, T),
        True where a query may attend to a key (packed sequences, see GPT.hidden_states)."""
        B, T, C = x.shape
        q, k, v = self.qkv(x, rope)
        if self._logit_max_hooks and attn_mask is None:
            maxima = causal_logit_max(q, k, self.scale, LOGIT_CHUNK)
            for hook in self._logit_max_hooks.values():
                hook(maxima)
        dropout = self.dropout if self.training else 0.0
        if self.softcap is None:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=attn_mask is None,
                                               dropout_p=dropout, scale=self.scale)
        else:
            y = capped_attention(q, k, v, attn_mask, self.scale, self.softcap, dropout)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.out_proj(y))

    def attention_stats(self, x, chunk_size, rope=None):
        """Per head, for the (normalised) input x: the largest causal pre-softmax logit q.k * scale
        (before any soft-cap) and the entropy -sum_k p log p of the attention (of the capped logits)
        averaged over batch and queries; (n_head,) each, in float32 or x's dtype if wider, from the
        logits of chunk_size queries at a time.
        """
        q, k, _ = self.qkv(x, rope)
        B, H, T, _ = q.shape
        best = torch.full((H,), float("-inf"), dtype=logit_dtype(q), device=x.device)
        entropy = torch.zeros(H, dtype=best.dtype, device=x.device)
        for logits, future in causal_logit_chunks(q, k, self.scale, chunk_size):
            best = torch.maximum(best, logits.amax(dim=(0, 2, 3)))  # raw: before the cap
            if self.softcap is not None:  # (the cap of a masked -inf is -cap: masked again)
                logits = softcap(logits, self.softcap).masked_fill(future, float("-inf"))
            log_p = logits.log_softmax(dim=-1).masked_fill(future, 0.0)  # p log p = 0 where p = 0
            entropy -= (log_p.exp() * log_p).sum(dim=(0, 2, 3))
        return best, entropy / (B * T)


def capped_attention(q, k, v, attn_mask, scale, cap, dropout):
    """Attention with soft-capped logits (SDPA has no place for the cap): softmax over the visible
    keys of softcap(q.k * scale), in float32 at least, as Hugging Face's Gemma 2 computes it;
    attn_mask as CausalSelfAttention.forward's (None: causal)."""
    logits = softcap((q @ k.transpose(-2, -1)) * scale, cap)
    if attn_mask is None:
        T = q.size(2)
        attn_mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    logits = logits.masked_fill(~attn_mask, float("-inf"))
    weights = logits.softmax(dim=-1, dtype=logit_dtype(q)).to(q.dtype)
    return (F.dropout(weights, dropout) if dropout else weights) @ v


class TanhGELU(nn.Module):
    """GPT-2's GELU, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): on contiguous float32 CPU
    tensors kernels/csrc/gelu.cpp's (3.1x torch's there, within a few float32 roundings of the
    function), elsewhere torch's."""

    def forward(self, x):
        if kernels.gelu_tanh_takes(x):
            return kernels.gelu_tanh(x)
        return F.gelu(x, approximate="tanh")


class MLP(nn.Module):
    """GPT-2's MLP: c_proj(gelu(c_fc(x)))."""

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, config.intermediate_size, bias=config.bias)
        self.gelu = TanhGELU()  # GPT-2 was trained with the tanh approximation
        self.c_proj = nn.Linear(config.intermediate_size, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def matrices(self) -> dict[str, nn.Linear]:
        return {"fc": self.c_fc, "proj": self.c_proj}

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class SwiGLU(nn.Module):
    """Llama's MLP: down_proj(silu(gate_proj(x)) * up_proj(x)) (Shazeer 2020)."""

    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.n_embd, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.n_embd, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.n_embd, bias=False)
        self.dropout = nn.Dropout(config.dropout)

    def matrices(self) -> dict[str, nn.Linear]:
        return {"gate": self.gate_proj, "up": self.up_proj, "proj": self.down_proj}

    def forward(self, x):
        return self.dropout(self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x)))


def norm(config):
    """The block and final norm: GPT-2's LayerNorm or Llama's RMSNorm."""
    if config.arch == "gpt2":
        return nn.LayerNorm(config.n_embd, eps=config.norm_eps, bias=config.bias)
    return RMSNorm(config.n_embd, config.norm_eps)


class Block(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.ln_1 = norm(config)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.ln_2 = norm(config)
        self.mlp = MLP(config) if config.arch == "gpt2" else SwiGLU(config)

    def forward(self, x, attn_mask=None, rope=None):
        x = x + self.attn(self.ln_1(x), attn_mask, rope)
        return x + self.mlp(self.ln_2(x))

    def matrices(self) -> list[tuple[str, torch.Tensor, slice]]:
        """The block's weight matrices as (name, weight, its rows): attn_q, attn_k, attn_v (rows of
        GPT-2's fused c_attn), attn_proj, and the MLP's (mlp_fc or mlp_gate and mlp_up; mlp_proj)."""
        qkv = [(f"attn_{name}", *rows[0]) for name, rows in self.attn.projection_rows().items()]
        return [*qkv, ("attn_proj", self.attn.out_proj.weight, slice(None)),
                *((f"mlp_{name}", linear.weight, slice(None)) for name, linear in self.mlp.matrices().items())]


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        gpt2 = config.arch == "gpt2"
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            **(dict(wpe=nn.Embedding(config.block_size, config.n_embd)) if gpt2 else {}),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
            ln_f=norm(config),
        ))
        self.rotary = None if gpt2 else Rotary(config.n_embd // config.n_head, config.rope_theta)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if gpt2:  # weight tying: the input embedding and the output projection share one matrix
            self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        # GPT-2 scales the projections that write into the residual stream by 1/sqrt(2 * n_layer)
        # (two per block), so the residual's variance does not grow with depth. Llama (Hugging
        # Face's and GaLore's init) keeps std 0.02 everywhere.
        for name, p in self.named_parameters():
            if gpt2 and name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def _embed(self, idx, positions=None):
        """The token embeddings (plus GPT-2's learned positions) and, for Llama, the rotary angles
        of the positions: (x, rope or None)."""
        T = idx.size(1)
        if positions is None:
            if T > self.config.block_size:
                raise ValueError(
                    f"sequence length {T} exceeds the model's block_size {self.config.block_size}"
                )
            positions = torch.arange(T, device=idx.device)
        x = self.transformer.wte(idx)
        if self.rotary is None:
            return self.transformer.drop(x + self.transformer.wpe(positions)), None
        return self.transformer.drop(x), self.rotary(positions, x.dtype)

    def hidden_states(self, idx, positions=None, attn_mask=None):
        """The final layer-normed hidden states (B, T, n_embd), to which lm_head gives the logits.

        By default position t is t and attention is causal. Packed sequences (eval/scorer.py puts
        one context and several continuations in one row) pass each token's position, (T,) or
        (B, T), and a bool attn_mask, (T, T) or (B, 1, T, T): True where a token may attend to another.
        """
        x, rope = self._embed(idx, positions)
        for block in self.transformer.h:
            x = block(x, attn_mask, rope)
        return self.transformer.ln_f(x)

    def forward(self, idx, targets=None, z_loss=0.0, logits=True):
        """idx (B, T) token ids -> logits (B, T, vocab) and the mean loss over targets != -1.

        z_loss > 0 adds PaLM's auxiliary loss z_loss * mean(log(Z)^2) over the same positions, Z
        the softmax normaliser: it pulls log Z towards 0 and so keeps the output logits from drifting.
        logits=False (training): (None, loss), the loss chunked where that wins (LOSS_CHUNK).
        """
        hidden = self.hidden_states(idx)
        if not logits and targets is not None and self.chunks_loss(z_loss):
            return None, self.chunked_loss(hidden.view(-1, hidden.size(-1)), targets.reshape(-1))
        all_logits = self.output_logits(hidden)
        loss = None
        if targets is not None:
            flat_logits, flat_targets = all_logits.view(-1, all_logits.size(-1)), targets.reshape(-1)
            loss = F.cross_entropy(flat_logits, flat_targets, ignore_index=-1)
            if z_loss:
                counted = flat_targets != -1
                # in float32 at least: log Z^2 of bf16 logits would lose the small differences
                log_z = torch.logsumexp(flat_logits.to(torch.promote_types(flat_logits.dtype, torch.float32)), dim=-1)
                loss = loss + z_loss * (log_z.square() * counted).sum() / counted.sum()
        return (all_logits if logits else None), loss

    def output_logits(self, hidden):
        """The LM head's logits of final hidden states, soft-capped if final_logit_softcap is set."""
        return softcap(self.lm_head(hidden), self.config.final_logit_softcap)

    def chunked_loss(self, hidden, targets):
        """The mean cross-entropy of hidden (N, n_embd) against targets (N,) (-1: not counted),
        LOSS_CHUNK rows at a time, so the (N, vocab) logits never exist whole: torch's
        linear_cross_entropy, or, with final_logit_softcap (which that op cannot apply), each chunk's
        capped logits recomputed in the backward pass (activation checkpointing) instead of kept."""
        cap = self.config.final_logit_softcap
        if cap is None:
            options = nn.LinearCrossEntropyOptions(batch_chunk_size=LOSS_CHUNK, chunking_method=None)
            return F.linear_cross_entropy(hidden, self.lm_head.weight, targets, ignore_index=-1, options=options)
        total = sum(checkpoint(self._capped_loss_sum, rows, labels, use_reentrant=False)
                    for rows, labels in zip(hidden.split(LOSS_CHUNK), targets.split(LOSS_CHUNK)))
        return total / (targets != -1).sum()

    def _capped_loss_sum(self, hidden, targets):
        return F.cross_entropy(self.output_logits(hidden), targets, ignore_index=-1, reduction="sum")

    def chunks_loss(self, z_loss=0.0) -> bool:
        """Whether a training forward takes the chunked loss: a large vocabulary, no z-loss (it
        needs every log Z), a torch that has the op, not inside torch.compile (where the chunked op
        would break the graph) and not under autocast (the op is not on autocast's lists: it would
        run the LM head in float32 where the whole logits run in bf16; unmeasured on a GPU)."""
        device_type = self.lm_head.weight.device.type
        return (self.config.vocab_size >= CHUNKED_LOSS_VOCAB * self.config.n_embd and not z_loss
                and hasattr(F, "linear_cross_entropy") and not torch.compiler.is_compiling()
                and not torch.is_autocast_enabled(device_type))

    @torch.no_grad()
    def probe(self, idx, chunk_size=256):
        """The instability instruments on the batch idx (B, T), tensors in float32 (float64 for a
        float64 model):

        * "max_logit" (n_layer, n_head): per layer and head, the max over batch and causal positions
          of the pre-softmax attention logit q.k * scale;
        * "attn_entropy" (n_layer, n_head): the attention distribution's entropy (nats), averaged
          over batch and queries;
        * "max_abs_logit", "log_z" (0-d): the LM head's largest |logit| and its mean log-normaliser
          log Z = logsumexp over the vocabulary, over all positions (what z_loss acts on).

        Where a soft-cap is set, the logits above are the raw ones (what the cap acts on), the
        entropy and log Z those of the capped logits (what the softmax sees), and "max_logit_capped"
        (attention) and "max_abs_logit_capped" (output) the capped maxima, cap * tanh(max / cap).

        The residual stream is the ordinary forward in eval mode (no dropout); each layer's logits
        are recomputed from its ln_1 output, and the LM head's from the final hidden states, in
        chunks of chunk_size queries (positions) to bound memory.
        """
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        was_training = self.training
        self.eval()
        try:
            x, rope = self._embed(idx)
            maxima, entropies = [], []
            for block in self.transformer.h:
                best, entropy = block.attn.attention_stats(block.ln_1(x), chunk_size, rope)
                maxima.append(best)
                entropies.append(entropy)
                x = block(x, rope=rope)
            hidden = self.transformer.ln_f(x).flatten(0, 1)
            dtype = maxima[0].dtype
            cap = self.config.final_logit_softcap
            max_abs = torch.zeros((), dtype=dtype, device=idx.device)
            log_z = torch.zeros((), dtype=dtype, device=idx.device)
            for rows in hidden.split(chunk_size):
                logits = self.lm_head(rows).to(dtype)
                max_abs = torch.maximum(max_abs, logits.abs().max())
                log_z += torch.logsumexp(softcap(logits, cap), dim=-1).sum()
        finally:
            self.train(was_training)
        stats = {"max_logit": torch.stack(maxima), "attn_entropy": torch.stack(entropies),
                 "max_abs_logit": max_abs, "log_z": log_z / hidden.size(0)}
        if self.config.attn_logit_softcap is not None:
            stats["max_logit_capped"] = softcap(stats["max_logit"], self.config.attn_logit_softcap)
        if cap is not None:
            stats["max_abs_logit_capped"] = softcap(max_abs, cap)
        return stats

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, generator=None, n_vocab=None):
        """Append max_new_tokens sampled tokens to idx (B, T); the caller picks train/eval mode.
        n_vocab: sample only the tokenizer's ids, never the padding rows of a padded vocabulary."""
        for _ in range(max_new_tokens):
            context = idx[:, -self.config.block_size:]
            logits, _ = self(context)
            logits = logits[:, -1, :n_vocab] / temperature
            if top_k is not None:
                kth_best = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
                logits = logits.masked_fill(logits < kth_best, float("-inf"))
            probs = F.softmax(logits, dim=-1)
            next_token = torch.multinomial(probs, num_samples=1, generator=generator)
            idx = torch.cat((idx, next_token), dim=1)
        return idx

    def num_params(self, non_embedding=True):
        """Parameter count (tied weights once). Non-embedding leaves out the lookups that do no
        matmul: GPT-2's wpe, as nanoGPT (its wte is also the output layer, so it does take part in
        the compute); Llama's wte (its untied lm_head is counted)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            lookup = self.transformer.wte if self.rotary is not None else self.transformer.wpe
            n -= lookup.weight.numel()
        return n

    def flops_per_token(self):
        """Training FLOPs per token at full context (PaLM appendix B, as nanoGPT's estimate_mfu):
        6N for the matmuls' forward and backward, plus 12 * L * H * Q * T for attention."""
        cfg = self.config
        L, H, Q, T = cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, cfg.block_size
        return 6 * self.num_params() + 12 * L * H * Q * T

    def estimate_mfu(self, tokens_per_second, peak_flops):
        """Model FLOPs utilisation: achieved training FLOP/s as a fraction of peak_flops."""
        return self.flops_per_token() * tokens_per_second / peak_flops
