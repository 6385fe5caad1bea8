"""Every bad input is refused before anything is written, with a message that names the input
and the fix: table-driven through train.py's main, on a folder that already holds a good run."""
import json
import re
import shutil
import socket
import sys

import pytest

import train
from configs import TrainConfig
from data.shards import HEADER_BYTES
from helpers import TINY_RUN

RUN = [*TINY_RUN, "--log_interval=1", "--batch_size=2", "--micro_batch_size=2", "--max_steps=2"]

# (extra arguments, a pattern the message must match: the input and what to do). "{good}" is the
# run that exists; "{data}" the prepared data folder (with its manifest).
CASES = {
    "lr zero": (["--lr=0"], r"lr=0.0 must be > 0"),
    "lr negative": (["--lr=-0.001"], r"lr=-0.001 must be > 0"),
    "min_lr above lr": (["--lr=0.001", "--min_lr=0.01"], r"min_lr=0.01 must lie in \[0, lr=0.001\]"),
    "negative warmup": (["--warmup_steps=-1"], r"warmup_steps=-1 is negative: a length in steps or tokens is >= 0"),
    "negative warmup in tokens": (["--warmup_tokens=-64"], r"warmup_tokens=-64 is negative: a length"),
    "negative length": (["--max_steps=-5"], r"max_steps=-5 is negative: a length in steps or tokens is >= 0 \(0 "
                                            r"leaves it unset\)"),
    "negative length in tokens": (["--max_steps=0", "--max_tokens=-5"], r"max_tokens=-5 is negative"),
    "warmup longer than the run": (["--warmup_steps=50"], r"warmup \(50 steps\) is longer than the run \(2 steps\)"
                                                          r": shorten warmup_steps"),
    "no length": (["--max_steps=0"], r"set exactly one of max_steps \(0\) and max_tokens \(0\)"),
    "both lengths": (["--max_tokens=1000"], r"set exactly one of max_steps \(2\) and max_tokens \(1000\)"),
    "batch not divisible": (["--batch_size=3"], r"batch_size=3 is not divisible by micro_batch_size=2.*make "
                                                r"batch_size a multiple of 2"),
    "probe batch zero": (["--probe_batch_size=0"], r"probe_batch_size=0 must be >= 1"),
    "val tokens zero": (["--val_tokens=0"], r"val_tokens=0 must be >= 1"),
    "negative grad clip": (["--grad_clip=-1"], r"grad_clip=-1.0 must be >= 0 \(0 turns it off\)"),
    "cuda without cuda": (["--device=cuda"], r"device='cuda', but this torch sees no CUDA device: use "
                                             r"device='auto' or 'cpu'"),
    "unknown device": (["--device=tpu"], r"device='tpu': use 'auto', 'cpu' or 'cuda'"),
    "optimizer typo": (["--optimizer=merti"], r"unknown optimizer 'merti' \(did you mean 'merit'\?\)"),
    "option that is a top-level key": (["--optimizer_options={'lr': 0.1}"],
                                       r"option 'lr' .* not in optimizer_options: use its top-level key"),
    "unknown option": (["--optimizer_options={'clip': False}"], r"unknown option 'clip' for optimizer 'merit'.*"
                                                                r"accepted options: maxlamb"),
    "zero-shot task typo": (["--zero_shot_tasks=hellaswg"], r"zero_shot_tasks='hellaswg'.*did you mean "
                                                            r"'hellaswag'"),
    # (any name may be a Hugging Face tokenizer: the shards' manifest refuses one they were not made with)
    "unknown tokenizer": (["--tokenizer=bpe"], r"prepared with the 'byte' tokenizer .*tokenizer='bpe': set "
                                               r"tokenizer='byte'"),
    "unknown nonfinite policy": (["--nonfinite=ignore"], r"nonfinite='ignore': use 'stop' .* or 'skip'"),
    "resume value": (["--resume=yes"], r"resume='yes': use --resume .*--resume=auto"),
    "run_name with a path": (["--run_name=../escape"], r"run_name='../escape' must be one folder name.*put the path "
                                                       r"in out_dir"),
    "unknown backend": (["--optim_backend=gpu"], r"optim_backend='gpu': use one of 'auto', 'torch', 'cpp'"),
    "wandb mode": (["--wandb_mode=on"], r"wandb_mode='on': use 'online', 'offline' or 'disabled'"),
    "dtype": (["--dtype=fp8"], r"dtype='fp8': use 'auto', 'float32', 'bfloat16' or 'float16'"),
    "schedule": (["--lr_schedule=linear"], r"lr_schedule='linear': use 'cosine', 'wsd' or 'constant'"),
    "unknown key": (["--learning_rate=0.1"], r"unknown config key 'learning_rate' in the command line"),
    "wrong type": (["--batch_size=2.5"], r"config key 'batch_size' in the command line must be int, got float"),
    "resume and overwrite": (["--resume", "--overwrite", "--run_name=good"], r"resume and overwrite exclude each "
                                                                             r"other"),
    "decay fraction": (["--decay_fraction=1.5"], r"decay_fraction=1.5 must lie in \[0, 1\]"),
    "zero stage": (["--zero_stage=2"], r"zero_stage=2: use 0 .* or 1 .*for sharded parameters and gradients too "
                                       r"use fsdp=True"),
    "fsdp and zero-1": (["--fsdp", "--zero_stage=1"], r"fsdp=True already shards the optimizer state .*set "
                                                      r"zero_stage=0 with it"),
    "local steps alone": (["--local_steps=10"], r"local_steps=10 needs replica groups to meet: set replica_groups"),
    "replica id": (["--replica_groups=2", "--replica_id=2"], r"replica_id=2 must lie in \[0, replica_groups=2\)"),
    "local method": (["--replica_groups=2", "--local_steps=5", "--local_method=easgd"],
                     r"local_method='easgd': use 'diloco' or 'localsgd'"),
    "replica groups with zero-1": (["--replica_groups=2", "--zero_stage=1"], r"replica_groups with zero_stage=1: "
                                                                         r".*use DDP \(the default\) or fsdp=True"),
    "schedule-free with local steps": (["--replica_groups=2", "--local_steps=5", "--optimizer=adamw_schedulefree",
                                        "--lr_schedule=constant"], r"local_steps with optimizer='adamw_schedulefree': "
                                                                   r"its evaluated weights x are optimizer state"),
    "replica groups with a batch schedule": (["--replica_groups=2", "--batch_schedule=[(0, 2), (1000, 4)]"],
                                             r"replica_groups with a batch_schedule: .*use one batch_size"),
    "qk-clip across groups": (["--replica_groups=2", "--qk_clip_tau=10"], r"qk_clip_tau with replica groups "
                              r"averaging every step: .*set local_steps, or leave qk_clip_tau unset"),
    "float16 local steps": (["--replica_groups=2", "--local_steps=5", "--dtype=float16"], r"local_steps with "
                            r"dtype='float16': .*use 'bfloat16' or 'float32'"),
    "no lighthouse": (["--replica_groups=2"], r"replica_groups=2 needs the lighthouse's address: pass "
                                              r"--lighthouse=http://HOST:PORT .*or set TORCHFT_LIGHTHOUSE"),
    "lighthouse not an address": (["--replica_groups=2", "--lighthouse=notaurl"], r"lighthouse='notaurl' is not an "
                                  r"address of the form http://HOST:PORT: pass the address torchft_lighthouse listens on"),
    "comm hook": (["--comm_hook=fp8"], r"comm_hook='fp8': use '' \(the exact mean\), 'bf16' or 'powersgd'"),
    "comm hook with fsdp": (["--comm_hook=bf16", "--fsdp"], r"comm_hook='bf16' is DDP's, with fsdp=True or replica "
                                                            r"groups .*use DDP \(or ZeRO-1\), or local_steps"),
    "heldout beyond the val split": (["--heldout_tokens=100000000"], r"heldout_tokens=100,000,000 after "
                                     r"val_tokens=512 needs .* validation tokens, but the 'val' split of .* lower "
                                     r"heldout_tokens or val_tokens"),
    "heldout negative": (["--heldout_tokens=-5"], r"heldout_tokens=-5 must be >= 0"),
    "qk_clip_tau zero": (["--qk_clip_tau=0"], r"qk_clip_tau=0.0 must be > 0 .*Kimi K2 used 100.* or None \(off\)"),
    "qk_clip with qk_norm": (["--qk_clip_tau=100", "--qk_norm=layernorm"], r"qk_clip_tau with qk_norm='layernorm': "
                             r".*no head can be clipped alone.*use one of the two"),
    "muon's lr rule": (["--optimizer=muon", "--optimizer_options={'adjust_lr': 'spectral'}"],
                       r"optimizer='muon' refuses its settings .*Invalid adjust_lr: 'spectral' \(must be one of "
                       r"'original', 'match_rms_adamw'\)"),
    "muon's momentum": (["--optimizer=muon", "--optimizer_options={'momentum': 1.0}"],
                        r"Invalid momentum: 1.0 \(must be in \[0, 1\)\).*the others in optimizer_options"),
    "fsdp in float16": (["--fsdp", "--dtype=float16"], r"fsdp=True with dtype='float16'.*use dtype='bfloat16'"),
    "tokenizer of the data": (["--tokenizer=gpt2"], r"prepared with the 'byte' tokenizer \(manifest.json\), but the "
                                                    r"config says tokenizer='gpt2': set tokenizer='byte'"),
    "missing data": (["--data_dir={data}-missing"], r"data dir .*-missing does not exist; prepare it with "
                                                    r"`python -m data.prepare"),
    "rerun without resume": (["--run_name=good"], r"already holds a run .*continue it with --resume.*start it "
                                                  r"over with --overwrite"),
    "resume without a checkpoint": (["--resume"], r"--resume: no checkpoint at .*ckpt.pt; start without --resume, "
                                                  r"use --resume=auto"),
    "resume another model": (["--resume", "--run_name=good", "--n_embd=64"], r"n_embd: checkpoint 32, now 64.*"
                                                                             r"resume with the checkpoint's settings"),
    "resume another batch": (["--resume", "--run_name=good", "--batch_size=4"], r"batch_size: checkpoint 2, now 4"),
    "resume another optimizer": (["--resume", "--run_name=good", "--optimizer=lion"],
                                 r"optimizer: checkpoint 'merit', now 'lion'"),
    "resume past max_steps": (["--resume", "--run_name=good", "--max_steps=1"], r"at step 2, past this config's 1 "
                                                                                r"steps: raise max_steps"),
    "resume with a change": (["--resume", "--run_name=good", "--grad_clip=0.1"], r"would change what the run trains "
                             r"\(grad_clip: checkpoint 1.0, now 0.1\).*--allow_changes=grad_clip"),
    "val_tokens past the split": (["--val_tokens=2000000"], r"val_tokens=2,000,000 needs [\d,]+ validation tokens, "
                                                            r"but the 'val' split of .* has [\d,]+: lower val_tokens"),
    "probe batch too large": (["--probe_batch_size=100000"], r"probe_batch_size=100000 needs 3,200,001 validation "
                                                                 r"tokens .*: lower probe_batch_size"),
    # Found trying the framework as a new user would (beyond the list):
    "heads do not divide the width": (["--n_embd=30", "--n_head=4"], r"n_embd \(30\) must be divisible by n_head \(4\)"),
    "unknown model preset": (["--model=gpt3"], r"unknown model preset 'gpt3'; valid presets: nano, .*gpt2-xl"),
    "dropout out of range": (["--dropout=1.5"], r"dropout must be in \[0, 1\), got 1.5"),
    "unknown qk_norm": (["--qk_norm=l2"], r"qk_norm must be one of None, 'layernorm', 'rmsnorm', got 'l2'"),
    "vocabulary smaller than the tokenizer's": (["--vocab_size=100"], r"vocab_size=100 is smaller than the "
                                                                      r"tokenizer's 257 tokens"),
    "no layers": (["--n_layer=0"], r"n_layer must be a positive int, got 0"),
    "beta out of range": (["--beta1=1.5"], r"optimizer='merit' refuses its settings \(.*betas \(1.5, 0.95\).*Invalid "
                                           r"beta parameter at index 0: 1.5 \(must be in \[0, 1\)\); betas are set by "
                                           r"beta1 and beta2"),
    "negative eps": (["--eps=-1"], r"Invalid epsilon value: -1.0 \(must be >= 0\)"),
    "Sophia-G's Hessian interval": (["--optimizer=sophiag", "--optimizer_options={'hessian_interval': 0}"],
                                    r"Invalid hessian_interval: 0 \(must be an int >= 1\).*optimizer_options"),
    "negative rho": (["--optimizer=sophiag", "--optimizer_options={'rho': -1}"], r"Invalid rho value: -1"),
    "unknown norm": (["--optimizer_options={'norm': 'l3'}"], r"Invalid norm: 'l3' \(must be 'max' or 'l2'\)"),
    "a flag that is not a bool": (["--optimizer_options={'maxlamb': 'yes'}"], r"option 'maxlamb' of optimizer 'merit' "
                                                                              r"must be True or False, got str 'yes'"),
    "block longer than the data": (["--block_size=100000"], r"the 'train' split of .* has [\d,]+ tokens, fewer than "
                                                             r"one global micro-batch needs.*Use a smaller batch or block"),
    "eval interval zero": (["--eval_interval=0"], r"log_interval and eval_interval must be > 0"),
    "negative weight decay": (["--optimizer=lion", "--weight_decay=-1"], r"weight_decay=-1.0 must be >= 0"),
    "micro-batch larger than the batch": (["--micro_batch_size=4"], r"batch_size=2 is not divisible by "
                                                                    r"micro_batch_size=4"),
    "no zero-shot task in the list": (["--zero_shot_tasks=,"], r"zero_shot_tasks=',': no task given; valid tasks"),
    "data_dir is a file": (["--data_dir={data}/manifest.json"], r"data dir .*manifest.json is a file: data_dir is "
                                                                r"the folder data/prepare.py wrote"),
    "config path is a folder": (["{data}"], r"config file .* is a folder: give a config file, e.g. "
                                            r"configs/default.py"),
    "optimizer options not a dict": (["--optimizer_options=3"], r"'optimizer_options' in the command line must be "
                                                                r"dict, got int 3"),
    "negative batch": (["--batch_size=-4"], r"batch_size and micro_batch_size must be > 0"),
    "out_dir is a file": (["--out_dir={out}/good/config.json"], r"config.json is a file; choose another out_dir"),
    "a config given as JSON": (["{out}/good/config.json", "--run_name=again", "--learning_rate=1"],
                               r"unknown config key 'learning_rate' in the command line; here it is lr"),
    "space form": (["--lr", "1e-3"], r"unexpected argument '1e-3' after --lr: write --lr=1e-3"),
    "nanoGPT's accumulation key": (["--gradient_accumulation_steps=4"], r"here it is batch_size \(the GLOBAL batch: "
                                                                        r"accumulation = batch_size / "),
    "nanoGPT's decay length": (["--lr_decay_iters=10"], r"here it is max_steps \(the schedule decays to min_lr"),
    "nanoGPT's eval budget": (["--eval_iters=10"], r"here it is val_tokens"),
    "HF Trainer's clip": (["--max_grad_norm=1.0"], r"here it is grad_clip"),
    "a helper variable": (["{data}/../helper.py"], r"unknown config key 'base_lr' in .*helper.py.*a helper variable "
                                                   r"in a config file starts with '_', e.g. _base_lr"),
    "a config with a syntax error": (["{data}/../broken.py"], r"broken.py, line 2: invalid syntax"),
    "no config at all": (None, r"no config given: python train.py configs/default.py"),
    "an infinite lr": (["--lr=1e999"], r"lr=inf must be a finite number"),
    "zero-shot data unreachable": (["--zero_shot_tasks=copa"], r"zero_shot_tasks='copa': task copa: Couldn't reach "
                                                               r".* on the Hub.*give local files"),
    "zero-shot data missing": (["--zero_shot_tasks=copa", "--zero_shot_data_dir={data}"],
                               r"zero_shot_data_dir=.*task copa: no local data file; expected .*copa.jsonl"),
    "resume another seed": (["--resume", "--run_name=good", "--seed=9"], r"seed: checkpoint 1337, now 9"),
    "stop_at_step behind the checkpoint": (["--resume", "--run_name=good", "--max_steps=4", "--stop_at_step=1"],
                                           r"stop_at_step=1 is not past the checkpoint's step 2: nothing would "
                                           r"train; raise stop_at_step"),
    "a planted metrics link": (["--resume", "--run_name=linked"], r"linked/metrics.jsonl is a symbolic link \(to "
                                                                  r".*\): a run's files are its own; remove the link"),
    "a Llama's rotary base zero": (["--arch=llama", "--rope_theta=0.0"], r"GPTConfig.rope_theta must be a finite "
                                                                        r"number > 0 \(the rotary base.*\), got 0.0"),
    "norm epsilon zero": (["--norm_eps=0.0"], r"GPTConfig.norm_eps must be a finite number > 0 \(.*\), got 0.0"),
    "negative peak FLOP/s": (["--peak_flops=-1"], r"peak_flops=-1.0 must be > 0 \(.*\) or None"),
    "negative seed": (["--seed=-1"], r"seed=-1 must lie in \[0, 2\*\*32\)"),
    "negative data seed": (["--data_seed=-1"], r"data_seed=-1 must lie in \[0, 2\*\*32\)"),
    "allow_changes typo": (["--resume", "--run_name=good", "--grad_clip=0.1", "--allow_changes=wieght_decay"],
                           r"allow_changes='wieght_decay': 'wieght_decay' is not a config key; did you mean "
                           r"'weight_decay'\?"),
    "newest checkpoint deleted": (["--resume", "--run_name=pruned"], r"the newest checkpoint .*ckpt_00000002.pt "
                                                                     r"\(ckpt.pt points at it\) is missing: resume the "
                                                                     r"one before it, ckpt_00000001.pt, with "
                                                                     r"--resume=auto"),
}


def offline(monkeypatch):
    """The hub unreachable at once (as on an air-gapped node, without datasets' retries)."""
    import datasets
    import huggingface_hub.constants
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def snapshot(root):
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def workspace(byte_shards, tmp_path_factory):
    """A data folder with a manifest (as data/prepare.py writes it), a finished run "good", and two
    damaged copies of it: "linked" (its metrics.jsonl a planted link) and "pruned" (the newest of
    its two checkpoints deleted)."""
    root = tmp_path_factory.mktemp("bad_inputs")
    data = root / "data"
    shutil.copytree(byte_shards, data)
    splits = {}
    for split in ("train", "val"):
        file = data / f"{split}_000000.bin"
        tokens = (file.stat().st_size - HEADER_BYTES) // 2
        splits[split] = {"tokens": tokens, "shards": [{"file": file.name, "tokens": tokens, "sha256": ""}]}
    (data / "manifest.json").write_text(json.dumps({"tokenizer": "byte", "splits": splits}))
    (root / "helper.py").write_text("base_lr = 6e-4\nlr = base_lr\n")  # a helper variable without its '_'
    (root / "broken.py").write_text("max_steps = 2\nlr = = 1\n")
    out = root / "out"
    train.main([*RUN, f"--data_dir={data}", f"--out_dir={out}", "--run_name=good"])
    shutil.copytree(out / "good", out / "linked", symlinks=True)
    (out / "linked" / "metrics.jsonl").unlink()
    (out / "linked" / "metrics.jsonl").symlink_to(out / "good" / "metrics.jsonl")
    train.main([*RUN, f"--data_dir={data}", f"--out_dir={out}", "--run_name=pruned", "--checkpoint_interval=1"])
    (out / "pruned" / "ckpt_00000002.pt").unlink()
    return data, out


def test_the_table_covers_at_least_30_inputs():
    assert len(CASES) >= 30


@pytest.mark.parametrize("name", CASES)
def test_a_bad_input_is_refused_with_its_fix_and_nothing_written(workspace, name, monkeypatch, tmp_path):
    data, out = workspace
    monkeypatch.chdir(tmp_path)
    offline(monkeypatch)
    monkeypatch.delenv("TORCHFT_LIGHTHOUSE", raising=False)
    extra, pattern = CASES[name]
    argv = []  # (None: no arguments at all)
    if extra is not None:
        extra = [arg.replace("{data}", str(data)).replace("{out}", str(out)) for arg in extra]
        config_file = extra[:1] if extra and not extra[0].startswith("--") else []
        argv = [*config_file, *RUN, f"--data_dir={data}", f"--out_dir={out}", "--run_name=new",
                *extra[len(config_file):]]
    before = snapshot(out.parent)
    with pytest.raises(SystemExit) as exit_info:
        train.main(argv)
    message = str(exit_info.value.code)
    assert message.startswith("train.py: ")
    assert re.search(pattern, message), message
    assert snapshot(out.parent) == before  # the good run, the data and everything else as they were
    assert list(tmp_path.iterdir()) == []


def test_no_config_file_and_no_length_says_how_to_name_a_config(workspace, monkeypatch, tmp_path):
    data, out = workspace
    monkeypatch.chdir(tmp_path)
    before = snapshot(out.parent)
    with pytest.raises(SystemExit) as exit_info:
        train.main([f"--data_dir={data}", f"--out_dir={out}", "--run_name=y"])
    assert str(exit_info.value.code) == (
        f"train.py: no config file given, so nothing sets the run's length (max_steps or max_tokens): name a "
        f"config file first, e.g. python train.py configs/default.py --data_dir={data} --out_dir={out} "
        f"--run_name=y, or set --max_steps (or --max_tokens)")
    assert snapshot(out.parent) == before and list(tmp_path.iterdir()) == []


def test_replica_groups_without_torchft_say_how_to_install_it(workspace, monkeypatch, tmp_path):
    data, out = workspace
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "torchft", None)  # (import torchft raises ImportError, as where it is absent)
    before = snapshot(out.parent)
    with pytest.raises(SystemExit) as exit_info:
        train.main([*RUN, f"--data_dir={data}", f"--out_dir={out}", "--run_name=new", "--replica_groups=2",
                    "--lighthouse=http://localhost:29510"])
    assert re.fullmatch(r"train.py: replica_groups=2 needs torchft \(.*\): pip install -r requirements-ft.txt",
                        str(exit_info.value.code))
    assert snapshot(out.parent) == before and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("address", ["notaurl", "localhost:29510", "http://host:port", "http://[::1", "ftp://h:1"])
def test_a_lighthouse_address_not_of_the_form_http_host_port_is_refused_naming_it(address):
    from training.replicas import lighthouse_address
    config = TrainConfig(replica_groups=2, lighthouse=address, max_steps=1)
    with pytest.raises(ValueError) as error:
        lighthouse_address(config)
    assert str(error.value) == (f"lighthouse={address!r} is not an address of the form http://HOST:PORT: pass the "
                                f"address torchft_lighthouse listens on (its --bind port, 29510 by default)")
    assert lighthouse_address(TrainConfig(replica_groups=2, lighthouse="http://[::1]:29510", max_steps=1))


def test_a_lighthouse_nothing_listens_at_is_one_line_at_start_up(workspace, monkeypatch, tmp_path):
    """Where nothing listens at the lighthouse's address, the run says so in one line once its short
    wait for a lighthouse starting beside it is over (here 0.5 s), not torchft's traceback after the timeout."""
    pytest.importorskip("torchft", reason="torchft is not installed (requirements-ft.txt)")
    from training import replicas
    data, out = workspace
    monkeypatch.setattr(replicas, "LIGHTHOUSE_WAIT_S", 0.5)
    with socket.socket() as s:  # (a port nothing listens on)
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    before = snapshot(out.parent)
    with pytest.raises(SystemExit) as exit_info:
        train.main([*RUN, f"--data_dir={data}", f"--out_dir={out}", "--run_name=new", "--replica_groups=2",
                    f"--lighthouse=http://localhost:{port}"])
    assert str(exit_info.value.code) == (
        f"train.py: lighthouse='http://localhost:{port}': nothing listens there (tried for 0.5 s): start the "
        f"lighthouse first (torchft_lighthouse --min_replicas 1 --bind [::]:{port}) or pass the address it listens on")
    assert snapshot(out.parent) == before


def test_a_corrupt_manifest_shard_is_refused(workspace, tmp_path):
    data, _ = workspace
    broken = tmp_path / "data"
    shutil.copytree(data, broken)
    with open(broken / "val_000000.bin", "ab") as f:
        f.write(b"\0\0")
    with pytest.raises(SystemExit, match=r"val_000000.bin has \d+ bytes, but manifest.json lists it with \d+ tokens.*"
                                         r"prepare the data again with --force"):
        train.main([*RUN, f"--data_dir={broken}", f"--out_dir={tmp_path / 'out'}"])
    assert not (tmp_path / "out").exists()
