"""A character-level tokenizer built in code (no download).

It is a ``Qwen2Tokenizer`` (byte-level BPE) whose vocabulary holds single characters and no
merges, so every character — including "\n" and " ", as verl requires — is exactly one token,
and ``AutoTokenizer`` reloads the saved directory as the same class (the model type is qwen2).
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
#: Every character the arithmetic task uses.
CHARS = "0123456789+-*=?:. \n" + "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
#: The chat template verl's agent loop applies: the messages' contents, concatenated.
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable-unicode map used by byte-level BPE."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    keep += list(range(ord("®"), ord("ÿ") + 1))
    codes = keep[:]
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            codes.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(keep, codes)}


def build_tokenizer() -> PreTrainedTokenizerBase:
    """Return the char-level tokenizer: ids 0-2 are <pad>, <eos>, <unk>; then one id per character."""
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    to_uni = _byte_to_unicode()
    pieces = [to_uni[b] for ch in CHARS for b in ch.encode("utf-8")]
    vocab = {tok: i for i, tok in enumerate([PAD, EOS, UNK, *pieces])}
    tok = Qwen2Tokenizer(vocab=vocab, merges=[], unk_token=UNK, eos_token=EOS, pad_token=PAD)
    tok.chat_template = CHAT_TEMPLATE
    return tok
