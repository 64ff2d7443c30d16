"""kvbench.report.comparison.compare and `kvbench compare`: ranked environment diff, per-cell verdicts, exit codes."""

import copy
import json
import statistics

import pytest
from records import ENVIRONMENT, PASSED_DIFF, machine_probe, scaling_seconds, synthetic_record
from records import noisy as jitter

from kvbench.cli import main
from kvbench.record import RecordView, write_record
from kvbench.report.comparison import compare


def changed_environment(**changes):
    """ENVIRONMENT with {"section.key": value} replaced."""
    env = copy.deepcopy(ENVIRONMENT)
    for path, value in changes.items():
        section, key = path.split(".", 1)
        env[section][key] = value
    return env


def write(tmp_path, name, record):
    return write_record(record, tmp_path / name)


def compare_records(old, new, **options):
    return compare.compare_records(RecordView(old, "OLD"), RecordView(new, "NEW"), **options)


# --- environment and config diff ---------------------------------------------------------

def test_identical_environments_have_no_difference():
    assert compare.environment_diff(ENVIRONMENT, copy.deepcopy(ENVIRONMENT)) == []


def test_environment_diff_is_ranked_critical_notable_informational():
    new = changed_environment(**{
        "system.load_average": [3.0, 2.0, 1.0], "system.memory_available_bytes": 1 << 30,
        "kvbench.git_commit": "b" * 40, "system.cpu_governor": "powersave", "torch.version": "2.14.0+cpu",
        "torch.intra_op_threads": 2, "cpu.flags": ["avx", "avx2", "fma", "avx512f"], "python.version": "3.12.1",
        "torch.debug": True, "torch.git_version": "deadbeef", "cpu.brand": "Other CPU", "torch.cpu_capability": "AVX512",
    })
    new["system"]["some_new_sensor"] = 42  # unknown keys are notable, never dropped
    diffs = compare.environment_diff(ENVIRONMENT, new)
    ranks = {d.key: d.rank for d in diffs}
    assert ranks == {
        "torch.version": "critical", "torch.git_version": "critical", "torch.debug": "critical",
        "torch.intra_op_threads": "critical", "torch.cpu_capability": "critical", "cpu.flags": "critical",
        "cpu.brand": "critical", "python.version": "critical",
        "system.cpu_governor": "notable", "system.some_new_sensor": "notable",
        "system.load_average": "informational", "system.memory_available_bytes": "informational",
        "kvbench.git_commit": "informational",
    }
    order = [d.rank for d in diffs]
    assert order == sorted(order, key=compare.RANKS.index)  # critical first, informational last
    shown = {d.key: (d.old, d.new) for d in diffs}
    assert shown["system.load_average"] == ("[0.25, 0.50, 0.75]", "[3.00, 2.00, 1.00]")
    assert shown["system.memory_available_bytes"] == ("8.0 GiB", "1.0 GiB")


def test_environment_diff_names_the_reason_for_an_unavailable_value():
    new = changed_environment(**{"torch.cpu_capability": None})
    new["unavailable"] = {"torch.cpu_capability": "AttributeError: no get_cpu_capability"}
    (diff,) = compare.environment_diff(ENVIRONMENT, new)
    assert diff.new == "unavailable (AttributeError: no get_cpu_capability)" and diff.rank == "critical"


def test_environment_diff_shows_the_first_differing_line_of_long_text():
    info = ENVIRONMENT["torch"]["parallel_info"].replace("get_num_threads() : 1", "get_num_threads() : 4")
    (diff,) = compare.environment_diff(ENVIRONMENT, changed_environment(**{"torch.parallel_info": info}))
    assert (diff.old, diff.new) == ("at::get_num_threads() : 1", "at::get_num_threads() : 4")


def test_config_diff_ranks_workload_changes_critical_and_statistics_notable():
    old = synthetic_record(scaling_seconds(repeats=5))
    new = synthetic_record(scaling_seconds(repeats=7), config={**old["config"], "dtype": "bfloat16"})
    ranks = {d.key: d.rank for d in compare.config_diff(RecordView(old), RecordView(new))}
    assert ranks["config.dtype"] == "critical"
    assert ranks["run.repeats"] == "notable"
    assert list(ranks)[0] == "config.dtype"


def test_a_record_from_before_workloads_timed_the_loop_like_a_record_that_says_so():
    old = synthetic_record(scaling_seconds(repeats=5))
    old["schema"] = "kvbench.record/2"  # written before the workload was: upgraded on reading
    old["run"].pop("workload", None)
    loop = synthetic_record(scaling_seconds(repeats=5))
    loop["run"]["workload"] = {"kind": "loop"}
    request = synthetic_record(scaling_seconds(repeats=5))
    request["run"]["workload"] = {"kind": "request", "prompt": 8, "generate": 4}
    assert not [d for d in compare.config_diff(RecordView(old), RecordView(loop)) if d.key.startswith("run.workload")]
    ranks = {d.key: d.rank for d in compare.config_diff(RecordView(old), RecordView(request))}
    assert ranks["run.workload.kind"] == "critical" and ranks["run.workload.prompt"] == "critical"


# --- cells --------------------------------------------------------------------------------

def verdicts(result):
    return {(c.mode, c.length): c.verdict for c in result.cells}


def test_identical_records_are_within_noise_everywhere_with_ratio_one():
    record = synthetic_record(scaling_seconds(repeats=15))
    result = compare_records(record, copy.deepcopy(record))
    assert result.environment == [] and result.config == [] and result.skipped == []
    assert set(verdicts(result).values()) == {compare.WITHIN_NOISE}
    for cell in result.cells:
        assert cell.time.ratio == 1.0 and cell.time.low < 1 < cell.time.high
        if cell.mode != "full":
            assert cell.judged_by == "vs full" and cell.relative.ratio == 1.0


def test_a_cached_mode_twice_as_slow_is_the_only_slower_cell_with_its_slowdown_inside_the_interval():
    old = synthetic_record(scaling_seconds(seed=1, repeats=15))
    new = synthetic_record(scaling_seconds(seed=2, repeats=15, slow={("concat", 64): 2.0}))
    result = compare_records(old, new)
    found = verdicts(result)
    assert found.pop(("concat", 64)) == compare.SLOWER
    assert set(found.values()) == {compare.WITHIN_NOISE}  # a different seed's 1 % noise is no change
    (slow,) = result.regressions
    assert slow.judged_by == "vs full" and slow.relative.low < 2.0 < slow.relative.high
    assert slow.relative.mde < 0.10  # 1 % noise, 15 rotations: a few percent are detectable


def test_machine_drift_that_slows_every_loop_and_the_probe_alike_is_not_a_regression(tmp_path, capsys):
    """The whole NEW run sat on a machine 30 % slower, and its machine probe says so: every cell
    moved with the machine, nothing is slower, and --fail-on-regression stays green."""
    base = scaling_seconds(seed=1, repeats=15)
    old = synthetic_record(base, probe=machine_probe(1.0, seed=1))
    new = synthetic_record({key: [s * 1.3 for s in values] for key, values in base.items()},
                           probe=machine_probe(1.3, seed=2))
    result = compare_records(old, new)
    assert all(c.time.ratio == pytest.approx(1.3) for c in result.cells)
    assert result.machine.moved and result.machine.overall.ratio == pytest.approx(1.3, rel=0.01)
    assert result.regressions == [] and result.count(compare.SLOWER) == 0
    for cell in result.cells:
        if cell.mode == "full":
            assert cell.judged_by == "vs machine" and cell.adjusted.ratio == pytest.approx(1.0, abs=0.01)
            assert cell.verdict in (compare.WITHIN_NOISE, compare.UNCHANGED)
        else:  # full did not change once the machine is allowed for, so the ratio to full judges
            assert cell.judged_by == "vs full" and cell.verdict == compare.WITHIN_NOISE
    assert "the machine was 30% slower in NEW" in result.notes[0] and "every cell there moved with the machine" \
        in result.notes[0]
    status = main(["compare", str(write(tmp_path, "old.json", old)), str(write(tmp_path, "new.json", new)),
                   "--fail-on-regression"])
    out = capsys.readouterr().out
    assert status == 0 and "the machine was 30% slower" in out.replace("\n", " ")


def test_without_a_machine_probe_the_same_drift_falls_back_to_time_and_says_so():
    """Records from before the probe cannot tell a slow machine from slow code: full changed, so the
    cached modes are judged by their time (the documented fallback), and every cell says why."""
    base = scaling_seconds(seed=1, repeats=15)
    result = compare_records(synthetic_record(base),
                             synthetic_record({key: [s * 1.3 for s in values] for key, values in base.items()}))
    assert result.machine is None
    assert {c.verdict for c in result.cells} == {compare.SLOWER}
    for cell in result.cells:
        if cell.mode != "full":
            assert cell.judged_by == "time" and any("full changed" in note for note in cell.notes)


def test_full_slower_while_the_probe_did_not_move_is_a_change_in_the_shared_path():
    base = scaling_seconds(seed=1, repeats=15)
    old = synthetic_record(base, probe=machine_probe(1.0, seed=1))
    new = synthetic_record({key: [s * 1.3 for s in values] for key, values in base.items()},
                           probe=machine_probe(1.0, seed=2))
    result = compare_records(old, new)
    assert not result.machine.moved
    assert [c.verdict for c in result.cells if c.mode == "full"] == [compare.SLOWER] * 4
    assert all(c.judged_by == "time" for c in result.cells)
    # every verdict names the quantity it judged: a bare "slower" beside a speedup column reads as inverted
    verdicts = {compare.cell_texts(c)[compare.VERDICT_COLUMN] for c in result.cells}
    assert verdicts == {"slower (time)"}
    assert any("while the machine probe did not: a change in the path every mode shares" in note
               for note in result.notes)


def test_full_slower_than_the_machine_moved_is_still_a_regression():
    """The machine was 20 % slower, but full 60 %: the probe explains only part of it."""
    base = scaling_seconds(seed=1, repeats=15)
    old = synthetic_record(base, probe=machine_probe(1.0, seed=1))
    new = synthetic_record({key: [s * 1.6 for s in values] for key, values in base.items()},
                           probe=machine_probe(1.2, seed=2))
    result = compare_records(old, new)
    assert result.machine.moved
    full = [c for c in result.cells if c.mode == "full"]
    assert all(c.verdict == compare.SLOWER and c.judged_by == "time" for c in full)
    assert any("more than the machine probe did" in note for note in result.notes)


def test_a_change_below_the_factor_is_unchanged_and_one_below_the_mde_is_within_noise():
    old = synthetic_record(scaling_seconds(seed=1, repeats=15))
    small = synthetic_record(scaling_seconds(seed=1, repeats=15, slow={("concat", 32): 1.05}))
    cell = next(c for c in compare_records(old, small).cells if (c.mode, c.length) == ("concat", 32))
    assert cell.relative.ratio == pytest.approx(1.05) and cell.relative.mde < 0.05
    assert cell.verdict == compare.UNCHANGED  # detectable, but within --factor 1.1
    # The same 5 % change under 20 % noise and 7 rotations: the MDE exceeds it, so it is within noise.
    noisy_seconds = {key: jitter(statistics.median(values), 7, 0.2, seed=5 + i)
                     for i, (key, values) in enumerate(scaling_seconds(seed=1, repeats=15).items())}
    noisy_old = synthetic_record(noisy_seconds)
    noisy_new = synthetic_record({key: [s * (1.05 if key == ("concat", 32) else 1.0) for s in values]
                                  for key, values in noisy_seconds.items()})
    cell = next(c for c in compare_records(noisy_old, noisy_new).cells if (c.mode, c.length) == ("concat", 32))
    assert cell.relative.ratio == pytest.approx(1.05) and cell.relative.mde > 0.05
    assert cell.verdict == compare.WITHIN_NOISE and cell.judged_by == "vs full"


def test_the_mde_grows_with_the_noise_and_shrinks_with_the_samples():
    from records import noisy as jitter

    def record(spread, repeats, seed):
        seconds = {("full", 64): jitter(4e-3, repeats, spread, seed), ("concat", 64): jitter(1e-3, repeats, spread, seed + 1)}
        return synthetic_record(seconds)

    def mde(spread, repeats):
        return compare_records(record(spread, repeats, 1), record(spread, repeats, 5)).cells[1].relative.mde

    assert mde(0.01, 15) < mde(0.10, 15)
    assert mde(0.10, 61) < mde(0.10, 15)


def test_pair_compares_a_new_kind_with_the_old_one_it_replaces():
    old = synthetic_record(scaling_seconds(modes=("full", "concat"), seed=1, repeats=15))
    seconds = scaling_seconds(modes=("full", "concat"), seed=2, repeats=15, slow={("concat", n): 1.5 for n in (16, 32, 64, 128)})
    new_seconds = {(mode if mode == "full" else "static", n): v for (mode, n), v in seconds.items()}
    new = synthetic_record(new_seconds)
    result = compare_records(old, new, mapping={"static": "concat"})
    paired = [c for c in result.cells if c.mode == "static"]
    assert len(paired) == 4 and all(c.old_mode == "concat" and c.verdict == compare.SLOWER for c in paired)
    assert all(c.relative.low < 1.5 < c.relative.high for c in paired)
    assert all("NEW's static against OLD's concat" in c.notes for c in paired)


def test_only_cells_in_both_records_are_compared_and_the_rest_are_named():
    old = synthetic_record(scaling_seconds(lengths=(16, 32, 64)))
    new = synthetic_record(scaling_seconds(modes=("full", "concat", "static"), lengths=(32, 64, 128)))
    result = compare_records(old, new)
    assert {(c.mode, c.length) for c in result.cells} == {(m, n) for m in ("full", "concat") for n in (32, 64)}
    assert result.skipped == ["full@16 only in OLD", "concat@16 only in OLD", "static@32 only in NEW",
                              "static@64 only in NEW", "full@128 only in NEW", "concat@128 only in NEW",
                              "static@128 only in NEW"]


def test_no_shared_cell_is_an_error_naming_both_grids():
    old = synthetic_record(scaling_seconds(lengths=(16,)))
    new = synthetic_record(scaling_seconds(lengths=(32,)))
    with pytest.raises(ValueError, match="no cell measured in both records: OLD has full@16, concat@16; NEW has full@32"):
        compare_records(old, new)


def test_equivalence_change_is_reported():
    old = synthetic_record(scaling_seconds())
    new = synthetic_record(scaling_seconds(), failed={("concat", 32)})
    (cell,) = [c for c in compare_records(old, new).cells if (c.mode, c.length) == ("concat", 32)]
    assert "equivalence now FAILS" in cell.notes
    assert cell.old_check["max_abs_diff"] == PASSED_DIFF and cell.new_check["max_abs_diff"] == 0.5


def test_differing_workloads_and_incomplete_records_are_stated():
    old = synthetic_record(scaling_seconds())
    partial = {key: values[:2] for key, values in scaling_seconds().items()}
    new = synthetic_record(partial, status="incomplete", repeats=7, config={**old["config"], "width": 64})
    result = compare_records(old, new)
    notes = " | ".join(result.notes)
    assert "NEW is INCOMPLETE" in notes
    assert "OLD and NEW timed different work (config.width 32 -> 64)" in notes
    assert {cell.verdict for cell in result.cells} == {compare.NOT_COMPARABLE} and result.regressions == []


@pytest.mark.parametrize("factor, alpha, message", [
    (1.0, 0.05, "^factor must be greater than 1, got 1"),
    (1.1, 0.0, "^alpha must lie strictly between 0 and 1, got 0"),
    (1.1, 1.5, "^alpha must lie strictly between 0 and 1, got 1.5"),
])
def test_bad_thresholds_are_rejected_naming_values_not_options(factor, alpha, message):
    record = synthetic_record(scaling_seconds())
    with pytest.raises(ValueError, match=message):
        compare_records(record, record, factor=factor, alpha=alpha)


# --- the command: output order and exit codes --------------------------------------------------

@pytest.fixture
def records(tmp_path):
    base = scaling_seconds(seed=1, repeats=15)
    return {
        "old": write(tmp_path, "old.json", synthetic_record(base)),
        "same": write(tmp_path, "same.json", synthetic_record(scaling_seconds(seed=2, repeats=15))),
        "slow": write(tmp_path, "slow.json", synthetic_record(
            scaling_seconds(seed=3, repeats=15, slow={("concat", 128): 2.0}),
            environment=changed_environment(**{"torch.version": "2.14.0+cpu", "system.load_average": [2.0, 1.0, 0.5]}))),
        "fast": write(tmp_path, "fast.json", synthetic_record(scaling_seconds(seed=4, repeats=15,
                                                                              slow={("concat", 16): 0.5}))),
    }


def test_compare_prints_the_environment_diff_before_the_numbers(records, capsys):
    assert main(["compare", str(records["old"]), str(records["slow"])]) == 0  # no flag: always 0
    out = capsys.readouterr().out
    assert out.index("torch.version") < out.index("system.load_average") < out.index("new/old")
    assert "critical" in out and "2.14.0+cpu" in out
    (line,) = [line for line in out.splitlines() if " slower " in line]
    assert "concat" in line and "2.0" in line and "(vs full)" in line
    assert "8 cells compared: 1 slower, 0 faster, 0 unchanged, 7 within noise" in out


@pytest.mark.parametrize("new, flag, code", [
    ("same", [], 0), ("same", ["--fail-on-regression"], 0),
    ("slow", [], 0), ("slow", ["--fail-on-regression"], 1),
    ("fast", ["--fail-on-regression"], 0),
    ("slow", ["--fail-on-regression", "--factor", "2.5"], 0),  # a 2x slowdown is within a 2.5x factor
])
def test_exit_codes(records, new, flag, code, capsys):
    assert main(["compare", str(records["old"]), str(records[new]), *flag]) == code
    err = capsys.readouterr().err
    if code == 1:
        assert err.startswith("kvbench: regression: 1 cell(s) slower beyond their MDE and 1.1x; "
                              "worst concat at length 128: 2.0")


def test_compare_markdown(records, capsys):
    assert main(["compare", str(records["old"]), str(records["slow"]), "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "| **critical** | `torch.version` | 2.14.0+cpu |" not in out  # OLD column comes first
    assert "| **critical** | `torch.version` | 2.13.0+cpu | 2.14.0+cpu |" in out
    assert "**slower (vs full)**" in out


@pytest.mark.parametrize("content, message", [
    ('{"schema": "kvbench.record/1", "status": "comp', "not valid JSON (truncated or corrupt?)"),
    ("", "not valid JSON"),
    ('{"results": {}, "version": 2}', "not a kvbench record: expected schema 'kvbench.record/4', got None"),
    ('{"schema": "kvbench.record/9"}', "unsupported schema version 'kvbench.record/9'"),
    ('[1, 2]', "expected a JSON object"),
])
def test_bad_files_exit_2_with_one_precise_line(records, tmp_path, capsys, content, message):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    for argv in (["compare", str(records["old"]), str(bad)], ["compare", str(bad), str(records["old"]), "--fail-on-regression"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"kvbench: error: {bad}: ") and message in err


def test_missing_file_and_bad_factor_exit_2(records, tmp_path, capsys):
    assert main(["compare", str(records["old"]), str(tmp_path / "nope.json")]) == 2
    assert "nope.json: no such file" in capsys.readouterr().err
    assert main(["compare", str(records["old"]), str(records["same"]), "--factor", "0.9"]) == 2
    assert capsys.readouterr().err == "kvbench: error: --factor must be greater than 1, got 0.9\n"
    assert main(["compare", str(records["old"]), str(records["same"]), "--pair", "static=concat", "--pair",
                 "static=paged"]) == 2
    assert capsys.readouterr().err == "kvbench: error: --pair names a NEW mode twice\n"


def test_a_record_with_a_tampered_summary_is_rejected(records, tmp_path, capsys):
    data = json.loads(records["old"].read_text())
    data["summary"]["cells"][0]["median"] *= 2
    tampered = tmp_path / "tampered.json"
    tampered.write_text(json.dumps(data))
    assert main(["compare", str(tampered), str(records["same"])]) == 2
    assert "but its repetitions give" in capsys.readouterr().err


# --- what a client sees: two request runs -------------------------------------------------


def test_two_request_runs_compare_ttft_and_tpot_and_a_slower_tpot_fails_the_regression_check(tmp_path, capsys):
    from records import request_record

    old, new = request_record(seed=1), request_record(seed=2, slow={("static", "tpot"): 1.5})
    result = compare_records(old, new)
    changes = {(c.mode, c.figure): c for c in result.latency}
    assert set(changes) == {(m, f) for m in ("full", "static", "paged") for f in ("ttft", "tpot")}
    slowed = changes[("static", "tpot")]
    assert slowed.relative.ratio == pytest.approx(1.5, rel=0.02) and slowed.verdict == compare.SLOWER
    assert slowed.judged_by == "vs full"  # full's TPOT did not move: the ratio to it judges
    assert all(c.verdict == compare.WITHIN_NOISE for key, c in changes.items() if key != ("static", "tpot"))
    assert changes[("full", "tpot")].relative is None and changes[("full", "tpot")].judged_by == "time"
    assert slowed in result.regressions
    status = main(["compare", str(write(tmp_path, "old.json", old)), str(write(tmp_path, "new.json", new)),
                   "--fail-on-regression"])
    captured = capsys.readouterr()
    assert status == 1 and "worst TPOT of static at length 24: 1.50x" in captured.err
    assert "TPOT" in captured.out and "what a client sees" in captured.out


def test_request_runs_of_different_shapes_compare_no_latency_and_say_so():
    from records import request_record

    result = compare_records(request_record(), request_record(prompt=20, generate=5, seed=3))  # both hold 24
    assert result.latency == []
    assert any("timed different work (run.workload.generate" in note for note in result.notes)
    assert {cell.verdict for cell in result.cells} == {compare.NOT_COMPARABLE}


# --- across machines ----------------------------------------------------------------------------


def test_records_from_two_cpus_get_no_verdict_on_seconds_nor_on_speedups(tmp_path, capsys):
    """Another CPU, 40% slower at everything, where a static cache costs 20% more relative to full: raw times
    measure the machines, and a speedup's size legitimately differs between CPUs, so no cell is called slower
    or faster, --fail-on-regression exits 0, and both outputs point at --across-machines."""
    base = scaling_seconds(modes=("full", "concat", "static"), seed=1, repeats=15)
    old = synthetic_record(base)
    slower = {key: [s * 1.4 * (1.2 if key[0] == "static" else 1.0) for s in values] for key, values in base.items()}
    new = synthetic_record(slower, environment=changed_environment(**{"cpu.brand": "Other"}))
    result = compare_records(old, new)
    assert result.not_comparable == "OLD and NEW ran on different machines (cpu.brand Test CPU 9000 -> Other)"
    assert {c.verdict for c in result.cells} == {compare.NOT_COMPARABLE} and result.regressions == []
    static = [c for c in result.cells if c.mode == "static"]
    assert all(c.relative.ratio == pytest.approx(1.2) and c.relative.verdict == compare.SLOWER for c in static)
    assert any("--across-machines" in note for note in result.notes)
    assert compare.summary_line(result) == ("12 cells lined up, none judged: OLD and NEW ran on different machines "
                                            "(cpu.brand Test CPU 9000 -> Other).")
    paths = [str(write(tmp_path, name, record)) for name, record in (("old.json", old), ("new.json", new))]
    assert main(["compare", *paths, "--fail-on-regression"]) == 0
    captured = capsys.readouterr()
    rows = [line for line in captured.out.splitlines() if "ok 1.0e-07 → ok 1.0e-07" in line]
    assert len(rows) == 12 and all("not comparable" in row and "slower" not in row and "faster" not in row
                                   for row in rows)
    assert "judged by time" not in captured.out  # no verdict, so no word on what would have decided it
    assert "--across-machines" in captured.out
    assert captured.err == ("kvbench: no regression check: OLD and NEW ran on different machines (cpu.brand "
                            "Test CPU 9000 -> Other), so no cell is slower or faster; `kvbench compare "
                            "--across-machines OLD NEW` lines up each run's speedups with their rerun intervals\n")


def test_another_hostname_on_the_same_cpu_is_the_same_machine():
    """Two containers or CI runners of one type: other names, one CPU; their runs compare and are judged."""
    base = scaling_seconds(modes=("full", "static"), seed=1, repeats=15)
    slower = {key: [s * (1.3 if key[0] == "static" else 1.0) for s in values] for key, values in base.items()}
    result = compare_records(synthetic_record(base),
                             synthetic_record(slower, environment=changed_environment(**{"os.hostname": "runner-7"})))
    assert result.not_comparable is None and {c.verdict for c in result.cells if c.mode == "static"} == {compare.SLOWER}


def test_across_machines_lines_every_records_speedups_up_per_cell(tmp_path, capsys):
    records = []
    for index, (host, factor) in enumerate((("a", 1.0), ("b", 1.5), ("c", 1.0))):
        seconds = scaling_seconds(seed=index, repeats=9, slow={("concat", n): factor for n in (16, 32, 64, 128)})
        records.append(str(write(tmp_path, f"{host}.json", synthetic_record(
            seconds, environment=changed_environment(**{"os.hostname": f"host-{host}"})))))
    assert main(["compare", "--across-machines", *records]) == 0
    out = capsys.readouterr().out
    assert "host-a (Test CPU 9000)" in out and "host-c (Test CPU 9000)" in out
    line = next(line for line in out.splitlines() if line.strip().startswith("64") and "concat" in line)
    assert "apart" in line and line.count("x [") == 3  # b's concat costs 1.5x: its interval is elsewhere
    assert main(["compare", "--across-machines", "--format", "markdown", *records]) == 0
    assert "| length | mode | host-a (Test CPU 9000) |" in capsys.readouterr().out


@pytest.mark.parametrize("argv, fragment", [
    (["a.json", "b.json", "c.json"], "1 more record(s) need --across-machines"),
    (["--across-machines", "--pair", "x=y", "a.json", "b.json"], "--pair judges NEW against OLD"),
    (["--across-machines", "--fail-on-regression", "a.json", "b.json"], "--fail-on-regression judges NEW"),
])
def test_across_machines_options_that_do_not_fit_are_refused(tmp_path, capsys, argv, fragment):
    assert main(["compare", *argv]) == 2
    assert fragment in capsys.readouterr().err


# --- a neighbour on the run's CPU ------------------------------------------------------------


def contended_record(cpu_slower: float, waits: float, probe: float, full_slower: float = 1.0, seed: int = 0):
    """The seed grid with thread CPU time `cpu_slower` times the base (full also `full_slower`), every sample
    waiting `waits` of its CPU time for a CPU, and a machine probe `probe` times slower."""
    from kvbench.measure import estimation, stats
    from kvbench.record.summary import summarize

    base = {("full", n): 0.002 * n / 16 for n in (16, 32)} | {("static", n): 0.001 * n / 16 for n in (16, 32)}
    cpu = {key: jitter(value * cpu_slower * (full_slower if key[0] == "full" else 1.0), 15, 0.02, seed + i)
           for i, (key, value) in enumerate(base.items())}
    record = synthetic_record({key: [s * (1 + waits) for s in values] for key, values in cpu.items()},
                              probe=machine_probe(probe, seed=seed + 50))
    for rep in record["repetitions"]:
        rep.update(cpu_seconds=cpu[(rep["mode"], rep["length"])][rep["repetition"]],
                   runqueue_seconds=rep["seconds"] * waits / (1 + waits))
    record["summary"] = summarize(record["repetitions"], record["checks"], estimator=stats.DEFAULT_ESTIMATOR,
                                  interval=stats.DEFAULT_INTERVAL, between_run=record["summary"]["between_run"],
                                  rule=estimation.RULE, threads=1)
    return RecordView(record)


def test_a_neighbour_on_the_runs_cpu_slows_the_machine_not_the_code():
    # measured in results/machine-probe: a busy loop at 50% duty made full's wall time 2.5-2.8x, its CPU
    # time 1.6-1.8x (caches shared with the neighbour) and the probe 1.65x
    quiet = contended_record(1.0, 0.0, 1.0)
    busy = contended_record(1.7, 0.6, 1.7, seed=7)
    result = compare.compare_records(quiet, busy)
    full = [cell for cell in result.cells if cell.mode == "full"]
    assert all(cell.time.verdict == "slower" for cell in full)  # by wall time alone it looks like a regression
    assert all(cell.judged_by == "vs machine" and cell.verdict in ("within noise", "unchanged") for cell in full)
    assert not result.regressions
    assert any("its CPU time where a run waited for a CPU" in note for note in result.notes)


def test_contention_without_a_probe_that_moved_is_told_by_cpu_time():
    quiet = contended_record(1.0, 0.0, 1.0)
    waiting = contended_record(1.0, 0.8, 1.0, seed=7)  # only waits: the thread's own time unchanged
    result = compare.compare_records(quiet, waiting)
    assert all(cell.judged_by == "on CPU time" for cell in result.cells if cell.mode == "full")
    assert not result.regressions
    assert any("a run waited for a CPU" in note and "full by its CPU time" in note for note in result.notes)


def test_full_made_slower_on_a_contended_machine_is_still_a_code_change():
    quiet = contended_record(1.0, 0.0, 1.0)
    slower_code = contended_record(1.0, 0.6, 1.0, full_slower=1.5, seed=7)
    result = compare.compare_records(quiet, slower_code)
    full = [cell for cell in result.cells if cell.mode == "full"]
    assert all(cell.judged_by == "time" and cell.verdict == "slower" for cell in full)
    assert {(cell.mode, cell.length) for cell in result.regressions} >= {("full", 16), ("full", 32)}


# --- different work is refused, not judged -----------------------------------------------------------------

RESULTS = __import__("pathlib").Path(__file__).resolve().parents[1] / "results"
DIFFERENT_WORK = [  # (OLD, NEW, what the refusal names first): committed records that time different work
    ("latency/llama-mini-request.json", "llama/llama-tiny.json", "run.workload.kind request -> loop"),
    ("latency/llama-mini-contexts.json", "latency/llama-mini-request.json", "run.workload.kind contexts -> request"),
    ("layouts/seed.json", "llama/llama-tiny.json", "config.family gpt2 -> llama"),
]


@pytest.mark.parametrize("old, new, first", DIFFERENT_WORK)
def test_records_of_different_work_are_refused_not_judged(capsys, old, new, first):
    assert main(["compare", str(RESULTS / old), str(RESULTS / new), "--fail-on-regression"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "regression" not in err
    assert f"{RESULTS / old} and {RESULTS / new} timed different work ({first}" in err and "--force" in err


def test_force_lines_different_work_up_with_its_note(capsys):
    old, new = (str(RESULTS / name) for name in DIFFERENT_WORK[2][:2])  # both timed the loop at length 64
    assert main(["compare", old, new, "--force", "--fail-on-regression"]) == 0
    captured = capsys.readouterr()
    assert "timed different work (config.family gpt2 -> llama" in captured.out
    assert "cells lined up, none judged: OLD and NEW timed different work (config.family" in captured.out
    assert captured.err.startswith("kvbench: no regression check: OLD and NEW timed different work (config.family")


def test_across_machines_refuses_different_work_among_any_of_its_records(capsys):
    same = [str(RESULTS / "machine-probe" / name) for name in ("machine-a.json", "machine-b.json")]
    assert main(["compare", "--across-machines", *same]) == 0
    capsys.readouterr()
    assert main(["compare", "--across-machines", *same, str(RESULTS / "llama" / "llama-tiny.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "llama-tiny.json timed different work" in err
    assert main(["compare", "--across-machines", "--force", *same, str(RESULTS / "llama" / "llama-tiny.json")]) == 0


def test_records_of_the_same_work_on_other_lengths_or_threads_still_compare():
    old = synthetic_record(scaling_seconds())
    new = synthetic_record(scaling_seconds(lengths=(16, 32), seed=1))
    new["run"].update(threads=2, seed=7, repeats=9)  # the same work on another thread count, seed and sample size
    from kvbench.report.comparison.differences import work_differences

    assert work_differences(RecordView(old), RecordView(new)) == []
    new["run"]["batch"] = 2
    assert [d.key for d in work_differences(RecordView(old), RecordView(new))] == ["run.batch"]


def test_the_reference_record_from_another_cpu_against_a_fresh_run_here_exits_0_with_no_verdict(tmp_path, capsys):
    """The acceptance of 'verdicts only between comparable runs': results/reference.json as a machine with another
    CPU took it (the capture's cpu fields changed), compared with a fresh run on this machine."""
    reference = json.loads((RESULTS / "reference.json").read_text())
    reference["environment"]["cpu"].update(brand="Intel(R) Xeon(R) Platinum 8375C", vendor="GenuineIntel")
    old = write(tmp_path, "reference-intel.json", reference)
    new = tmp_path / "fresh.json"
    assert main(["run", "--lengths", "16,32", "--repeats", "3", "--no-progress", "--output", str(new)]) == 0
    capsys.readouterr()
    assert main(["compare", str(old), str(new), "--fail-on-regression"]) == 0
    captured = capsys.readouterr()
    rows = [line for line in captured.out.splitlines() if " → ok " in line]  # a table row: its checks old → new
    assert len(rows) == 8 and all("not comparable" in row for row in rows)
    assert not any("slower" in row or "faster" in row for row in rows) and "8 cells lined up, none judged" in captured.out
    assert "different machines (cpu.brand AMD EPYC -> " not in captured.out  # OLD is the Intel one
    assert f"cpu.brand Intel(R) Xeon(R) Platinum 8375C -> {json.loads(new.read_text())['environment']['cpu']['brand']}" \
        in captured.err and "--across-machines" in captured.err and "--across-machines" in captured.out


def test_the_across_machines_legend_names_the_interval_each_record_computed(tmp_path, capsys):
    from kvbench.report.comparison import machines

    views = [RecordView(synthetic_record(scaling_seconds(seed=seed, repeats=9))) for seed in (0, 1)]
    assert {view.interval for view in views} == {"rerun"}
    assert "with its 95% rerun interval;" in machines.legend(views)
    views[1].interval = "confidence"  # a record whose run computed another interval: both are named
    assert ("with the interval its record computed (95% rerun interval; 95% confidence interval);"
            in machines.legend(views))
    for view in views:
        view.interval = None  # schema 1: ratios of medians, no interval
    assert "without an interval" in machines.legend(views) and "95%" not in machines.legend(views)
    paths = [str(write(tmp_path, f"{name}.json", synthetic_record(scaling_seconds(seed=seed, repeats=9))))
             for seed, name in enumerate("ab")]
    for layout in ("text", "markdown"):
        assert main(["compare", "--across-machines", "--format", layout, *paths]) == 0
        assert "95% rerun interval" in " ".join(capsys.readouterr().out.split())
