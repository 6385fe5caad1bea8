"""Tokenizers behind one small interface: name, n_vocab, eot_token, encode, encode_batch, decode.

"gpt2" is GPT-2 BPE through tiktoken; on an air-gapped machine it is built from the ranks file
that data/assets.py takes from the package registry (the same encoding, token for token).
"byte" is UTF-8 bytes plus an end-of-text token, for tiny CPU demos.
Any other name is a tokenizer transformers' AutoTokenizer loads: a hub name such as "t5-base" (the
MERIT paper's for C4, as GaLore's code uses it) or a local folder; its end-of-sequence token
separates documents. transformers is imported only then (it is in requirements-eval.txt). Where the
Hugging Face hub cannot be reached (``hub_unreachable``: one short request), a hub name is loaded
from the hub's cache, or refused at once with the local alternatives; transformers would retry for a
minute and then call the name unknown.
"""
import functools
import http.client
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import tiktoken
from tiktoken.load import load_tiktoken_bpe
from tiktoken_ext.openai_public import r50k_pat_str

from data import assets

# tiktoken downloads with requests.get and no timeout: behind a firewall that drops packets
# (common on clusters) that hangs for minutes, so the online attempt is abandoned after this.
TIKTOKEN_ONLINE_TIMEOUT_S = 10.0
# The longest the hub check waits for the hub's answer (a refused connection or an unknown host fails at once).
HUB_CHECK_TIMEOUT_S = 5.0


class HubUnreachable(ConnectionError):
    """Something must come from the Hugging Face hub, which cannot be reached."""


class TiktokenTokenizer:
    def __init__(self, encoding: tiktoken.Encoding):
        self.encoding = encoding
        self.name = encoding.name
        self.n_vocab = encoding.n_vocab
        self.eot_token = encoding.eot_token

    def encode(self, text: str) -> list[int]:
        return self.encoding.encode_ordinary(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.encoding.encode_ordinary_batch(texts)  # parallel over threads in Rust

    def decode(self, tokens: list[int]) -> str:
        return self.encoding.decode(tokens)


class ByteTokenizer:
    name = "byte"
    n_vocab = 257
    eot_token = 256  # the one id that is not a byte

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(text) for text in texts]

    def decode(self, tokens: list[int]) -> str:
        data = bytearray()
        for token in tokens:
            if token == self.eot_token:
                data += b"<|endoftext|>"  # shown as tiktoken shows it
            else:
                data.append(token)
        return data.decode("utf-8", errors="replace")


class HuggingFaceTokenizer:
    """A tokenizer transformers' AutoTokenizer loads; ``hf_tokenizer`` is transformers' own object.
    Its end-of-sequence token (t5's </s>, id 1) is the end-of-text token. Text is encoded as
    ``hf_tokenizer(text, add_special_tokens=False)`` encodes it (as GaLore's and lm-eval's calls do:
    special-token strings in the text, such as a literal "</s>", become those tokens)."""

    def __init__(self, name: str):
        try:
            import transformers
        except ImportError as error:
            raise ModuleNotFoundError(f"tokenizer {name!r} is loaded with transformers, which is not installed: "
                                      "pip install -r requirements-eval.txt") from error
        unreachable = hub_unreachable() if from_hub(name) else None  # (then only the hub's cache can have it)
        try:
            self.hf_tokenizer = transformers.AutoTokenizer.from_pretrained(name, local_files_only=bool(unreachable))
        except OSError as error:
            if unreachable:
                raise HubUnreachable(f"tokenizer {name!r} comes from the Hugging Face hub, which cannot be reached "
                                     f"({unreachable}), and is not in its cache: give a local folder with its files "
                                     f"instead (AutoTokenizer.from_pretrained({name!r}).save_pretrained(folder) where "
                                     "the hub can be reached), or the gpt2 or byte tokenizer") from error
            raise ValueError(f"unknown tokenizer {name!r}: not 'gpt2' or 'byte', and transformers could not load "
                             f"it as a hub name (such as 't5-base') or a local folder: {error}") from error
        if self.hf_tokenizer.eos_token_id is None:
            raise ValueError(f"tokenizer {name!r} has no end-of-sequence token to separate documents with; give "
                             "its eos_token in its tokenizer_config.json, or choose another tokenizer")
        self.name = name
        self.n_vocab = len(self.hf_tokenizer)  # with the added tokens (t5-base: 32,000 pieces and 100 extra ids)
        self.eot_token = self.hf_tokenizer.eos_token_id

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        # The document separator is the caller's to add, and a document longer than the model's
        # context is packed, not fed whole: no special tokens, no warning about its length.
        encoded = self.hf_tokenizer(texts, add_special_tokens=False, verbose=False, return_attention_mask=False)
        return encoded["input_ids"]

    def decode(self, tokens: list[int]) -> str:
        return self.hf_tokenizer.decode(tokens)


BUILT_IN = ("gpt2", "byte")  # ours; any other name goes to transformers
# Besides its vocabulary files, what a transformers tokenizer folder may hold that changes the encoding.
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")


@functools.cache  # one network attempt and one ranks parse per process
def get_tokenizer(name: str):
    if name == "gpt2":
        return TiktokenTokenizer(gpt2_encoding())
    if name == "byte":
        return ByteTokenizer()
    return HuggingFaceTokenizer(name)


def from_hub(name: str) -> bool:
    """Whether tokenizer ``name`` is a Hugging Face hub name (loaded from the hub or its cache): neither
    ours nor a local folder, and shaped as a hub id ("name" or "owner/name"; a path that is no folder is
    not one, and transformers refuses it without asking the hub)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id
    if name in BUILT_IN or Path(name).is_dir():
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


@functools.cache  # one check per process
def hub_unreachable() -> str | None:
    """Why the Hugging Face hub (huggingface_hub's endpoint, $HF_ENDPOINT) cannot be reached, or None if
    it answers: offline mode ($HF_HUB_OFFLINE), or a request to it that fails or has no answer within
    HUB_CHECK_TIMEOUT_S. Any answer, an error status too, means it can be reached."""
    from huggingface_hub import constants
    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    request = urllib.request.Request(constants.ENDPOINT, method="HEAD")  # (through $HTTPS_PROXY if set)
    try:
        call_with_timeout(lambda: urllib.request.urlopen(request, timeout=HUB_CHECK_TIMEOUT_S).close(),
                          HUB_CHECK_TIMEOUT_S)
    except urllib.error.HTTPError:  # (an error status: an answer all the same)
        return None
    except (OSError, http.client.HTTPException) as error:  # (no route, no name, refused, timed out, cut)
        reason = getattr(error, "reason", None) or error  # (urllib's URLError wraps the cause)
        if isinstance(reason, TimeoutError):  # (the socket's or call_with_timeout's, whichever came first)
            reason = f"no answer within {HUB_CHECK_TIMEOUT_S:g} s"
        return f"{constants.ENDPOINT}: {reason}"
    return None


def tokenizer_identity(name: str) -> dict:
    """What a manifest records of the tokenizer: its name, and for a local folder the sha256 of each
    of its tokenizer files (a folder's name does not say what it holds: a preparation is not
    resumed or reused with a folder whose files changed)."""
    folder = Path(name)
    if name in BUILT_IN or not folder.is_dir():
        return {"tokenizer": name}
    names = {*HF_TOKENIZER_FILES, *get_tokenizer(name).hf_tokenizer.vocab_files_names.values()}
    files = {file: assets.sha256_of(folder / file) for file in sorted(names) if (folder / file).is_file()}
    return {"tokenizer": name, "tokenizer_files": files}


def gpt2_encoding() -> tiktoken.Encoding:
    try:
        return call_with_timeout(lambda: tiktoken.get_encoding("gpt2"), TIKTOKEN_ONLINE_TIMEOUT_S)
    except Exception as online_error:
        print(f"tiktoken could not load gpt2 ({type(online_error).__name__}); building it from "
              "the registry's gpt2.tiktoken", file=sys.stderr)
        ranks_path = assets.gpt2_tiktoken_path()
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=r50k_pat_str,
        mergeable_ranks=load_tiktoken_bpe(str(ranks_path), assets.GPT2_TIKTOKEN_SHA256),
        special_tokens={"<|endoftext|>": 50256},
    )


def call_with_timeout(fn, timeout_s: float):
    """fn() run in a daemon thread; TimeoutError if it has not returned within timeout_s (the
    thread is then left behind: a blocked socket read cannot be interrupted from outside)."""
    outcome = {}

    def run():
        try:
            outcome["value"] = fn()
        except Exception as error:
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if "error" in outcome:
        raise outcome["error"]
    if "value" not in outcome:
        raise TimeoutError(f"gave up after {timeout_s:g} s")
    return outcome["value"]
