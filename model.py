"""GPT-2 in one file, nanoGPT style.

Module names match nanoGPT and Hugging Face's GPT-2 (transformer.wte, transformer.h[i].attn.c_attn,
...), so state dicts map onto HF checkpoints one to one. Besides the usual forward/generate, the
model has a no-grad probe, `max_attention_logits`, that reports per layer the largest pre-softmax
attention logit: the quantity MERIT is designed to keep in check. `to_hf` and `GPT.from_hf` convert to
and from Hugging Face's GPT2LMHeadModel (scripts/export_hf.py writes a checkpoint as one).
"""

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

# Presets only fix the shape (n_layer, n_head, n_embd); every other field keeps its default
# unless overridden. The small ones are for CPU runs and tests. Comments: parameters in the
# transformer blocks (total at vocab 50304, block_size 1024, no biases).
PRESETS = {
    "nano": dict(n_layer=4, n_head=4, n_embd=128),  # 0.8M (7.4M)
    "micro": dict(n_layer=6, n_head=6, n_embd=192),  # 2.7M (12.5M)
    "mini": dict(n_layer=6, n_head=6, n_embd=384),  # 10.6M (30.3M)
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768),  # 85M (124M)
    "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024),  # 302M (355M)
    "gpt2-large": dict(n_layer=36, n_head=20, n_embd=1280),  # 708M (774M)
    "gpt2-xl": dict(n_layer=48, n_head=25, n_embd=1600),  # 1475M (1557M)
}

# Hugging Face's GPT-2 uses Conv1D (weight stored as in x out) where this file uses nn.Linear
# (out x in): these weights are transposed between the two; every other tensor is the same.
HF_TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# HF activation_function names of the tanh-approximated GELU this model uses (the same function;
# "gelu_pytorch_tanh" is the same kernel too, so it is what exports write).
HF_TANH_GELUS = ("gelu_pytorch_tanh", "gelu_new", "gelu_fast", "gelu_python_tanh")


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

    def __post_init__(self):
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GPTConfig.{name} must be a positive int, got {value!r}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(
                f"GPTConfig.n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout must be in [0, 1), got {self.dropout!r}")

    @classmethod
    def preset(cls, name, **overrides):
        """A named model shape, e.g. GPTConfig.preset("gpt2-medium", scale_attn_by_inverse_layer_idx=True)."""
        if name not in PRESETS:
            raise ValueError(f"unknown model preset {name!r}; valid presets: {', '.join(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})


class CausalSelfAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.n_head = config.n_head
        self.dropout = config.dropout
        head_dim = config.n_embd // config.n_head
        # The inverse-layer factor tames logit growth in deep GPT-2s (used for Medium and Large).
        layer_factor = layer_idx + 1 if config.scale_attn_by_inverse_layer_idx else 1
        self.scale = 1.0 / (math.sqrt(head_dim) * layer_factor)
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # fused q, k, v
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def qkv(self, x):
        """(B, T, C) -> q, k, v, each (B, n_head, T, head_dim)."""
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        return [t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v)]

    def forward(self, x, attn_mask=None):
        """attn_mask: None for causal attention, else a bool mask broadcasting to (B, n_head, T, T),
        True where a query may attend to a key (packed sequences, see GPT.hidden_states)."""
        B, T, C = x.shape
        q, k, v = self.qkv(x)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=attn_mask is None,
            dropout_p=self.dropout if self.training else 0.0, scale=self.scale
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))

    def max_logit(self, x, chunk_size):
        """Largest causal pre-softmax logit q.k * scale for the (normalised) input x, as float32.

        Queries are taken chunk_size at a time, each against only the keys it may see, so the
        extra memory is O(B * H * chunk_size * T) instead of the full T x T logit matrix.
        """
        q, k, _ = self.qkv(x)
        T = q.size(2)
        best = torch.tensor(float("-inf"), device=x.device)
        # float32 logits even under autocast, which would otherwise run the matmul in bf16/fp16
        with torch.autocast(device_type=x.device.type, enabled=False):
            q, k = q.float(), k.float()
            for start in range(0, T, chunk_size):
                end = min(start + chunk_size, T)
                logits = (q[:, :, start:end] @ k[:, :, :end].transpose(-2, -1)) * self.scale
                query_pos = torch.arange(start, end, device=x.device).unsqueeze(1)
                key_pos = torch.arange(end, device=x.device).unsqueeze(0)
                logits = logits.masked_fill(key_pos > query_pos, float("-inf"))
                best = torch.maximum(best, logits.max())
        return best


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate="tanh")  # GPT-2 was trained with the tanh approximation
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, attn_mask=None):
        x = x + self.attn(self.ln_1(x), attn_mask)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # Weight tying: the input embedding and the output projection share one matrix.
        self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        # GPT-2 scales the projections that write into the residual stream by 1/sqrt(2 * n_layer)
        # (two per block), so the residual's variance does not grow with depth.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def _embed(self, idx, positions=None):
        T = idx.size(1)
        if positions is None:
            if T > self.config.block_size:
                raise ValueError(
                    f"sequence length {T} exceeds the model's block_size {self.config.block_size}"
                )
            positions = torch.arange(T, device=idx.device)
        return self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(positions))

    def hidden_states(self, idx, positions=None, attn_mask=None):
        """The final layer-normed hidden states (B, T, n_embd), to which lm_head gives the logits.

        By default position t is t and attention is causal. Packed sequences (eval/scorer.py puts
        one context and several continuations in one row) pass each token's position, (T,) or
        (B, T), and a bool attn_mask, (T, T) or (B, 1, T, T): True where a token may attend to another.
        """
        x = self._embed(idx, positions)
        for block in self.transformer.h:
            x = block(x, attn_mask)
        return self.transformer.ln_f(x)

    def forward(self, idx, targets=None):
        """idx (B, T) token ids -> logits (B, T, vocab) and the mean loss over targets != -1."""
        logits = self.lm_head(self.hidden_states(idx))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(
                logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1
            )
        return logits, loss

    @torch.no_grad()
    def max_attention_logits(self, idx, chunk_size=256):
        """Per layer, the max over batch, heads and causal positions of q.k * scale: float32 (n_layer,).

        The residual stream is the ordinary forward in eval mode (no dropout); each layer's logits
        are recomputed from its ln_1 output in query chunks of chunk_size to bound memory.
        """
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        was_training = self.training
        self.eval()
        try:
            x = self._embed(idx)
            maxima = []
            for block in self.transformer.h:
                maxima.append(block.attn.max_logit(block.ln_1(x), chunk_size))
                x = block(x)
        finally:
            self.train(was_training)
        return torch.stack(maxima)

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
        """Parameter count (tied weights once). Non-embedding leaves out wpe, as nanoGPT: wte is
        also the output layer, so its parameters do take part in the compute."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.transformer.wpe.weight.numel()
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

    def to_hf(self, eos_token_id=None):
        """The equivalent Hugging Face GPT2LMHeadModel: (config.json's fields, HF-named CPU tensors).
        The state has no lm_head (HF ties it to wte). HF's GPT-2 always has biases: a model without
        them gets zero biases, which compute the same."""
        cfg = self.config
        config = dict(
            architectures=["GPT2LMHeadModel"], model_type="gpt2", vocab_size=cfg.vocab_size,
            n_positions=cfg.block_size, n_ctx=cfg.block_size, n_embd=cfg.n_embd, n_layer=cfg.n_layer,
            n_head=cfg.n_head, n_inner=None, activation_function=HF_TANH_GELUS[0],
            resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout, attn_pdrop=cfg.dropout,
            layer_norm_epsilon=self.transformer.ln_f.eps, initializer_range=0.02, scale_attn_weights=True,
            scale_attn_by_inverse_layer_idx=cfg.scale_attn_by_inverse_layer_idx, reorder_and_upcast_attn=False,
            add_cross_attention=False, tie_word_embeddings=True, use_cache=True,
            bos_token_id=eos_token_id, eos_token_id=eos_token_id,
        )
        state = {name: self.transformer[name].weight.detach().cpu().clone() for name in ("wte", "wpe")}
        state = {f"transformer.{name}.weight": w for name, w in state.items()}
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.LayerNorm)) and name != "lm_head":
                weight = module.weight.detach().cpu()
                # every Linear here but lm_head is a Conv1D in HF: stored transposed
                state[f"{name}.weight"] = weight.t().contiguous() if isinstance(module, nn.Linear) else weight.clone()
                bias = module.bias
                state[f"{name}.bias"] = (torch.zeros(weight.shape[0], dtype=weight.dtype) if bias is None
                                         else bias.detach().cpu().clone())
        return config, state

    @classmethod
    def from_hf(cls, source, dropout=None, bias=None):
        """A GPT from a Hugging Face GPT-2 (GPT2LMHeadModel or GPT2Model): a folder with config.json and
        model.safetensors (or its sharded index, or pytorch_model.bin), e.g. a local copy of
        openai-community/gpt2, or a (config dict, state dict) tuple such as to_hf's. dropout: default the config's
        (when its three p_drops agree). bias: default True exactly when some bias is nonzero;
        False drops biases (they must be zero). Returned in eval mode, as HF's from_pretrained."""
        config, state = source if isinstance(source, tuple) else _read_hf(Path(source))
        def get(key, default):  # HF's default where the config omits a key or writes null
            return default if config.get(key) is None else config[key]

        n_embd = get("n_embd", 768)
        checks = [  # (ok, what is unsupported)
            (get("model_type", "gpt2") == "gpt2", f"model_type {config.get('model_type')!r}"),
            (get("activation_function", "gelu_new") in HF_TANH_GELUS,
             f"activation_function {config.get('activation_function')!r} (this model has the tanh GELU: "
             f"{', '.join(HF_TANH_GELUS)})"),
            (get("n_inner", 4 * n_embd) == 4 * n_embd, f"n_inner {config.get('n_inner')} != 4 * n_embd"),
            (get("layer_norm_epsilon", 1e-5) == 1e-5, f"layer_norm_epsilon {config.get('layer_norm_epsilon')} != 1e-5"),
            (get("scale_attn_weights", True), "scale_attn_weights False"),
            (not get("add_cross_attention", False), "add_cross_attention True"),
        ]
        problems = [what for ok, what in checks if not ok]
        if problems:
            raise ValueError(f"unsupported Hugging Face GPT-2 config: {'; '.join(problems)}")
        if dropout is None:
            p_drops = {get(key, 0.1) for key in ("attn_pdrop", "resid_pdrop", "embd_pdrop")}
            if len(p_drops) > 1:
                raise ValueError(f"the config's attn/resid/embd_pdrop differ ({sorted(p_drops)}): pass dropout=")
            dropout = p_drops.pop()

        sd = {}
        for key, tensor in state.items():
            key = key.removeprefix("transformer.")  # the hub's GPT-2 was saved as a GPT2Model
            if re.fullmatch(r"h\.\d+\.attn\.(masked_)?bias", key):
                continue  # causal-mask buffers of old transformers versions
            key = key if key == "lm_head.weight" else f"transformer.{key}"
            sd[key] = tensor.t() if key.endswith(HF_TRANSPOSED) else tensor
        wte = sd.get("transformer.wte.weight")
        lm_head = sd.pop("lm_head.weight", None)
        tied = get("tie_word_embeddings", True)
        if wte is not None and (not tied if lm_head is None else not torch.equal(lm_head, wte)):
            head = "missing" if lm_head is None else "different from wte"
            raise ValueError(f"the Hugging Face model's lm_head is untied (tie_word_embeddings {tied}, lm_head.weight "
                             f"{head}): this model always ties it to wte")
        biases = [k for k in sd if k.endswith(".bias")]
        if bias is None:
            bias = any(sd[k].any() for k in biases)
        elif not bias and any(sd[k].any() for k in biases):
            raise ValueError("bias=False, but the Hugging Face model has nonzero biases")
        if not bias:
            sd = {k: v for k, v in sd.items() if k not in biases}

        model = cls(GPTConfig(
            block_size=get("n_positions", get("n_ctx", 1024)), vocab_size=get("vocab_size", 50257),
            n_layer=get("n_layer", 12), n_head=get("n_head", 12), n_embd=n_embd, dropout=dropout, bias=bias,
            scale_attn_by_inverse_layer_idx=get("scale_attn_by_inverse_layer_idx", False),
        ))
        expected = set(model.state_dict()) - {"lm_head.weight"}
        missing, unexpected = sorted(expected - set(sd)), sorted(set(sd) - expected)
        if missing or unexpected:
            raise ValueError(f"the Hugging Face state dict does not fit this config: missing {missing[:5]}"
                             f"{' ...' * (len(missing) > 5)}, unexpected {unexpected[:5]}{' ...' * (len(unexpected) > 5)}")
        model.load_state_dict(sd, strict=False)  # lm_head.weight is wte
        return model.eval()


def _read_hf(folder):
    """(config, state dict) of a Hugging Face model folder, on the CPU."""
    import safetensors.torch

    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder} has no config.json: not a Hugging Face model folder")
    config = json.loads((folder / "config.json").read_text())
    if (folder / "model.safetensors").is_file():
        return config, safetensors.torch.load_file(folder / "model.safetensors")
    if (folder / "model.safetensors.index.json").is_file():
        shards = set(json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"].values())
        return config, {k: v for shard in sorted(shards) for k, v in safetensors.torch.load_file(folder / shard).items()}
    if (folder / "pytorch_model.bin").is_file():
        return config, torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"{folder} has no model.safetensors, model.safetensors.index.json or pytorch_model.bin")
