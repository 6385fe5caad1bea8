"""Each rank's (x, y) micro-batches, cut from one global token stream.

The global stream is the split's shards concatenated, epoch after epoch without a gap: each
epoch of train takes its shards in an order shuffled by (seed, epoch); val keeps sorted order.
Each global micro-step takes the next world_size * B * T tokens; rank r reads its B * T of them
from offset r * B * T, plus one token for the shifted targets. Batches simply run on across
shard and epoch boundaries, so no token is dropped, and the stream depends only on how many
tokens were consumed: one rank doing two micro-steps sees the same tokens as two ranks doing
one each, and a run can resume on another number of ranks from the same position.

With align_documents, every row (a sequence of T + 1 tokens) starts at a document. Documents
are preceded by the end-of-text token (llm.c's convention), so a global micro-step's
world_size * B rows are laid out one after another from a cursor: row k starts at the first
end-of-text token at or after the cursor and takes T + 1 tokens (running on into the next
documents when its own is short; a long document is cut and the rest of it skipped), then the
cursor moves to start + T. Rank r takes rows r * B .. r * B + B - 1. The position is the cursor
after the micro-step, a stream offset equal on every rank, so the layout independence above
holds here as well.

A batch is read into a new int64 array (no copy after that on a CPU; on a GPU the array is
pinned and copied to the device without waiting, so the host goes on while the copy runs), and
the shard of the last read is remembered, so a batch costs a few microseconds on the host.

Shards are checked lazily, once each: the first time a shard is used, its largest token is
compared with the vocabulary and (aligned) its end-of-text positions are indexed. When reading
enters a shard, a background thread asks the OS to bring the next one into the page cache and
scans it, so a shard boundary does not stall a step. Batches never depend on that thread's
timing: a scan is a pure function of the shard, and a scan still running is waited for.
"""
import itertools
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from data.shards import MANIFEST, list_shards, open_shard

SCAN_CHUNK_TOKENS = 1 << 24  # scan in 32 MiB pieces: small temporaries even for a 9B-token train.bin



class ShardTokenError(ValueError):
    """A shard holds a token id the tokenizer does not have (found when the loader reaches it,
    which may be mid-run: train.py then exits with this message, its last checkpoint intact)."""

class ShardScan(NamedTuple):
    max_token: int | None  # None when no vocabulary check was asked for
    eot_positions: np.ndarray | None  # sorted; None when documents are not aligned


def scan_shard(tokens: np.ndarray, find_max: bool, eot_token: int | None) -> ShardScan:
    """One pass over a shard, computing only what is asked for: its largest token and the
    positions of eot_token."""
    if not find_max and eot_token is None:
        return ShardScan(None, None)
    max_token, eot_chunks = -1, []
    for start in range(0, len(tokens), SCAN_CHUNK_TOKENS):
        chunk = tokens[start: start + SCAN_CHUNK_TOKENS]
        if find_max:
            max_token = max(max_token, int(chunk.max()))
        if eot_token is not None:
            eot_chunks.append(np.flatnonzero(chunk == eot_token) + start)
    eot_positions = None
    if eot_token is not None:
        # int32 halves the index of llm.c shards, whose int32 headers cap them below 2^31 tokens.
        dtype = np.int32 if len(tokens) < 2**31 else np.int64
        eot_positions = np.concatenate(eot_chunks or [np.zeros(0, np.int64)]).astype(dtype)
    return ShardScan(max_token if find_max else None, eot_positions)


def advise_willneed(path) -> None:
    """Ask the OS to start reading a file into the page cache. Only a hint: skipped where
    posix_fadvise does not exist (macOS, Windows), and an error here is left to the real read."""
    if not hasattr(os, "posix_fadvise"):
        return
    try:
        with open(path, "rb") as f:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_WILLNEED)
    except OSError:
        pass


class TokenLoader:
    def __init__(self, data_dir, split: str, micro_batch_size: int, block_size: int,
                 rank: int = 0, world_size: int = 1, seed: int = 0,
                 align_documents: bool = False, eot_token: int | None = None,
                 vocab_size: int | None = None, prefetch: bool = True, device: torch.device | str = "cpu"):
        """align_documents: start every row at an eot_token (the token before each document).
        vocab_size: refuse shards holding a token id >= vocab_size (None: no check).
        prefetch: read and scan the next shard in a background thread.
        device: where next_batch puts the batches."""
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        if align_documents and eot_token is None:
            raise ValueError("align_documents needs eot_token, the token that precedes each document")
        self.data_dir = data_dir
        self.split = split
        self.micro_batch_size = micro_batch_size
        self.block_size = block_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.align_documents = align_documents
        self.eot_token = eot_token
        self.vocab_size = vocab_size
        self.prefetch = prefetch
        self.device = torch.device(device)
        self.shard_paths = list_shards(data_dir, split)
        # Plain arrays on the memmaps (which they keep open): slicing a memmap costs a microsecond more.
        self.shards = [open_shard(path).view(np.ndarray) for path in self.shard_paths]
        self.shard_lengths = np.array([len(shard) for shard in self.shards], dtype=np.int64)
        self.split_tokens = int(self.shard_lengths.sum())
        self.nonempty_shards = int(np.count_nonzero(self.shard_lengths))
        self.rank_tokens = micro_batch_size * block_size  # per rank and micro-step
        self.global_tokens = world_size * self.rank_tokens  # all ranks, one micro-step
        if self.split_tokens < self.global_tokens + 1:
            raise ValueError(
                f"the {split!r} split of {data_dir} has {self.split_tokens:,} tokens, fewer than "
                f"one global micro-batch needs: world_size {world_size} x micro_batch_size "
                f"{micro_batch_size} x block_size {block_size} + 1 = {self.global_tokens + 1:,}. "
                "Use a smaller batch or block size, or prepare more data."
            )
        self._layout_epoch = None
        self._scans: dict[int, ShardScan] = {}  # by shard index, once computed and collected
        self._pending_scans: dict[int, Future] = {}  # by shard index, submitted to the prefetcher
        self._prefetcher: ThreadPoolExecutor | None = None  # started on the first prefetch
        # Without a vocabulary check or an end-of-text index, a scan has nothing to compute.
        self._scan_needed = vocab_size is not None or align_documents
        self._aligned_rows = None  # (position, row starts, next position), for the next micro-step
        self.seek(0)

    @property
    def epoch(self) -> int:
        return self.position // self.split_tokens

    @property
    def next_offset(self) -> int:
        """Stream offset of this rank's next batch (its first row): the same tokens have the same
        offset whatever the number of ranks (used to seed per-batch randomness independently of
        the layout)."""
        if self.align_documents:
            row_starts, _ = self.next_aligned_rows()
            return row_starts[self.rank * self.micro_batch_size]
        return self.position + self.rank * self.rank_tokens

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y), each int64 of shape (micro_batch_size, block_size), on the loader's device; y is x
        shifted by one (views of one array of the batch's tokens)."""
        batch, block = self.micro_batch_size, self.block_size
        if self.align_documents:
            row_starts, next_position = self.next_aligned_rows()
            first = self.rank * batch
            pinned, rows = self._new_tokens((batch, block + 1))
            for row, start in zip(rows, row_starts[first: first + batch]):
                self.read(start, row)
            self.position = next_position
            return self._shifted(pinned, rows, lambda t: t[:, :-1], lambda t: t[:, 1:])
        pinned, tokens = self._new_tokens(self.rank_tokens + 1)
        self.read(self.next_offset, tokens)
        self.position += self.global_tokens
        return self._shifted(pinned, tokens, lambda t: t[:-1].reshape(batch, block),
                             lambda t: t[1:].reshape(batch, block))

    def _new_tokens(self, shape) -> tuple[torch.Tensor | None, np.ndarray]:
        """(None, an int64 array) to read a batch into; for another device than the CPU (the tensor,
        its numpy face), the tensor pinned for a CUDA device."""
        if self.device.type == "cpu":
            return None, np.empty(shape, dtype=np.int64)
        tensor = torch.empty(shape, dtype=torch.int64, pin_memory=self.device.type == "cuda")
        return tensor, tensor.numpy()

    def _shifted(self, tensor: torch.Tensor | None, tokens: np.ndarray, x_of,
                 y_of) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y): ``x_of`` and ``y_of`` of the batch's tokens, on the loader's device. On the CPU as
        views of the numpy array (numpy's views are cheaper than torch's); else the tensor is copied
        without waiting (from pinned memory, on CUDA), as itself: torch's pinned-memory allocator then
        keeps its block until the copy is done."""
        if tensor is None:
            return torch.from_numpy(x_of(tokens)), torch.from_numpy(y_of(tokens))
        on_device = tensor.to(self.device, non_blocking=True)
        return x_of(on_device), y_of(on_device)

    def next_aligned_rows(self) -> tuple[list[int], int]:
        """Stream offsets where the next global micro-step's rows start (all ranks' rows, as every
        rank needs the cursor after them), and that cursor: the position after the micro-step."""
        if self._aligned_rows is None or self._aligned_rows[0] != self.position:
            row_starts, cursor = [], self.position
            for _ in range(self.world_size * self.micro_batch_size):
                row_starts.append(self.next_document_start(cursor))
                cursor = row_starts[-1] + self.block_size
            self._aligned_rows = (self.position, row_starts, cursor)
        return self._aligned_rows[1], self._aligned_rows[2]

    def next_document_start(self, offset: int) -> int:
        """Stream offset of the first end-of-text token at or after `offset`."""
        for shards_searched in itertools.count(1):
            shard, shard_start = self.shard_at(offset)
            eot_positions = self.scan(shard).eot_positions
            i = int(np.searchsorted(eot_positions, offset - shard_start))
            if i < len(eot_positions):
                return shard_start + int(eot_positions[i])
            # Searching on without end means the split has no document start at all: check that
            # once, when the search has crossed as many shards as there are.
            if shards_searched == self.nonempty_shards and not any(
                    len(self.scan(s).eot_positions) for s in range(len(self.shards))):
                raise ValueError(
                    f"align_documents: the {self.split!r} split of {self.data_dir} contains no "
                    f"end-of-text token (id {self.eot_token}), so no row can start at a document. "
                    "The shards were made with another tokenizer or without document separators: "
                    "re-prepare them with `python -m data.prepare`, or set align_documents=False."
                )
            offset = shard_start + len(self.shards[shard])

    def read(self, start: int, out: np.ndarray) -> None:
        """Tokens [start, start + len(out)) of the endless stream into ``out`` (int64)."""
        count, filled = len(out), 0
        while filled < count:
            shard, shard_start = self.shard_at(start + filled)
            local = start + filled - shard_start
            n = min(count - filled, len(self.shards[shard]) - local)
            out[filled: filled + n] = self.shards[shard][local: local + n]
            filled += n

    def shard_at(self, offset: int) -> tuple[int, int]:
        """(index, stream offset of its first token) of the shard holding stream offset `offset`.
        Checks the shard's tokens on its first use; the first time reading gets into a shard,
        prefetches the shard after it. The shard found last is remembered (until a seek): reading
        on in it needs none of that again."""
        start, end, shard = self._last_shard
        if start <= offset < end:
            return shard, start
        epoch, i, shard, shard_end = self._locate(offset)
        if self.prefetch and shard_end > self._furthest_shard_end:
            self._furthest_shard_end = shard_end
            self.prefetch_shard(self.shard_after(epoch, i))
        self.check_vocabulary(shard)
        start = shard_end - len(self.shards[shard])
        self._last_shard = start, shard_end, shard
        return shard, start

    def _locate(self, offset: int) -> tuple[int, int, int, int]:
        """(epoch, place in the epoch's order, index, stream offset of its end) of the shard holding
        stream offset ``offset``."""
        epoch, epoch_offset = divmod(offset, self.split_tokens)
        order, shard_ends = self.epoch_layout(epoch)
        i = int(np.searchsorted(shard_ends, epoch_offset, side="right"))  # skips empty shards
        return epoch, i, int(order[i]), epoch * self.split_tokens + int(shard_ends[i])

    def shard_order(self, epoch: int) -> np.ndarray:
        if self.split == "train":
            return np.random.default_rng([self.seed, epoch]).permutation(len(self.shards))
        return np.arange(len(self.shards))

    def epoch_layout(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """The shard order of an epoch and the stream offset where each of its shards ends."""
        if self._layout_epoch != epoch:
            order = self.shard_order(epoch)
            self._layout = order, np.cumsum(self.shard_lengths[order])
            self._layout_epoch = epoch
        return self._layout

    def shard_after(self, epoch: int, i: int) -> int:
        """The next non-empty shard in stream order after the i-th shard of an epoch (the first
        of the next epoch after the last)."""
        following = itertools.chain(self.epoch_layout(epoch)[0][i + 1:], self.shard_order(epoch + 1))
        return next(int(shard) for shard in following if self.shard_lengths[shard])

    # --- shard checks and prefetching ---
    def scan(self, shard: int) -> ShardScan:
        """The shard's scan, computed once: collected from the prefetcher if it started it."""
        if shard not in self._scans:
            pending = self._pending_scans.pop(shard, None)
            self._scans[shard] = pending.result() if pending else self._scan_now(shard)
        return self._scans[shard]

    def _scan_now(self, shard: int) -> ShardScan:
        return scan_shard(self.shards[shard], find_max=self.vocab_size is not None,
                          eot_token=self.eot_token if self.align_documents else None)

    def check_vocabulary(self, shard: int) -> None:
        if self.vocab_size is None:
            return
        max_token = self.scan(shard).max_token
        if max_token >= self.vocab_size:
            found = (f"shard {self.shard_paths[shard]} holds token id {max_token}, but the tokenizer has only "
                     f"{self.vocab_size} tokens (ids 0..{self.vocab_size - 1})")
            if (Path(self.data_dir) / MANIFEST).is_file():  # (train.py checked its tokenizer: this one)
                raise ShardTokenError(
                    f"{found}: the shard is corrupt, since {MANIFEST} says the data was prepared with this "
                    f"tokenizer. `python -m data.prepare --verify {self.data_dir}` checks every shard against "
                    f"its checksum; prepare the data again with --force")
            raise ShardTokenError(
                f"{found}: the data was prepared with another tokenizer. Re-prepare it with `python -m "
                "data.prepare --tokenizer NAME ...` naming this run's tokenizer, or set the config's tokenizer "
                "to the one the data was made with.")

    def prefetch_shard(self, shard: int) -> None:
        """Bring a shard into the page cache and scan it, in the background."""
        if self._prefetcher is None:
            self._prefetcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"prefetch-{self.split}")
        self._prefetcher.submit(advise_willneed, self.shard_paths[shard])
        if self._scan_needed and shard not in self._scans and shard not in self._pending_scans:
            self._pending_scans[shard] = self._prefetcher.submit(self._scan_now, shard)

    def close(self) -> None:
        """Stop the prefetch thread (it also ends when the loader is garbage collected); the
        loader stays usable and starts a new one if it prefetches again."""
        if self._prefetcher is not None:
            self._prefetcher.shutdown(wait=True, cancel_futures=True)
            self._prefetcher = None
        self._pending_scans.clear()

    # --- position ---
    def seek(self, position: int) -> None:
        self.position = position  # global tokens consumed, all ranks together, over all epochs
        # Where the furthest shard entered since the seek ends: getting past it prefetches.
        self._furthest_shard_end = -1
        self._last_shard = (0, 0, -1)  # (stream offsets it spans, its index) of the shard shard_at found last
        self.check_vocabulary(self._locate(position)[2])  # the shard read next: a run finds a bad one before it writes

    def reset(self) -> None:
        """Back to the start of the stream (e.g. to evaluate on the same val tokens each time)."""
        self.seek(0)

    def state_dict(self) -> dict:
        return {"position": self.position, "epoch": self.epoch, "seed": self.seed,
                "split_tokens": self.split_tokens}

    def load_state_dict(self, state: dict) -> None:
        # Positions only mean the same tokens on the same data with the same shuffling.
        for key in ("seed", "split_tokens"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"loader state was saved with {key}={state[key]}, but this {self.split!r} "
                    f"loader has {key}={getattr(self, key)}: the data or its shuffling seed (the config's "
                    f"data_seed) changed, so "
                    "the saved position does not point at the same tokens"
                )
        self.seek(int(state["position"]))
