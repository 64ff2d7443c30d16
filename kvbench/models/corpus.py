"""The real text a trained model reads: a fixed English corpus shipped with kvbench, and its token ids.

The corpus is the licence texts every Debian system carries under /usr/share/common-licenses
(package base-files 12.4+deb12u11), twelve of them in a fixed order, each headed by its name:
about 191,000 characters, 40,000+ tokens of SmolLM2's tokenizer. Why these: each licence allows
verbatim copies (GPL: "Everyone is permitted to copy and distribute verbatim copies of this
license document"), so kvbench can ship them; anyone can check the text byte for byte against
their own Debian system (scripts/make_corpus.py rebuilds the shipped file); and they are long,
plain English prose, not code. What they are not: varied. Legal English repeats itself (GPL-2
and LGPL-2.1 share whole sections), so a model copying from its context does well on them,
which makes a cache that loses the context show up plainly.

The text is checked against its sha256 on every read: token ids from a changed corpus would
silently change every figure measured on it.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
from pathlib import Path

CORPUS_PATH = Path(__file__).parents[1] / "data" / "common-licenses.txt.gz"  # kvbench/data, beside the presets
NAME = "debian-common-licenses"
LICENCE = "each text's own licence, all allowing verbatim copies (Debian base-files 12.4+deb12u11)"
TEXTS = ("GPL-3", "Apache-2.0", "MPL-2.0", "GFDL-1.3", "LGPL-2.1", "Artistic", "CC0-1.0", "GPL-2", "MPL-1.1",
         "GPL-1", "LGPL-3", "BSD")
SHA256 = "269bf3e2f3579739c18f4517d6b424b946aa7b7635a71b0fff208ee8479fc5bf"  # of the text, as UTF-8


def corpus_text() -> str:
    """The whole corpus, checked against SHA256."""
    text = gzip.decompress(CORPUS_PATH.read_bytes()).decode("utf-8")
    digest = hashlib.sha256(text.encode()).hexdigest()
    if digest != SHA256:
        raise ValueError(f"{CORPUS_PATH}: expected text of sha256 {SHA256}, got {digest}")
    return text


def describe() -> dict:
    """The record's account of where the token ids came from."""
    return {"name": NAME, "sha256": SHA256, "texts": list(TEXTS), "licence": LICENCE}


def corpus_ids(tokenizer, batch: int, length: int):
    """Token ids (B, length) of the corpus: sequence b is the b-th run of `length` consecutive tokens, so a
    shorter length gives a prefix of a longer one. `tokenizer` turns text into ids (encode(text) -> list)."""
    import torch

    tokens = corpus_tokens(tokenizer)
    needed = batch * length
    if needed > len(tokens):
        raise ValueError(f"the corpus holds {len(tokens)} tokens, expected at least batch x length = {batch} x "
                         f"{length} = {needed}")
    return torch.tensor(tokens[:needed], dtype=torch.long).view(batch, length)


@functools.lru_cache(maxsize=4)
def corpus_tokens(tokenizer) -> tuple[int, ...]:
    """The whole corpus's token ids through `tokenizer`, encoded once per tokenizer (a run reads them for its ids,
    its quality text and its needle's filler: tens of thousands of tokens each time otherwise)."""
    return tuple(encode(tokenizer, corpus_text()))


def encode(tokenizer, text: str) -> list[int]:
    """The ids of `text`, without the special tokens a tokenizer would add around it (a `tokenizers.Tokenizer`
    returns an Encoding, a transformers tokenizer the ids)."""
    encoded = tokenizer.encode(text, add_special_tokens=False)
    return list(getattr(encoded, "ids", encoded))
