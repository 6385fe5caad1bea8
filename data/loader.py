"""Each rank's (x, y) micro-batches, cut from one global token stream.

The global stream is the split's shards concatenated, epoch after epoch without a gap: each
epoch of train takes its shards in an order shuffled by (seed, epoch); val keeps sorted order.
Each global micro-step takes the next world_size * B * T tokens; rank r reads its B * T of them
from offset r * B * T, plus one token for the shifted targets. Batches simply run on across
shard and epoch boundaries, so no token is dropped, and the stream depends only on how many
tokens were consumed: one rank doing two micro-steps sees the same tokens as two ranks doing
one each, and a run can resume on another number of ranks from the same position.
"""
import numpy as np
import torch

from data.shards import list_shards, open_shard


class TokenLoader:
    def __init__(self, data_dir, split: str, micro_batch_size: int, block_size: int,
                 rank: int = 0, world_size: int = 1, seed: int = 0):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        self.split = split
        self.micro_batch_size = micro_batch_size
        self.block_size = block_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.shards = [open_shard(path) for path in list_shards(data_dir, split)]
        self.shard_lengths = np.array([len(shard) for shard in self.shards], dtype=np.int64)
        self.split_tokens = int(self.shard_lengths.sum())
        self.rank_tokens = micro_batch_size * block_size  # per rank and micro-step
        self.global_tokens = world_size * self.rank_tokens  # all ranks, one micro-step
        if self.split_tokens < self.global_tokens + 1:
            raise ValueError(
                f"the {split!r} split of {data_dir} has {self.split_tokens:,} tokens, fewer than "
                f"one global micro-batch needs: world_size {world_size} x micro_batch_size "
                f"{micro_batch_size} x block_size {block_size} + 1 = {self.global_tokens + 1:,}. "
                "Use a smaller batch or block size, or prepare more data."
            )
        self.position = 0  # global tokens consumed, all ranks together, over all epochs
        self._layout_epoch = None

    @property
    def epoch(self) -> int:
        return self.position // self.split_tokens

    @property
    def next_offset(self) -> int:
        """Stream offset of this rank's next batch: the same tokens have the same offset whatever
        the number of ranks (used to seed per-batch randomness independently of the layout)."""
        return self.position + self.rank * self.rank_tokens

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y), each int64 of shape (micro_batch_size, block_size); y is x shifted by one."""
        tokens = torch.from_numpy(self.read(self.next_offset, self.rank_tokens + 1))
        self.position += self.global_tokens
        shape = (self.micro_batch_size, self.block_size)
        return tokens[:-1].view(shape), tokens[1:].view(shape)

    def read(self, start: int, count: int) -> np.ndarray:
        """Tokens [start, start + count) of the endless stream, as int64."""
        out = np.empty(count, dtype=np.int64)
        filled = 0
        while filled < count:
            epoch, offset = divmod(start + filled, self.split_tokens)
            order, shard_ends = self.epoch_layout(epoch)
            i = int(np.searchsorted(shard_ends, offset, side="right"))  # skips empty shards
            shard = self.shards[order[i]]
            local = offset - (shard_ends[i] - len(shard))
            n = min(count - filled, len(shard) - local)
            out[filled: filled + n] = shard[local: local + n]
            filled += n
        return out

    def epoch_layout(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """The shard order of an epoch and the stream offset where each of its shards ends."""
        if self._layout_epoch != epoch:
            if self.split == "train":
                order = np.random.default_rng([self.seed, epoch]).permutation(len(self.shards))
            else:
                order = np.arange(len(self.shards))
            self._layout = order, np.cumsum(self.shard_lengths[order])
            self._layout_epoch = epoch
        return self._layout

    def reset(self) -> None:
        """Back to the start of the stream (e.g. to evaluate on the same val tokens each time)."""
        self.position = 0

    def state_dict(self) -> dict:
        return {"position": self.position, "epoch": self.epoch, "seed": self.seed,
                "split_tokens": self.split_tokens}

    def load_state_dict(self, state: dict) -> None:
        # Positions only mean the same tokens on the same data with the same shuffling.
        for key in ("seed", "split_tokens"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"loader state was saved with {key}={state[key]}, but this {self.split!r} "
                    f"loader has {key}={getattr(self, key)}: the data or the seed changed, so "
                    "the saved position does not point at the same tokens"
                )
        self.position = int(state["position"])
