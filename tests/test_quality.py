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
    full = torch.nn.functional.cross_entropy(reference[0, :-1], piece[1:], reduction="none")
    found = {"nll": float(nll.mean()), "reference_nll": float(full.mean()), "kl": float(kl.mean()),
             "kl_max": float(kl.max()),
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


def test_token_nll_matches_a_float64_reference_on_a_full_size_vocabulary():
    """float32's cross-entropy over 49,152 classes in the (B, V, T) layout read about 7e-5 nats a token low
    here (1e-4 on SmolLM2's logits): the mean must agree with float64's log-softmax to 1e-7."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 128, 49152, generator=generator) * 4
    ids = torch.randint(0, 49152, (1, 128), generator=generator)
    reference = -torch.log_softmax(logits.double(), dim=-1)[0, :-1].gather(1, ids[0, 1:, None])[:, 0]
    nll = quality.token_nll(logits, ids)
    assert nll.shape == (1, 127)
    assert float(nll.mean()) == pytest.approx(float(reference.mean()), abs=1e-7)
    assert torch.allclose(nll[0].double(), reference, atol=1e-9, rtol=0)


def test_each_mode_records_what_its_cache_held_after_a_chunk(measured):
    """30-token chunks with G = R = 4: 24 positions quantized (4 * ((30 - 4) // 4)), in the bytes the formula says."""
    from kvbench.modes import expected_bytes

    int4 = next(row for row in measured["modes"] if row["mode"] == "quantized-int4")
    assert int4["quantized_positions"] == 24
    assert int4["cache_bytes"] == expected_bytes("quantized-int4", CONFIG, 1, 30, group_size=4, residual=4)
    assert all("quantized_positions" not in row for row in measured["modes"] if row["mode"] != "quantized-int4")


def quality_report(make_record, quality):
    record = make_record({("full", 8): [1.0, 1.1, 1.2], ("concat", 8): [0.5, 0.6, 0.5]}, config=CONFIG.to_dict())
    record["quality"] = quality
    validate_record(record)
    return build_report(RecordView(record, "r.json"))


def test_a_quantized_kind_whose_chunks_sat_in_its_residual_is_marked(make_record, measured):
    """The same figures had the run kept the default residual of 128: 30-token chunks quantize nothing."""
    import copy

    from kvbench.report.record import columns

    quality = copy.deepcopy(measured)
    quality["options"] = {}
    for row in quality["modes"]:
        row.pop("quantized_positions", None)  # a record from before the count: kvbench's rule says 0
    report = quality_report(make_record, quality)
    int4 = next(row for row in report.quality if row.mode == "quantized-int4")
    assert (int4.quantized, int4.held, int4.marks) == (0, 30, ("unquantized",))
    page = markdown.render_report(report)
    assert "| quantized-int4 |" in page and "| 0 of 30 | ∅ |" in page
    assert columns.unquantized_sentences(report) == [
        "quantized-int4's quality on text held 0 of each 30-token chunk quantized (0%), so its perplexity and KL there "
        "are mostly float's"]
    assert "24 of 30" in markdown.render_report(quality_report(make_record, measured))


def test_the_bytes_against_drift_plot_uses_the_quality_kl_and_says_so(make_record, measured):
    """Not the gate's KL on the timed ids (1e-11 inside a residual): each kind's KL on the text, at its bytes after
    a chunk."""
    from matplotlib.figure import Figure

    from kvbench.report.record import plots
    from kvbench.report.record.quality import label_of

    report = quality_report(make_record, measured)
    ax = Figure().subplots()
    plots.panel_tradeoff(ax, report)
    drawn = {line.get_label(): tuple(line.get_xydata()[0]) for line in ax.get_lines()}
    for row in measured["modes"][1:]:
        label = label_of(row)
        assert drawn[label][1] == pytest.approx(max(row["kl_mean"], 1e-12))
    int4 = next(row for row in measured["modes"] if row["mode"] == "quantized-int4")
    assert drawn["quantized-int4"][0] == pytest.approx(int4["cache_bytes"] / (2 * CONFIG.layers * CONFIG.kv_heads * 30
                                                                              * CONFIG.head_dim * 4))
    assert "on text" in ax.get_ylabel() and "30-token" in ax.get_title()


def test_a_peer_measured_with_other_cache_settings_is_said_to_describe_other_work(make_record, measured):
    """transformers' int4 cache beside kvbench's int4 with another residual is other work: the note says so."""
    import copy

    quality = copy.deepcopy(measured)
    peer = {**copy.deepcopy(next(row for row in quality["modes"] if row["mode"] == "quantized-int4")),
            "mode": "hf-quantized-int4"}
    quality["modes"].append(peer)
    quality["options"]["hf-quantized-int4"] = {"group_size": 32, "residual": 128}
    note = quality_report(make_record, quality).quality_note
    assert ("hf-quantized-int4 ran with group 32 and residual 128, quantized-int4 beside it with group 4 and "
            "residual 4: not the same cache settings, not the same work") in note
    quality["options"]["hf-quantized-int4"] = dict(OPTIONS["quantized-int4"])
    assert "not the same cache settings" not in quality_report(make_record, quality).quality_note


def test_the_real_model_page_sets_transformers_int4_beside_kvbenchs_with_the_settings_each_ran_with():
    """docs/real-model.md's peer paragraphs, from the committed records: the run with transformers' defaults
    (residual 128) is said to be other work; the run with kvbench's G = R = 16 is not."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("real_model_docs", root / "scripts" / "real_model_docs.py")
    docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(docs)
    beside = root / "results/real/quality-quantized.json"
    defaults = docs.peer_block(root / "results/real/quality-hf-int4.json", beside)
    assert "ran with group 32 and residual 128, not those of kvbench's quantized-int4" in defaults
    assert "(group 16 and residual 16): other settings, other work" in defaults
    matched = docs.peer_block(root / "results/real/quality-hf-int4-g16.json", beside)
    assert "ran with group 16 and residual 16, the settings of kvbench's quantized-int4" in matched
    assert "--quant-group 16 --quant-residual 16" in matched


def test_the_progress_callback_counts_every_chunk_and_greedy_text_without_changing_a_figure(model, ids, measured):
    """Full's 3 chunks and its text, then per run the same: int4, the window without its sinks and with them."""
    events = []
    found = quality.measure(model, ids, ["full", "quantized-int4", "window"], Digits(), OPTIONS, chunks=3, prompt=6,
                            generate=8, on_progress=lambda *event: events.append(event))
    assert [done for done, _, _ in events] == list(range(1, 17)) and {total for _, total, _ in events} == {16}
    per_run = ["chunk 1 of 3", "chunk 2 of 3", "chunk 3 of 3", "greedy text"]
    assert [what for _, _, what in events] == [f"{mode} {step}" for mode in
                                               ["full", "quantized-int4", "window", "window"] for step in per_run]
    assert found == measured


def test_a_compressing_kind_is_scored_from_the_last_position_of_its_chunks_first_half():
    assert [quality.scored_from("knorm", length) for length in (2, 3, 16, 17)] == [0, 0, 7, 7]
    assert quality.scored_from("static", 16) == 0


def test_step_logits_predict_from_the_first_position_on_unless_told_a_prompt(model, ids):
    chunk = ids[:, :12]
    with torch.inference_mode():
        full = model(chunk)[0].float()
    logits, held = quality.step_logits(model, chunk, "static", None)
    assert logits.shape == full.shape and held["cache_bytes"] > 0
    torch.testing.assert_close(logits, full, atol=1e-5, rtol=1e-5)
    from_fifth, _ = quality.step_logits(model, chunk, "static", None, prompt=5)
    torch.testing.assert_close(from_fifth, full[:, 4:], atol=1e-5, rtol=1e-5)
