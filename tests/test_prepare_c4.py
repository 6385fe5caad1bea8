"""C4 (`python -m data.prepare c4`) from json.gz files in the hub's layout, with a T5-like tokenizer
folder built here (a Unigram model with </s> as EOS, saved through transformers) loaded by name as
transformers loads it: shards against gzip + json + AutoTokenizer, a kill and a resume, the
manifest's record of the tokenizer, and data/tokenizer.py's interface on such a folder. Without
the hub (a local port that refuses connections, as a machine without network meets it): the
command says so at once and writes nothing, and a tokenizer in the hub's cache still loads."""
import gzip
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from huggingface_hub import constants
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from data import prepare as prepare_module
from data.prepare import c4_corpus, main
from data.tokenizer import HuggingFaceTokenizer, get_tokenizer, hub_unreachable
from helpers import PREPARE_KILLER, random_documents, split_streams

REPO_ROOT = Path(__file__).resolve().parent.parent
# Files written per kind (C4 en has 1,024 train and 8 validation files) and documents in each: the
# preparations read the first 2 train files and the first validation file, so the last of each is unread.
TRAIN_DOCS, VAL_DOCS = (450, 450, 30), (500, 40)
C4_ARGS = ["--train-files", "2", "--val-files", "1", "--shard-tokens", "6000", "--workers", "1"]


def build_tokenizer(folder: Path, vocab_size: int, seed: int) -> Path:
    """A SentencePiece-style Unigram tokenizer as t5-base's is built (NFKC, Metaspace, </s> id 1,
    a post-processor that appends </s>), trained on a few KB of text, saved as transformers saves
    one. A model_max_length of 16 makes every document "too long" for it."""
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "</s>", "<unk>"],
                                      unk_token="<unk>")
    tokenizer.train_from_iterator(random_documents(300, seed), trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
                            model_max_length=16).save_pretrained(folder)
    return folder


def write_c4(root: Path) -> Path:
    """C4's hub layout: en/c4-train.0000N-of-01024.json.gz and en/c4-validation.0000N-of-00008.json.gz,
    json lines of {"text", "timestamp", "url"}."""
    (root / "en").mkdir(parents=True)
    for kind, total, counts, seed in (("train", 1024, TRAIN_DOCS, 10), ("validation", 8, VAL_DOCS, 20)):
        for index, count in enumerate(counts):
            lines = [json.dumps({"text": text, "timestamp": "2019-04-25T12:57:54Z", "url": f"https://example.com/{i}"})
                     for i, text in enumerate(random_documents(count, seed + index))]
            with gzip.open(root / "en" / f"c4-{kind}.{index:05d}-of-{total:05d}.json.gz", "wt", encoding="utf-8") as f:
                f.write("\n".join(lines) + "\n")
    return root


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> tuple[Path, Path]:
    """(a C4 folder, a tokenizer folder)."""
    root = tmp_path_factory.mktemp("c4")
    return write_c4(root / "c4"), build_tokenizer(root / "tokenizer", vocab_size=120, seed=0)


def expected_streams(c4: Path, tokenizer: Path) -> dict[str, list[int]]:
    """The documents of the files read, in file order, gzip + json, each [eos] + its ids as
    transformers' own tokenizer gives them."""
    auto = AutoTokenizer.from_pretrained(tokenizer)
    streams = {}
    for split, pattern in (("train", "c4-train.0000[01]-*"), ("val", "c4-validation.00000-*")):
        streams[split] = []
        for path in sorted((c4 / "en").glob(pattern)):
            for line in gzip.open(path, "rt", encoding="utf-8"):
                ids = auto(json.loads(line)["text"], add_special_tokens=False, verbose=False)["input_ids"]
                streams[split] += [auto.eos_token_id, *ids]
    return streams


def test_c4_shards_are_c4s_own_splits_encoded_by_transformers(folders, tmp_path):
    c4, tokenizer = folders
    out_dir = tmp_path / "out"
    main(["c4", "--source", str(c4), "--tokenizer", str(tokenizer), *C4_ARGS, "--out", str(out_dir)])
    expected = expected_streams(c4, tokenizer)
    assert split_streams(out_dir) == expected
    assert len(expected["val"]) > 6000 and len(expected["train"]) > 6000  # several shards each
    manifest = json.loads((out_dir / "manifest.json").read_text())
    auto = AutoTokenizer.from_pretrained(tokenizer)
    assert (manifest["tokenizer"], manifest["n_vocab"], manifest["eot_token"]) == (str(tokenizer), len(auto), 1)
    assert manifest["tokenizer_files"] == {name: hashlib.sha256((tokenizer / name).read_bytes()).hexdigest()
                                           for name in ("tokenizer.json", "tokenizer_config.json")}
    assert (manifest["corpus"], manifest["source"], manifest["train_files"], manifest["val_files"]) == (
        "c4", str(c4), 2, 1)
    assert manifest["data_files"] == {
        "train": [str(c4 / "en" / f"c4-train.0000{i}-of-01024.json.gz") for i in (0, 1)],
        "val": [str(c4 / "en" / "c4-validation.00000-of-00008.json.gz")]}
    assert {split: manifest["splits"][split]["documents"] for split in ("train", "val")} == {"train": 900, "val": 500}
    assert "val_fraction" not in manifest and not (out_dir / ".prepare_progress.json").exists()


def test_another_tokenizer_or_changed_tokenizer_files_are_refused_or_redone(folders, tmp_path, monkeypatch, capsys):
    c4, built = folders
    tokenizer = shutil.copytree(built, tmp_path / "tokenizer")
    args = ["c4", "--source", str(c4), "--tokenizer", str(tokenizer), *C4_ARGS, "--out", str(tmp_path / "out")]
    main(args)
    with pytest.raises(SystemExit, match="prepare: .*other settings.*--force"):
        main([*args, "--tokenizer", "byte"])

    # An unfinished preparation with the folder's first files, interrupted after its third batch ...
    save_progress, saved = prepare_module.save_progress, []

    def interrupted(*progress):
        save_progress(*progress)
        saved.append(1)
        if len(saved) == 3:
            raise KeyboardInterrupt
    monkeypatch.setattr(prepare_module, "DOCUMENTS_PER_BATCH", 300)
    monkeypatch.setattr(prepare_module, "save_progress", interrupted)
    with pytest.raises(KeyboardInterrupt):
        main([*args, "--force"])
    monkeypatch.setattr(prepare_module, "save_progress", save_progress)
    assert json.loads((tmp_path / "out" / ".prepare_progress.json").read_text())["documents_done"] == 800
    # ... is started again, not resumed, once the folder holds another tokenizer (a new process would
    # load it afresh; this one forgets the first).
    shutil.rmtree(tokenizer)
    build_tokenizer(tokenizer, vocab_size=90, seed=1)
    get_tokenizer.cache_clear()
    capsys.readouterr()
    main(args)
    assert "resuming" not in capsys.readouterr().out
    assert split_streams(tmp_path / "out") == expected_streams(c4, tokenizer)
    # A finished preparation is not reused once the folder holds the first files again.
    shutil.rmtree(tokenizer)
    shutil.copytree(built, tokenizer)
    get_tokenizer.cache_clear()
    with pytest.raises(SystemExit, match="other settings"):
        main(args)


@pytest.mark.slow  # real processes, killed mid-preparation
def test_killed_c4_preparation_resumes_byte_identical(folders, tmp_path):
    """Killed (SIGKILL) in the first train batch, before its checkpoint (so the resume starts at the
    end of the val files), then again as a train shard is finished; resumed by two tokenizer processes."""
    c4, tokenizer = folders
    args = ["c4", "--source", str(c4), "--tokenizer", str(tokenizer), *C4_ARGS]
    reference = tmp_path / "reference"
    main([*args, "--out", str(reference)])
    out_dir = tmp_path / "killed"
    # Batches of 300 documents: 2 of the val file's 500 (each checkpoints both splits' writers), and
    # 5 train shards of 6,000 tokens finished in each batch of train documents.
    for target, nth, part in (("checkpoint", 5, 0), ("_finish_shard", 7, 1)):
        killed = subprocess.run([sys.executable, "-c", PREPARE_KILLER.format(target=target, nth=nth), *args, "--out",
                                 str(out_dir)], cwd=REPO_ROOT, capture_output=True, text=True)
        assert killed.returncode == -9, killed.stderr[-3000:]
        progress = json.loads((out_dir / ".prepare_progress.json").read_text())
        assert progress["part"] == part  # the val files', or the train files'
    assert "resuming" in killed.stdout
    resumed = subprocess.run([sys.executable, "-m", "data.prepare", *args, "--workers", "2", "--out", str(out_dir)],
                             cwd=REPO_ROOT, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming" in resumed.stdout
    assert sorted(p.name for p in out_dir.iterdir()) == sorted(p.name for p in reference.iterdir())
    for path in reference.glob("*.bin"):
        assert (out_dir / path.name).read_bytes() == path.read_bytes(), path.name
    assert json.loads((out_dir / "manifest.json").read_text()) == json.loads((reference / "manifest.json").read_text())


def test_hf_tokenizer_from_a_folder(folders, caplog):
    _, folder = folders
    tok, auto = get_tokenizer(str(folder)), AutoTokenizer.from_pretrained(folder)
    assert (tok.name, tok.n_vocab, tok.eot_token) == (str(folder), len(auto), auto.convert_tokens_to_ids("</s>"))
    texts = random_documents(5, seed=3)
    long_text = " ".join(texts)
    encoded = tok.encode(long_text)
    assert "sequence length is longer" not in caplog.text  # (its model_max_length is 16) ...
    assert encoded == auto(long_text, add_special_tokens=False, verbose=False)["input_ids"] and len(encoded) > 16
    assert auto(long_text)["input_ids"] == [*encoded, 1]  # (the folder's own post-processor would add </s>)
    assert "sequence length is longer" in caplog.text  # ... as transformers' own call warns
    assert tok.encode_batch(texts) == [tok.encode(text) for text in texts]
    for text in texts:
        assert tok.decode(tok.encode(text)) == text
    assert tok.decode([tok.eot_token]) == "</s>"


def test_missing_transformers_names_the_requirements(monkeypatch, folders):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers raises ImportError
    with pytest.raises(ModuleNotFoundError, match=r"pip install -r requirements-eval\.txt"):
        HuggingFaceTokenizer(str(folders[1]))


def test_c4_files_and_bad_inputs(folders, tmp_path):
    assert c4_corpus("allenai/c4", 2, 1).data_files() == {
        "train": ["hf://datasets/allenai/c4/en/c4-train.00000-of-01024.json.gz",
                  "hf://datasets/allenai/c4/en/c4-train.00001-of-01024.json.gz"],
        "val": ["hf://datasets/allenai/c4/en/c4-validation.00000-of-00008.json.gz"]}
    c4, _ = folders
    common = ["c4", "--source", str(c4), "--tokenizer", "byte", "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit, match="--train-files 0: C4 en has 1024 train files; give 1 to 1024"):
        main([*common, "--train-files", "0"])
    with pytest.raises(SystemExit, match="--val-files 9: C4 en has 8 validation files"):
        main([*common, "--val-files", "9"])
    with pytest.raises(SystemExit, match=r"c4-train\.00003-of-01024\.json\.gz is missing \(2 of"):
        main([*common, "--train-files", "5"])
    with pytest.raises(SystemExit, match="no such folder"):
        main([*common[:2], str(tmp_path / "nothing"), *common[3:]])
    with pytest.raises(SystemExit):  # (argparse's error: a held-out fraction makes no sense for C4)
        main([*common, "--val-fraction", "0.1"])


@pytest.fixture
def refusing_port():
    """A local port that refuses connections (bound, not listening), for as long as the test runs."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield bound.getsockname()[1]


@pytest.fixture
def no_hub(refusing_port, monkeypatch, tmp_path):
    """The Hugging Face hub at the refusing port, offline mode off and an empty cache (huggingface_hub's
    settings, read when used); the hub check and the tokenizers are forgotten before and after."""
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{refusing_port}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub_cache"))
    hub_unreachable.cache_clear()
    get_tokenizer.cache_clear()
    yield constants.ENDPOINT
    hub_unreachable.cache_clear()
    get_tokenizer.cache_clear()


# What the hub cannot give, and what to give instead, as the refusal says them.
C4_FROM_HUB = "allenai/c4"
LOCAL_C4 = "--source DIR (a local copy of its files in the hub's layout)"
LOCAL_TOKENIZER = "--tokenizer gpt2, byte or a local tokenizer folder"


def test_without_the_hub_c4_is_refused_at_once_naming_the_local_alternatives_and_nothing_is_written(
        no_hub, folders, tmp_path):
    c4, _ = folders
    out = tmp_path / "out"
    cannot = rf"prepare: the Hugging Face hub cannot be reached \({no_hub}: .*Connection refused\), and this " \
             "preparation"
    cases = [  # (the arguments, what the message says)
        (["c4"], rf"{cannot} reads {C4_FROM_HUB} and the tokenizer 't5-base' from it: without network, give "
                 rf"{re.escape(LOCAL_C4)} and {re.escape(LOCAL_TOKENIZER)} \(docs/data\.md, \"Without network\"\)$"),
        (["c4", "--tokenizer", "byte"], rf"{cannot} reads {C4_FROM_HUB} from it: without network, give "
                                        rf"{re.escape(LOCAL_C4)} \("),
        (["openwebtext", "--tokenizer", "byte"], rf"{cannot} reads Skylion007/openwebtext from it: without network, "
                                                 rf"give --source DIR \("),
        (["c4", "--source", str(c4), "--train-files", "2"],
         rf"prepare: tokenizer 't5-base' comes from the Hugging Face hub, which cannot be reached \({no_hub}: .*\), "
         "and is not in its cache: give a local folder"),
    ]
    for args, message in cases:
        start = time.perf_counter()
        with pytest.raises(SystemExit, match=message):
            main([*args, "--out", str(out)])
        assert time.perf_counter() - start < 10, args  # (was: a minute of retries, then "unknown tokenizer")
        assert not out.exists(), args


def test_a_tokenizer_in_the_hubs_cache_loads_without_the_hub(no_hub, folders, monkeypatch):
    """As huggingface_hub caches a hub tokenizer (models--OWNER--NAME/snapshots/COMMIT/, refs/main naming
    the commit, .no_exist/COMMIT/ marking the files asked for that the repository lacks: this folder has
    no config.json), here the folder's files: loaded from there, with the hub refused or offline mode on."""
    _, folder = folders
    cached = Path(constants.HF_HUB_CACHE) / "models--nanomerit-tests--t5-like"
    commit = "0" * 40
    shutil.copytree(folder, cached / "snapshots" / commit)
    (cached / "refs").mkdir()
    (cached / "refs" / "main").write_text(commit)
    (cached / ".no_exist" / commit).mkdir(parents=True)
    (cached / ".no_exist" / commit / "config.json").touch()
    text = " ".join(random_documents(3, seed=5))
    expected = AutoTokenizer.from_pretrained(folder)(text, add_special_tokens=False)["input_ids"]
    assert get_tokenizer("nanomerit-tests/t5-like").encode(text) == expected
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    hub_unreachable.cache_clear()
    get_tokenizer.cache_clear()
    assert get_tokenizer("nanomerit-tests/t5-like").encode(text) == expected
    with pytest.raises(ConnectionError, match=r"tokenizer 'nanomerit-tests/absent' comes from the Hugging Face hub, "
                                              r"which cannot be reached \(HF_HUB_OFFLINE is set\)"):
        get_tokenizer("nanomerit-tests/absent")


@pytest.mark.slow  # a new process (the imports: some seconds)
def test_the_c4_command_without_network_fails_at_once_and_leaves_no_folder(refusing_port, tmp_path):
    """The issue's command as typed, in a process whose hub is the refusing port (HF_ENDPOINT), with an empty
    cache (HF_HOME) and offline mode not set: no retries, the network named, no output folder."""
    env = {key: value for key, value in os.environ.items() if key not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{refusing_port}", HF_HOME=str(tmp_path / "hf"))
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "data.prepare", "c4", "--out", str(tmp_path / "out")], cwd=REPO_ROOT,
                            env=env, capture_output=True, text=True, timeout=120)
    assert time.perf_counter() - start < 30, result.stderr[-2000:]  # (was 51-75 s)
    assert result.returncode == 1
    assert "Retrying" not in result.stderr
    assert result.stderr.strip().endswith(f"reads {C4_FROM_HUB} and the tokenizer 't5-base' from it: without network, "
                                          f"give {LOCAL_C4} and {LOCAL_TOKENIZER} (docs/data.md, \"Without network\")")
    assert "cannot be reached" in result.stderr and not (tmp_path / "out").exists()
