"""kvbench compare and export of serving records: every measure recomputed here from the raw token timestamps
and per-iteration memory of the committed records, and every exported format read back by the consumers
tests/test_export.py uses (schemas, benchadapt, `pytest-benchmark compare`)."""

import copy
import json
import math
import re
import statistics
import subprocess
import warnings
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from test_export import PYTEST_BENCHMARK, REPOSITORY, export, schema

from kvbench.cli import main
from kvbench.report.record.serving import plain

ROOT = Path(__file__).resolve().parents[1]
CHAT = ROOT / "results" / "serving" / "llama-mini-chat-16.json"  # static, paged under 5.7 MiB
MAX_LENGTH = ROOT / "results" / "serving" / "llama-mini-chat-16-max-length.json"  # the same trace, static at max_length
PEER = ROOT / "results" / "serving" / "llama-mini-chat-16-peer.json"  # paged and hf-continuous
CASE = "llama-mini,serving=chat,arrivals=all,budget=5996544,reserve=request"


def truth(path: Path) -> dict[str, dict[str, list[float]]]:
    """kind -> measure -> per-rotation values, from the raw replay in the record (not kvbench's figures)."""
    record = json.loads(path.read_text())
    out = {}
    for kept in record["samples"]:
        if kept["mode"] not in record["kinds"]:
            continue  # the A/A control's replays
        requests, iterations = kept["replay"]["requests"], kept["replay"]["iterations"]
        makespan = max(r["token_times"][-1] for r in requests)
        tokens = sum(len(r["token_times"]) for r in requests)
        found = {"output_tokens_per_second": tokens / makespan, "requests_per_second": len(requests) / makespan}
        per_request = {
            "ttft": [r["token_times"][0] - r["arrival"] for r in requests],
            "tpot": [(r["token_times"][-1] - r["token_times"][0]) / (len(r["token_times"]) - 1)
                     for r in requests if len(r["token_times"]) > 1],
            "itl": [b - a for r in requests for a, b in zip(r["token_times"], r["token_times"][1:])],
            "e2e": [r["token_times"][-1] - r["arrival"] for r in requests]}
        for name, values in per_request.items():
            found.update({f"{name}_p{level}": float(np.percentile(values, level)) for level in (50, 90, 99)})
        if iterations:
            times = [0.0] + [it["time"] for it in iterations]
            weights = np.diff(times)
            used = float(np.dot(weights, [it["used"] for it in iterations]))
            reserved = float(np.dot(weights, [it["reserved"] for it in iterations]))
            found.update(waste=1 - used / reserved, preemptions=sum(it["preempted"] for it in iterations))
        for name, value in found.items():
            out.setdefault(kept["mode"], {}).setdefault(name, []).append(value)
    return out


@pytest.fixture(scope="module")
def chat_truth():
    return truth(CHAT)


def run_main(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# -- compare ----------------------------------------------------------------------------------------------


def scaled_record(tmp_path: Path, factor: float) -> Path:
    """The chat record with every timestamp multiplied by `factor`: the same replays, `factor` times as slow."""
    record = json.loads(CHAT.read_text())
    for kept in record["samples"]:
        for request in kept["replay"]["requests"]:
            request["token_times"] = [t * factor for t in request["token_times"]]
            request["arrival"] *= factor
            request["admitted"] *= factor
        for it in kept["replay"]["iterations"]:
            it["time"] *= factor
    path = tmp_path / f"scaled-{factor}.json"
    path.write_text(json.dumps(record))
    return path


def test_compare_lines_up_every_measure_with_its_interval_and_ratio(capsys, tmp_path, chat_truth):
    """NEW's replays at half the speed: throughput halves, every latency doubles, waste and preemptions stay."""
    slower = scaled_record(tmp_path, 2.0)
    code, out, err = run_main(capsys, "compare", CHAT, slower, "--format", "markdown")
    assert code == 0, err
    out = out.replace("\\", "")  # markdown's escapes
    rows = {tuple(cell.strip() for cell in line.strip("|").split("|")[:2]): line
            for line in out.splitlines() if line.startswith("| static") or line.startswith("| paged")}
    names = ["output tok/s", "req/s",
             *(f"{f} p{level}" for f in ("TTFT", "TPOT", "ITL", "E2E") for level in (50, 90, 99)), "waste",
             "preemptions"]
    assert set(rows) == {(kind, name) for kind in ("static", "paged") for name in names}
    for kind in ("static", "paged"):
        values = chat_truth[kind]
        tokens = rows[(kind, "output tok/s")]
        median, low, high = statistics.median(values["output_tokens_per_second"]), \
            *sorted(values["output_tokens_per_second"])[::2]
        assert f"| {plain(median, 4)} [{plain(low, 4)}, {plain(high, 4)}] |" in tokens  # three rotations: the range
        assert "| 0.500x [" in tokens and tokens.rstrip(" |").endswith("worse")
        tpot = statistics.median(values['tpot_p99'])
        assert tpot < 1 and f"| {plain(tpot * 1e3)} ms [" in rows[(kind, "TPOT p99")]  # in ms, as its size reads
        assert "| 2.000x [" in rows[(kind, "TPOT p99")] and "| 2.000x [" in rows[(kind, "E2E p50")]
        assert "| 1.000x [" in rows[(kind, "waste")] and "within noise" in rows[(kind, "waste")]
    assert "| 0 [0, 0] | 0 [0, 0] | +0 (NEW - OLD) |" in rows[("static", "preemptions")]
    assert "| 14 [14, 14] | 14 [14, 14] | 1.000x [" in rows[("paged", "preemptions")]
    code, out, err = run_main(capsys, "compare", CHAT, slower, "--fail-on-regression")
    assert code == 1 and "kvbench: regression:" in err and "output tok/s" in out


def test_compare_of_the_same_record_is_unchanged_and_text_shows_both_kinds(capsys):
    code, out, err = run_main(capsys, "compare", CHAT, CHAT, "--fail-on-regression")
    assert code == 0, err
    assert "environment: identical" in out and out.count("1.000x") == 15 + 16  # every measure but static's zero preemptions
    assert "worse" not in out and "better" not in out


def test_compare_refuses_other_work_unless_forced_and_other_records(capsys):
    code, _, err = run_main(capsys, "compare", CHAT, MAX_LENGTH)
    assert code == 2 and len(err.splitlines()) == 1 and "replayed a different KV budget" in err and "--force" in err
    code, out, _ = run_main(capsys, "compare", CHAT, MAX_LENGTH, "--force")
    assert code == 0 and "92.2%" in out  # static reserving max_length wastes most of what it reserves
    code, _, err = run_main(capsys, "compare", CHAT, ROOT / "results" / "reference.json")
    assert code == 2 and len(err.splitlines()) == 1 and "is not a serving record" in err
    code, out, err = run_main(capsys, "compare", CHAT, PEER, "--force", "--pair", "hf-continuous=static")
    assert code == 0, err
    assert "hf-continuous (OLD static)" in out and "skipped (not in both records)" not in out


# -- export -----------------------------------------------------------------------------------------------


def test_bmf_and_the_action_carry_every_measure_with_its_unit_and_interval(capsys, tmp_path, chat_truth):
    bmf, _ = export(capsys, tmp_path, "bmf", CHAT)
    jsonschema.validate(bmf, schema("bmf.schema.json"))
    actions, _ = export(capsys, tmp_path, "github-action-benchmark", CHAT)
    jsonschema.validate(actions, schema("github-action-benchmark.schema.json"))
    by_name = {entry["name"]: entry for entry in actions}
    assert len(by_name) == len(actions)
    bigger_document, _ = export(capsys, tmp_path, "github-action-benchmark-bigger-is-better", CHAT)
    jsonschema.validate(bigger_document, schema("github-action-benchmark.schema.json"))
    bigger = {entry["name"]: entry for entry in bigger_document}
    for kind, values in chat_truth.items():
        cell = f"kvbench/{CASE}/{kind}/16"
        for name, slug in (("output_tokens_per_second", "output-tokens-per-second"),
                           ("requests_per_second", "requests-per-second"), ("waste", "waste-fraction"),
                           ("preemptions", "preemptions-count")):
            ordered = sorted(values[name])
            assert bmf[cell][slug] == pytest.approx({"value": ordered[1], "lower_value": ordered[0],
                                                     "upper_value": ordered[2]})
        for figure in ("ttft_p99", "tpot_p50", "itl_p90", "e2e_p99"):
            assert bmf[f"{cell}/{figure}"]["latency"]["value"] == pytest.approx(
                statistics.median(values[figure]) * 1e9)
            entry = by_name[f"{cell}/{figure}"]
            assert entry["unit"] == "ms" and entry["value"] == pytest.approx(statistics.median(values[figure]) * 1e3)
        assert f"{cell}/output_tokens_per_second" not in by_name  # bigger is better: the other document's
        for name, unit in (("output_tokens_per_second", "tokens/s"), ("requests_per_second", "requests/s")):
            entry = bigger[f"{cell}/{name}"]
            assert entry["unit"] == unit and entry["value"] == pytest.approx(statistics.median(values[name]))
        waste = by_name[f"{cell}/waste"]
        assert waste["unit"] == "fraction" and waste["value"] == pytest.approx(statistics.median(values["waste"]))
    paged = bmf[f"kvbench/{CASE}/paged/16"]["speedup"]  # output throughput over static's, as the report prints it
    assert paged["lower_value"] < paged["value"] < paged["upper_value"]
    assert paged["value"] == pytest.approx(statistics.median(
        np.array(chat_truth["paged"]["output_tokens_per_second"]) /
        np.array(chat_truth["static"]["output_tokens_per_second"])), rel=0.2)


def test_conbench_results_pass_benchadapt_with_throughputs_in_items_per_second(capsys, tmp_path, chat_truth):
    from benchadapt import BenchmarkResult

    document, _ = export(capsys, tmp_path, "conbench", CHAT, extra=("--repository", REPOSITORY))
    server = schema("conbench-result.schema.json")
    for result in document:
        jsonschema.validate(result, server)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert BenchmarkResult(**copy.deepcopy(result)).to_publishable_dict() == result
    by_case = {(r["tags"]["mode"], r["tags"].get("figure")): r for r in document}
    for kind, values in chat_truth.items():
        throughput = by_case[(kind, "output_tokens_per_second")]["stats"]
        assert throughput["unit"] == "i/s" and sorted(throughput["data"]) == pytest.approx(
            sorted(values["output_tokens_per_second"]))
        ttft = by_case[(kind, "ttft_p99")]["stats"]
        assert ttft["unit"] == "s" and sorted(ttft["data"]) == pytest.approx(sorted(values["ttft_p99"]))
        info = by_case[(kind, None)]["info"]
        assert info["waste"] == pytest.approx(statistics.median(values["waste"])) and info["waste_unit"] == "fraction"
        assert info["preemptions"] == statistics.median(values["preemptions"]) and info["preemptions_unit"] == "count"


@pytest.mark.skipif(not Path(PYTEST_BENCHMARK).exists(), reason="pytest-benchmark is in the dev extra")
def test_pytest_benchmark_compare_prints_each_latency_series_median(capsys, tmp_path, chat_truth):
    document, output = export(capsys, tmp_path, "pytest-benchmark", CHAT)
    done = subprocess.run([PYTEST_BENCHMARK, "compare", str(output), "--columns=median,rounds", "--name=long",
                           "--time-unit=ms", "--group-by=group"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "Failed to load" not in done.stdout + done.stderr, done.stderr
    for kind, values in chat_truth.items():
        for figure in ("ttft_p50", "tpot_p99", "itl_p99", "e2e_p90"):
            name = f"kvbench/{CASE}::{figure}[{kind}-16]"
            line = next((line for line in done.stdout.splitlines() if name in line), None)
            assert line is not None, f"{name} missing from:\n{done.stdout}"
            numbers = [float(n.replace(",", "")) for n in
                       re.findall(r"(?<![\w.\[-])[0-9][0-9,]*\.?[0-9]*(?![\w\]-])", line.split(name, 1)[1])]
            assert any(math.isclose(n, statistics.median(values[figure]) * 1e3, rel_tol=1e-3) for n in numbers)
        (decode,) = [b for b in document["benchmarks"] if b["name"] == f"decode[{kind}-16]"]
        assert decode["extra_info"]["output_tokens_per_second_unit"] == "tokens/s"
        assert decode["extra_info"]["output_tokens_per_second"] == pytest.approx(
            statistics.median(values["output_tokens_per_second"]))
