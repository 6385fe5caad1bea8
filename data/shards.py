"""Token shards in llm.c's format (dev/data/data_common.py), so FineWeb / OpenWebText shards from
llm.c and modded-nanogpt load as they are.

A shard is a header of 256 int32 (magic 20240520, version 1, token count, zeros) followed by the
tokens as uint16. nanoGPT's header-less train.bin / val.bin (raw uint16) are read as well.
"""
import re
from pathlib import Path

import numpy as np

from data import atomic_open

MAGIC = 20240520
VERSION = 1  # uint16 tokens; llm.c's version 2 (uint32, Llama 3) is not supported
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
NANOGPT_FILE_NAMES = ("train.bin", "val.bin")
SPLITS = ("train", "val")


def write_shard(path, tokens) -> None:
    tokens = np.asarray(tokens)
    if tokens.size and not (0 <= tokens.min() and tokens.max() < 2**16):
        raise ValueError(f"cannot write {path}: token ids range over [{tokens.min()}, "
                         f"{tokens.max()}], but shards store uint16 ids in [0, 65536)")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = MAGIC, VERSION, tokens.size
    with atomic_open(path) as f:
        f.write(header.tobytes())
        f.write(tokens.astype("<u2", copy=False).tobytes())


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
            f"256 int32 header, then uint16 tokens). Re-create it with data/prepare.py; a "
            f"header-less nanoGPT file must be named {' or '.join(NANOGPT_FILE_NAMES)}."
        )
    version, n_tokens = int(header[1]), int(header[2])
    if version != VERSION:
        raise ValueError(f"{path}: shard version {version}, but only version {VERSION} (uint16 "
                         "tokens) is supported. Re-create it with data/prepare.py.")
    expected_bytes = HEADER_BYTES + 2 * n_tokens
    if file_bytes != expected_bytes:
        raise ValueError(
            f"{path}: file is {file_bytes} bytes but its header says {n_tokens} tokens "
            f"({expected_bytes} bytes): it is truncated or was not fully written. Delete it and "
            "re-create it with data/prepare.py."
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
    name_pattern = re.compile(rf"(?:.*_)?{split}(?:_\d+)?\.bin")
    shards = sorted(p for p in data_dir.iterdir() if name_pattern.fullmatch(p.name))
    if not shards:
        raise FileNotFoundError(
            f"no {split!r} shards in data dir {data_dir}; {prepare_hint(data_dir)}")
    return shards


def prepare_hint(data_dir) -> str:
    return (f"prepare it with `python data/prepare.py shakespeare --out {data_dir}` "
            f"(or `python data/prepare.py --files 'corpus/*.txt' --out {data_dir}`)")
