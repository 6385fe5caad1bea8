"""Requests longer than the model's window, scored as lm-evaluation-harness scores them, on a model
exported here and loaded by the harness's own `hf` backend: a context too long is truncated from
the left (the same log-likelihood), a continuation longer than the window is refused by both (the
harness asserts; ours says why), and a training run's zero-shot evaluation skips such a task with
a warning instead of failing after training."""
import math

import pytest
import torch

from data.tokenizer import get_tokenizer
from eval.scorer import Scorer
from hf import export
from model import GPT, GPTConfig
from training.checkpoint import Checkpoint

BLOCK = 8


@pytest.fixture(scope="module")
def model_and_export(tmp_path_factory):
    root = tmp_path_factory.mktemp("window")
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=BLOCK, vocab_size=320, n_layer=1, n_head=2, n_embd=16, bias=True)).eval()
    Checkpoint.of_model(model, "byte").save(root / "ckpt.pt")
    return model, export(root / "ckpt.pt", root / "hf")


def harness(folder):
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    lm = HFLM(pretrained=str(folder), device="cpu", batch_size=1)
    assert lm.max_length == BLOCK
    return lambda context, continuation: lm.loglikelihood(
        [Instance(request_type="loglikelihood", doc={}, arguments=(context, continuation), idx=0)],
        disable_tqdm=True)[0]


def test_a_long_context_is_truncated_from_the_left_as_the_harness_does(model_and_export):
    model, folder = model_and_export
    ours = Scorer(model, get_tokenizer("byte"), batch_size=1, show_progress=False)
    theirs = harness(folder)
    for context, continuation in (("Once upon a time there", " was"), ("ab", " cdef"), ("x" * 30, "yz")):
        (ll, greedy), (their_ll, their_greedy) = ours.loglikelihood([(context, continuation)])[0], \
            theirs(context, continuation)
        assert math.isclose(ll, their_ll, rel_tol=0, abs_tol=1e-4) and greedy == their_greedy, (context, continuation)


def test_a_continuation_longer_than_the_window_is_refused_like_the_harness(model_and_export):
    model, folder = model_and_export
    continuation = " and they lived happily"  # 23 byte tokens > the 8-token window
    with pytest.raises(AssertionError):
        harness(folder)("Once", continuation)
    with pytest.raises(ValueError, match=r"a continuation of 23 tokens .* longer than the model's 8-token window, so "
                                         r"it cannot be scored \(lm-evaluation-harness refuses it too\)"):
        Scorer(model, get_tokenizer("byte"), show_progress=False).loglikelihood([("Once", continuation)])
