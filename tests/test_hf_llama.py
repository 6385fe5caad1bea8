"""The Llama family's Hugging Face interop: hf.py's to_hf, from_hf and export for arch="llama", checked
against transformers' own LlamaForCausalLM, LlamaConfig and tokenizers, and lm-evaluation-harness's
`hf` backend on an exported model (CPU, offline, tiny models); what no HF class holds is refused."""

import json
import subprocess
import sys

import pytest
import torch

import hf as interop
from data.tokenizer import get_tokenizer
from eval import evaluate
from eval.samples import write_fixtures
from eval.scorer import Scorer
from eval.tasks import tasks_named
from helpers import ROOT
from model import GPT, GPTConfig
from training.checkpoint import Checkpoint

transformers = pytest.importorskip("transformers")

# llama_nano's shape, a short context, a rotary base and an epsilon of their own (so a reader that
# fell back to the defaults would show), the byte tokenizer's vocabulary padded
NANO = dict(block_size=64, vocab_size=320, rope_theta=5000.0, norm_eps=1e-5)


def random_llama(seed=0, **overrides) -> GPT:
    """A llama_nano-sized GPT whose every parameter is random, the RMSNorm gains about 1 +- 0.3, in eval mode."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig.preset("llama_nano", **{**NANO, **overrides}))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(1 + 0.3 * torch.randn_like(p)) if p.dim() == 1 else p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def export(model, folder, tokenizer="byte", **kwargs):
    Checkpoint.of_model(model, tokenizer, step=3, tokens=3 * 64).save(folder / "ckpt.pt")
    return interop.export(folder / "ckpt.pt", folder / "hf", **kwargs)


def hf_from_pretrained(folder, **kwargs):
    hf, info = transformers.LlamaForCausalLM.from_pretrained(folder, output_loading_info=True, **kwargs)
    assert not any(info.get(key) for key in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    return hf.eval()


def tokens(model, B, T, seed=1):
    return torch.randint(0, model.config.vocab_size, (B, T), generator=torch.Generator().manual_seed(seed))


def assert_same_weights(back: GPT, model: GPT):
    assert back.config == model.config and not back.training
    assert back.state_dict().keys() == model.state_dict().keys()
    for key, tensor in model.state_dict().items():
        assert torch.equal(back.state_dict()[key], tensor), key


# ---- round trips ----

def test_to_hf_then_from_hf_is_exact(tmp_path):
    model = random_llama(dropout=0.1)
    assert_same_weights(interop.from_hf(interop.to_hf(model)), model)
    out = export(model, tmp_path)
    back = interop.from_hf(out)
    assert_same_weights(back, model)
    assert back.lm_head.weight is not back.transformer.wte.weight  # untied, as the model
    x = tokens(model, 2, 64)
    assert torch.equal(back(x)[0], model(x)[0])


def test_to_hf_has_transformers_names_shapes_and_config():
    model = random_llama()
    config, state = interop.to_hf(model, eos_token_id=256)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config))
    assert {k: v.shape for k, v in state.items()} == {k: v.shape for k, v in hf.state_dict().items()}
    assert torch.equal(state["model.layers.3.mlp.gate_proj.weight"], model.transformer.h[3].mlp.gate_proj.weight)
    assert torch.equal(state["model.norm.weight"], model.transformer.ln_f.weight)
    parsed = hf.config  # what transformers makes of the fields
    assert (parsed.hidden_size, parsed.intermediate_size, parsed.num_hidden_layers) == (128, 352, 4)
    assert (parsed.num_attention_heads, parsed.num_key_value_heads, parsed.head_dim) == (4, 4, 32)
    assert (parsed.rms_norm_eps, parsed.max_position_embeddings, parsed.vocab_size) == (1e-5, 64, 320)
    assert parsed.rope_parameters == {"rope_type": "default", "rope_theta": 5000.0}
    assert not (parsed.tie_word_embeddings or parsed.attention_bias or parsed.mlp_bias)
    assert (parsed.bos_token_id, parsed.eos_token_id, parsed.hidden_act) == (256, 256, "silu")


# ---- export -> transformers ----

@pytest.mark.parametrize("T", [1, 7, 64])
def test_transformers_computes_the_same_logits_bit_for_bit(tmp_path, T):
    """Our Llama's operations are Hugging Face's (RMSNorm, rotary, SDPA with its scale, SwiGLU), so the
    float32 logits are equal to the last bit, on one token, a few and the whole block."""
    model = random_llama()
    out = export(model, tmp_path)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf) is transformers.LlamaForCausalLM and hf.dtype == torch.float32
    x = tokens(model, 3, T)
    with torch.no_grad():
        assert torch.equal(hf(x).logits, model(x)[0])
        if T > 1:  # HF's loss over shifted labels is ours over next tokens
            torch.testing.assert_close(hf(x, labels=x).loss, model(x[:, :-1], x[:, 1:])[1], atol=1e-6, rtol=1e-6)


def test_from_hf_of_a_model_made_by_transformers(tmp_path):
    """The path a Llama from the hub takes: transformers' own config and weights, as it saves them."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                      num_attention_heads=4, max_position_embeddings=32, rms_norm_eps=1e-6,
                                      rope_parameters={"rope_type": "default", "rope_theta": 20000.0})
    hf = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.1 * torch.randn_like(p))
    hf.eval().save_pretrained(tmp_path / "hf")
    model = interop.from_hf(tmp_path / "hf")
    assert model.config == GPTConfig(arch="llama", block_size=32, vocab_size=300, n_layer=2, n_head=4, n_embd=64,
                                     intermediate_size=160, norm_eps=1e-6, rope_theta=20000.0)
    x = torch.randint(0, 300, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(model(x)[0], hf(x).logits)


@pytest.mark.parametrize("rope", [
    {"rope_theta": 5000.0},  # transformers 4.x's config.json
    {"rope_parameters": {"rope_type": "default", "rope_theta": 5000.0}},  # 5.x's
    {"rope_theta": 7.0, "rope_parameters": {"rope_type": "default", "rope_theta": 5000.0}},  # both: 5.x's wins
    {"rope_scaling": None, "rope_parameters": {"rope_theta": 5000.0}},
])
def test_from_hf_reads_the_rotary_base_as_transformers_does(rope):
    config, state = interop.to_hf(random_llama())
    for key in ("rope_theta", "rope_parameters"):
        del config[key]
    config.update(rope)
    assert transformers.LlamaConfig(**config).rope_parameters["rope_theta"] == 5000.0
    assert interop.from_hf((config, state)).config.rope_theta == 5000.0


def test_exported_byte_tokenizer_and_bfloat16(tmp_path):
    model = random_llama()
    out = export(model, tmp_path, dtype="bfloat16")
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert tokenizer.encode("héllo wörld 🤖") == get_tokenizer("byte").encode("héllo wörld 🤖")
    assert tokenizer.encode("a<|endoftext|>b") == [97, 256, 98]
    assert tokenizer.eos_token_id == 256 and tokenizer.model_max_length == 64
    hf = hf_from_pretrained(out).float()
    assert torch.equal(hf.lm_head.weight, model.lm_head.weight.bfloat16().float())
    assert_same_weights(interop.from_hf(out).float(), model.bfloat16().float())


def hf_tokenizer_folder(folder):
    """A Hugging Face tokenizer folder, as a hub tokenizer's (t5-base's on C4) would be: a small BPE
    trained here, "</s>" its end-of-sequence token, which it appends to every text, as T5's does."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=150, special_tokens=["<pad>", "</s>", "<unk>"])
    tokenizer.train_from_iterator(["the king speaks softly to the queen", "a river of gold and silver stone"] * 5,
                                  trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="</s>", unk_token="<unk>",
                                         pad_token="<pad>").save_pretrained(folder)
    return folder


def test_a_hugging_face_tokenizer_is_saved_with_the_model(tmp_path):
    source = hf_tokenizer_folder(tmp_path / "tokenizer")
    model = random_llama(vocab_size=192)
    out = export(model, tmp_path, tokenizer=str(source))
    theirs = transformers.AutoTokenizer.from_pretrained(out)
    original = transformers.AutoTokenizer.from_pretrained(source)
    for text in ("the king speaks", "gold </s> stone", "unseen wörds"):
        assert theirs.encode(text) == original.encode(text) and theirs.encode(text)[-1] == 1, text
        assert theirs(text, add_special_tokens=False)["input_ids"] == get_tokenizer(str(source)).encode(text)
    assert theirs.model_max_length == 64 and theirs.eos_token == "</s>"
    config = json.loads((out / "config.json").read_text())
    assert config["eos_token_id"] == config["bos_token_id"] == 1  # the document separator
    assert json.loads((out / "nanomerit.json").read_text())["tokenizer"] == str(source)
    x = tokens(model, 2, 16)
    with torch.no_grad():
        assert torch.equal(hf_from_pretrained(out)(x).logits, model(x)[0])


@pytest.mark.slow  # lm-eval's hf backend (its import) on two models: 6 s
def test_lm_eval_scores_a_hugging_face_tokenizer_export_as_we_do_without_its_special_tokens(tmp_path):
    """lm-eval's `hf` backend encodes with the tokenizer's special tokens (here an appended </s>, as T5's)
    unless add_bos_token=False; with it, its scores are python -m eval's scorer's."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    source = hf_tokenizer_folder(tmp_path / "tokenizer")
    model = random_llama(vocab_size=192)
    out = export(model, tmp_path, tokenizer=str(source))
    assert HFLM(pretrained=str(out), device="cpu").tok_encode("the king")[-1] == 1  # </s> appended
    lm = HFLM(pretrained=str(out), device="cpu", batch_size=2, add_bos_token=False)
    pairs = [("the king speaks", " softly to the queen"), ("", "a river of gold"), ("gold and ", "silver stone")]
    theirs = lm.loglikelihood([Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)])
    text = "the king speaks softly to the queen of a river of gold and silver stone " * 6  # several windows
    their_rolling = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    scorer = Scorer(model, get_tokenizer(str(source)), show_progress=False)
    for (ll, greedy), (their_ll, their_greedy) in zip(scorer.loglikelihood(pairs), theirs):
        assert ll == pytest.approx(their_ll, abs=1e-4) and greedy == their_greedy
    assert scorer.loglikelihood_rolling([text]) == pytest.approx(their_rolling, abs=1e-4)


@pytest.mark.slow  # scripts/export_hf.py in a process of its own (transformers imported)
def test_the_cli_names_the_class_and_the_run_guide_says_it(tmp_path):
    from configs import TrainConfig
    from training import run_folder
    model = random_llama()
    Checkpoint.of_model(model, "byte", step=3).save(tmp_path / "ckpt.pt")
    result = subprocess.run([sys.executable, "-m", "scripts.export_hf", str(tmp_path / "ckpt.pt"),
                             str(tmp_path / "hf")], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.stdout.startswith(f"wrote {tmp_path / 'hf'}: LlamaForCausalLM, 4 layers, 128 dims, "
                                              f"vocab 320, float32, byte tokenizer, step 3")
    for config, hf_class in ((TrainConfig(model="llama_nano", max_steps=2), "LlamaForCausalLM"),
                             (TrainConfig(model="nano", arch="llama", max_steps=2), "LlamaForCausalLM"),
                             (TrainConfig(model="nano", max_steps=2), "GPT2LMHeadModel")):
        guide = run_folder.guide(tmp_path, 2, 2, config, ["python"], [])
        assert guide.splitlines()[-1].endswith(f"(a Hugging Face {hf_class} folder)")


# ---- what no Hugging Face class here holds ----

@pytest.mark.parametrize("arch, family", [("gpt2", "GPT-2"), ("llama", "Llama")])
@pytest.mark.parametrize("caps", [{"attn_logit_softcap": 50.0}, {"final_logit_softcap": 30.0},
                                  {"attn_logit_softcap": 50.0, "final_logit_softcap": 30.0}])
def test_export_refuses_soft_caps(tmp_path, arch, family, caps):
    model = GPT(GPTConfig(arch=arch, n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=320, **caps))
    named = ", ".join(f"{key}={value!r}" for key, value in caps.items())
    with pytest.raises(ValueError, match=rf"a model with {named} has no Hugging Face {family} equivalent "
                                         rf"\(\w+ soft-caps no logits\): evaluate its checkpoint with python -m eval"):
        export(model, tmp_path)
    assert not (tmp_path / "hf").exists()


def test_export_refuses_a_qk_norm_llama(tmp_path):
    with pytest.raises(ValueError, match="qk_norm='layernorm' has no Hugging Face Llama equivalent.*python -m eval"):
        export(random_llama(qk_norm="layernorm"), tmp_path)


@pytest.mark.parametrize("changes, message", [
    ({"num_key_value_heads": 2}, "num_key_value_heads 2 != num_attention_heads 4 .grouped-query"),
    ({"attention_bias": True}, "attention_bias True"),
    ({"mlp_bias": True}, "mlp_bias True"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0}}, "rope_type 'linear'"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope_type 'dynamic'"),  # transformers 4.x's form
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_type 'llama3'"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor 0.5"),
    ({"head_dim": 16}, "head_dim 16 != hidden_size 128 / num_attention_heads 4"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"tie_word_embeddings": True}, "tie_word_embeddings True"),
    ({"model_type": "mistral"}, "model_type 'mistral'"),
    ({"num_hidden_layers": 5}, "missing .*transformer.h.4"),
])
def test_from_hf_refuses_what_this_llama_cannot_hold(changes, message):
    config, state = interop.to_hf(random_llama())
    with pytest.raises(ValueError, match=message):
        interop.from_hf(({**config, **changes}, state))


def test_from_hf_refuses_llama_biases_and_stray_weights():
    config, state = interop.to_hf(random_llama())
    with pytest.raises(ValueError, match="bias=True: the Llama family has no biases"):
        interop.from_hf((config, state), bias=True)
    with pytest.raises(ValueError, match=r"unexpected \['transformer.h.0.attn.q_proj.bias'\]"):
        interop.from_hf((config, {**state, "model.layers.0.self_attn.q_proj.bias": torch.zeros(128)}))
    without_head = {k: v for k, v in state.items() if k != "lm_head.weight"}
    with pytest.raises(ValueError, match=r"missing \['lm_head.weight'\]"):
        interop.from_hf((config, without_head))


# ---- lm-evaluation-harness on the export ----

# One task of each kind: a loglikelihood with greedy flags, rolling windows across the block, multiple
# choice with and without partial scoring (the GPT-2 agreement test of test_eval.py covers every task).
HARNESS_TASKS = ("lambada_openai", "wikitext", "hellaswag", "winogrande")


@pytest.mark.slow  # the harness
def test_agreement_with_the_harness_hf_backend_on_an_exported_llama(tmp_path, monkeypatch):
    """`python -m eval`'s evaluation (evaluate with our scorer) of a random Llama and lm-eval's `hf`
    backend on its export: the same log-likelihoods, greedy flags and metrics, as for GPT-2."""
    import numpy as np
    from eval import samples
    from test_eval import assert_same_as_harness, decision_slack, harness_run
    monkeypatch.setattr(samples, "HARNESS_YAMLS", {name: samples.HARNESS_YAMLS[name] for name in HARNESS_TASKS})
    model = random_llama(n_layer=2, block_size=128, vocab_size=50304)
    out = export(model, tmp_path, tokenizer="gpt2")
    write_fixtures(tmp_path / "tasks")
    ours = evaluate(Scorer(model, get_tokenizer("gpt2"), batch_size=16, show_progress=False),
                    tasks_named(list(HARNESS_TASKS)), data_dir=tmp_path / "tasks", log_samples=True)
    harness = harness_run("hf", tmp_path, tmp_path / "tasks", model_args=f"pretrained={out},dtype=float32",
                          batch_size=4, device="cpu")
    assert harness.keys() == set(HARNESS_TASKS)
    # (as test_eval.py's: the hf backend's float32 sums, to 2 float32 epsilons on a WikiText page's -4000)
    assert_same_as_harness(ours, harness, decision_slack(ours, tmp_path / "tasks"), atol=1e-4,
                           rtol=2 * float(np.finfo(np.float32).eps))


def test_python_m_eval_reads_a_folder_s_tokenizer(tmp_path):
    """`python -m eval --hf`: an export of ours names its tokenizer; a Llama folder from elsewhere
    brings its own tokenizer files, which transformers loads (here they encode as the byte tokenizer)."""
    import eval.__main__ as cli
    out = export(random_llama(), tmp_path)
    model = interop.from_hf(out)
    assert cli.hf_folder_tokenizer(out, model) == "byte"
    (out / "nanomerit.json").unlink()
    assert cli.hf_folder_tokenizer(out, model) == str(out)
    assert get_tokenizer(str(out)).encode("héllo wörld") == get_tokenizer("byte").encode("héllo wörld")
