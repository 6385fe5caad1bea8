"""eval/scorer.py against independent references: the harness's own windowing and encoding code,
and a naive one-request-at-a-time float64 computation of every log-likelihood."""
import pytest
import torch
import torch.nn.functional as F
from lm_eval import utils as harness_utils

from data.tokenizer import get_tokenizer
from eval.scorer import Scorer, TokenRequest
from model import GPT, GPTConfig

PAIRS = [
    ("Question: What is the capital of France?\nAnswer:", " Paris"),
    ("The cat sat on the ", "mat."),             # trailing space moves to the continuation
    ("He said  ", " twice"),                     # two trailing spaces
    ("", "An empty context is the end-of-text token."),
    ("", "<|endoftext|> starts with it"),  # (as text: GPT-2 encodes it as ordinary characters)
    ("Nebuchadnezzar was king of", " Babylon and Nebuchadnezzar"),
    ("東京 is the capital of", " Japan"),
    # Several continuations of one context: packed into rows that share it (two rows at block 16).
    ("Question: What is the capital of France?\nAnswer:", " London"),
    ("Question: What is the capital of France?\nAnswer:", " the city of Lyon, on the Rhône"),
    ("Question: What is the capital of France?\nAnswer:", " Marseille"),
    ("One two", " three"), ("One two", " four five six seven eight nine ten eleven twelve thirteen fourteen"),
]


@pytest.fixture(scope="module")
def scorer() -> Scorer:
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=50304))
    return Scorer(model, get_tokenizer("gpt2"), batch_size=3, show_progress=False)


def harness_encode_pair(tok, context: str, continuation: str):
    """lm-eval 0.4's TemplateLM.loglikelihood + _encode_pair, transcribed for a causal model."""
    if context == "":
        cont = tok.encode(continuation)
        return ([tok.eot_token], cont) if tok.eot_token != cont[0] else (cont[:1], cont[1:])
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = tok.encode(context + continuation)
    ctx = tok.encode(context)
    return ctx, whole[len(ctx):]


def naive_loglikelihood(model: GPT, context: list[int], continuation: list[int], max_length: int):
    """One request alone, float64: the sum of log-probabilities of the continuation, and greedy."""
    tokens = (context + continuation)[-(max_length + 1):]
    model64 = model.double()
    try:
        logits, _ = model64(torch.tensor([tokens[:-1]]))
    finally:
        model.float()
    logprobs = F.log_softmax(logits[0].double(), dim=-1)[-len(continuation):]
    target = torch.tensor(continuation)
    return logprobs.gather(1, target[:, None]).sum().item(), bool((logprobs.argmax(-1) == target).all())


def test_encoding_follows_the_harness(scorer):
    tok = scorer.tokenizer
    for context, continuation in PAIRS:
        request = scorer.encode_pair(context, continuation)
        assert (list(request.context), list(request.continuation)) == harness_encode_pair(tok, context, continuation)
    assert scorer.encode_pair("The cat sat on the ", "mat.").continuation[0] == tok.encode(" mat")[0]


def test_rolling_windows_are_the_harness_windows(scorer):
    text = " ".join(f"word{i}" for i in range(40))  # ~80 tokens, several windows of 16
    tokens = scorer.tokenizer.encode(text)
    expected = [harness_utils.make_disjoint_window(w) for w in harness_utils.get_rolling_token_windows(
        token_list=tokens, prefix_token=scorer.tokenizer.eot_token, max_seq_len=16, context_len=1)]
    windows = scorer.rolling_windows(text)
    assert [(list(w.context), list(w.continuation)) for w in windows] == [(list(a), list(b)) for a, b in expected]
    assert [t for w in windows for t in w.continuation] == tokens  # every token predicted once


@pytest.mark.parametrize("batch_size", [1, 3, 64])  # 64: packed and plain rows in one call
def test_loglikelihoods_equal_a_naive_float64_computation(scorer, batch_size):
    results = Scorer(scorer.model, scorer.tokenizer, batch_size=batch_size, show_progress=False).loglikelihood(PAIRS)
    for (context, continuation), (ll, greedy) in zip(PAIRS, results):
        ctx, cont = harness_encode_pair(scorer.tokenizer, context, continuation)
        expected_ll, expected_greedy = naive_loglikelihood(scorer.model, ctx, cont, scorer.max_length)
        assert ll == pytest.approx(expected_ll, abs=1e-4)
        assert greedy == expected_greedy


def test_rolling_loglikelihood_is_the_sum_over_windows(scorer):
    texts = ["short text", " ".join(f"token{i}" for i in range(30))]
    for text, ll in zip(texts, scorer.loglikelihood_rolling(texts)):
        expected = sum(naive_loglikelihood(scorer.model, list(w.context), list(w.continuation), 16)[0]
                       for w in scorer.rolling_windows(text))
        assert ll == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize("batch_size", [1, 2, 5, 64])
def test_results_do_not_depend_on_batch_size(scorer, batch_size):
    reference = scorer.loglikelihood(PAIRS)
    other = Scorer(scorer.model, scorer.tokenizer, batch_size=batch_size, show_progress=False)
    for (ll, greedy), (ll2, greedy2) in zip(reference, other.loglikelihood(PAIRS * 2)):
        assert ll2 == pytest.approx(ll, abs=1e-5) and greedy2 == greedy


def test_identical_requests_share_one_forward_pass(scorer, monkeypatch):
    rows = []
    original = scorer._score_batch
    monkeypatch.setattr(scorer, "_score_batch", lambda batch: rows.extend(batch) or original(batch))
    request = TokenRequest((1, 2, 3), (4,))
    assert len(scorer.score_tokens([request, request, TokenRequest((1, 2), (3,)), request])) == 4
    assert len(rows) == 2


def test_empty_continuation_is_an_error_naming_the_request(scorer):
    with pytest.raises(ValueError, match="request 1.*encodes to no tokens"):
        scorer.loglikelihood([("a", " b"), ("context", "")])
