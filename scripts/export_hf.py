"""Export a checkpoint of train.py as a Hugging Face GPT-2 folder.

    python scripts/export_hf.py runs/NAME/ckpt.pt OUT_DIR [--dtype float32|bfloat16|float16] [--force]

OUT_DIR gets config.json (a GPT2LMHeadModel with the checkpoint's shape, its padded vocabulary
included, so logits match), model.safetensors, the tokenizer (tokenizer.json and
tokenizer_config.json, built offline from data/tokenizer.py's encoding; it encodes text exactly as
that does, except that the text "<|endoftext|>" becomes the end-of-text token, as in HF's GPT-2)
and nanomerit.json (where the weights came from). Then, with no network,

    AutoModelForCausalLM.from_pretrained(OUT_DIR), AutoTokenizer.from_pretrained(OUT_DIR)
    lm_eval --model hf --model_args pretrained=OUT_DIR ...
    GPT.from_hf(OUT_DIR)                                    # back into model.py, bit for bit

The folder is written next to OUT_DIR under a temporary name, checked (its weights are read back
and compared with the checkpoint's) and renamed into place, so a failed export never leaves a
complete-looking folder. An existing non-empty OUT_DIR is replaced only with --force.
"""
import argparse
import functools
import json
import os
import shutil
import sys
import uuid
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from data.tokenizer import get_tokenizer  # noqa: E402
from model import GPT  # noqa: E402
from training.checkpoint import load_model  # noqa: E402

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


def write_folder(folder: Path, model: GPT, state: dict, tokenizer_name: str, dtype: str, source: Path):
    tokenizer = get_tokenizer(tokenizer_name)
    config, weights = model.to_hf(eos_token_id=tokenizer.eot_token)
    config["torch_dtype"] = dtype
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    weights = {key: tensor.to(DTYPES[dtype]).contiguous() for key, tensor in weights.items()}
    from safetensors.torch import save_file
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})

    hf_tokenizer(tokenizer_name).save(str(folder / "tokenizer.json"))
    specials = {"bos_token": EOT, "eos_token": EOT, "unk_token": EOT}
    # PreTrainedTokenizerFast loads tokenizer.json as it is, in transformers 4 and 5 alike
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", **specials, "model_max_length": model.config.block_size,
        "clean_up_tokenization_spaces": False}, indent=2) + "\n")
    (folder / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": tokenizer.eot_token, "eos_token_id": tokenizer.eot_token}, indent=2) + "\n")
    provenance = {"checkpoint": str(source), "step": state.get("step"), "tokens": state.get("tokens"),
                  "code_version": state.get("code_version"), "tokenizer": tokenizer_name, "dtype": dtype,
                  "model_args": state.get("model_args"), "train_config": state.get("config")}
    (folder / "nanomerit.json").write_text(json.dumps(provenance, indent=2, default=str) + "\n")


def check_folder(folder: Path, model: GPT, dtype: str):
    """The written weights, read back through GPT.from_hf, are the model's (rounded to dtype)."""
    reloaded = GPT.from_hf(folder, bias=model.config.bias)
    if reloaded.config != model.config:
        raise RuntimeError(f"the exported config reads back as {reloaded.config}, not {model.config}")
    expected, got = model.state_dict(), reloaded.state_dict()
    for key, tensor in expected.items():
        if not torch.equal(tensor.cpu().to(DTYPES[dtype]).float(), got[key]):
            raise RuntimeError(f"the exported {key} does not read back as the checkpoint's")


def export(checkpoint_path, out_dir, dtype: str = "float32", force: bool = False, tokenizer: str | None = None) -> Path:
    """Write the checkpoint at checkpoint_path as a Hugging Face GPT-2 folder out_dir; returns out_dir."""
    checkpoint_path, out_dir = Path(checkpoint_path), Path(os.path.abspath(out_dir))
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    if out_dir.exists() and not (out_dir.is_dir() and not any(out_dir.iterdir())) and not force:
        raise FileExistsError(f"{out_dir} exists and is not an empty folder: pass --force to replace it")
    model, state = load_model(checkpoint_path)
    tokenizer = tokenizer or (state.get("config") or {}).get("tokenizer")
    if tokenizer is None:
        raise ValueError(f"checkpoint {checkpoint_path} names no tokenizer in its config: pass --tokenizer")
    n_vocab = get_tokenizer(tokenizer).n_vocab
    if model.config.vocab_size < n_vocab:
        raise ValueError(f"the model's vocab_size {model.config.vocab_size} is smaller than the {tokenizer} "
                         f"tokenizer's {n_vocab} tokens")

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(f".{out_dir.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.mkdir()
    try:
        write_folder(tmp, model, state, tokenizer, dtype, checkpoint_path)
        check_folder(tmp, model, dtype)
        if out_dir.exists() or out_dir.is_symlink():
            old = tmp.with_name(tmp.name + ".old")
            os.replace(out_dir, old)
            os.replace(tmp, out_dir)
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old)
            else:
                old.unlink()
        else:
            os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # only left on failure
    return out_dir


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path, help="a checkpoint written by train.py (RUN/ckpt.pt)")
    parser.add_argument("out_dir", type=Path, help="the Hugging Face model folder to write")
    parser.add_argument("--dtype", default="float32", choices=list(DTYPES), help="the weights' dtype (default float32)")
    parser.add_argument("--tokenizer", choices=["gpt2", "byte"], help="default: the checkpoint's")
    parser.add_argument("--force", action="store_true", help="replace an existing out_dir")
    args = parser.parse_args(argv)
    try:
        out_dir = export(args.checkpoint, args.out_dir, args.dtype, args.force, args.tokenizer)
    except (OSError, ValueError, RuntimeError) as e:
        sys.exit(f"export_hf: {e}")
    config = json.loads((out_dir / "config.json").read_text())
    provenance = json.loads((out_dir / "nanomerit.json").read_text())
    print(f"wrote {out_dir}: GPT2LMHeadModel, {config['n_layer']} layers, {config['n_embd']} dims, vocab "
          f"{config['vocab_size']}, {args.dtype}, {provenance['tokenizer']} tokenizer, step {provenance['step']}")


if __name__ == "__main__":
    main()
