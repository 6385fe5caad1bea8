"""An lm-evaluation-harness model backed by our scorer, so the harness runs on our checkpoints:

    from eval.harness import NanoMeritLM
    import lm_eval
    lm = NanoMeritLM.from_checkpoint("runs/NAME/ckpt.pt", batch_size=16)
    results = lm_eval.simple_evaluate(model=lm, tasks=["lambada_openai", "hellaswag"])

The harness builds the prompts and requests; ``TemplateLM`` encodes (context, continuation) pairs
with our tokenizer; eval/scorer.py computes the log-likelihoods. Generation tasks are not
supported (none of the study's tasks generates).
"""
from lm_eval.api.model import TemplateLM

from data.tokenizer import get_tokenizer
from eval.scorer import Scorer, TokenRequest
from training.checkpoint import load_model


class NanoMeritLM(TemplateLM):
    def __init__(self, scorer: Scorer):
        super().__init__()
        self.scorer = scorer

    @classmethod
    def from_checkpoint(cls, path, batch_size: int = 16, device: str = "cpu") -> "NanoMeritLM":
        model, checkpoint = load_model(path)
        tokenizer = get_tokenizer(checkpoint.config["tokenizer"])
        return cls(Scorer(model.to(device), tokenizer, batch_size=batch_size, device=device))

    @property
    def eot_token_id(self) -> int:
        return self.scorer.tokenizer.eot_token

    @property
    def max_length(self) -> int:
        return self.scorer.max_length

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self.scorer.tokenizer.encode(string)  # GPT-2 adds no special tokens

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        return self.scorer.score_tokens([TokenRequest(tuple(context), tuple(continuation))
                                         for _, context, continuation in requests])

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        return self.scorer.loglikelihood_rolling([request.args[0] for request in requests])

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        raise NotImplementedError("NanoMeritLM scores log-likelihoods only; generation tasks are not supported")
