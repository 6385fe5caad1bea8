"""Tokenizers behind one small interface: name, n_vocab, eot_token, encode, encode_batch, decode.

"gpt2" is GPT-2 BPE through tiktoken; on an air-gapped machine it is built from the ranks file
that data/assets.py takes from the package registry (the same encoding, token for token).
"byte" is UTF-8 bytes plus an end-of-text token, for tiny CPU demos.
"""
import functools
import sys
import threading

import tiktoken
from tiktoken.load import load_tiktoken_bpe
from tiktoken_ext.openai_public import r50k_pat_str

from data import assets

# tiktoken downloads with requests.get and no timeout: behind a firewall that drops packets
# (common on clusters) that hangs for minutes, so the online attempt is abandoned after this.
TIKTOKEN_ONLINE_TIMEOUT_S = 10.0


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


@functools.cache  # one network attempt and one ranks parse per process
def get_tokenizer(name: str):
    if name == "gpt2":
        return TiktokenTokenizer(gpt2_encoding())
    if name == "byte":
        return ByteTokenizer()
    raise ValueError(f"unknown tokenizer {name!r}; choose 'gpt2' or 'byte'")


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
