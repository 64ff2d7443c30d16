"""A GGUF file's metadata, checked before kvbench builds anything from it (kvbench.gguf reads the file).

The model is built from the metadata: the block count sizes the loop over tensor names, the head count
divides the width, the context length sizes the rotary tables, and transformers builds the tokenizer from
the vocabulary's keys. A file can state anything in them: a billion blocks, zero heads, an array where a
count belongs, neither merges nor the scores they are derived from. Each used to fail late and obscurely
(out of memory after a minute, ZeroDivisionError, TypeError, a KeyError after the weights were
dequantized). Here every key the reader and the tokenizer read is checked for its GGUF type and a range,
before a tensor is looked at: a problem is one ValueError naming the file and the key, what was expected
and what the file holds.
"""

from __future__ import annotations

import math
from pathlib import Path

ARCHITECTURES = ("llama", "mistral", "qwen2")  # whose metadata maps onto kvbench's llama family
# tokenizer.ggml.model: the byte-level BPE and SentencePiece vocabularies transformers builds for that family
TOKENIZERS = ("gpt2", "llama")
INTEGERS = frozenset({"UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "UINT64", "INT64"})
FLOATS = frozenset({"FLOAT32", "FLOAT64"})  # GGUF's rotary base and epsilon (transformers refuses an integer)
NUMBERS = INTEGERS | FLOATS
# Upper bounds, several times the largest published model of the family (Llama 3.1 405B: 126 blocks, width
# 16,384, 128 heads of 128 channels, feed-forward 53,248; vocabularies up to 262,144 tokens; contexts up to
# 10M): a file past one states nonsense, not a model. Whether a model inside them fits this machine is
# kvbench.memory's question, asked before the weights are built (kvbench.gguf.build_gguf_model).
MAX_BLOCKS, MAX_WIDTH, MAX_HEADS, MAX_HEAD_WIDTH = 1024, 1 << 17, 1024, 1024
MAX_FEED_FORWARD, MAX_CONTEXT, MAX_VOCABULARY = 1 << 19, 1 << 24, 1 << 21
MAX_EPSILON, MAX_ROTARY_BASE = 1.0, 1e12
SPECIAL_TOKENS = ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id")
FLAGS = ("add_bos_token", "add_eos_token", "add_space_prefix")
MISSING = object()


class Metadata:
    """A GGUFReader's fields, each read through a typed accessor that returns a value in its range or raises."""

    def __init__(self, fields: dict, path: Path) -> None:
        self.fields, self.path = fields, path

    def error(self, key: str, expected: str, got: str | None = None) -> ValueError:
        found = "which the file lacks" if got is None else f"got {got}"
        return ValueError(f"{self.path}: {key}: expected {expected}, {found}")

    def kind(self, key: str) -> str | None:
        types = self.fields[key].types
        return types[0].name if types else None

    def describe(self, key: str) -> str:
        """What the file holds under `key`, for a message: its GGUF type and value (a string by its quotes)."""
        field, kind = self.fields[key], self.kind(key)
        if kind == "ARRAY":
            return f"an array of {len(field.data)} {field.types[-1].name}"
        try:
            value = field.contents()
        except Exception:  # noqa: BLE001 - a string that is not UTF-8, a type gguf cannot decode
            return f"an unreadable {kind}"
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        return shown if kind == "STRING" else f"{kind} {shown}"

    def scalar(self, key: str, kinds, expected: str, default=MISSING):
        if key not in self.fields:
            if default is MISSING:
                raise self.error(key, expected)
            return default
        if self.kind(key) not in kinds:
            raise self.error(key, expected, self.describe(key))
        try:
            return self.fields[key].contents()
        except Exception:  # noqa: BLE001 - see describe
            raise self.error(key, expected, self.describe(key)) from None

    def integer(self, key: str, low: int, high: int, default=MISSING) -> int:
        expected = f"an integer from {low} to {high}"
        value = self.scalar(key, INTEGERS, expected, default)
        if key not in self.fields:
            return value
        if not low <= value <= high:
            raise self.error(key, expected, self.describe(key))
        return int(value)

    def number(self, key: str, high: float, default=MISSING) -> float:
        expected = f"a float above 0 and at most {high:g}"
        value = self.scalar(key, FLOATS, expected, default)
        if key not in self.fields:
            return value
        if not (math.isfinite(value) and 0 < value <= high):
            raise self.error(key, expected, self.describe(key))
        return float(value)

    def string(self, key: str, choices: tuple[str, ...] = (), default=MISSING, expected: str | None = None):
        expected = expected or (f"one of {list(choices)}" if choices else "a string")
        value = self.scalar(key, {"STRING"}, expected, default)
        if key in self.fields and choices and value not in choices:
            raise self.error(key, expected, self.describe(key))
        return value

    def array(self, key: str, items, what: str, count: int | None = None, required: bool = True) -> int | None:
        """The length of the array under `key` (None where an optional one is absent): its items of `items`
        kinds, and `count` of them where one is given."""
        expected = f"an array of {what}" + (f", one per token ({count})" if count is not None else "")
        if key not in self.fields:
            if required:
                raise self.error(key, expected)
            return None
        field = self.fields[key]
        if self.kind(key) != "ARRAY" or field.types[-1].name not in items:
            raise self.error(key, expected, self.describe(key))
        if count is not None and len(field.data) != count:
            raise self.error(key, expected, f"{len(field.data)}")
        return len(field.data)


def config_fields(metadata: Metadata, tensor_names) -> dict:
    """PlainConfig fields (without the dtype) from the metadata, each in its range; `tensor_names` say whether
    q, k and v have biases and whether the head is tied. ValueError naming the key on anything else."""
    arch = metadata.string("general.architecture", ARCHITECTURES,
                           expected=f"a GGUF of architecture {' or '.join(ARCHITECTURES)} (the llama family)")
    key = lambda name: f"{arch}.{name}"  # noqa: E731 - every shape key is under the architecture's name
    scaling = metadata.string(key("rope.scaling.type"), default="none")
    if scaling != "none":
        raise metadata.error(key("rope.scaling.type"), "none (rotary scaling is not supported)", repr(scaling))
    if "rope_freqs.weight" in tensor_names:  # llama 3's scaling, as llama.cpp's converter writes it
        raise ValueError(f"{metadata.path}: tensor rope_freqs.weight: rotary scaling is not supported: expected none")
    width = metadata.integer(key("embedding_length"), 1, MAX_WIDTH)
    heads = metadata.integer(key("attention.head_count"), 1, MAX_HEADS)
    kv_heads = metadata.integer(key("attention.head_count_kv"), 1, heads, default=heads)
    if heads % kv_heads:  # grouped-query attention: each kv head serves the same number of query heads
        raise metadata.error(key("attention.head_count_kv"), f"a count that divides attention.head_count {heads}",
                             metadata.describe(key("attention.head_count_kv")))
    if key("attention.key_length") not in metadata.fields and width % heads:  # the heads split the width
        raise metadata.error(key("embedding_length"), f"a multiple of attention.head_count {heads} (without "
                             "attention.key_length)", metadata.describe(key("embedding_length")))
    head_dim = metadata.integer(key("attention.key_length"), 2, MAX_HEAD_WIDTH, default=width // heads)
    if head_dim % 2:  # rotary positions turn pairs of channels
        raise metadata.error(key("attention.key_length"), "an even head width (rotary positions turn pairs)",
                             metadata.describe(key("attention.key_length")))
    if metadata.integer(key("rope.dimension_count"), 1, MAX_HEAD_WIDTH, default=head_dim) != head_dim:
        raise metadata.error(key("rope.dimension_count"), f"the head width {head_dim} (kvbench's block turns "
                             "every channel of a head)", metadata.describe(key("rope.dimension_count")))
    metadata.integer(key("vocab_size"), 1, MAX_VOCABULARY, default=None)  # transformers' config reads it
    context = metadata.integer(key("context_length"), 1, MAX_CONTEXT)
    window = metadata.integer(key("attention.sliding_window"), 0, context, default=0)
    layers, intermediate = metadata.integer(key("block_count"), 1, MAX_BLOCKS), \
        metadata.integer(key("feed_forward_length"), 1, MAX_FEED_FORWARD)
    return {"family": "llama", "vocab_size": vocabulary_size(metadata), "width": width, "layers": layers,
            "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "intermediate_size": intermediate,
            "max_length": context, "norm_eps": metadata.number(key("attention.layer_norm_rms_epsilon"), MAX_EPSILON),
            "rope_theta": metadata.number(key("rope.freq_base"), MAX_ROTARY_BASE, default=10000.0),
            "qkv_bias": "blk.0.attn_q.bias" in tensor_names, "tie_embeddings": "output.weight" not in tensor_names,
            "window": window or None}  # llama.cpp's converters write 0 for a model without a window


def vocabulary_size(metadata: Metadata) -> int:
    """The number of tokens, once every key transformers builds the tokenizer from is sound: the tokens, the
    merges or the scores they are derived from, the token types, the special tokens and the flags. Counted,
    not read: 49,152 strings cost seconds in Python."""
    metadata.string("tokenizer.ggml.model", TOKENIZERS)
    metadata.string("tokenizer.ggml.pre", default=None)
    metadata.string("tokenizer.chat_template", default=None)
    vocab = metadata.array("tokenizer.ggml.tokens", {"STRING"}, "strings")
    if not 1 <= vocab <= MAX_VOCABULARY:
        raise metadata.error("tokenizer.ggml.tokens", f"from 1 to {MAX_VOCABULARY} tokens", f"{vocab}")
    merges = metadata.array("tokenizer.ggml.merges", {"STRING"}, "strings", required=False)
    if merges is None and "tokenizer.ggml.scores" not in metadata.fields:
        raise metadata.error("tokenizer.ggml.scores", "the scores transformers derives the merges from (the file "
                             "has no tokenizer.ggml.merges)")
    metadata.array("tokenizer.ggml.scores", NUMBERS, "numbers", vocab, required=merges is None)
    metadata.array("tokenizer.ggml.token_type", INTEGERS, "integers", vocab, required=False)
    for name in SPECIAL_TOKENS:
        metadata.integer(f"tokenizer.ggml.{name}", 0, vocab - 1, default=None)
    for name in FLAGS:
        metadata.scalar(f"tokenizer.ggml.{name}", {"BOOL"}, "a BOOL", default=None)
    return vocab
