"""data/loader.py beyond the plain token stream (tests/test_data.py): document-aligned rows
against a naive scan of the concatenated stream, resuming on another number of ranks,
prefetching of the next shard, and the errors for data that does not fit the run."""
import threading

import numpy as np
import pytest
import torch

from data import loader as loader_module
from data.loader import TokenLoader
from data.shards import write_shard

EOT = 500  # precedes every document, as data/prepare.py and llm.c write them
VOCAB = 501


def documents(rng: np.random.Generator, n_docs: int) -> list[int]:
    """Documents of 1 to 30 tokens, each preceded by EOT: some fit in a row many times, some
    are cut."""
    tokens = []
    for _ in range(n_docs):
        tokens += [EOT, *rng.integers(0, EOT, rng.integers(1, 31)).tolist()]
    return tokens


@pytest.fixture
def doc_shards(tmp_path):
    """train: four shards of documents cut at arbitrary points, one of them inside a long
    document (no EOT at all) and one empty; val: two shards. Returns (data_dir, shards by split)."""
    rng = np.random.default_rng(0)
    shards = {
        "train": [documents(rng, 6)[3:], [7] * 45 + rng.integers(0, EOT, 15).tolist(), [], documents(rng, 9)],
        "val": [documents(rng, 5), documents(rng, 4)[2:]],
    }
    for split, split_shards in shards.items():
        for i, tokens in enumerate(split_shards):
            write_shard(tmp_path / f"{split}_{i:06d}.bin", np.array(tokens, dtype=np.uint16))
    assert EOT not in shards["train"][1] and shards["train"][0][0] != EOT  # a shard starts mid-document
    return tmp_path, shards


def reference_stream(data_dir, split: str, shards: list[list[int]], epochs: int) -> np.ndarray:
    """The split's shards concatenated epoch after epoch; train's order per epoch is the one
    tests/test_data.py checks the loader against."""
    layout = TokenLoader(data_dir, split, 1, 1, seed=3, prefetch=False)
    return np.array([t for e in range(epochs) for i in layout.epoch_layout(e)[0] for t in shards[i]])


def naive_aligned_rows(stream: np.ndarray, cursor: int, n_rows: int, block_size: int):
    """The rule, token by token: a row starts at the first EOT at or after the cursor and takes
    block_size + 1 tokens; the cursor moves to its start + block_size. (starts, rows, cursor)."""
    starts, rows = [], []
    for _ in range(n_rows):
        start = cursor
        while stream[start] != EOT:
            start += 1
        assert start + block_size + 1 <= len(stream), "reference stream too short"
        starts.append(start)
        rows.append(stream[start: start + block_size + 1])
        cursor = start + block_size
    return starts, rows, cursor


def aligned(data_dir, split="train", **kwargs) -> TokenLoader:
    kwargs = {"micro_batch_size": 2, "block_size": 8, "seed": 3, "align_documents": True, "eot_token": EOT,
              "vocab_size": VOCAB, **kwargs}
    return TokenLoader(data_dir, split, **kwargs)


def batches(loader: TokenLoader, steps: int) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """(x, y, next_offset) of the next `steps` micro-batches."""
    out = []
    for _ in range(steps):
        offset = loader.next_offset
        out.append((*loader.next_batch(), offset))
    return out


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for (xa, ya, offset_a), (xb, yb, offset_b) in zip(a, b):
        assert torch.equal(xa, xb) and torch.equal(ya, yb) and offset_a == offset_b


# ---- document alignment ----------------------------------------------------------------------

@pytest.mark.parametrize("split", ["train", "val"])
@pytest.mark.parametrize("block_size", [4, 8, 23])
def test_aligned_rows_equal_the_naive_reference(doc_shards, split, block_size):
    data_dir, shards = doc_shards
    stream = reference_stream(data_dir, split, shards[split], epochs=20)
    loader = aligned(data_dir, split, block_size=block_size)
    cursor = 0
    for _ in range(15):  # across shard boundaries, the document-free shard and several epochs
        starts, rows, cursor = naive_aligned_rows(stream, cursor, 2, block_size)
        assert loader.next_offset == starts[0]
        x, y = loader.next_batch()
        assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (2, block_size)
        assert (x[:, 0] == EOT).all()
        assert x.tolist() == [row[:-1].tolist() for row in rows]
        assert y.tolist() == [row[1:].tolist() for row in rows]
        assert loader.position == cursor
    assert loader.epoch >= 2


def test_aligned_two_ranks_one_step_equal_one_rank_two_steps(doc_shards):
    data_dir, _ = doc_shards
    single = aligned(data_dir, micro_batch_size=3)
    ranks = [aligned(data_dir, micro_batch_size=3, rank=r, world_size=2) for r in range(2)]
    for _ in range(12):
        for rank_loader in ranks:
            assert_same_batches(batches(rank_loader, 1), batches(single, 1))
        assert ranks[0].position == ranks[1].position == single.position


def test_aligned_state_dict_resumes_on_another_world_size(doc_shards):
    data_dir, _ = doc_shards
    ranks = [aligned(data_dir, rank=r, world_size=2) for r in range(2)]
    for rank_loader in ranks:
        batches(rank_loader, 7)
    state = ranks[0].state_dict()
    assert state == ranks[1].state_dict()  # the position is global: any rank's state will do
    expected = [batch for _ in range(5) for rank_loader in ranks for batch in batches(rank_loader, 1)]

    on_one_rank = aligned(data_dir)
    on_one_rank.load_state_dict(state)
    assert_same_batches(batches(on_one_rank, 10), expected)

    on_two_ranks = [aligned(data_dir, rank=r, world_size=2) for r in range(2)]
    for rank_loader in on_two_ranks:
        rank_loader.load_state_dict(state)
    assert_same_batches([b for _ in range(5) for rank_loader in on_two_ranks for b in batches(rank_loader, 1)],
                        expected)


def test_unaligned_stream_ignores_documents(doc_shards):
    """align_documents=False keeps the plain stream even when an eot_token is given."""
    data_dir, shards = doc_shards
    stream = reference_stream(data_dir, "train", shards["train"], epochs=3)
    loader = TokenLoader(data_dir, "train", 2, 8, seed=3, eot_token=EOT, vocab_size=VOCAB)
    for step in range(10):
        assert loader.next_offset == step * 16
        assert loader.next_batch()[0].flatten().tolist() == stream[step * 16: step * 16 + 16].tolist()


def test_split_without_documents_is_an_error(tmp_path):
    write_shard(tmp_path / "val_000000.bin", np.arange(100))
    loader = aligned(tmp_path, "val")
    with pytest.raises(ValueError, match=rf"align_documents: the 'val' split of {tmp_path} contains no "
                                         rf"end-of-text token \(id {EOT}\).*align_documents=False"):
        loader.next_batch()
    with pytest.raises(ValueError, match="needs eot_token"):
        TokenLoader(tmp_path, "val", 1, 8, align_documents=True)


# ---- prefetching -----------------------------------------------------------------------------

def test_prefetch_requests_the_next_shard_in_stream_order(doc_shards, monkeypatch):
    data_dir, shards = doc_shards
    # Recorded when requested (in this thread): close() cancels requests still queued.
    advised = []
    request = TokenLoader.prefetch_shard
    monkeypatch.setattr(TokenLoader, "prefetch_shard",
                        lambda self, shard: advised.append(self.shard_paths[shard]) or request(self, shard))
    loader = TokenLoader(data_dir, "train", 1, 10, seed=3, vocab_size=VOCAB)
    steps = 80  # reads stream offsets [0, 801)
    assert 2 * sum(map(len, shards["train"])) < 800  # so that is over two epochs
    carried_out = []
    monkeypatch.setattr(loader_module, "advise_willneed", carried_out.append)
    batches(loader, steps)
    loader._prefetcher.submit(lambda: None).result()  # one FIFO worker: every earlier request is done
    loader.close()
    assert carried_out == advised  # each request reached the OS hint, in order

    # The non-empty shards in the order the stream visits them, and where each starts.
    visits, start = [], 0
    for epoch in range(4):
        for shard in loader.epoch_layout(epoch)[0]:
            if shards["train"][shard]:
                visits.append((int(shard), start))
                start += len(shards["train"][shard])
    entered = [i for i, (_, start) in enumerate(visits) if start <= 800]
    assert advised == [loader.shard_paths[visits[i + 1][0]] for i in entered]
    last_of_epoch_0 = len([s for s in loader.epoch_layout(0)[0] if shards["train"][s]]) - 1
    first_of_epoch_1 = next(s for s in loader.epoch_layout(1)[0] if shards["train"][s])
    assert advised[last_of_epoch_0] == loader.shard_paths[first_of_epoch_1]  # the wrap to the next epoch


def test_each_shard_is_scanned_once(doc_shards, monkeypatch):
    data_dir, _ = doc_shards
    scanned = []

    def recording_scan(tokens, find_max, eot_token):
        scanned.append(tokens[:5].tolist())
        return scan_shard(tokens, find_max, eot_token)

    scan_shard = loader_module.scan_shard
    monkeypatch.setattr(loader_module, "scan_shard", recording_scan)
    loader = aligned(data_dir)
    batches(loader, 40)  # several epochs
    loader.close()
    assert len(scanned) == 3 and len({tuple(s) for s in scanned}) == 3  # the non-empty shards


@pytest.mark.parametrize("align_documents", [False, True])
def test_prefetching_does_not_change_batches(doc_shards, monkeypatch, align_documents):
    data_dir, _ = doc_shards
    kwargs = dict(align_documents=align_documents, micro_batch_size=2, block_size=7)
    expected = batches(aligned(data_dir, prefetch=False, **kwargs), 30)

    prefetching = aligned(data_dir, **kwargs)
    assert_same_batches(batches(prefetching, 30), expected)
    prefetching.close()

    # A slow prefetcher: the loader waits for a scan it started rather than racing it.
    scan_shard = loader_module.scan_shard

    def slow_scan(*args, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            threading.Event().wait(0.02)
        return scan_shard(*args, **kwargs)

    monkeypatch.setattr(loader_module, "scan_shard", slow_scan)
    monkeypatch.delattr(loader_module.os, "posix_fadvise", raising=False)  # as on macOS
    slow = aligned(data_dir, **kwargs)
    assert_same_batches(batches(slow, 30), expected)
    slow.close()


def test_close_leaves_no_thread(doc_shards):
    data_dir, _ = doc_shards
    running_before = set(threading.enumerate())
    loader = aligned(data_dir)
    batches(loader, 20)
    started = set(threading.enumerate()) - running_before
    assert [t.name for t in started] == ["prefetch-train_0"]
    loader.close()
    assert not any(t.is_alive() for t in started)
    batches(loader, 1)  # still usable after close
    loader.close()


# ---- errors ----------------------------------------------------------------------------------

def test_token_outside_the_vocabulary_is_an_error_when_its_shard_is_used(tmp_path):
    write_shard(tmp_path / "val_000000.bin", np.full(50, 7))
    write_shard(tmp_path / "val_000001.bin", [EOT, 3, 60000, 4] * 10)
    loader = TokenLoader(tmp_path, "val", 1, 10, vocab_size=VOCAB)
    batches(loader, 4)  # the first shard is fine, whether or not the second was prefetched yet
    with pytest.raises(ValueError, match=rf"shard {tmp_path / 'val_000001.bin'} holds token id 60000, but "
                                         rf"the tokenizer has only {VOCAB} tokens.*another tokenizer.*"
                                         r"python -m data.prepare --tokenizer"):
        loader.next_batch()
    loader.close()


def test_data_errors_name_the_input_and_the_fix(doc_shards, tmp_path):
    data_dir, shards = doc_shards
    with pytest.raises(FileNotFoundError, match=r"no 'val' shards in data dir .*empty.*python -m data\.prepare"):
        (tmp_path / "empty").mkdir()
        TokenLoader(tmp_path / "empty", "val", 1, 8)
    truncated = tmp_path / "truncated"
    write_shard(truncated / "val_000000.bin", np.arange(100))
    with open(truncated / "val_000000.bin", "r+b") as f:
        f.truncate(1024 + 150)
    with pytest.raises(ValueError, match=r"val_000000.bin: file is 1174 bytes but its header says 100 tokens.*"
                                         r"truncated.*python -m data\.prepare"):
        TokenLoader(truncated, "val", 1, 8)
    val_tokens = sum(map(len, shards["val"]))
    assert val_tokens < 2 * 8 * 16 + 1
    with pytest.raises(ValueError, match=rf"'val' split .* has {val_tokens} tokens, fewer than one global micro-batch"):
        aligned(data_dir, "val", micro_batch_size=8, block_size=16, world_size=2)


# ---- the batches' device ---------------------------------------------------------------------

@pytest.mark.parametrize("align_documents", [False, True])
def test_a_seek_back_reads_the_same_batches_again(doc_shards, align_documents):
    data_dir, _ = doc_shards
    loader = aligned(data_dir, align_documents=align_documents, block_size=7)
    batches(loader, 3)
    state = loader.state_dict()
    first = batches(loader, 20)  # across shards and epochs
    loader.load_state_dict(state)
    assert_same_batches(batches(loader, 20), first)


@pytest.mark.parametrize("align_documents", [False, True])
def test_batches_on_another_device_are_the_cpu_batches_there(doc_shards, align_documents):
    """The "meta" device stands for a GPU here (shapes, dtypes and strides, not values): the batch's
    tokens go over as one tensor, and x and y are the same views of it as on the CPU."""
    data_dir, _ = doc_shards
    on_cpu = batches(aligned(data_dir, align_documents=align_documents), 12)
    for (x, y, offset), (x_cpu, y_cpu, offset_cpu) in zip(batches(aligned(data_dir, align_documents=align_documents,
                                                                          device="meta"), 12), on_cpu):
        assert x.device.type == y.device.type == "meta" and offset == offset_cpu
        for on_device, here in ((x, x_cpu), (y, y_cpu)):
            assert (on_device.shape, on_device.dtype, on_device.stride()) == (here.shape, here.dtype, here.stride())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("align_documents", [False, True])
def test_batches_on_cuda_equal_the_cpu_batches(doc_shards, align_documents):
    """Copied from pinned memory without waiting: many batches in flight, none overwritten."""
    data_dir, _ = doc_shards
    on_cpu = batches(aligned(data_dir, align_documents=align_documents), 200)
    on_cuda = batches(aligned(data_dir, align_documents=align_documents, device="cuda"), 200)
    assert all(x.is_cuda and y.is_cuda for x, y, _ in on_cuda)
    assert_same_batches([(x.cpu(), y.cpu(), offset) for x, y, offset in on_cuda], on_cpu)
