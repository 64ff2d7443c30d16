"""What a lossy cache does to text (kvbench.workloads.quality), on a tiny llama-family model: the figures are checked
against their definitions computed here by hand, and the report renders them from a record."""

from __future__ import annotations

import math

import pytest
import torch

from kvbench.model import build_model, preset_config
from kvbench.record import RecordView, validate_record
from kvbench.report.record import markdown, terminal
from kvbench.report.record.model import build_report
from kvbench.workloads import quality

CONFIG = preset_config("llama-tiny", vocab_size=96, max_length=256, rope_scaling=None, window=12, sinks=2)
OPTIONS = {"quantized-int4": {"group_size": 4, "residual": 4}}


class Digits:
    """A stand-in tokenizer: ids as text."""

    def decode(self, ids):
        return " ".join(str(i) for i in ids)


@pytest.fixture(scope="module")
def model():
    return build_model(CONFIG, seed=1)


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, CONFIG.vocab_size, (1, 3 * 30), generator=torch.Generator().manual_seed(2))


@pytest.fixture(scope="module")
def measured(model, ids):
    return quality.measure(model, ids, ["full", "quantized-int4", "window"], Digits(), OPTIONS, chunks=3, prompt=6,
                           generate=8)


def test_full_perplexity_is_the_exponential_of_its_mean_next_token_nll(model, ids, measured):
    unwindowed = quality.variant(model, window=None, window_pattern=None, sinks=0)
    with torch.inference_mode():
        nll = [torch.nn.functional.cross_entropy(unwindowed(piece[None])[0][0, :-1], piece[1:]) for piece in ids.view(3, -1)]
    full = measured["modes"][0]
    assert full["mode"] == "full" and full["kl_mean"] == 0 and full["top1_agreement"] == 1
    assert full["perplexity"] == pytest.approx(math.exp(sum(float(n) for n in nll) / 3), rel=1e-5)
    assert full["greedy_departure"] is None


def test_greedy_text_is_the_argmax_chain_of_the_full_prefix(model, ids, measured):
    unwindowed = quality.variant(model, window=None, window_pattern=None, sinks=0)
    chain = ids[:, :6].clone()
    with torch.inference_mode():
        for _ in range(8):
            chain = torch.cat((chain, unwindowed(chain)[0][:, -1:].argmax(-1)), dim=1)
    assert measured["modes"][0]["sample"] == Digits().decode(chain[0, 6:].tolist())


def test_lossy_modes_are_measured_against_full_with_an_interval(measured):
    rows = {(row["mode"], row.get("sinks")): row for row in measured["modes"]}
    assert set(rows) == {("full", None), ("quantized-int4", None), ("window", 0), ("window", 2)}
    int4 = rows[("quantized-int4", None)]
    assert 0 < int4["kl_mean"] < 1 and int4["nll_difference"]["low"] <= int4["nll_difference"]["mean"] <= \
        int4["nll_difference"]["high"]
    for sinks in (0, 2):  # the window's perplexity past W, beside full's over the same positions
        window = rows[("window", sinks)]
        assert window["window"] == 12 and window["kl_mean"] > 0
        assert window["full_perplexity_beyond_window"] > 0 and window["perplexity_beyond_window"] > 0
    assert rows[("window", 0)]["kl_mean"] != rows[("window", 2)]["kl_mean"]


def test_first_departure():
    assert quality.first_departure([1, 2, 3], [1, 2, 3]) is None
    assert quality.first_departure([1, 5, 3], [1, 2, 4]) == 1


def test_the_report_shows_the_quality_table_and_the_samples(make_record, measured):
    record = make_record({("full", 8): [1.0, 1.1, 1.2], ("concat", 8): [0.5, 0.6, 0.5]})
    record["quality"] = measured
    validate_record(record)
    report = build_report(RecordView(record, "r.json"))
    text = terminal.render_report(report)
    assert "quality on text" in text and "window W=12 K=2" in text and "greedy departs at" in text
    assert measured["modes"][1]["sample"][:20] in text
    page = markdown.render_report(report)
    assert "| quantized-int4 |" in page and f"{measured['modes'][0]['perplexity']:.3f}" in page


def by_hand(reference, candidate, piece, beyond=None):
    """One chunk's figures from their definitions: NLL of each next token, KL(P_full || P_mode), top-1, diff."""
    p, q = torch.softmax(reference[0], -1), torch.softmax(candidate[0], -1)
    kl = (p * (p.log() - q.log())).sum(-1)
    nll = torch.nn.functional.cross_entropy(candidate[0, :-1], piece[1:], reduction="none")
    found = {"nll": float(nll.mean()), "kl": float(kl.mean()), "kl_max": float(kl.max()),
             "max_abs_diff": float((candidate - reference).abs().max()),
             "top1": float((reference.argmax(-1) == candidate.argmax(-1)).double().mean())}
    return found | ({"nll_beyond": float(nll[beyond:].mean())} if beyond is not None else {})


def t_interval(values, tolerance=1e-9):
    """Mean and 95% t interval of three values (t at 0.975 with 2 degrees of freedom: 4.302652729911275)."""
    mean = sum(values) / 3
    half = 4.302652729911275 * math.sqrt(sum((v - mean) ** 2 for v in values) / 2) / math.sqrt(3)
    return {"mean": pytest.approx(mean, abs=tolerance), "low": pytest.approx(mean - half, abs=tolerance),
            "high": pytest.approx(mean + half, abs=tolerance)}


def test_every_figure_of_a_lossy_mode_by_hand(model, ids, measured):
    """int4 decoded a token a step and the window's full-prefix logits (with and without sinks), against the
    unwindowed forward: each chunk's figures, their means, maxima and the NLL difference's t interval."""
    from kvbench.workloads.decode import decode

    unwindowed = quality.variant(model, window=None, window_pattern=None, sinks=0)
    pieces = ids.view(3, -1)
    with torch.inference_mode():
        references = [unwindowed(piece[None])[0].float() for piece in pieces]
        modes = {("quantized-int4", None): [decode(unwindowed, piece[None], "quantized-int4", keep_logits=True,
                                                   options=OPTIONS).float() for piece in pieces],
                 ("window", 2): [model(piece[None])[0].float() for piece in pieces],
                 ("window", 0): [quality.variant(model, sinks=0)(piece[None])[0].float() for piece in pieces]}
    full = [by_hand(r, r, piece, 12) for r, piece in zip(references, pieces)]
    rows = {(row["mode"], row.get("sinks")): row for row in measured["modes"]}
    assert rows[("full", None)]["chunks"] == [pytest.approx(chunk, abs=1e-6) for chunk in full]
    for key, logits in modes.items():
        beyond = 12 if key[0] == "window" else None
        chunks = [by_hand(r, c, piece, beyond) for r, c, piece in zip(references, logits, pieces)]
        row = rows[key]
        assert row["chunks"] == [pytest.approx(chunk, abs=1e-6) for chunk in chunks], key
        nll = sum(c["nll"] for c in chunks) / 3
        assert row["nll_mean"] == pytest.approx(nll, abs=1e-6) and row["perplexity"] == pytest.approx(math.exp(nll))
        assert row["kl_mean"] == pytest.approx(sum(c["kl"] for c in chunks) / 3, abs=1e-6)
        assert row["kl_max"] == pytest.approx(max(c["kl_max"] for c in chunks), abs=1e-6)
        assert row["max_abs_diff"] == pytest.approx(max(c["max_abs_diff"] for c in chunks), abs=1e-6)
        assert row["top1_agreement"] == pytest.approx(sum(c["top1"] for c in chunks) / 3)
        # float32 NLLs summed in another order: differences of 1e-6 on an interval 0.02 wide
        assert row["nll_difference"] == t_interval([c["nll"] - f["nll"] for c, f in zip(chunks, full)], 1e-5)
        chosen = unwindowed if beyond is None else model if key[1] else quality.variant(model, sinks=0)
        tokens = quality.greedy(chosen, pieces[0, :6][None], key[0], 8, OPTIONS)  # from the first chunk's prompt
        full_tokens = quality.greedy(unwindowed, pieces[0, :6][None], "concat", 8, OPTIONS)
        assert row["sample"] == Digits().decode(tokens), key
        assert row["greedy_departure"] == quality.first_departure(tokens, full_tokens), key
        if beyond is not None:
            assert row["perplexity_beyond_window"] == pytest.approx(math.exp(sum(c["nll_beyond"] for c in chunks) / 3))
            assert row["full_perplexity_beyond_window"] == pytest.approx(
                math.exp(sum(f["nll_beyond"] for f in full) / 3))
        else:
            assert "perplexity_beyond_window" not in row and "window" not in row


def test_the_interval_of_one_two_and_three_chunks():
    assert quality.interval([2.0]) == {"mean": 2.0, "low": None, "high": None}  # one chunk: no interval
    # two chunks: sd sqrt(2), t(0.975, 1) = 12.706204736174698, half = t * sqrt(2) / sqrt(2)
    assert quality.interval([1.0, 3.0]) == {"mean": 2.0, "low": pytest.approx(2 - 12.706204736174698),
                                            "high": pytest.approx(2 + 12.706204736174698)}
    assert quality.interval([1.0, 2.0, 6.0]) == t_interval([1.0, 2.0, 6.0])


def test_the_defaults_measure_four_chunks_from_a_32_token_prompt_48_tokens_long(model):
    ids = torch.randint(0, CONFIG.vocab_size, (1, 4 * 40), generator=torch.Generator().manual_seed(3))
    found = quality.measure(model, ids, ["full"], Digits())
    assert (found["chunks"], found["tokens"], found["prompt"], found["generate"]) == (4, 40, 32, 48)
    assert found["prompt_text"] == Digits().decode(ids[0, :32].tolist()) and found["options"] == {}
    assert len(found["modes"]) == 1 and len(found["modes"][0]["sample"].split()) == 48


def test_greedy_feeds_back_each_token_it_chose(model):
    """A prompt whose greedy chain changes token (81, then 62 on): each step reads the token chosen just before it,
    as the argmax chain of the full prefix does (the fixture's chain repeats one token, which hides a feed of the
    wrong one; fed 81 again, this prompt's chain goes 81, 62, 62, 81, ...)."""
    unwindowed = quality.variant(model, window=None, window_pattern=None, sinks=0)
    prompt = torch.randint(0, CONFIG.vocab_size, (1, 6), generator=torch.Generator().manual_seed(24))
    chain = prompt.clone()
    with torch.inference_mode():
        for _ in range(8):
            chain = torch.cat((chain, unwindowed(chain)[0][:, -1:].argmax(-1)), dim=1)
    tokens = quality.greedy(unwindowed, prompt, "concat", 8, OPTIONS)
    assert tokens == chain[0, 6:].tolist() == [81] + [62] * 7
