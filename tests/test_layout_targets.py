"""scripts/layout_targets.py: the README's layout targets come from records, checked here on known numbers."""

import importlib.util
import json
from pathlib import Path

import pytest
from records import synthetic_record, view

from kvbench.cache import expected_cache_bytes
from kvbench.config import DecoderConfig, PlainConfig
from kvbench.kinds import quantized_cache_bytes

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("layout_targets", ROOT / "scripts" / "layout_targets.py")
layout_targets = importlib.util.module_from_spec(spec)
spec.loader.exec_module(layout_targets)


WINDOW_CONFIG = {**DecoderConfig(window=256).to_dict()}


def records(static_medium=0.6, paged_medium=0.65, static_seed=1.0, static_long=1.2, int4=1.5, window_long=1.1):
    concat = 1.0
    seed = synthetic_record({("concat", 1024): [concat] * 3, ("static", 1024): [static_seed] * 3,
                             ("paged", 1024): [1.02] * 3})
    long = synthetic_record({("static", 64): [64 / 1024] * 3, ("static", 2048): [2 * static_long] * 3})
    medium = synthetic_record({("concat", 2048): [concat] * 3, ("static", 2048): [static_medium] * 3,
                               ("paged", 2048): [paged_medium] * 3}, preset="medium")
    quantized = synthetic_record({("static", 1024): [1.0] * 3, ("quantized-int8", 1024): [1.3] * 3,
                                  ("quantized-int4", 1024): [int4] * 3}, preset="medium")
    window = synthetic_record({("static", 256): [0.2] * 3, ("window", 256): [0.256] * 3,
                               ("static", 1024): [1.0] * 3, ("window", 1024): [1.024 * window_long] * 3},
                              config=WINDOW_CONFIG, preset="medium")
    kinds = synthetic_record({("static", 1024): [1.0] * 3, ("quantized-int8", 1024): [1.3] * 3,
                              ("quantized-int4", 1024): [1.5] * 3})
    return {"seed": view(seed, "seed.json"), "seed-long": view(long, "seed-long.json"), "medium": view(medium, "medium.json"),
            "medium-quantized": view(quantized, "medium-quantized.json"),
            "medium-window": view(window, "medium-window.json"), "seed-kinds": view(kinds, "seed-kinds.json")}


EXTERNAL = {"source": "hf.json", "preset": "seed", "length": 1024, "fastest_kvbench_mode": "paged", "fastest_hf_mode": "hf-gpt2-dynamic",
            "ratio_fastest_kvbench_to_fastest_hf": 0.3, "transformers_version": "5.0",
            "per_token_median_us": {"paged": 300.0, "hf-gpt2-dynamic": 1000.0},
            "repetitions": [{"mode": mode, "length": 1024, "repetition": r, "order": 0, "seconds": seconds}
                            for r in range(3) for mode, seconds in (("paged", 0.3), ("hf-gpt2-dynamic", 1.0))]}


QUANTIZED = {"source": "hfq.json", "config": PlainConfig.from_preset("medium").to_dict(), "length": 1024, "optimum_quanto_version": "0.2.7",
             "per_token_median_us": {"static": 1000.0, "quantized-int4": 1500.0, "hf-gpt2-quanto-int4": 2000.0,
                                     "hf-llama-quanto-int4": 2500.0, "hf-gpt2-quanto-int2": 1900.0},
             "checks": {"static": {"passed": True}, "quantized-int4": {"kl_mean": 1e-7, "top1_agreement": 0.99},
                        "hf-gpt2-quanto-int4": {"kl_mean": 1e-6, "top1_agreement": 0.98},
                        "hf-llama-quanto-int4": {"kl_mean": 1e-5, "top1_agreement": 0.9},
                        "hf-gpt2-quanto-int2": {"kl_mean": 1e-4, "top1_agreement": 0.8}},
             "repetitions": [{"mode": mode, "length": 1024, "repetition": r, "order": 0, "seconds": seconds}
                             for r in range(3) for mode, seconds in (("quantized-int4", 1.5), ("hf-gpt2-quanto-int4", 2.0),
                                                                     ("hf-llama-quanto-int4", 2.5),
                                                                     ("hf-gpt2-quanto-int2", 1.9))]}


def test_representation_targets_from_bytes_and_per_token_medians():
    rows = {name: (estimate, bound) for name, estimate, bound in layout_targets.representation_targets(records(), QUANTIZED)}
    config = DecoderConfig()
    float_bytes = expected_cache_bytes(config, 1, 1024)
    int8_bytes, bound = rows["medium, T=1024: quantized-int8 bytes / float32 bytes"]
    assert int8_bytes.ratio == pytest.approx(quantized_cache_bytes(config, 1, 1024, 8) / float_bytes) and bound == 0.40
    assert int8_bytes.ratio == pytest.approx(0.412, abs=1e-3)  # D = 8: value scales cost more than on medium
    assert rows["medium, T=1024: quantized-int4 / static per token"][0].ratio == pytest.approx(1.5)
    assert rows["medium, W=256: window per token at T=1024 / at T=256"][0].ratio == pytest.approx(1.1)
    assert rows["medium, W=256: window bytes at T=1024 / at T=256"][0].ratio == 1.0  # the ring keeps W positions
    # against transformers' int4 paths only (same bits per element), the faster of them
    (name,) = [name for name in rows if "transformers" in name]
    assert "hf-gpt2-quanto-int4" in name and rows[name][0].ratio == pytest.approx(0.75)


def test_a_quantized_kind_beyond_twice_static_says_no():
    text = layout_targets.block(records(int4=2.5), EXTERNAL, QUANTIZED)
    assert "| medium, T=1024: quantized-int4 / static per token | 2.50 | [2.50, 2.50] | <= 2.00 | **no** |" in text
    assert "| medium, T=1024: quantized-int8 bytes / float32 bytes | 0.41 | exact | <= 0.40 | **no** |" in text


def test_targets_are_ratios_of_per_token_medians():
    rows = {name: (estimate, bound) for name, estimate, bound in layout_targets.targets(records(), EXTERNAL)}
    static, bound = rows["medium, T=2048: static / concat"]
    assert static.ratio == pytest.approx(0.6) and bound == 0.70
    assert static.low == pytest.approx(0.6) and static.high == pytest.approx(0.6)  # identical samples: no spread
    assert rows["medium, T=2048: paged / concat"][0].ratio == pytest.approx(0.65)
    assert rows["seed, T=1024: paged / concat"][0].ratio == pytest.approx(1.02)
    # per token: (2 * 1.2 / 2048) / ((64 / 1024) / 64) = 1.2
    assert rows["seed: static per token at T=2048 / at T=64"][0].ratio == pytest.approx(1.2)
    assert rows["seed, T=1024: fastest cached (paged) / transformers (hf-gpt2-dynamic)"][0].ratio == pytest.approx(0.3)


def test_verdict_reads_the_whole_interval():
    from kvbench.measure.stats import RatioEstimate

    assert layout_targets.verdict(RatioEstimate(0.6, 0.55, 0.68, 7), 0.70) == "yes"
    assert layout_targets.verdict(RatioEstimate(0.8, 0.75, 0.87, 7), 0.70) == "**no**"
    assert layout_targets.verdict(RatioEstimate(0.65, 0.6, 0.75, 7), 0.70) == "undecided, point within"
    assert layout_targets.verdict(RatioEstimate(0.75, 0.6, 0.9, 7), 0.70) == "undecided, point beyond"


def test_a_missed_target_says_no():
    text = layout_targets.block(records(static_medium=0.8, static_long=1.5), EXTERNAL, QUANTIZED)
    assert "| medium, T=2048: static / concat | 0.80 | [0.80, 0.80] | <= 0.70 | **no** |" in text
    assert "| seed: static per token at T=2048 / at T=64 | 1.50 | [1.50, 1.50] | <= 1.30 | **no** |" in text


def test_a_cell_that_failed_the_gate_is_not_a_target_value():
    bad = records()
    bad["medium"] = view(synthetic_record({("concat", 2048): [1.0] * 3, ("static", 2048): [0.5] * 3,
                                           ("paged", 2048): [0.5] * 3}, failed={("static", 2048)}))
    with pytest.raises(ValueError, match="static at length 2048 failed the equivalence gate"):
        layout_targets.targets(bad, EXTERNAL)


def test_main_splices_the_block_and_reports_missing_records(tmp_path, capsys):
    argv = []
    for name, record in records().items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(record.record))
        argv += [f"--{name}", str(path)]
    external = tmp_path / "hf.json"
    external.write_text(json.dumps(EXTERNAL))
    quantized = tmp_path / "hfq.json"
    quantized.write_text(json.dumps(QUANTIZED))
    argv += ["--external-quantized", str(quantized)]
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{layout_targets.BEGIN}\nSTALE CONTENT\n{layout_targets.END}\noutro\n")
    readme.chmod(0o640)
    assert layout_targets.main(["--into", str(readme), *argv, "--external", str(external)]) == 0
    text = readme.read_text()
    assert "STALE CONTENT" not in text and text.startswith("intro\n") and text.endswith("outro\n")
    assert "| medium, T=2048: static / concat | 0.60 | [0.60, 0.60] | <= 0.70 | yes |" in text
    assert f"`{tmp_path / 'medium.json'}`" in text  # the records named are the ones read
    assert readme.stat().st_mode & 0o777 == 0o640  # rewritten atomically, keeping its mode
    (tmp_path / "medium.json").unlink()
    assert layout_targets.main(["--into", str(readme), *argv, "--external", str(external)]) == 2
    assert "medium.json" in capsys.readouterr().err


def test_rows_are_labelled_by_the_preset_each_record_ran_not_by_its_slot():
    """A record given as --medium that ran the seed preset is labelled seed (the script once assumed)."""
    views = records()
    views["medium"] = view(synthetic_record({("concat", 2048): [1.0] * 3, ("static", 2048): [0.6] * 3,
                                             ("paged", 2048): [0.65] * 3}, preset="seed"), "medium.json")
    rows = {name: estimate for name, estimate, _ in layout_targets.targets(views, EXTERNAL)}
    assert "seed, T=2048: static / concat" in rows and "medium, T=2048: static / concat" not in rows
    assert layout_targets.external_preset(QUANTIZED) == "medium"  # no preset named: found by its config
    assert layout_targets.external_preset({"config": {"width": 7}}) == "custom config"
