"""Retrieval (kvbench.workloads.needle): prompts built to the token, both scores checked against the full prefix by
hand on a tiny llama-family model with a byte tokenizer, the safe-ratio rule on numbers made up here; the record
keeps the section and the report renders it (terminal, markdown, HTML with its heat map)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvbench import modes
from kvbench.model import build_model, preset_config
from kvbench.models import corpus
from kvbench.plugins import load_plugin
from kvbench.workloads import needle

CONFIG = preset_config("llama-tiny", max_length=256, rope_scaling=None)
PLUGINS = Path(__file__).resolve().parent / "plugins"


class Bytes:
    """A stand-in tokenizer: a token per UTF-8 byte (llama-tiny's 256 ids)."""

    def encode(self, text, add_special_tokens=False):
        return list(text.encode())

    def decode(self, ids):
        return bytes(ids).decode(errors="replace")


@pytest.fixture(scope="module")
def model():
    return build_model(CONFIG, seed=1)


@pytest.fixture(scope="module")
def kinds():
    """The evicting example (thinned) and a kind taking evict_ratio (oldest), for this module only."""
    before = dict(modes.SPECS)
    load_plugin(PLUGINS / "thinned.py")
    load_plugin(PLUGINS / "oldest.py")
    yield
    for name in [name for name in modes.SPECS if name not in before]:
        modes.unregister(name)


@pytest.fixture(scope="module")
def cells():
    return needle.build_cells(Bytes(), [64, 96], [0, 50, 100], seed=3, max_length=CONFIG.max_length)


@pytest.fixture(scope="module")
def measured(model, cells, kinds):
    return needle.measure(model, Bytes(), cells, [("static", {}), ("thinned", {}), ("oldest", {"evict_ratio": 0.25}),
                                                  ("oldest", {"evict_ratio": 0.5})])


def test_each_context_is_exactly_its_length_with_the_needle_at_its_depth(cells):
    filler = Bytes().encode(corpus.corpus_text())
    assert [(cell.context, cell.depth) for cell in cells] == [(c, d) for c in (64, 96) for d in (0, 50, 100)]
    for cell in cells:
        stated = Bytes().encode(needle.NEEDLE.format(code=cell.code))
        room = cell.context - len(stated)
        assert len(cell.ids) == cell.context and cell.needle_at == round(cell.depth / 100 * room)
        assert list(cell.ids[cell.needle_at:cell.needle_at + len(stated)]) == stated
        assert list(cell.ids[:cell.needle_at]) + list(cell.ids[cell.needle_at + len(stated):]) == filler[:room]
        assert Bytes().decode(cell.question) == needle.QUESTION
        assert Bytes().decode(cell.answer) == f" {cell.code}" and len(cell.code) == 4
    first, last = cells[0], cells[2]  # depth 0: the context's first tokens; 100: its last
    assert first.needle_at == 0 and Bytes().decode(first.ids).startswith(" The secret code is ")
    assert Bytes().decode(last.ids).endswith(f" The secret code is {last.code}.")


def test_a_cells_code_is_its_own_whatever_the_grid():
    alone = needle.build_cells(Bytes(), [96], [50], seed=3)[0]
    grid = needle.build_cells(Bytes(), [64, 96], [0, 50], seed=3)
    assert grid[3].code == alone.code == needle.code_for(3, 96, 50)
    assert needle.code_for(4, 96, 50) != alone.code or needle.code_for(5, 96, 50) != alone.code
    assert len({needle.code_for(0, 1024, depth) for depth in range(0, 101, 5)}) > 15  # drawn, not one value


@pytest.mark.parametrize("contexts, depths, fragment", [
    ([64], [101], "depths must be integers in [0, 100] (percent of the context), got [101]"),
    ([64], [-1, 50], "got [-1, 50]"),
    ([64], [], "got []"),
    ([64], [50.0], "got [50.0]"),
    ([20], [0], "context 20: expected more tokens than the needle's 25, got 20"),
    ([230], [0], "context 230: with the question's 44 tokens and the answer's 5 + 2 generated, expected at most "
                 "max_length 256 positions, got 280 (the longest that fits: 206)"),
])
def test_bad_grids_are_refused_naming_what_was_expected(contexts, depths, fragment):
    with pytest.raises(ValueError) as error:
        needle.build_cells(Bytes(), contexts, depths, seed=0, max_length=256)
    assert fragment in str(error.value)


def test_a_context_longer_than_the_filler_is_refused():
    with pytest.raises(ValueError, match=r"context 64: expected at most 10 filler tokens \(the corpus's\), got 39"):
        needle.build_cells(Bytes(), [64], [0], filler=list(range(10)))


def by_hand(model, cell):
    """Both scores from the full prefix, re-run at every token: the answer's log-probability and the greedy chain."""
    prompt = len(cell.prompt)
    with torch.inference_mode():
        logprobs = torch.log_softmax(model(torch.tensor([cell.prompt + list(cell.answer)]))[0][0].double(), -1)
        chain = torch.tensor([cell.prompt])
        for _ in range(len(cell.answer) + needle.EXTRA):
            chain = torch.cat((chain, model(chain)[0][:, -1:].argmax(-1)), dim=1)
    logprob = sum(float(logprobs[prompt - 1 + j, token]) for j, token in enumerate(cell.answer))
    return logprob, Bytes().decode(chain[0, prompt:].tolist())


def test_full_and_an_exact_kind_score_what_the_full_prefix_gives(model, cells, measured):
    rows = {row["label"]: row for row in measured["modes"]}
    assert list(rows) == ["full", "static", "thinned", "oldest evict_ratio=0.25", "oldest evict_ratio=0.5"]
    for name in ("full", "static"):
        for cell, found in zip(cells, rows[name]["cells"]):
            logprob, generated = by_hand(model, cell)
            assert found["logprob"] == pytest.approx(logprob, abs=1e-4)
            assert found["generated"] == generated
            assert found["correct"] == needle.matches(generated, cell.code)
            assert (found["context"], found["depth"], found["answer"], found["needle_at"]) == (
                cell.context, cell.depth, cell.code, cell.needle_at)
    assert rows["static"]["logprob_difference"]["mean"] == pytest.approx(0, abs=1e-4)
    assert "logprob_difference" not in rows["full"] and "cache_bytes" not in rows["full"]["cells"][0]


def test_an_evicting_kind_compresses_the_context_and_its_answers_move(model, cells, measured):
    rows = {row["label"]: row for row in measured["modes"]}
    for name in ("thinned", "oldest evict_ratio=0.5"):
        assert rows[name]["logprob_difference"]["mean"] != pytest.approx(0, abs=1e-3)
        assert all(found["cache_bytes"] < rows["static"]["cells"][i]["cache_bytes"]
                   for i, found in enumerate(rows[name]["cells"]))
    half, quarter = rows["oldest evict_ratio=0.5"]["cells"], rows["oldest evict_ratio=0.25"]["cells"]
    assert half[0]["cache_bytes"] < quarter[0]["cache_bytes"]


def test_the_two_paths_agree_a_copied_cache_and_the_context_run_twice(model, cells, kinds, monkeypatch):
    """A kvbench kind continues one prefilled cache twice (a copy); a mode that cannot be copied (transformers',
    a compiled step) runs the context again: the same numbers."""
    copied = [needle.answer_scores(model, cell, mode, {}) for cell in cells[:3] for mode in ("static", "thinned")]
    monkeypatch.setattr(needle, "forks", lambda mode: False)
    again = [needle.answer_scores(model, cell, mode, {}) for cell in cells[:3] for mode in ("static", "thinned")]
    for (tokens, logprob, held), (tokens_again, logprob_again, none) in zip(copied, again):
        assert tokens == tokens_again and logprob == pytest.approx(logprob_again, abs=1e-5)
        assert held > 0 and none is None


def test_the_summary_accuracy_and_intervals(measured):
    from kvbench.workloads.quality import interval

    for row in measured["modes"]:
        values = [cell["logprob"] for cell in row["cells"]]
        assert row["correct"] == sum(cell["correct"] for cell in row["cells"])
        assert row["accuracy"] == row["correct"] / 6 and row["logprob"] == interval(values)
    assert measured["contexts"] == [64, 96] and measured["depths"] == [0, 50, 100]
    assert measured["safe_ratios"] == [{"mode": "oldest", "ratios": [0.25, 0.5],
                                        "safe_ratio": needle.safe_ratios(measured["modes"])[0]["safe_ratio"]}]


@pytest.mark.parametrize("generated, correct", [
    (" 7391.", True), ("7391", True), (" 7391 7", True), (" 73910", False), (" 739.1", False), (" code 7391", True),
    (" 1 7391", False), ("", False), (" seven", False)])
def test_the_first_number_generated_is_compared(generated, correct):
    assert needle.matches(generated, "7391") is correct


def row(mode, accuracy, logprob, ratio=None):
    return {"mode": mode, "options": {} if ratio is None else {"evict_ratio": ratio}, "accuracy": accuracy,
            "logprob": {"mean": logprob, "low": None, "high": None}}


@pytest.mark.parametrize("rows, safe", [
    # within both limits up to 0.5; 0.75 loses 0.15 nats
    ([row("a", 0.8, -2.0, 0.25), row("a", 0.8, -2.05, 0.5), row("a", 0.8, -2.15, 0.75)], 0.5),
    # 0.5 loses one cell of 20 (5 points); 0.25 is at exactly 0.1 nats, which is allowed
    ([row("a", 0.8, -2.1, 0.25), row("a", 0.75, -2.0, 0.5)], 0.25),
    ([row("a", 0.79, -3.0, 0.25), row("a", 0.5, -2.0, 0.5)], None),  # neither
    ([row("a", 0.9, -1.0, 0.25), row("a", 0.8, -3.0, 0.5), row("a", 0.79, -2.0, 0.75)], 0.75),  # judged alone
])
def test_the_largest_safe_ratio_loses_at_most_a_point_and_a_tenth_of_a_nat(rows, safe):
    found = needle.safe_ratios([row("full", 0.8, -2.0), *rows, row("b", 0.1, -9.0, 0.5), row("static", 0.8, -2.0)])
    assert found == [{"mode": "a", "ratios": sorted(r["options"]["evict_ratio"] for r in rows), "safe_ratio": safe}]


def test_a_window_kind_runs_with_its_window_and_full_without_it(cells):
    windowed = build_model(preset_config("llama-tiny", max_length=256, rope_scaling=None, window=16, sinks=2), seed=1)
    found = needle.measure(windowed, Bytes(), cells[:1], [("window", {})])
    assert [row["label"] for row in found["modes"]] == ["full", "window W=16 K=2"]
    unwindowed = build_model(CONFIG, seed=1)  # the same weights: full's numbers are the unwindowed model's
    assert found["modes"][0]["cells"][0]["logprob"] == pytest.approx(by_hand(unwindowed, cells[0])[0], abs=1e-4)
    held = modes.expected_bytes("window", windowed.config, 1, len(cells[0].prompt))  # W + K positions, not the prompt
    assert found["modes"][1]["cells"][0]["cache_bytes"] == held < modes.expected_bytes("static", CONFIG, 1, 64)


def test_runs_sweep_the_ratios_of_kinds_that_take_them(kinds):
    runs = needle.runs_for(["full", "static", "oldest"], {"oldest": {"evict_ratio": 0.9}}, [0.25, 0.5])
    assert runs == [("full", {}), ("static", {}), ("oldest", {"evict_ratio": 0.25}), ("oldest", {"evict_ratio": 0.5})]
    assert needle.runs_for(["oldest"], {"oldest": {"evict_ratio": 0.9}}) == [("oldest", {"evict_ratio": 0.9})]


def test_the_record_keeps_the_section_and_refuses_one_that_disagrees(make_record, measured, tmp_path):
    import copy
    import json

    from kvbench.record import RecordError, load_record, validate_record, write_record

    record = make_record({("full", 8): [1.0, 1.1, 1.2], ("static", 8): [0.5, 0.6, 0.5]})
    record["needle"] = json.loads(json.dumps(measured))  # what a file holds: tuples become lists
    path = write_record(validate_record(record), tmp_path / "rec.json")
    assert load_record(path)["needle"] == record["needle"]
    for change, fragment in [
            (lambda s: s["modes"][1].update(correct=s["modes"][1]["correct"] + 1), "needle/modes/1/correct: expected"),
            (lambda s: s["modes"][2].update(accuracy=0.5 if s["modes"][2]["accuracy"] != 0.5 else 0.25),
             "needle/modes/2/accuracy: expected"),
            (lambda s: s["modes"][1]["cells"].reverse(), "expected the cells in the first mode's order"),
            (lambda s: s["modes"][0]["cells"].pop(), "needle/modes/0: expected the cells of contexts [64, 96] x "
                                                     "depths [0, 50, 100]"),
            (lambda s: s["safe_ratios"][0].update(mode="snapkv"), "expected one of the modes run"),
            (lambda s: s["modes"][0]["cells"][0].update(depth=101), "needle/modes/0/cells/0/depth"),
            (lambda s: s["modes"][0]["cells"][0].update(answer="12a4"), "needle/modes/0/cells/0/answer")]:
        broken = copy.deepcopy(record)
        change(broken["needle"])
        with pytest.raises(RecordError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
            validate_record(broken)


def test_the_report_shows_the_table_the_grid_and_the_heat_map(make_record, measured):
    from kvbench.record import RecordView, validate_record
    from kvbench.report.record import html, markdown, plots, terminal
    from kvbench.report.record.model import build_report
    from rich.table import Table

    record = make_record({("full", 8): [1.0, 1.1, 1.2], ("static", 8): [0.5, 0.6, 0.5]})
    record["needle"] = measured
    report = build_report(RecordView(validate_record(record), "r.json"))
    text = terminal.render_report(report)
    full = measured["modes"][0]
    assert "retrieval: a needle in the context" in text and "oldest evict_ratio=0.25" in text
    assert f"{full['logprob']['mean']:.3f} [{full['logprob']['low']:.3f}, {full['logprob']['high']:.3f}]" in text
    assert "retrieval by cell" in text and "depth 100%" in text
    assert f"{'✓' if full['cells'][0]['correct'] else '✗'} {full['cells'][0]['logprob']:.2f}" in text
    assert "oldest: of evict_ratio 0.25, 0.5, the largest losing at most 1 point of accuracy and 0.1 nats" in text
    quick = terminal.quick_renderables(report)  # kvbench run's: the summary table, not the grid
    titles = [str(item.title) for item in quick if isinstance(item, Table)]
    assert "retrieval: a needle in the context" in titles and not any("by cell" in title for title in titles)
    page = markdown.render_report(report)
    assert "| thinned |" in page and "| Δ vs full (95% CI) |" in page
    images = plots.render_panels(report)
    assert images["needle"][1] == "image/png" and images["needle"][0][:4] == b"\x89PNG"
    page = html.render_report(report, images)
    assert "Retrieval of the needle per mode" in page and page.count("data:image/png;base64,") == len(images)


def test_a_report_without_the_section_has_no_needle(make_record):
    from kvbench.record import RecordView
    from kvbench.report.record import plots
    from kvbench.report.record.model import build_report

    report = build_report(RecordView(make_record({("full", 8): [1.0, 1.1], ("static", 8): [0.5, 0.6]}), "r.json"))
    assert report.needle is None and "needle" not in plots.render_panels(report)


@pytest.fixture(scope="module")
def packaged():
    """The packaged SmolLM2 file: the CLI refuses --needle without a trained model."""
    import kvbench.models.gguf as kvgguf

    pytest.importorskip("gguf", reason="reading GGUF files needs the gguf extra (make test installs it)")
    try:
        return kvgguf.packaged_path("smollm2-135m")
    except ValueError as error:
        pytest.skip(str(error))


def run_main(capsys, *argv):
    from kvbench.cli import main

    code = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv, fragment", [
    (["--needle", "8192"], "--needle 8192: a context and its question need more than 8192 positions, expected fewer "
                           "than max_length 8192 of model 'smollm2-135m', GGUF file"),
    (["--needle", "64", "--max-length", "64"], "--needle 64: a context and its question need more than 64 positions"),
    (["--needle", "64", "--needle-ratios", "0.5"], "--needle-ratios is read by kinds that take evict_ratio only, and "
                                                   "--modes full,concat,static,paged runs none of them"),
    (["--needle-depths", "50"], "--needle-depths needs --needle in a loop run: they say where --needle hides the needle"),
    (["--needle", "64", "--needle-ratios", "0.5", "--modes", "full,snapkv", "--kv-keep", "128", "--lengths", "256"],
     "--needle-ratios runs each kind at each evict_ratio; --kv-keep 128 gives them a count of positions instead"),
])
def test_a_grid_refused_before_the_model_loads_is_one_line(capsys, tmp_path, packaged, argv, fragment):
    output = tmp_path / "rec.json"
    code, out, err = run_main(capsys, "run", "--model", "smollm2-135m", "--lengths", "8", *argv, "--output", output)
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("kvbench: error: ") and fragment in lines[0], err
    assert out == "" and not output.exists()


def test_a_grid_that_cannot_fit_in_memory_is_refused_before_the_model_loads(capsys, tmp_path, packaged, monkeypatch):
    monkeypatch.setenv("KVBENCH_AVAILABLE_MEMORY", "2GiB")
    code, out, err = run_main(capsys, "run", "--model", "smollm2-135m", "--lengths", "8", "--needle", "1024,4096",
                              "--output", tmp_path / "rec.json")
    assert code == 2 and len(err.splitlines()) == 1 and out == "", err
    assert "a cache and its copy 360.0 MiB, the --needle 4096 prefill 2.7 GiB), but 2.0 GiB of memory is available" in err


@pytest.mark.slow
def test_a_context_that_leaves_the_question_no_room_is_refused_once_the_tokenizer_counts_it(capsys, tmp_path,
                                                                                               packaged):
    output = tmp_path / "rec.json"
    code, out, err = run_main(capsys, "run", "--model", "smollm2-135m", "--needle", "8185", "--lengths", "4",
                              "--output", output, "--no-progress")
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1 and not output.exists(), err
    assert lines[0] == ("kvbench: error: --needle: context 8185: with the question's 11 tokens and the answer's 5 + "
                        "2 generated, expected at most max_length 8192 positions, got 8202 (the longest that fits: "
                        "8175)")


@pytest.mark.slow
def test_kvbench_run_needle_on_the_real_model_then_its_report(capsys, tmp_path, packaged, clean_kinds):
    """A small grid end to end: a ratio sweep of an evicting kind, the record, the HTML page with its heat map."""
    if "oldest" in modes.SPECS:  # kvbench run loads the file afresh, as a new process would
        modes.unregister("oldest")
    output, page = tmp_path / "rec.json", tmp_path / "report.html"
    code, out, err = run_main(capsys, "run", "--model", "smollm2-135m", "--lengths", "4", "--repeats", "1",
                              "--control", "none", "--plugin", PLUGINS / "oldest.py", "--modes", "full,static,oldest",
                              "--needle", "96", "--needle-depths", "0,100", "--needle-ratios", "0.25,0.5",
                              "--output", output, "--no-progress")
    assert code == 0, err
    assert "retrieval: a needle in the context" in out and "oldest evict_ratio=0.5" in out
    from kvbench.record import load_record

    section = load_record(output)["needle"]
    assert [row["label"] for row in section["modes"]] == ["full", "static", "oldest evict_ratio=0.25",
                                                          "oldest evict_ratio=0.5"]
    assert section["contexts"] == [96] and section["depths"] == [0, 100]
    assert [entry["mode"] for entry in section["safe_ratios"]] == ["oldest"]
    full, static = section["modes"][:2]
    assert [cell["logprob"] for cell in static["cells"]] == pytest.approx([cell["logprob"] for cell in full["cells"]],
                                                                          abs=1e-3)
    assert run_main(capsys, "report", output, "--format", "html", "--output", page)[0] == 0
    assert "Retrieval of the needle per mode" in page.read_text()
