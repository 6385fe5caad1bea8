"""data/prepare.py: hub-layout parquet, local files, nanoGPT's val split, workers, resume after a
kill, reuse; shards checked with an llm.c reader written here from the format description."""
import hashlib
import json
import os
import struct
import subprocess
import sys
import urllib.request
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data import assets
from data.loader import TokenLoader
from data.prepare import files_corpus, main, prepare, prepare_shakespeare
from data.tokenizer import get_tokenizer
from helpers import PREPARE_KILLER, random_documents, split_streams

REPO_ROOT = Path(__file__).resolve().parent.parent


def write_hub_parquet(root: Path, docs: list[str], files: int = 2) -> Path:
    """The layout of the hub's parquet export of OpenWebText: <config>/<split>/<NNNN>.parquet, with
    the dataset's columns (text) in several row groups."""
    folder = root / "plain_text" / "train"
    folder.mkdir(parents=True)
    per_file = -(-len(docs) // files)
    for index in range(files):
        table = pa.table({"text": docs[index * per_file:(index + 1) * per_file]})
        pq.write_table(table, folder / f"{index:04d}.parquet", row_group_size=400)
    return root


def expected_streams(docs: list[str], val_ids: set[int], encode, eot: int) -> dict[str, list[int]]:
    streams = {"train": [], "val": []}
    for i, doc in enumerate(docs):
        streams["val" if i in val_ids else "train"] += [eot, *encode(doc)]
    return streams


def nanogpt_val_ids(n: int, val_fraction: float, seed: int) -> set[int]:
    """The documents nanoGPT's prepare.py holds out, by the call it makes."""
    dataset = datasets.Dataset.from_dict({"i": list(range(n))})
    return set(dataset.train_test_split(test_size=val_fraction, seed=seed, shuffle=True)["test"]["i"])


@pytest.fixture(scope="module")
def owt(tmp_path_factory) -> tuple[Path, list[str]]:
    docs = random_documents(4100, seed=0)  # 0.05% of 4,100: three val documents
    return write_hub_parquet(tmp_path_factory.mktemp("owt"), docs), docs


def test_openwebtext_from_a_hub_layout_folder_is_nanogpts_split_of_tiktoken_streams(owt, tmp_path):
    source, docs = owt
    out_dir = tmp_path / "out"
    main(["openwebtext", "--source", str(source), "--out", str(out_dir), "--shard-tokens", "5000",
          "--workers", "1"])
    manifest = json.loads((out_dir / "manifest.json").read_text())
    encoding = get_tokenizer("gpt2").encoding  # tiktoken's own Encoding
    val_ids = nanogpt_val_ids(len(docs), 0.0005, 2357)
    assert len(val_ids) == 3
    expected = expected_streams(docs, val_ids, encoding.encode_ordinary, encoding.eot_token)
    assert split_streams(out_dir, manifest) == expected
    for split in ("train", "val"):
        info = manifest["splits"][split]
        assert info["tokens"] == len(expected[split]) == sum(s["tokens"] for s in info["shards"])
        assert all(s["tokens"] == 5000 for s in info["shards"][:-1]) and 0 < info["shards"][-1]["tokens"] <= 5000
        for shard in info["shards"]:
            assert shard["sha256"] == hashlib.sha256((out_dir / shard["file"]).read_bytes()).hexdigest()
    assert manifest["splits"]["val"]["documents"] == 3 and manifest["splits"]["train"]["documents"] == 4097
    assert (manifest["corpus"], manifest["source"], manifest["tokenizer"], manifest["n_vocab"]) == (
        "openwebtext", str(source), "gpt2", 50257)
    assert (manifest["val_fraction"], manifest["split_seed"]) == (0.0005, 2357)
    assert not (out_dir / ".prepare_progress.json").exists()
    # The loader reads them as the concatenated stream.
    loader = TokenLoader(out_dir, "val", micro_batch_size=1, block_size=len(expected["val"]) - 1)
    assert loader.next_batch()[0][0].tolist() == expected["val"][:-1]


def test_two_workers_write_the_same_bytes_as_one(owt, tmp_path):
    source, _ = owt
    outputs = []
    for workers in (1, 2):
        out_dir = tmp_path / f"w{workers}"
        main(["openwebtext", "--source", str(source), "--out", str(out_dir), "--shard-tokens", "7000",
              "--tokenizer", "byte", "--workers", str(workers)])
        outputs.append({p.name: p.read_bytes() for p in out_dir.glob("*.bin")})
    assert outputs[0] == outputs[1] and len(outputs[0]) > 4




@pytest.mark.slow  # real processes, killed mid-preparation
@pytest.mark.parametrize("target, nth", [("append", 9), ("_finish_shard", 20), ("checkpoint", 11)])
def test_killed_preparation_resumes_byte_identical(owt, tmp_path, target, nth):
    source, _ = owt
    args = ["openwebtext", "--source", str(source), "--shard-tokens", "6000", "--tokenizer", "byte",
            "--workers", "1"]
    reference = tmp_path / "reference"
    main([*args, "--out", str(reference)])
    out_dir = tmp_path / "killed"
    script = PREPARE_KILLER.format(target=target, nth=nth)
    # Run from the repository root: `python -c` puts the working folder first on sys.path.
    killed = subprocess.run([sys.executable, "-c", script, *args, "--out", str(out_dir)], cwd=REPO_ROOT,
                            capture_output=True)
    assert killed.returncode == -9, killed.stderr.decode()
    assert not (out_dir / "manifest.json").exists()
    progress = json.loads((out_dir / ".prepare_progress.json").read_text())
    checkpointed = [s["file"] for writer in progress["writers"].values() for s in writer["shards"]]
    finished = {name: (out_dir / name).stat().st_mtime_ns for name in checkpointed}
    assert finished  # the kill came after some shards were done and checkpointed

    resumed = subprocess.run([sys.executable, "-m", "data.prepare", *args, "--out", str(out_dir)],
                             cwd=REPO_ROOT, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stdout
    assert {p.name: p.stat().st_mtime_ns for p in out_dir.glob("*.bin") if p.name in finished} == finished
    assert sorted(p.name for p in out_dir.iterdir()) == sorted(p.name for p in reference.iterdir())
    for path in reference.glob("*.bin"):
        assert (out_dir / path.name).read_bytes() == path.read_bytes(), path.name
    assert json.loads((out_dir / "manifest.json").read_text()) == json.loads((reference / "manifest.json").read_text())


def test_local_files_of_each_kind(tmp_path):
    docs = random_documents(60, seed=1)
    for kind in ("txt", "jsonl", "parquet"):
        folder = tmp_path / kind
        folder.mkdir()
    for i, doc in enumerate(docs[:6]):  # .txt: one document per file, taken in sorted order
        (tmp_path / "txt" / f"{i:02d}.txt").write_text(doc, encoding="utf-8")
    (tmp_path / "jsonl" / "a.jsonl").write_text(
        "".join(json.dumps({"body": d, "id": i}) + "\n" for i, d in enumerate(docs)), encoding="utf-8")
    pq.write_table(pa.table({"body": docs, "id": list(range(60))}), tmp_path / "parquet" / "a.parquet")
    tok = get_tokenizer("gpt2")
    for kind, text_column, expected_docs in (("txt", "text", docs[:6]), ("jsonl", "body", docs),
                                             ("parquet", "body", docs)):
        corpus = files_corpus(str(tmp_path / kind / f"*.{kind}"), text_column)
        manifest = prepare(corpus, out_dir=tmp_path / f"out-{kind}", val_fraction=0.1, split_seed=7,
                           shard_tokens=150)
        val_ids = nanogpt_val_ids(len(expected_docs), 0.1, 7)
        assert split_streams(tmp_path / f"out-{kind}", manifest) == expected_streams(
            expected_docs, val_ids, tok.encode, tok.eot_token), kind


def test_file_and_column_errors(tmp_path):
    (tmp_path / "a.txt").write_text("x")
    (tmp_path / "b.jsonl").write_text(json.dumps({"body": "y"}) + "\n")
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        files_corpus(str(tmp_path / "nothing-here*"))
    with pytest.raises(ValueError, match=r"\.jsonl.*\.txt.*one kind"):
        files_corpus(str(tmp_path / "*"))
    with pytest.raises(ValueError, match="no column 'text'.*body.*--text-column"):
        prepare(files_corpus(str(tmp_path / "*.jsonl")), out_dir=tmp_path / "out")


def test_complete_output_is_reused_and_force_redoes(owt, tmp_path, monkeypatch):
    source, _ = owt
    args = ["openwebtext", "--source", str(source), "--tokenizer", "byte", "--workers", "1",
            "--out", str(tmp_path / "out")]
    main([*args, "--shard-tokens", "20000"])
    first = json.loads((tmp_path / "out" / "manifest.json").read_text())
    monkeypatch.setattr("data.prepare.encode_documents", lambda *a: pytest.fail("redone"))
    main([*args, "--shard-tokens", "20000"])
    with pytest.raises(SystemExit, match="prepare: .*other settings.*--force"):  # one line, no traceback
        main([*args, "--shard-tokens", "30000"])
    monkeypatch.undo()
    main([*args, "--shard-tokens", "30000", "--force"])
    redone = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert redone["splits"]["train"]["tokens"] == first["splits"]["train"]["tokens"]
    assert sorted(p.name for p in (tmp_path / "out").glob("*.bin")) == [
        s["file"] for split in ("train", "val") for s in redone["splits"][split]["shards"]]  # none stale


def test_llmc_shards_made_here_load_in_the_loader(tmp_path):
    rng = np.random.default_rng(0)
    streams = [rng.integers(0, 50257, size=n) for n in (300, 250)]
    for index, tokens in enumerate(streams):  # llm.c's names and bytes, packed by hand
        header = struct.pack("<256i", 20240520, 1, len(tokens), *[0] * 253)
        (tmp_path / f"fineweb_val_{index:06d}.bin").write_bytes(header + struct.pack(f"<{len(tokens)}H", *tokens))
    loader = TokenLoader(tmp_path, "val", micro_batch_size=1, block_size=549)
    assert loader.next_batch()[0][0].tolist() == np.concatenate(streams)[:549].tolist()


def test_shakespeare_falls_back_to_registry_texts(tmp_path, monkeypatch):
    def no_network(*args, **kwargs):
        raise OSError("offline")
    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    manifest = prepare_shakespeare(tokenizer="byte", out_dir=tmp_path / "shakespeare")
    texts = [path.read_bytes() for path in assets.shakespeare_text_paths()]
    assert manifest["documents"] == len(texts) == 42
    expected = [t for text in texts for t in (256, *text)]
    streams = split_streams(tmp_path / "shakespeare", manifest)
    assert streams["train"] + streams["val"] == expected
    assert len(streams["val"]) == round(0.1 * len(expected))


@pytest.mark.slow  # `python -m data.prepare`, a process of its own
def test_cli_runs_as_a_script(tmp_path):
    (tmp_path / "a.txt").write_text("one document", encoding="utf-8")
    out_dir = tmp_path / "cli"
    result = subprocess.run([sys.executable, "-m", "data.prepare", "--files", str(tmp_path / "*.txt"), "--tokenizer",
                             "byte", "--out", str(out_dir), "--val-fraction", "0"],
                            cwd=REPO_ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out_dir / "manifest.json").read_text())
    assert manifest["splits"]["train"]["tokens"] == 1 + len("one document")


@pytest.mark.slow  # `python -m data.prepare`: the process's stderr
def test_a_malformed_jsonl_line_is_a_message_not_a_traceback(tmp_path):
    (tmp_path / "corpus.jsonl").write_text('{"text": "a first document"}\n{"text": "cut off\n')
    result = subprocess.run([sys.executable, "-m", "data.prepare", "--files", str(tmp_path / "*.jsonl"), "--tokenizer",
                             "byte", "--out", str(tmp_path / "out"), "--workers", "1"], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert f"prepare: {tmp_path / '*.jsonl'} cannot be read (ArrowInvalid" in result.stderr
    assert "Fix or remove that record (a .jsonl line must be one JSON object)" in result.stderr
