"""kvbench.serving.tokens: every request's ids, random or runs of a text, fixed by (seed, request) before a replay."""

from __future__ import annotations

import pytest
import torch

from kvbench.serving.tokens import TokenSource
from kvbench.serving.trace import TraceRequest

TEXT = torch.arange(1000, 1300)  # ids no random draw of a vocabulary of 50 gives: runs of it are told apart


def request(id: int, prompt: int = 6, output: int = 4, prefix: int = 0) -> TraceRequest:
    return TraceRequest(id=id, prompt=prompt, output=output, arrival=0.0, prefix=prefix)


def test_a_request_is_a_run_of_the_text_fixed_by_seed_and_request():
    source = TokenSource(50, 3, 0, text=TEXT)
    ids = source.ids(request(0))[0]
    assert ids.shape == (9,) and ids.dtype == torch.long
    assert ids.tolist() == list(range(int(ids[0]), int(ids[0]) + 9))  # consecutive tokens: the prompt, then its text
    assert TokenSource(50, 3, 0, text=TEXT).ids(request(0)).tolist() == [ids.tolist()]
    starts = {int(TokenSource(50, seed, 0, text=TEXT).ids(request(r))[0, 0]) for seed in range(3) for r in range(3)}
    assert len(starts) > 3  # other seeds and requests start elsewhere
    assert source.prompt(request(0)).tolist() == [ids[:6].tolist()]


def test_a_shared_prefix_is_one_run_of_the_text_every_request_begins_with():
    source = TokenSource(50, 0, 4, text=TEXT)
    first, second = (source.ids(request(r, prompt=8, prefix=4))[0] for r in (0, 1))
    assert first[:4].tolist() == second[:4].tolist() == source.prefix[0].tolist()
    assert first[:4].tolist() == list(range(int(first[0]), int(first[0]) + 4))
    assert first[4:].tolist() != second[4:].tolist()


def test_continuations_replace_the_outputs_and_the_prompt_stays_the_text():
    forced = TokenSource(50, 0, 0, continuations={0: [7, 8, 9]}, text=TEXT)
    plain = TokenSource(50, 0, 0, text=TEXT)
    assert forced.ids(request(0)).tolist() == [plain.ids(request(0))[0, :6].tolist() + [7, 8, 9]]
    assert forced.describe()["ids"] == {"0": [7, 8, 9]}
    assert plain.describe()["source"].startswith("runs of the corpus")
    assert TokenSource(50, 0, 0).describe() == {"source": "random ids seeded by (seed, request)"}


def test_a_run_longer_than_the_text_or_a_text_not_1d_is_a_value_error():
    with pytest.raises(ValueError, match="a request needs a run of 9 tokens of the text, which holds 5"):
        TokenSource(50, 0, 0, text=TEXT[:5]).ids(request(0))
    with pytest.raises(ValueError, match=r"text must be 1-D token ids, got shape \(2, 3\)"):
        TokenSource(50, 0, 0, text=torch.zeros(2, 3, dtype=torch.long))
