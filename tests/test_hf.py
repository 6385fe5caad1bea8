"""Hugging Face interop: hf.py (to_hf, from_hf, export), scripts/export_hf.py and training/parallel.py's
load_model, checked against transformers' own GPT2LMHeadModel and tokenizer (CPU, offline, tiny models)."""

import hashlib
import json
import random
import re
import subprocess
import sys

import pytest
import torch

import hf as interop
from data.tokenizer import get_tokenizer
from helpers import ROOT, TINY_RUN, train_here
from model import GPT, GPTConfig
from training.checkpoint import Checkpoint, load_model
from training.checkpoint.format import FORMAT_VERSION

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=64)
TEXTS = ["Hello world", "  two leading spaces", " one", "héllo wörld, 日本語 and 🤖 emoji", "tabs\tand\nnew\n\nlines  ",
         "It's 12345 don't we'll THEY'RE", "a<|endoftext|>b", "<|endoftext|>", "trailing space ", "", "\u00a0nbsp\r\n",
         "x" * 300, "<|endoftext|> then <|endoftext|><|endoftext|>"]


def random_model(seed=0, **overrides) -> GPT:
    """A tiny GPT whose every parameter (LayerNorms and biases too) is random, in eval mode."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**{**TINY, **overrides}))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def save_checkpoint(model, path, tokenizer="gpt2"):
    Checkpoint.of_model(model, tokenizer, step=7, tokens=7 * 64).save(path)
    return path


def tokens(model, B=2, T=None, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 50257 if model.config.vocab_size > 50257 else model.config.vocab_size,
                         (B, T or model.config.block_size), generator=g)


def hf_from_pretrained(folder, **kwargs):
    model, info = transformers.GPT2LMHeadModel.from_pretrained(folder, output_loading_info=True, **kwargs)
    assert not any(info.get(key) for key in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    return model.eval()


@pytest.fixture(scope="module")
def gpt2_export(tmp_path_factory):
    """One exported gpt2-tokenizer folder, for the tokenizer tests."""
    root = tmp_path_factory.mktemp("gpt2_export")
    model = random_model()
    return interop.export(save_checkpoint(model, root / "ckpt.pt"), root / "hf")


# ---- export -> transformers ----

@pytest.mark.parametrize("vocab_size", [50304, 50257])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("scale", [False, True])
def test_export_gives_hf_the_same_logits(tmp_path, vocab_size, bias, scale):
    model = random_model(vocab_size=vocab_size, bias=bias, scale_attn_by_inverse_layer_idx=scale, dropout=0.1)
    out = interop.export(save_checkpoint(model, tmp_path / "ckpt.pt"), tmp_path / "hf")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "generation_config.json", "model.safetensors",
                                                     "nanomerit.json", "special_tokens_map.json", "tokenizer.json",
                                                     "tokenizer_config.json"]
    assert not list(tmp_path.glob(".hf.*")), "temporary folders left behind"
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "gpt2" and config["architectures"] == ["GPT2LMHeadModel"]
    assert (config["vocab_size"], config["n_positions"], config["attn_pdrop"]) == (vocab_size, 64, 0.1)
    assert config["eos_token_id"] == config["bos_token_id"] == 50256

    hf = hf_from_pretrained(out)
    assert not hf.training and hf.config.scale_attn_by_inverse_layer_idx == scale
    assert hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()  # tied
    x = tokens(model)
    with torch.no_grad():
        ours, theirs = model(x)[0], hf(x).logits
        torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(hf.double()(x).logits, model.double()(x)[0], atol=1e-12, rtol=1e-12)
    # the same in training mode's terms: HF's loss over shifted labels is ours over next tokens
    with torch.no_grad():
        ours_loss = model.float()(x[:, :-1], x[:, 1:])[1]
        torch.testing.assert_close(hf.float()(x, labels=x).loss, ours_loss, atol=1e-5, rtol=1e-5)


def test_export_in_bfloat16(tmp_path):
    model = random_model()
    out = interop.export(save_checkpoint(model, tmp_path / "ckpt.pt"), tmp_path / "hf", dtype="bfloat16")
    weights = safetensors_torch.load_file(out / "model.safetensors")
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    hf = hf_from_pretrained(out).float()
    torch.testing.assert_close(hf.transformer.wte.weight, model.transformer.wte.weight.bfloat16().float(),
                               atol=0, rtol=0)


# ---- round trips in model.py ----

@pytest.mark.parametrize("bias", [False, True])
def test_export_then_from_hf_is_exact(tmp_path, bias):
    model = random_model(bias=bias, scale_attn_by_inverse_layer_idx=True, dropout=0.1)
    out = interop.export(save_checkpoint(model, tmp_path / "ckpt.pt"), tmp_path / "hf")
    for back in (interop.from_hf(out), interop.from_hf(str(out)), interop.from_hf(interop.to_hf(model))):
        assert back.config == model.config and not back.training
        assert back.state_dict().keys() == model.state_dict().keys()
        for key, tensor in model.state_dict().items():
            assert torch.equal(back.state_dict()[key], tensor), key
        assert back.lm_head.weight is back.transformer.wte.weight
        x = tokens(model)
        assert torch.equal(back(x)[0], model(x)[0])


def test_an_export_records_the_model_it_came_from(tmp_path):
    """nanomerit.json names the checkpoint, its step and model_sha256: the sha256 of the weights'
    names, dtypes, shapes and bytes, in name order (computed here from that description)."""
    model = random_model(n_layer=1)
    out = interop.export(save_checkpoint(model, tmp_path / "ckpt.pt"), tmp_path / "hf")
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(f"{name} {tensor.dtype} {tuple(tensor.shape)}\n".encode() + tensor.contiguous().numpy().tobytes())
    provenance = json.loads((out / "nanomerit.json").read_text())
    assert (provenance["checkpoint"], provenance["step"]) == (str(tmp_path / "ckpt.pt"), 7)
    assert provenance["model_sha256"] == digest.hexdigest()


def test_to_hf_names_shapes_and_zero_biases():
    model = random_model(bias=False)
    config, state = interop.to_hf(model, eos_token_id=256)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**config))
    expected = {k: v.shape for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    assert {k: v.shape for k, v in state.items()} == expected
    assert (config["bos_token_id"], config["eos_token_id"]) == (256, 256)
    assert not state["transformer.h.0.ln_1.bias"].any() and not state["transformer.h.1.mlp.c_fc.bias"].any()
    assert torch.equal(state["transformer.h.0.attn.c_attn.weight"], model.transformer.h[0].attn.c_attn.weight.t())
    assert config["activation_function"] == "gelu_pytorch_tanh" and config["layer_norm_epsilon"] == 1e-5


# ---- a model made by transformers (the path OpenAI's GPT-2 weights take) ----

def random_hf_model(seed=0, **overrides):
    """A random GPT2LMHeadModel with GPT-2's defaults (biases, gelu_new, p_drop 0.1) and nonzero biases."""
    torch.manual_seed(seed)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64, **overrides)
    hf = transformers.GPT2LMHeadModel(config)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return hf.eval()


@pytest.mark.parametrize("scale", [False, True])
def test_from_hf_of_a_transformers_model(tmp_path, scale):
    hf = random_hf_model(scale_attn_by_inverse_layer_idx=scale)
    hf.save_pretrained(tmp_path / "hf")
    model = interop.from_hf(tmp_path / "hf")
    assert model.config == GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_size=50257, dropout=0.1,
                                     bias=True, scale_attn_by_inverse_layer_idx=scale)
    x = tokens(model)
    with torch.no_grad():
        torch.testing.assert_close(model(x)[0], hf(x).logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(model.double()(x)[0], hf.double()(x).logits, atol=1e-12, rtol=1e-12)
    assert interop.from_hf(tmp_path / "hf", dropout=0.0).config.dropout == 0.0


def test_from_hf_reads_the_hubs_gpt2_layout(tmp_path):
    """openai-community/gpt2 holds a GPT2Model's tensors (no "transformer." prefix, no lm_head) and,
    in its pytorch_model.bin, the causal-mask buffers h.N.attn.bias of old transformers versions."""
    hf = random_hf_model()
    config = {**hf.config.to_dict(), "n_ctx": 64}
    state = {k.removeprefix("transformer."): v.contiguous() for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    buffers = {f"h.{i}.attn.{name}": value for i in range(2) for name, value in (
        ("bias", torch.tril(torch.ones(64, 64)).view(1, 1, 64, 64)), ("masked_bias", torch.tensor(-1e4)))}
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "config.json").write_text(json.dumps(config))
    torch.save({**state, **buffers}, tmp_path / "bin" / "pytorch_model.bin")
    (tmp_path / "st").mkdir()
    (tmp_path / "st" / "config.json").write_text(json.dumps(config))
    safetensors_torch.save_file(state, tmp_path / "st" / "model.safetensors")
    x = torch.randint(0, 50257, (2, 64), generator=torch.Generator().manual_seed(1))
    expected = hf(x).logits.detach()
    for model in (interop.from_hf(tmp_path / "bin"), interop.from_hf(tmp_path / "st"), interop.from_hf((config, {**state, **buffers}))):
        torch.testing.assert_close(model(x)[0].detach(), expected, atol=1e-5, rtol=1e-5)


def test_from_hf_of_zero_biases_drops_them_unless_asked():
    model = random_model(bias=False)
    assert not interop.from_hf(interop.to_hf(model)).config.bias
    kept = interop.from_hf(interop.to_hf(model), bias=True)
    assert kept.config.bias and not kept.transformer.h[0].attn.c_attn.bias.any()
    x = tokens(model)
    torch.testing.assert_close(kept(x)[0], model(x)[0], atol=1e-6, rtol=1e-6)


def test_lm_eval_hf_backend_scores_an_export_as_we_do(gpt2_export):
    lm_eval_hf = pytest.importorskip("lm_eval.models.huggingface")
    from lm_eval.api.instance import Instance

    lm = lm_eval_hf.HFLM(pretrained=str(gpt2_export), device="cpu", batch_size=2)
    context, continuation = "The king speaks", " softly to the queen"
    request = Instance(request_type="loglikelihood", doc={}, arguments=(context, continuation), idx=0)
    (loglikelihood, _), = lm.loglikelihood([request])
    encoding = get_tokenizer("gpt2").encoding
    c, k = encoding.encode_ordinary(context), encoding.encode_ordinary(continuation)
    model = interop.from_hf(gpt2_export)
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([c + k]))[0][0].double(), dim=-1)
    assert loglikelihood == pytest.approx(sum(logp[len(c) - 1 + i, t].item() for i, t in enumerate(k)), abs=1e-4)


# ---- tokenizers ----

def test_exported_gpt2_tokenizer_encodes_like_tiktoken(gpt2_export):
    tokenizer = transformers.AutoTokenizer.from_pretrained(gpt2_export)
    encoding = get_tokenizer("gpt2").encoding
    rng = random.Random(0)
    pieces = [*"abcXYZ019 \n\t.,'-!", "é", "日本", "🤖", "\u00a0", "\r\n", "'s", "'ll", " 've", "  ", "<|endoftext|>"]
    texts = TEXTS + ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 40))) for _ in range(300)]
    for text in texts:
        ids = tokenizer.encode(text)
        assert ids == encoding.encode(text, allowed_special="all"), text  # "<|endoftext|>" is the special token
        if "<|endoftext|>" not in text:
            assert ids == encoding.encode_ordinary(text), text
        assert tokenizer.decode(ids) == text
    assert tokenizer.encode("Hello world") == [15496, 995]
    assert (tokenizer.eos_token, tokenizer.eos_token_id, tokenizer.bos_token_id) == ("<|endoftext|>", 50256, 50256)
    assert len(tokenizer) == 50257 and tokenizer.model_max_length == 64


def test_exported_byte_tokenizer_encodes_like_ours(tmp_path):
    model = random_model(vocab_size=320)
    out = interop.export(save_checkpoint(model, tmp_path / "ckpt.pt", tokenizer="byte"), tmp_path / "hf")
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    ours = get_tokenizer("byte")
    for text in TEXTS:
        ids = tokenizer.encode(text)
        assert ids == ours.encode(text) or "<|endoftext|>" in text, text
        assert ours.decode(ids) == text and tokenizer.decode(ids) == text
    assert tokenizer.encode("a<|endoftext|>b") == [97, 256, 98]
    assert tokenizer.eos_token_id == 256 and len(tokenizer) == 257
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == 256
    hf = hf_from_pretrained(out)
    x = tokens(model)
    torch.testing.assert_close(hf(x).logits.detach(), model(x)[0].detach(), atol=1e-5, rtol=1e-5)


# ---- the command line, on checkpoints of train.py ----

def run_export(*args, check=True):
    result = subprocess.run([sys.executable, "-m", "scripts.export_hf", *map(str, args)],
                            capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0 or not check, result.stderr
    return result


def test_cli_exports_a_checkpoint_of_train_py(byte_shards, tmp_path):
    train_here(*TINY_RUN, "--bias=True", "--scale_attn_by_inverse_layer_idx=True", "--max_steps=2", "--batch_size=2",
               "--micro_batch_size=2", f"--data_dir={byte_shards}", f"--out_dir={tmp_path}", "--run_name=run")
    result = run_export(tmp_path / "run" / "ckpt.pt", tmp_path / "hf")
    assert "wrote" in result.stdout and "step 2" in result.stdout
    model, state = load_model(tmp_path / "run" / "ckpt.pt")
    assert state.step == 2 and not model.training and model.config.bias
    hf = hf_from_pretrained(tmp_path / "hf")
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    x = torch.tensor([tokenizer.encode("The king speaks softly.")])
    assert x.tolist() == [get_tokenizer("byte").encode("The king speaks softly.")]
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, model(x)[0], atol=1e-5, rtol=1e-5)
    provenance = json.loads((tmp_path / "hf" / "nanomerit.json").read_text())
    assert provenance["step"] == 2 and provenance["tokenizer"] == "byte"


@pytest.mark.slow  # scripts/export_hf.py in processes of their own (transformers imported each time)
def test_cli_gpt2_checkpoint_and_force(tmp_path):
    model = random_model(scale_attn_by_inverse_layer_idx=True)
    ckpt = save_checkpoint(model, tmp_path / "ckpt.pt")
    loaded, _ = load_model(ckpt)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in model.state_dict().items())
    run_export(ckpt, tmp_path / "hf", "--dtype", "float32")
    refused = run_export(ckpt, tmp_path / "hf", check=False)
    assert refused.returncode != 0 and "exists" in refused.stderr and "--force" in refused.stderr
    (tmp_path / "hf" / "stale.txt").write_text("from an older export")
    run_export(ckpt, tmp_path / "hf", "--force")
    assert not (tmp_path / "hf" / "stale.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt", "hf"]
    x = tokens(model)
    torch.testing.assert_close(hf_from_pretrained(tmp_path / "hf")(x).logits.detach(), model(x)[0].detach(),
                               atol=1e-5, rtol=1e-5)


# ---- errors ----

@pytest.mark.slow  # scripts/export_hf.py in processes of their own (transformers imported each time)
def test_cli_errors(tmp_path):
    missing = run_export(tmp_path / "nope.pt", tmp_path / "hf", check=False)
    assert missing.returncode != 0 and "no checkpoint at" in missing.stderr
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    junk = run_export(tmp_path / "junk.pt", tmp_path / "hf", check=False)
    assert junk.returncode != 0 and "not a nanoMERIT checkpoint" in junk.stderr
    assert not (tmp_path / "hf").exists()


def test_load_model_errors(tmp_path):
    torch.save({"format_version": FORMAT_VERSION, "step": 3}, tmp_path / "no_model.pt")
    with pytest.raises(ValueError, match=r"does not have the fields.*missing \['batch_phases', 'changes', 'code_version', 'config'"):
        load_model(tmp_path / "no_model.pt")
    future = Checkpoint.of_model(random_model(), "gpt2")
    future.model_args["n_kv_head"] = 1
    future.save(tmp_path / "future.pt")
    with pytest.raises(ValueError, match="model_args"):
        load_model(tmp_path / "future.pt")


def test_failed_export_leaves_no_folder(tmp_path, monkeypatch):
    ckpt = save_checkpoint(random_model(), tmp_path / "ckpt.pt")

    def fail(*args):
        raise RuntimeError("disk full")
    monkeypatch.setattr(interop, "check_folder", fail)
    with pytest.raises(RuntimeError, match="disk full"):
        interop.export(ckpt, tmp_path / "hf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]


def test_export_refuses_a_vocabulary_smaller_than_the_tokenizers(tmp_path):
    ckpt = save_checkpoint(random_model(vocab_size=1000), tmp_path / "ckpt.pt")
    with pytest.raises(ValueError, match="vocab_size 1000 is smaller than the gpt2 tokenizer's 50257"):
        interop.export(ckpt, tmp_path / "hf")


def edited(model, config_changes=(), state_changes=()):
    config, state = interop.to_hf(model)
    return {**config, **dict(config_changes)}, {**state, **dict(state_changes)}


@pytest.mark.parametrize("changes, message", [
    ({"activation_function": "gelu"}, "activation_function 'gelu'"),
    ({"activation_function": "relu"}, "activation_function 'relu'"),
    ({"n_inner": 96}, "n_inner 96"),
    ({"layer_norm_epsilon": 1e-6}, "layer_norm_epsilon"),
    ({"model_type": "gpt_neo"}, "model_type 'gpt_neo'"),
    ({"add_cross_attention": True}, "add_cross_attention"),
    ({"scale_attn_weights": False}, "scale_attn_weights"),
    ({"attn_pdrop": 0.2}, "pdrop differ"),
    ({"tie_word_embeddings": False}, "lm_head.weight missing"),
    ({"n_layer": 3}, "missing .*transformer.h.2"),
])
def test_from_hf_refuses_unsupported_configs(changes, message):
    with pytest.raises(ValueError, match=message):
        interop.from_hf(edited(random_model(), changes))


def test_from_hf_refuses_untied_heads_and_stray_weights():
    model = random_model()
    wte = model.transformer.wte.weight.detach()
    with pytest.raises(ValueError, match="lm_head.weight different from wte"):
        interop.from_hf(edited(model, state_changes={"lm_head.weight": wte + 1}))
    interop.from_hf(edited(model, {"tie_word_embeddings": False}, {"lm_head.weight": wte.clone()}))  # equal: fine
    with pytest.raises(ValueError, match="unexpected .*multiple_choice_head"):
        interop.from_hf(edited(model, state_changes={"multiple_choice_head.summary.weight": torch.zeros(1, 32)}))
    hf = random_hf_model()
    with pytest.raises(ValueError, match="nonzero biases"):
        interop.from_hf((hf.config.to_dict(), hf.state_dict()), bias=False)


def test_from_hf_refuses_folders_without_a_model(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        interop.from_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(interop.to_hf(random_model())[0]))
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        interop.from_hf(tmp_path)


def test_a_qk_norm_model_is_refused_with_the_way_to_evaluate_it(tmp_path):
    model = random_model(qk_norm="rmsnorm")
    with pytest.raises(ValueError, match="qk_norm='rmsnorm' has no Hugging Face GPT-2 equivalent.*python -m eval"):
        interop.export(save_checkpoint(model, tmp_path / "ckpt.pt"), tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_export_without_the_hf_extras_names_the_requirements_file(tmp_path):
    torch.manual_seed(0)
    Checkpoint.of_model(GPT(GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=8, vocab_size=320)), "byte").save(
        tmp_path / "ckpt.pt")
    # The CLI in a process where Hugging Face's tokenizers cannot be imported (only requirements.txt).
    code = ("import runpy, sys; sys.modules['tokenizers'] = None; "
            f"sys.argv = ['export_hf', {str(tmp_path / 'ckpt.pt')!r}, {str(tmp_path / 'hf')!r}]; "
            "runpy.run_module('scripts.export_hf', run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert re.search(r"export_hf: .*tokenizers.*: the export needs the Hugging Face extras: pip install -r "
                     r"requirements-eval.txt", result.stderr), result.stderr
    assert not (tmp_path / "hf").exists()
