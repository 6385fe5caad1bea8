"""The scoring engine: log-likelihoods of continuations and rolling log-likelihoods of documents,
computed exactly as lm-evaluation-harness 0.4.x computes them, batched for speed.

Encoding of a (context, continuation) pair (the harness's ``_encode_pair``): trailing whitespace
moves from the context to the front of the continuation; ``context + continuation`` is tokenized
as one string and the context alone; the continuation's tokens are the whole's after the
context's. An empty context is the end-of-text token. The model sees
``(context + continuation)[-(max_length + 1):][:-1]`` (the context truncated from the left) and the
log-likelihood is the sum of the log-softmax of the continuation's tokens; ``is_greedy`` says
every one of them is the argmax. A continuation longer than the model's window cannot be scored:
the harness refuses it (an assertion), and so does ``loglikelihood`` (a ValueError that says so).
The harness's tokenizer and ours are the same BPE (tiktoken's GPT-2 and its HF conversion).

Rolling log-likelihood (WikiText) cuts the document's tokens into the harness's disjoint windows:
the first predicts ``t[:L]`` from ``[eot] + t[:L-1]``, each further window predicts the next at
most L tokens from a full L-token context, so every token is predicted once.

Speed, with the same results up to float rounding (whatever the batch size):
* identical requests are scored once;
* requests sharing a context (a multiple-choice question's 2-5 answers after one long prompt)
  are packed into one row: the context once, then each continuation's tokens attending to the
  context and to themselves only, at the positions they would have had (see ``pack``);
* the LM head runs only where a continuation token is predicted (with GPT-2's 50k vocabulary it
  is most of a small model's compute at every position);
* rows are sorted longest first and cut into batches of ``batch_size`` right-padded rows.
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
            if len(request.continuation) > self.max_length:
                raise ValueError(f"a continuation of {len(request.continuation)} tokens ({continuation[:60]!r}...) "
                                 f"is longer than the model's {self.max_length}-token window, so it cannot be scored "
                                 f"(lm-evaluation-harness refuses it too): evaluate a model with a longer block_size, "
                                 f"or leave this task out")
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
        rows = sorted(pack(set(requests), self.max_length), key=lambda row: (-len(row.tokens), row.tokens))
        # Plain rows are batched apart from packed ones: they need no attention mask.
        batches = [kind[i: i + self.batch_size] for kind in ([r for r in rows if not r.packed], [r for r in rows if r.packed])
                   for i in range(0, len(kind), self.batch_size)]
        scores = {}
        for batch in tqdm(batches, desc=desc, unit="batch", disable=not self.show_progress or len(batches) < 2):
            scores.update(self._score_batch(batch))
        return [scores[r] for r in requests]

    def _score_batch(self, batch: list["Row"]) -> dict[TokenRequest, tuple[float, bool]]:
        width = max(len(row.tokens) for row in batch)
        idx = torch.zeros(len(batch), width, dtype=torch.long)
        for i, row in enumerate(batch):
            idx[i, :len(row.tokens)] = torch.tensor(row.tokens)
        positions = mask = None
        if batch[0].packed:
            positions = torch.zeros(len(batch), width, dtype=torch.long)
            segments = torch.full((len(batch), width), -1, dtype=torch.long)  # padding: its own segment
            for i, row in enumerate(batch):
                positions[i, :len(row.tokens)] = torch.tensor(row.positions)
                segments[i, :len(row.tokens)] = torch.tensor(row.segments)
            order = torch.arange(width)
            # A token sees the earlier tokens of its own segment and the shared context (segment 0).
            mask = ((order[None, None, :] <= order[None, :, None])
                    & ((segments[:, None, :] == 0) | (segments[:, None, :] == segments[:, :, None])))
            positions, mask = positions.to(self.device), mask[:, None].to(self.device)
        hidden = self.model.hidden_states(idx.to(self.device), positions, mask)
        # The LM head only where a continuation token is predicted: most positions are context.
        where = [(i, p) for i, row in enumerate(batch) for _, predictors in row.requests for p in predictors]
        rows_index, cols_index = (torch.tensor(x, device=self.device) for x in zip(*where))
        logprobs = F.log_softmax(self.model.output_logits(hidden[rows_index, cols_index]).float(), dim=-1)
        targets = torch.tensor([t for row in batch for request, _ in row.requests for t in request.continuation],
                               device=self.device)
        token_logprobs = logprobs.gather(1, targets[:, None])[:, 0].tolist()
        greedy = (logprobs.argmax(-1) == targets).tolist()
        results, k = {}, 0
        for row in batch:
            for request, predictors in row.requests:
                n = len(predictors)
                results[request] = (sum(token_logprobs[k: k + n]), all(greedy[k: k + n]))
                k += n
        return results


@dataclass
class Row:
    """One sequence of a batch. ``requests``: each request it scores, with the positions in
    ``tokens`` whose outputs predict the request's continuation tokens. A packed row (``positions``
    and ``segments`` set) holds one context (segment 0) followed by the inputs of several
    continuations (segments 1, 2, ...), each attending to the context and to itself only, with
    positions continuing the context's: the same computation as one row per request."""
    tokens: tuple[int, ...]
    requests: list[tuple[TokenRequest, list[int]]]
    positions: tuple[int, ...] | None = None
    segments: tuple[int, ...] | None = None

    @property
    def packed(self) -> bool:
        return self.positions is not None


def pack(requests, max_length: int) -> list[Row]:
    """Rows for ``requests``: those sharing a context, whose context and continuation fit in the
    model without truncation, are packed together up to ``max_length`` tokens a row (the context is
    computed once: multiple-choice tasks score 2-5 continuations after one long prompt); any other
    request gets a row of its own, the harness's ``(context + continuation)[-(L + 1):][:-1]``."""
    by_context = {}
    rows = []
    for request in requests:
        if len(request.context) + len(request.continuation) <= max_length + 1:
            by_context.setdefault(request.context, []).append(request)
        else:
            rows.append(single_row(request, max_length))
    for context, group in by_context.items():
        if len(group) == 1:
            rows.append(single_row(group[0], max_length))
            continue
        group.sort(key=lambda r: r.continuation)
        row = None
        for request in group:
            extra = len(request.continuation) - 1  # its input tokens after the context
            if row is None or len(row[0]) + extra > max_length:
                if row:
                    rows.append(Row(tuple(row[0]), row[1], tuple(row[2]), tuple(row[3])))
                row = (list(context), [], list(range(len(context))), [0] * len(context))
            tokens, scored, positions, segments = row
            segment = segments[-1] + 1
            # Continuation token 0 is predicted by the context's last token, token j by token j - 1.
            scored.append((request, [len(context) - 1] + list(range(len(tokens), len(tokens) + extra))))
            tokens.extend(request.continuation[:-1])
            positions.extend(range(len(context), len(context) + extra))
            segments.extend([segment] * extra)
        rows.append(Row(tuple(row[0]), row[1], tuple(row[2]), tuple(row[3])))
    return rows


def single_row(request: TokenRequest, max_length: int) -> Row:
    tokens = (request.context + request.continuation)[-(max_length + 1):][:-1]
    n = len(request.continuation)
    return Row(tokens, [(request, list(range(len(tokens) - n, len(tokens))))])
