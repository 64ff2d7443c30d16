"""What a served request reads and is fed: every request's token ids, drawn before the replay.

Tokens are teacher-forced: request r's ids (its prompt, then its outputs but the last, fed back) are fixed
before the replay by (seed, r), so batching, padding and preemption never change what is computed, only when.
On random weights they are random ids. On a trained model they are runs of the real text the model reads
(kvbench.models.corpus, through its own tokenizer): a random-weight model does not care what its ids say, a
trained one does (its logits, and the drift a lossy kind causes, depend on it), and random ids are text no
trained model was ever shown. A request's run starts at an offset drawn from (seed, r), its outputs are the
text's next tokens; a shared prefix is one run every request that has it begins with.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kvbench.serving.trace import TraceRequest


class TokenSource:
    """Every request's ids (1, prompt + output - 1), seeded by (seed, request): the shared prefix, when a
    request has one, is the same ids for all. With `text` (1-D token ids: the corpus), each is a run of
    consecutive tokens of it, else random ids. With `continuations` (request id -> output ids: the greedy
    continuation a generating peer produces, kvbench.serving.peer), the outputs are those instead."""

    def __init__(self, vocab_size: int, seed: int, prefix: int, continuations: dict[int, list[int]] | None = None,
                 text: Tensor | None = None) -> None:
        if text is not None and (text.dim() != 1 or len(text) < 1):
            raise ValueError(f"text must be 1-D token ids, got shape {tuple(text.shape)}")
        self.vocab_size, self.seed, self.continuations, self.text = vocab_size, seed, continuations, text
        self.prefix = self._draw(prefix, -1) if prefix else None  # key -1: no request's id

    def _draw(self, length: int, key: int) -> Tensor:
        generator = torch.Generator().manual_seed((self.seed * 1_000_003 + key) % 2**63)
        # On the host by the host's generator: the same ids whatever the model's device (the scheduler moves them).
        if self.text is None:
            return torch.randint(0, self.vocab_size, (1, length), generator=generator, device="cpu")
        if length > len(self.text):
            raise ValueError(f"a request needs a run of {length} tokens of the text, which holds {len(self.text)}")
        start = int(torch.randint(0, len(self.text) - length + 1, (1,), generator=generator))
        return self.text[start : start + length].view(1, length).to("cpu", torch.long)

    def ids(self, request: TraceRequest) -> Tensor:
        own = self._draw(request.positions - request.prefix, request.id + 1)
        ids = torch.cat((self.prefix[:, : request.prefix], own), dim=1) if request.prefix else own
        if self.continuations is not None:
            outputs = torch.tensor(self.continuations[request.id][: request.output - 1], dtype=torch.long, device="cpu")
            ids = torch.cat((ids[:, : request.prompt], outputs.view(1, -1)), dim=1)
        return ids

    def prompt(self, request: TraceRequest) -> Tensor:
        """Its prompt ids (1, prompt), the same with or without continuations."""
        return self.ids(request)[:, : request.prompt]

    def describe(self) -> dict:
        return describe_source(self.continuations, self.text is not None)


def describe_source(continuations: dict[int, list[int]] | None, text: bool) -> dict:
    """The record's account of where the ids came from (the corpus's own account is the record's token_ids)."""
    if continuations is not None:
        return {"source": "the full path's greedy continuation of each prompt (kvbench.peer)",
                "ids": {str(request): ids for request, ids in continuations.items()}}
    if text:
        return {"source": "runs of the corpus's token ids, each at an offset seeded by (seed, request)"}
    return {"source": "random ids seeded by (seed, request)"}
