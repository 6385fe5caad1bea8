"""Token shards in llm.c's format (dev/data/data_common.py), so FineWeb / OpenWebText shards from
llm.c and modded-nanogpt load as they are.

A shard is a header of 256 int32 (magic 20240520, version 1, token count, zeros) followed by the
tokens as uint16. nanoGPT's header-less train.bin / val.bin (raw uint16) are read as well.
"""
import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np

from atomic import atomic_write, publish
from data.assets import sha256_of

MAGIC = 20240520
VERSION = 1  # uint16 tokens; llm.c's version 2 (uint32, Llama 3) is not supported
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
NANOGPT_FILE_NAMES = ("train.bin", "val.bin")
SPLITS = ("train", "val")


def header(n_tokens: int) -> bytes:
    values = np.zeros(HEADER_INTS, dtype="<i4")
    values[:3] = MAGIC, VERSION, n_tokens
    return values.tobytes()


def as_uint16(tokens, where) -> np.ndarray:
    """Token ids as little-endian uint16, or an error naming ``where`` if any does not fit."""
    tokens = np.asarray(tokens)
    if tokens.size and not (0 <= tokens.min() and tokens.max() < 2**16):
        raise ValueError(f"cannot write {where}: token ids range over [{tokens.min()}, "
                         f"{tokens.max()}], but shards store uint16 ids in [0, 65536)")
    return tokens.astype("<u2", copy=False)


def write_shard(path, tokens) -> None:
    tokens = as_uint16(tokens, path)
    with atomic_write(path) as f:
        f.write(header(tokens.size))
        f.write(tokens.tobytes())


class ShardWriter:
    """Appends one split's token stream to shards of exactly ``shard_tokens`` tokens (the last one
    may be shorter), named ``{split}_{index:06d}.bin``, resumably.

    The open shard grows in ``{name}.partial`` (a header placeholder, then the tokens). A full
    shard gets its header, is fsynced and renamed to its final name, so a shard under its final
    name is always complete. ``checkpoint()`` fsyncs the open shard and returns the writer's state
    (finished shards with token counts and sha256, tokens in the open shard); a writer built from
    that state after a crash truncates the open shard back to it and continues exactly, whatever
    was written after the checkpoint.
    """

    def __init__(self, out_dir, split: str, shard_tokens: int, state: dict | None = None):
        if shard_tokens < 1:
            raise ValueError(f"shard_tokens must be positive, got {shard_tokens}")
        self.out_dir, self.split, self.shard_tokens = Path(out_dir), split, shard_tokens
        self.shards = list(state["shards"]) if state else []  # finished: {"file", "tokens", "sha256"}
        open_tokens = state["open_tokens"] if state else 0
        self._remove_later_shards()
        path, partial = self._final_path(), self._partial_path()
        if path.exists():  # finished after the checkpoint, before the next one was recorded
            os.replace(path, partial)
        checkpointed_bytes = HEADER_BYTES + 2 * open_tokens
        if open_tokens and not (partial.exists() and partial.stat().st_size >= checkpointed_bytes):
            raise ValueError(f"cannot resume writing {partial}: it is missing or shorter than the "
                             f"{open_tokens:,} tokens checkpointed; prepare again with --force")
        self.file = open(partial, "r+b" if open_tokens else "w+b")
        self.file.truncate(checkpointed_bytes)  # a new shard: zeros, the header's placeholder
        self.file.seek(0, os.SEEK_END)
        self.open_tokens = open_tokens

    @property
    def tokens(self) -> int:
        return sum(shard["tokens"] for shard in self.shards) + self.open_tokens

    def append(self, tokens: np.ndarray) -> None:
        tokens = as_uint16(tokens, f"the {self.split} shards in {self.out_dir}")
        while tokens.size:
            n = min(tokens.size, self.shard_tokens - self.open_tokens)
            self.file.write(tokens[:n].tobytes())
            self.open_tokens += n
            tokens = tokens[n:]
            if self.open_tokens == self.shard_tokens:
                self._finish_shard()
                self._open_next()

    def checkpoint(self) -> dict:
        self.file.flush()
        os.fsync(self.file.fileno())
        return {"shards": list(self.shards), "open_tokens": self.open_tokens}

    def close(self) -> list[dict]:
        """Finish the open shard (unless it is empty and others exist); the finished shards."""
        if self.open_tokens or not self.shards:
            self._finish_shard()
        else:
            self.file.close()
            self._partial_path().unlink()
        return self.shards

    def _finish_shard(self) -> None:
        self.file.seek(0)
        self.file.write(header(self.open_tokens))
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        path = self._final_path()
        # The partial file has a fixed name, not atomic_write's unique one: a rerun resumes it.
        publish(self._partial_path(), path)
        self.shards.append({"file": path.name, "tokens": self.open_tokens, "sha256": sha256_of(path)})

    def _open_next(self) -> None:
        self.open_tokens = 0
        self.file = open(self._partial_path(), "w+b")
        self.file.write(header(0))  # a placeholder until the shard is finished

    def _final_path(self) -> Path:
        return self.out_dir / f"{self.split}_{len(self.shards):06d}.bin"

    def _partial_path(self) -> Path:
        return self._final_path().with_name(self._final_path().name + ".partial")

    def _remove_later_shards(self) -> None:
        """Shards (finished or partial) past the open one are from after the checkpoint."""
        pattern = re.compile(rf"{self.split}_(\d{{6}})\.bin(\.partial)?")
        for path in self.out_dir.iterdir():
            match = pattern.fullmatch(path.name)
            if match and int(match.group(1)) > len(self.shards):
                path.unlink()


def open_shard(path) -> np.ndarray:
    """The shard's tokens as a read-only uint16 memmap, after checking header and size."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"shard {path} does not exist")
    file_bytes = path.stat().st_size
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    if header.size < 3 or header[0] != MAGIC:
        if path.name in NANOGPT_FILE_NAMES:
            return open_nanogpt_bin(path, file_bytes)
        found = f"magic {header[0]}" if header.size else "an empty file"
        raise ValueError(
            f"{path} is not a token shard: found {found}, expected magic {MAGIC} (llm.c format: "
            f"256 int32 header, then uint16 tokens). Re-create it with `python -m data.prepare`; a "
            f"header-less nanoGPT file must be named {' or '.join(NANOGPT_FILE_NAMES)}."
        )
    version, n_tokens = int(header[1]), int(header[2])
    if version != VERSION:
        raise ValueError(f"{path}: shard version {version}, but only version {VERSION} (uint16 "
                         "tokens) is supported. Re-create it with `python -m data.prepare`.")
    expected_bytes = HEADER_BYTES + 2 * n_tokens
    if file_bytes != expected_bytes:
        raise ValueError(
            f"{path}: file is {file_bytes} bytes but its header says {n_tokens} tokens "
            f"({expected_bytes} bytes): it is truncated or was not fully written. Delete it and "
            "re-create it with `python -m data.prepare`."
        )
    if n_tokens == 0:
        return np.zeros(0, dtype=np.uint16)  # np.memmap cannot map zero bytes
    return np.memmap(path, dtype="<u2", mode="r", offset=HEADER_BYTES, shape=(n_tokens,))


def open_nanogpt_bin(path: Path, file_bytes: int) -> np.ndarray:
    if file_bytes % 2:
        raise ValueError(f"{path}: a header-less nanoGPT file must hold uint16 tokens, but its "
                         f"size ({file_bytes} bytes) is odd: it is truncated or not tokens.")
    if file_bytes == 0:
        return np.zeros(0, dtype=np.uint16)
    return np.memmap(path, dtype="<u2", mode="r")


def list_shards(data_dir, split: str) -> list[Path]:
    """The split's shards sorted by name: ours (train_000000.bin), llm.c's
    (fineweb_train_000001.bin, tiny_shakespeare_train.bin) and nanoGPT's (train.bin)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise FileNotFoundError(f"data dir {data_dir} does not exist; {prepare_hint(data_dir)}")
    shards = _split_files(data_dir, split)
    if not shards:
        raise FileNotFoundError(
            f"no {split!r} shards in data dir {data_dir}; {prepare_hint(data_dir)}")
    return shards


def _split_files(data_dir, split: str) -> list[Path]:
    name_pattern = re.compile(rf"(?:.*_)?{split}(?:_\d+)?\.bin")
    return sorted(p for p in Path(data_dir).iterdir() if name_pattern.fullmatch(p.name))


MANIFEST = "manifest.json"  # written by data/prepare.py last: its presence means the folder is complete


def verify_manifest(data_dir, tokenizer: str | None, sha256: bool = False) -> dict | None:
    """Check a prepared folder against its manifest.json (if it has one; shards from other tools
    have none): the tokenizer it was made with (unless ``tokenizer`` is None), and every listed
    shard present with the size its token count gives (and, if ``sha256``, its checksum), and no
    shard it does not list. Returns the manifest. A missing folder is an error that says how to
    prepare it (with ``tokenizer``); nanoGPT's character-level bins (meta.pkl) are refused."""
    if Path(data_dir).is_file():
        raise NotADirectoryError(f"data dir {data_dir} is a file: data_dir is the folder data/prepare.py wrote "
                                 f"(its shards and manifest.json)")
    if not Path(data_dir).is_dir():
        raise FileNotFoundError(f"data dir {data_dir} does not exist; {prepare_hint(data_dir, tokenizer)}")
    if (Path(data_dir) / "meta.pkl").is_file():  # nanoGPT's shakespeare_char: ids of its own character vocabulary
        raise ValueError(f"{data_dir} holds nanoGPT's meta.pkl: its .bin files are ids of nanoGPT's own "
                         f"character vocabulary, which neither the byte nor the GPT-2 tokenizer reads; prepare "
                         f"the text itself into a new folder instead: {prepare_hint(f'{data_dir}-text', tokenizer)}")
    path = Path(data_dir) / MANIFEST
    if not path.is_file():
        for split in SPLITS:  # (shards of other tools have no manifest: the loader lists them)
            if not _split_files(data_dir, split):
                raise FileNotFoundError(f"no {split!r} shards in data dir {data_dir}; "
                                        f"{prepare_hint(data_dir, tokenizer)}")
        return None
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error}): prepare the data again with --force") from error
    if tokenizer is not None and manifest.get("tokenizer") != tokenizer:
        raise ValueError(f"the data in {data_dir} was prepared with the {manifest.get('tokenizer')!r} tokenizer "
                         f"({MANIFEST}), but the config says tokenizer={tokenizer!r}: set "
                         f"tokenizer={manifest.get('tokenizer')!r}, or prepare the data with --tokenizer {tokenizer}")
    for split, listed in manifest.get("splits", {}).items():
        for shard in listed["shards"]:
            file = Path(data_dir) / shard["file"]
            expected = HEADER_BYTES + 2 * shard["tokens"]
            found = file.stat().st_size if file.is_file() else None
            if found != expected:
                what = "is missing" if found is None else f"has {found} bytes"
                raise ValueError(f"{file} {what}, but {MANIFEST} lists it with {shard['tokens']} tokens "
                                 f"({expected} bytes): prepare the data again with --force")
            if sha256 and sha256_of(file) != shard["sha256"]:
                raise ValueError(f"{file}: its sha256 is not the one {MANIFEST} lists: the file changed after "
                                 f"preparation; prepare the data again with --force")
        unlisted = sorted({p.name for p in _split_files(data_dir, split)} - {s["file"] for s in listed["shards"]})
        if unlisted:  # (the loader would train on them)
            raise ValueError(f"{data_dir} holds {split} shards that {MANIFEST} does not list ({', '.join(unlisted)}): "
                             f"remove them, or prepare the data again with --force")
    return manifest


def fingerprint(data_dir) -> str:
    """What the shards of ``data_dir`` are, in 16 hex digits that do not depend on where the folder
    lies: every train and val shard's name and size, with its sha256 where a manifest lists one.
    Replica groups compare it (training/replica_checks.py): two clusters' copies of the same
    prepared data give the same digits."""
    manifest = Path(data_dir) / MANIFEST
    if manifest.is_file():
        listed = json.loads(manifest.read_text()).get("splits", {})
    else:
        listed = {split: [(p.name, p.stat().st_size) for p in _split_files(data_dir, split)] for split in SPLITS}
    return hashlib.sha256(json.dumps(listed, sort_keys=True).encode()).hexdigest()[:16]

def prepare_hint(data_dir, tokenizer: str | None = None) -> str:
    """How to prepare ``data_dir`` (for ``tokenizer``, the one a config asks for, if known)."""
    tokens = f" --tokenizer {tokenizer}" if tokenizer else ""
    return (f"prepare it with `python -m data.prepare shakespeare{tokens} --out {data_dir}` "
            f"(or `python -m data.prepare --files 'corpus/*.txt'{tokens} --out {data_dir}`)")
