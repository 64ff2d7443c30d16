"""scripts/layout_targets.py: the README's layout targets come from records, checked here on known numbers."""

import importlib.util
import json
from pathlib import Path

import pytest
from records import synthetic_record, view

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("layout_targets", ROOT / "scripts" / "layout_targets.py")
layout_targets = importlib.util.module_from_spec(spec)
spec.loader.exec_module(layout_targets)


def records(static_medium=0.6, paged_medium=0.65, static_seed=1.0, static_long=1.2):
    concat = 1.0
    seed = synthetic_record({("concat", 1024): [concat] * 3, ("static", 1024): [static_seed] * 3,
                             ("paged", 1024): [1.02] * 3})
    long = synthetic_record({("static", 64): [64 / 1024] * 3, ("static", 2048): [2 * static_long] * 3})
    medium = synthetic_record({("concat", 2048): [concat] * 3, ("static", 2048): [static_medium] * 3,
                               ("paged", 2048): [paged_medium] * 3})
    return {"seed": view(seed, "seed.json"), "seed-long": view(long, "seed-long.json"), "medium": view(medium, "medium.json")}


EXTERNAL = {"source": "hf.json", "length": 1024, "fastest_kvbench_mode": "paged", "fastest_hf_mode": "hf-gpt2-dynamic",
            "ratio_fastest_kvbench_to_fastest_hf": 0.3, "transformers_version": "5.0",
            "per_token_median_us": {"paged": 300.0, "hf-gpt2-dynamic": 1000.0},
            "repetitions": [{"mode": mode, "length": 1024, "repetition": r, "order": 0, "seconds": seconds}
                            for r in range(3) for mode, seconds in (("paged", 0.3), ("hf-gpt2-dynamic", 1.0))]}


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
    from kvbench.stats import RatioEstimate

    assert layout_targets.verdict(RatioEstimate(0.6, 0.55, 0.68, 7), 0.70) == "yes"
    assert layout_targets.verdict(RatioEstimate(0.8, 0.75, 0.87, 7), 0.70) == "**no**"
    assert layout_targets.verdict(RatioEstimate(0.65, 0.6, 0.75, 7), 0.70) == "undecided, point within"
    assert layout_targets.verdict(RatioEstimate(0.75, 0.6, 0.9, 7), 0.70) == "undecided, point beyond"


def test_a_missed_target_says_no():
    text = layout_targets.block(records(static_medium=0.8, static_long=1.5), EXTERNAL)
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
