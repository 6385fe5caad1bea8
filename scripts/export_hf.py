"""Export a checkpoint of train.py as a Hugging Face model folder: a GPT2LMHeadModel (arch gpt2) or a
LlamaForCausalLM (arch llama), with its tokenizer (hf.py says what it holds).

    python -m scripts.export_hf runs/NAME/ckpt.pt OUT_DIR [--dtype float32|bfloat16|float16] [--force]
"""
import argparse
import json
import sys
from pathlib import Path

from hf import DTYPES, export


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path, help="a checkpoint written by train.py (RUN/ckpt.pt)")
    parser.add_argument("out_dir", type=Path, help="the Hugging Face model folder to write")
    parser.add_argument("--dtype", default="float32", choices=list(DTYPES), help="the weights' dtype (default float32)")
    parser.add_argument("--tokenizer", help="gpt2, byte, or a Hugging Face tokenizer's hub name or folder "
                                            "(default: the checkpoint's)")
    parser.add_argument("--force", action="store_true", help="replace an existing out_dir")
    args = parser.parse_args(argv)
    try:
        out_dir = export(args.checkpoint, args.out_dir, args.dtype, args.force, args.tokenizer)
    except ModuleNotFoundError as e:  # (the tokenizer files are written with Hugging Face's tokenizers)
        sys.exit(f"export_hf: {e}: the export needs the Hugging Face extras: pip install -r requirements-eval.txt")
    except (OSError, ValueError, RuntimeError) as e:
        sys.exit(f"export_hf: {e}")
    config = json.loads((out_dir / "config.json").read_text())
    provenance = json.loads((out_dir / "nanomerit.json").read_text())
    shape = provenance["model_args"]
    print(f"wrote {out_dir}: {config['architectures'][0]}, {shape['n_layer']} layers, {shape['n_embd']} dims, vocab "
          f"{config['vocab_size']}, {args.dtype}, {provenance['tokenizer']} tokenizer, step {provenance['step']}")


if __name__ == "__main__":
    main()
