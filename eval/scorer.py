"""The scoring engine: log-likelihoods of continuations and rolling log-likelihoods of documents,
computed exactly as lm-evaluation-harness 0.4.x computes them, batched for speed.

Encoding of a (context, continuation) pair (the harness's ``_encode_pair``): trailing whitespace
moves from the context to the front of the continuation; ``context + continuation`` is tokenized
as one string and the context alone; the continuation's tokens are the whole's after the
context's. An empty context is the end-of-text token. The model sees
``(context + continuation)[-(max_length + 1):][:-1]`` and the log-likelihood is the sum of the
log-softmax of the continuation's tokens; ``is_greedy`` says every one of them is the argmax.
The harness's tokenizer and ours are the same BPE (tiktoken's GPT-2 and its HF conversion).

Rolling log-likelihood (WikiText) cuts the document's tokens into the harness's disjoint windows:
the first predicts ``t[:L]`` from ``[eot] + t[:L-1]``, each further window predicts the next at
most L tokens from a full L-token context, so every token is predicted once.

Requests are deduplicated (identical token sequences share one forward pass), sorted longest
first and cut into batches of ``batch_size`` sequences right-padded to the batch's longest; the
result of a request does not depend on which batch it lands in beyond float rounding.
"""
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm import tqdm


@dataclass(frozen=True)
class TokenRequest:
    """The model input of one request: score ``continuation`` (token ids) after ``context``."""
    context: tuple[int, ...]
    continuation: tuple[int, ...]


class Scorer:
    def __init__(self, model, tokenizer, batch_size: int = 16, device="cpu", max_length: int | None = None,
                 show_progress: bool = True):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.device = torch.device(device)
        self.max_length = max_length or model.config.block_size
        self.show_progress = show_progress

    # ---- encoding ---------------------------------------------------------------------------

    def encode_pair(self, context: str, continuation: str) -> TokenRequest:
        eot = self.tokenizer.eot_token
        if context == "":  # the end-of-text token is the context, unless the continuation starts with it
            tokens = tuple(self.tokenizer.encode(continuation))
            return TokenRequest((eot,), tokens) if tokens[:1] != (eot,) else TokenRequest(tokens[:1], tokens[1:])
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
        whole = self.tokenizer.encode(context + continuation)
        context_tokens = self.tokenizer.encode(context)
        return TokenRequest(tuple(context_tokens), tuple(whole[len(context_tokens):]))

    def rolling_windows(self, text: str) -> list[TokenRequest]:
        """The harness's disjoint rolling windows over ``text``'s tokens (each a TokenRequest)."""
        tokens = self.tokenizer.encode(text)
        L = self.max_length
        first = min(L, len(tokens))
        windows = [TokenRequest((self.tokenizer.eot_token,), tuple(tokens[:first]))]
        predicted = first
        while predicted < len(tokens):
            n = min(len(tokens) - predicted, L)
            end = predicted + n
            context = tokens[max(0, end - L - 1): end - 1]
            # Disjoint (as the harness makes every window): the context is what precedes the
            # predicted tokens; the model input is the last L tokens before the window's end.
            windows.append(TokenRequest(tuple(context[:len(context) - (n - 1)]), tuple(tokens[end - n: end])))
            predicted = end
        return windows

    # ---- scoring ----------------------------------------------------------------------------

    def loglikelihood(self, requests: list[tuple[str, str]], desc: str = "loglikelihood") -> list[tuple[float, bool]]:
        """(log-likelihood, is_greedy) of each (context, continuation)."""
        encoded = []
        for index, (context, continuation) in enumerate(requests):
            request = self.encode_pair(context, continuation)
            if not request.continuation:
                raise ValueError(f"request {index}: the continuation {continuation!r} after context "
                                 f"{context[-80:]!r} encodes to no tokens; nothing to score")
            encoded.append(request)
        return self.score_tokens(encoded, desc)

    def loglikelihood_rolling(self, texts: list[str], desc: str = "rolling loglikelihood") -> list[float]:
        """Log-likelihood of each whole text."""
        windows = [self.rolling_windows(text) for text in texts]
        flat = [w for text_windows in windows for w in text_windows]
        results = iter(self.score_tokens(flat, desc))
        return [sum(next(results)[0] for _ in text_windows) for text_windows in windows]

    @torch.no_grad()
    def score_tokens(self, requests: list[TokenRequest], desc: str = "scoring") -> list[tuple[float, bool]]:
        """(log-likelihood, is_greedy) of each TokenRequest."""
        unique = sorted(set(requests), key=lambda r: (-len(r.context) - len(r.continuation), r.context, r.continuation))
        scores = {}
        batches = range(0, len(unique), self.batch_size)
        for start in tqdm(batches, desc=desc, unit="batch", disable=not self.show_progress or len(batches) < 2):
            batch = unique[start: start + self.batch_size]
            scores.update(zip(batch, self._score_batch(batch)))
        return [scores[r] for r in requests]

    def _score_batch(self, batch: list[TokenRequest]) -> list[tuple[float, bool]]:
        inputs = [(r.context + r.continuation)[-(self.max_length + 1):][:-1] for r in batch]
        width = max(len(tokens) for tokens in inputs)
        idx = torch.zeros(len(batch), width, dtype=torch.long)
        for row, tokens in enumerate(inputs):
            idx[row, :len(tokens)] = torch.tensor(tokens)
        logits, _ = self.model(idx.to(self.device))
        results = []
        for row, (request, tokens) in enumerate(zip(batch, inputs)):
            n = len(request.continuation)
            # The last n input positions predict the continuation's n tokens.
            logprobs = F.log_softmax(logits[row, len(tokens) - n: len(tokens)].float(), dim=-1)
            target = torch.tensor(request.continuation, device=logprobs.device)
            ll = logprobs.gather(1, target[:, None]).sum().item()
            results.append((ll, bool((logprobs.argmax(-1) == target).all())))
        return results
