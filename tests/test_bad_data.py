"""Data that would train on garbage or on nothing is refused with one line naming it and the fix:
an empty corpus, a glob that matches nothing, nanoGPT's character-level bins, a shard the
manifest does not list (for train.py and for `data.prepare --verify`)."""
import json
import os
import shutil

import numpy as np
import pytest

import train
from data.prepare import main as prepare
from data.shards import write_shard
from helpers import TINY_RUN

RUN = [*TINY_RUN, "--batch_size=2", "--micro_batch_size=2", "--max_steps=1"]


def test_a_corpus_that_is_empty_or_absent_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.jsonl").write_text("")
    with pytest.raises(SystemExit, match=r"prepare: --files '.*a.jsonl' matches only empty files \(1\)"):
        prepare(["--files", str(tmp_path / "empty" / "a.jsonl"), "--tokenizer", "byte", "--out", str(tmp_path / "o")])
    (tmp_path / "empty" / "b.jsonl").write_text('{"text": ""}\n' * 20)
    with pytest.raises(SystemExit, match=r"prepare: the corpus .* gave no text \(every document is empty\) "
                                         r"\(20 documents\): check the source, its text column"):
        prepare(["--files", str(tmp_path / "empty" / "b.jsonl"), "--tokenizer", "byte", "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o" / "manifest.json").exists()
    with pytest.raises(SystemExit, match=r"prepare: --files '.*nonexistent/\*.jsonl' matches no files"):
        prepare(["--files", str(tmp_path / "nonexistent" / "*.jsonl"), "--tokenizer", "byte", "--out",
                 str(tmp_path / "o")])


@pytest.fixture
def prepared(tmp_path):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.jsonl").write_text("".join(json.dumps({"text": f"line {i} " * 40}) + "\n"
                                                         for i in range(200)))
    prepare(["--files", str(tmp_path / "corpus" / "*.jsonl"), "--tokenizer", "byte", "--out", str(tmp_path / "data"),
             "--val-fraction", "0.1"])
    return tmp_path / "data"


def test_a_shard_the_manifest_does_not_list_is_refused(prepared, tmp_path):
    write_shard(prepared / "train_000007.bin", np.arange(100, dtype=np.uint16))  # copied in by hand
    with pytest.raises(SystemExit, match=r"holds train shards that manifest.json does not list \(train_000007.bin\)"):
        train.main([*RUN, f"--data_dir={prepared}", f"--out_dir={tmp_path / 'runs'}"])
    with pytest.raises(SystemExit, match=r"does not list \(train_000007.bin\): remove them"):
        prepare(["--verify", str(prepared)])
    assert not (tmp_path / "runs").exists()


def test_nanogpts_character_level_bins_are_refused(prepared, tmp_path):
    char_level = tmp_path / "shakespeare_char"
    shutil.copytree(prepared, char_level)
    (char_level / "manifest.json").unlink()
    (char_level / "meta.pkl").write_bytes(b"\x80\x04}\x94.")  # nanoGPT's vocabulary of 65 characters
    with pytest.raises(SystemExit, match=r"holds nanoGPT's meta.pkl: .*prepare the text itself into a new folder "
                                         r"instead: prepare it with `python -m data.prepare shakespeare --tokenizer byte"):
        train.main([*RUN, f"--data_dir={char_level}", f"--out_dir={tmp_path / 'runs'}"])


def test_a_shard_corrupted_in_place_is_called_corrupt_and_the_refused_start_writes_nothing(prepared, tmp_path):
    shard = prepared / "train_000000.bin"
    with open(shard, "r+b") as f:  # one token overwritten: the size (all the manifest checks at start) unchanged
        f.seek(-2, os.SEEK_END)
        f.write(np.array([0xFFFF], dtype=np.uint16).tobytes())
    with pytest.raises(SystemExit, match=rf"shard {shard} holds token id 65535, but the tokenizer has only 257 tokens "
                                         rf"\(ids 0..256\): the shard is corrupt, since manifest.json says the data "
                                         rf"was prepared with this tokenizer. `python -m data.prepare --verify "
                                         rf"{prepared}` checks every shard"):
        train.main([*RUN, f"--data_dir={prepared}", f"--out_dir={tmp_path / 'runs'}"])
    assert not (tmp_path / "runs").exists()  # refused before anything is written


def test_a_bad_token_id_in_a_later_shard_is_one_line_naming_it_and_the_checkpoint_stays(tmp_path):
    data = tmp_path / "data"
    rng = np.random.default_rng(0)
    write_shard(data / "train_000000.bin", rng.integers(0, 256, 700, dtype=np.uint16))
    write_shard(data / "train_000001.bin", np.full(700, 300, dtype=np.uint16))  # not a byte: another tokenizer's
    write_shard(data / "val_000000.bin", rng.integers(0, 256, 700, dtype=np.uint16))
    with pytest.raises(SystemExit, match=r"train.py: shard .*train_000001.bin holds token id 300, but the tokenizer "
                                         r"has only 257 tokens"):
        train.main([*RUN, f"--data_dir={data}", f"--out_dir={tmp_path / 'runs'}", "--max_steps=40",
                    "--checkpoint_interval=2", "--log_interval=2"])
    from training.checkpoint import Checkpoint
    assert Checkpoint.load(tmp_path / "runs" / "default" / "ckpt.pt").step >= 2  # what was trained is kept
