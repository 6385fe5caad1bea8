"""Data pipeline: offline assets, tokenizers, the shard format, corpus preparation and the
distributed token loader.

    corpus --data/prepare.py--> shards (data/shards.py) --data/loader.py--> (x, y) per rank
"""
import os
import uuid
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_open(path):
    """Open a binary file for writing that appears at `path` only once it is complete.

    Writes go to a temp file in the same folder, renamed onto `path` on success, so a crash or
    a concurrent reader (another rank, another run) never sees a half-written file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_path = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp_path, "xb") as f:
            yield f
        os.replace(tmp_path, path)
    finally:
        tmp_path.unlink(missing_ok=True)
