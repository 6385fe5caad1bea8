"""Hugging Face interop: GPT <-> GPT2LMHeadModel (arch "gpt2") and LlamaForCausalLM (arch "llama"),
and a checkpoint exported as an HF model folder.

    to_hf(model)              (config.json's fields, HF-named state dict)
    from_hf(folder or pair)   a GPT from an HF GPT-2 or Llama folder (or to_hf's pair), bit for bit
    export(ckpt, out_dir)     train.py's checkpoint as a folder that transformers and lm-eval load

The exported folder holds config.json (a GPT2LMHeadModel or LlamaForCausalLM with the checkpoint's
shape, its padded vocabulary included, so logits match), model.safetensors, the tokenizer and
nanomerit.json (where the weights came from: the checkpoint, its step and ``model_sha256``, the hash
of its weights that python -m eval and scripts/hessian.py record too). For data/tokenizer.py's
"gpt2" and "byte" the tokenizer (tokenizer.json and tokenizer_config.json) is built offline from
that encoding; it encodes text exactly as that does, except that the text "<|endoftext|>" becomes the end-of-text
token, as in HF's GPT-2. A Hugging Face tokenizer (a hub name or folder) is saved as transformers
saves it. Then, with no network,

    AutoModelForCausalLM.from_pretrained(OUT_DIR), AutoTokenizer.from_pretrained(OUT_DIR)
    lm_eval --model hf --model_args pretrained=OUT_DIR ...
    hf.from_hf(OUT_DIR)                                     # back into model.py, bit for bit

Neither HF class has QK-Norm or logit soft-capping: a model with either is refused (python -m eval
evaluates its checkpoint; model.py's ``hf_export_refusal`` says why, for the run guide too). The
folder is written under a temporary name beside OUT_DIR, checked (its weights are read back and
compared with the checkpoint's) and renamed into place (atomic.atomic_directory), so a failed export never leaves a complete-looking folder. An existing
non-empty OUT_DIR is replaced only with force=True, and only if it is an earlier export; OUT_DIR
may never be the checkpoint's run folder or contain it.
"""
import functools
import json
import os
import re
from pathlib import Path

import torch
import torch.nn as nn

from atomic import atomic_directory
from data.tokenizer import BUILT_IN, get_tokenizer
from model import GPT, HF_CLASSES, GPTConfig, hf_export_refusal
from training.checkpoint import Checkpoint, load_model
from training.run_folder import model_sha256

# Hugging Face's GPT-2 uses Conv1D (weight stored as in x out) where this file uses nn.Linear
# (out x in): these weights are transposed between the two; every other tensor is the same.
HF_TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# HF activation_function names of the tanh-approximated GELU this model uses (the same function;
# "gelu_pytorch_tanh" is the same kernel too, so it is what exports write).
HF_TANH_GELUS = ("gelu_pytorch_tanh", "gelu_new", "gelu_fast", "gelu_python_tanh")
# HF hidden_act names of the SiLU in Llama's SwiGLU (both are torch's F.silu in transformers' ACT2FN).
HF_SILUS = ("silu", "swish")
# (our state-dict name's prefix, HF LlamaForCausalLM's), {} a layer's index; lm_head.weight is the same
LLAMA_NAMES = (
    ("transformer.wte.", "model.embed_tokens."),
    ("transformer.ln_f.", "model.norm."),
    ("transformer.h.{}.ln_1.", "model.layers.{}.input_layernorm."),
    ("transformer.h.{}.ln_2.", "model.layers.{}.post_attention_layernorm."),
    ("transformer.h.{}.attn.", "model.layers.{}.self_attn."),
    ("transformer.h.{}.mlp.", "model.layers.{}.mlp."),
)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
EOT = "<|endoftext|>"


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (byte-level BPE works on these characters)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(others)}}


@functools.cache
def hf_tokenizer(name: str):
    """A `tokenizers.Tokenizer` that encodes as data/tokenizer.py's `name` ("gpt2" or "byte"), with
    "<|endoftext|>" as a special token of the same id."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    ours = get_tokenizer(name)
    char = bytes_to_unicode()

    def text(token: bytes) -> str:
        return token.decode("latin-1").translate(char)  # latin-1: byte b -> code point b

    if name == "gpt2":
        # tiktoken's BPE: ranks, and the regex that splits text before BPE. Each token of two or
        # more bytes becomes merges of its splits into two tokens, in rank order (as
        # transformers' TikTokenConverter does); ignore_merges takes a whole piece that is a token.
        encoding = ours.encoding
        ranks = encoding._mergeable_ranks
        vocab = {text(token): rank for token, rank in ranks.items()}
        merges = sorted((rank, ranks[token[:i]], ranks[token[i:]], text(token[:i]), text(token[i:]))
                        for token, rank in ranks.items() for i in range(1, len(token))
                        if token[:i] in ranks and token[i:] in ranks)
        merges = [(left, right) for *_, left, right in merges]
        split = [pre_tokenizers.Split(Regex(encoding._pat_str), behavior="isolated", invert=False)]
    elif name == "byte":  # one token per UTF-8 byte, no merges
        vocab, merges, split = {char[b]: b for b in range(256)}, [], []
    else:
        raise ValueError(f"no Hugging Face tokenizer for {name!r}")
    tokenizer = Tokenizer(models.BPE(vocab, merges, ignore_merges=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [*split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.add_special_tokens([AddedToken(EOT, normalized=False, special=True)])
    if tokenizer.token_to_id(EOT) != ours.eot_token or tokenizer.get_vocab_size() != ours.n_vocab:
        raise RuntimeError(f"the {name} tokenizer did not convert: {EOT} -> {tokenizer.token_to_id(EOT)}, "
                           f"{tokenizer.get_vocab_size()} tokens (expected {ours.eot_token}, {ours.n_vocab})")
    return tokenizer


def write_folder(folder: Path, model: GPT, checkpoint: Checkpoint, tokenizer_name: str, dtype: str, source: Path):
    tokenizer = get_tokenizer(tokenizer_name)
    config, weights = to_hf(model, eos_token_id=tokenizer.eot_token)
    config["torch_dtype"] = dtype
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    weights = {key: tensor.to(DTYPES[dtype]).contiguous() for key, tensor in weights.items()}
    from safetensors.torch import save_file
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})

    write_tokenizer(folder, tokenizer_name, model.config.block_size)
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": tokenizer.eot_token, "eos_token_id": tokenizer.eot_token}, indent=2) + "\n")
    provenance = {"checkpoint": str(source), "step": checkpoint.step, "model_sha256": model_sha256(model),
                  "tokens": checkpoint.tokens,
                  "code_version": checkpoint.code_version, "tokenizer": tokenizer_name, "dtype": dtype,
                  "model_args": checkpoint.model_args, "train_config": checkpoint.config}
    (folder / "nanomerit.json").write_text(json.dumps(provenance, indent=2, default=str) + "\n")


def write_tokenizer(folder: Path, name: str, block_size: int):
    """The tokenizer files of data/tokenizer.py's tokenizer ``name``: ours built by hf_tokenizer, a
    Hugging Face one saved by transformers; model_max_length is the model's block_size either way."""
    if name not in BUILT_IN:
        get_tokenizer(name).hf_tokenizer.save_pretrained(folder)
        settings = json.loads((folder / "tokenizer_config.json").read_text())
        (folder / "tokenizer_config.json").write_text(json.dumps(
            {**settings, "model_max_length": block_size}, indent=2, ensure_ascii=False) + "\n")
        return
    hf_tokenizer(name).save(str(folder / "tokenizer.json"))
    specials = {"bos_token": EOT, "eos_token": EOT, "unk_token": EOT}
    # PreTrainedTokenizerFast loads tokenizer.json as it is, in transformers 4 and 5 alike
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", **specials, "model_max_length": block_size,
        "clean_up_tokenization_spaces": False}, indent=2) + "\n")
    (folder / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")


def check_folder(folder: Path, model: GPT, dtype: str):
    """The written weights, read back through from_hf, are the model's (rounded to dtype)."""
    reloaded = from_hf(folder, bias=model.config.bias)
    if reloaded.config != model.config:
        raise RuntimeError(f"the exported config reads back as {reloaded.config}, not {model.config}")
    expected, got = model.state_dict(), reloaded.state_dict()
    for key, tensor in expected.items():
        if not torch.equal(tensor.cpu().to(DTYPES[dtype]).float(), got[key]):
            raise RuntimeError(f"the exported {key} does not read back as the checkpoint's")


def check_export_target(checkpoint_path: Path, out_dir: Path, force: bool) -> None:
    """Refuse an ``out_dir`` that is or contains the checkpoint's run folder (the export would
    replace its input), and one that holds anything but an earlier export unless empty: ``force``
    replaces only an HF folder this module wrote (it has nanomerit.json)."""
    sources = {checkpoint_path.absolute().parent, checkpoint_path.resolve().parent}
    for source in sources:
        if source == out_dir or out_dir in source.parents:
            raise ValueError(f"{out_dir} holds the checkpoint {checkpoint_path} (its run folder {source}): the "
                             f"export would replace its own input; choose an out_dir outside the run folder")
    if not out_dir.exists() or (out_dir.is_dir() and not any(out_dir.iterdir())):
        return
    if not out_dir.is_dir() or not (out_dir / "nanomerit.json").is_file():
        raise FileExistsError(f"{out_dir} exists and is not a Hugging Face export (no nanomerit.json): choose "
                              f"another out_dir (--force replaces only an earlier export)")
    if not force:
        raise FileExistsError(f"{out_dir} exists and holds an earlier export: pass --force to replace it")


def export(checkpoint_path, out_dir, dtype: str = "float32", force: bool = False, tokenizer: str | None = None) -> Path:
    """Write the checkpoint at checkpoint_path as a Hugging Face model folder out_dir (GPT2LMHeadModel or
    LlamaForCausalLM, as its arch); returns out_dir."""
    checkpoint_path, out_dir = Path(checkpoint_path), Path(os.path.abspath(out_dir))
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    check_export_target(checkpoint_path, out_dir, force)
    model, checkpoint = load_model(checkpoint_path)
    tokenizer = tokenizer or checkpoint.config.get("tokenizer")
    if tokenizer is None:
        raise ValueError(f"checkpoint {checkpoint_path} names no tokenizer in its config: pass --tokenizer")
    n_vocab = get_tokenizer(tokenizer).n_vocab
    if model.config.vocab_size < n_vocab:
        raise ValueError(f"the model's vocab_size {model.config.vocab_size} is smaller than the {tokenizer} "
                         f"tokenizer's {n_vocab} tokens")
    with atomic_directory(out_dir) as folder:
        write_folder(folder, model, checkpoint, tokenizer, dtype, checkpoint_path)
        check_folder(folder, model, dtype)
    return out_dir


def to_hf(model: GPT, eos_token_id: int | None = None) -> tuple[dict, dict]:
    """The equivalent Hugging Face model, GPT2LMHeadModel or LlamaForCausalLM as the model's arch:
    (config.json's fields, HF-named CPU tensors). eos_token_id is the bos and eos token of the config."""
    cfg = model.config
    refusal = hf_export_refusal(cfg)
    if refusal:
        raise ValueError(f"{refusal}: evaluate its checkpoint with python -m eval instead")
    config, state = (gpt2_to_hf if cfg.arch == "gpt2" else llama_to_hf)(model)
    return ({"architectures": [HF_CLASSES[cfg.arch]], **config, "bos_token_id": eos_token_id,
             "eos_token_id": eos_token_id}, state)


def gpt2_to_hf(model: GPT) -> tuple[dict, dict]:
    """GPT2LMHeadModel's config and tensors. The state has no lm_head (HF ties it to wte). HF's GPT-2
    always has biases: a model without them gets zero biases, which compute the same."""
    cfg = model.config
    config = dict(
        model_type="gpt2", vocab_size=cfg.vocab_size,
        n_positions=cfg.block_size, n_ctx=cfg.block_size, n_embd=cfg.n_embd, n_layer=cfg.n_layer,
        n_head=cfg.n_head, n_inner=None, activation_function=HF_TANH_GELUS[0],
        resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout, attn_pdrop=cfg.dropout,
        layer_norm_epsilon=model.transformer.ln_f.eps, initializer_range=0.02, scale_attn_weights=True,
        scale_attn_by_inverse_layer_idx=cfg.scale_attn_by_inverse_layer_idx, reorder_and_upcast_attn=False,
        add_cross_attention=False, tie_word_embeddings=True, use_cache=True,
    )
    state = {name: model.transformer[name].weight.detach().cpu().clone() for name in ("wte", "wpe")}
    state = {f"transformer.{name}.weight": w for name, w in state.items()}
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.LayerNorm)) and name != "lm_head":
            weight = module.weight.detach().cpu()
            # every Linear here but lm_head is a Conv1D in HF: stored transposed
            state[f"{name}.weight"] = weight.t().contiguous() if isinstance(module, nn.Linear) else weight.clone()
            bias = module.bias
            state[f"{name}.bias"] = (torch.zeros(weight.shape[0], dtype=weight.dtype) if bias is None
                                     else bias.detach().cpu().clone())
    return config, state


def llama_to_hf(model: GPT) -> tuple[dict, dict]:
    """LlamaForCausalLM's config and tensors: the same tensors under HF's names (LLAMA_NAMES).
    The rotary base is written twice: transformers 5 reads rope_parameters, 4.x rope_theta."""
    cfg = model.config
    config = dict(
        model_type="llama", vocab_size=cfg.vocab_size, hidden_size=cfg.n_embd,
        intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head,
        num_key_value_heads=cfg.n_head, head_dim=cfg.n_embd // cfg.n_head, hidden_act=HF_SILUS[0],
        max_position_embeddings=cfg.block_size, rms_norm_eps=float(cfg.norm_eps),
        rope_theta=float(cfg.rope_theta), rope_parameters={"rope_type": "default", "rope_theta": float(cfg.rope_theta)},
        attention_bias=False, mlp_bias=False, attention_dropout=cfg.dropout, tie_word_embeddings=False,
        initializer_range=0.02, pretraining_tp=1, use_cache=True,
    )
    state = {renamed(key, LLAMA_NAMES): tensor.detach().cpu().clone() for key, tensor in model.state_dict().items()}
    return config, state


def renamed(key: str, prefixes) -> str:
    """key with the first of prefixes' (old, new) pairs whose old prefix it has replaced by the new one."""
    for old, new in prefixes:
        match = re.match(re.escape(old).replace(r"\{\}", r"(\d+)"), key)
        if match:
            return new.format(*match.groups()) + key[match.end():]
    return key


def from_hf(source, dropout: float | None = None, bias: bool | None = None) -> GPT:
    """A GPT from a Hugging Face GPT-2 (GPT2LMHeadModel or GPT2Model) or Llama (LlamaForCausalLM): a
    folder with config.json and model.safetensors (or its sharded index, or pytorch_model.bin), e.g. a
    local copy of openai-community/gpt2, or a (config dict, state dict) tuple such as to_hf's. dropout:
    default the config's (GPT-2: when its three p_drops agree; Llama: attention_dropout). bias (GPT-2;
    Llama has none): default True exactly when some bias is nonzero; False drops biases (they must be
    zero). Returned in eval mode, as HF's from_pretrained."""
    config, state = source if isinstance(source, tuple) else read_folder(Path(source))
    def get(key, default):  # HF's default where the config omits a key or writes null
        return default if config.get(key) is None else config[key]

    readers = {"gpt2": gpt2_from_hf, "llama": llama_from_hf}
    model_type = get("model_type", "gpt2")
    if model_type not in readers:
        raise ValueError(f"unsupported Hugging Face model_type {model_type!r}: this model reads "
                         f"{' and '.join(map(repr, readers))} folders")
    model_config, sd = readers[model_type](get, state, dropout, bias)
    model = GPT(model_config)
    tied = {"lm_head.weight"} if model.lm_head.weight is model.transformer.wte.weight else set()
    expected = set(model.state_dict()) - tied
    missing, unexpected = sorted(expected - set(sd)), sorted(set(sd) - expected)
    if missing or unexpected:
        raise ValueError(f"the Hugging Face state dict does not fit this config: missing {missing[:5]}"
                         f"{' ...' * (len(missing) > 5)}, unexpected {unexpected[:5]}{' ...' * (len(unexpected) > 5)}")
    model.load_state_dict(sd, strict=not tied)  # a tied lm_head.weight is wte
    return model.eval()


def refuse_unsupported(family: str, checks: list[tuple[bool, str]]) -> None:
    """checks: (ok, what is unsupported) pairs; one error names every failed one."""
    problems = [what for ok, what in checks if not ok]
    if problems:
        raise ValueError(f"unsupported Hugging Face {family} config: {'; '.join(problems)}")


def config_dropout(get, keys: tuple[str, ...], default: float) -> float:
    """The one dropout probability of the config's keys (HF's default where absent)."""
    p_drops = {get(key, default) for key in keys}
    if len(p_drops) > 1:
        raise ValueError(f"the config's {'/'.join(keys)} differ ({sorted(p_drops)}): pass dropout=")
    return p_drops.pop()


def gpt2_from_hf(get, state: dict, dropout: float | None, bias: bool | None) -> tuple[GPTConfig, dict]:
    """from_hf's GPTConfig and our-named state dict of a GPT-2 config (``get``) and state."""
    n_embd = get("n_embd", 768)
    refuse_unsupported("GPT-2", [
        (get("activation_function", "gelu_new") in HF_TANH_GELUS,
         f"activation_function {get('activation_function', None)!r} (this model has the tanh GELU: "
         f"{', '.join(HF_TANH_GELUS)})"),
        (get("n_inner", 4 * n_embd) == 4 * n_embd, f"n_inner {get('n_inner', None)} != 4 * n_embd"),
        (get("layer_norm_epsilon", 1e-5) == 1e-5, f"layer_norm_epsilon {get('layer_norm_epsilon', None)} != 1e-5"),
        (get("scale_attn_weights", True), "scale_attn_weights False"),
        (not get("add_cross_attention", False), "add_cross_attention True"),
    ])
    if dropout is None:
        dropout = config_dropout(get, ("attn_pdrop", "resid_pdrop", "embd_pdrop"), 0.1)

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
    return GPTConfig(
        block_size=get("n_positions", get("n_ctx", 1024)), vocab_size=get("vocab_size", 50257),
        n_layer=get("n_layer", 12), n_head=get("n_head", 12), n_embd=n_embd, dropout=dropout, bias=bias,
        scale_attn_by_inverse_layer_idx=get("scale_attn_by_inverse_layer_idx", False),
    ), sd


def llama_from_hf(get, state: dict, dropout: float | None, bias: bool | None) -> tuple[GPTConfig, dict]:
    """from_hf's GPTConfig and our-named state dict of a Llama config (``get``) and state; what this
    model cannot hold is refused: grouped-query attention, biases, scaled or partial rotary, another
    head_dim, another activation, a tied LM head."""
    if bias:
        raise ValueError("bias=True: the Llama family has no biases (leave bias unset for a Llama folder)")
    hidden, heads = get("hidden_size", 4096), get("num_attention_heads", 32)
    kv_heads, head_dim = get("num_key_value_heads", heads), get("head_dim", hidden // heads)
    # transformers 5 keeps the rotary settings in rope_parameters, 4.x in rope_theta and rope_scaling
    # (where both are written, 5 takes rope_scaling first and rope_parameters' theta before rope_theta)
    rope = get("rope_scaling", None) or get("rope_parameters", {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    partial = rope.get("partial_rotary_factor", get("partial_rotary_factor", 1.0))
    refuse_unsupported("Llama", [
        (kv_heads == heads, f"num_key_value_heads {kv_heads} != num_attention_heads {heads} (grouped-query "
                            f"attention: this model has a k and v head per q head)"),
        (not get("attention_bias", False), "attention_bias True (this model has no biases)"),
        (not get("mlp_bias", False), "mlp_bias True (this model has no biases)"),
        (rope_type == "default", f"rope_type {rope_type!r} (this model has unscaled rotary positions: 'default')"),
        (partial == 1.0, f"partial_rotary_factor {partial} (this model rotates all of each head)"),
        (head_dim * heads == hidden, f"head_dim {head_dim} != hidden_size {hidden} / num_attention_heads {heads}"),
        (get("hidden_act", "silu") in HF_SILUS, f"hidden_act {get('hidden_act', None)!r} (this model's SwiGLU "
                                                f"has the SiLU: {', '.join(HF_SILUS)})"),
        (not get("tie_word_embeddings", False), "tie_word_embeddings True (this model's Llama has an untied "
                                                "lm_head)"),
    ])
    config = GPTConfig(
        arch="llama", block_size=get("max_position_embeddings", 2048), vocab_size=get("vocab_size", 32000),
        n_layer=get("num_hidden_layers", 32), n_head=heads, n_embd=hidden,
        intermediate_size=get("intermediate_size", 11008), norm_eps=get("rms_norm_eps", 1e-6),
        rope_theta=rope.get("rope_theta", get("rope_theta", 10000.0)),
        dropout=get("attention_dropout", 0.0) if dropout is None else dropout,
    )
    return config, {renamed(key, [(hf, ours) for ours, hf in LLAMA_NAMES]): tensor for key, tensor in state.items()}


def read_folder(folder: Path) -> tuple[dict, dict]:
    """(config, state dict) of a Hugging Face model folder, on the CPU."""
    import safetensors.torch

    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder} has no config.json: not a Hugging Face model folder")
    config = json.loads((folder / "config.json").read_text())
    if (folder / "model.safetensors").is_file():
        return config, safetensors.torch.load_file(folder / "model.safetensors")
    if (folder / "model.safetensors.index.json").is_file():
        shards = set(json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"].values())
        return config, {key: tensor for shard in sorted(shards)
                        for key, tensor in safetensors.torch.load_file(folder / shard).items()}
    if (folder / "pytorch_model.bin").is_file():
        return config, torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"{folder} has no model.safetensors, model.safetensors.index.json or pytorch_model.bin")
