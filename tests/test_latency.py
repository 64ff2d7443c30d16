"""kvbench.measure.latency: every client-visible figure from raw per-step durations, checked by hand."""

import pytest

from kvbench.measure import latency


def request(rotation, ttft, steps, mode="static"):
    return {"mode": mode, "length": len(steps) + 4, "repetition": rotation, "seconds": ttft + sum(steps) + 1e-6,
            "ttft_seconds": ttft, "step_seconds": steps}


def test_one_request_by_hand():
    figures = latency.request_figures(request(0, 0.010, [0.002, 0.003, 0.004]), batch=2)
    assert figures["ttft"] == 0.010
    assert figures["e2e"] == pytest.approx(0.019)
    assert figures["tpot"] == pytest.approx((0.019 - 0.010) / 3)  # vLLM: (E2E - TTFT) / (N - 1)
    assert figures["tokens_per_second"] == pytest.approx(2 * 4 / 0.019)  # batch x N tokens over E2E
    assert latency.request_figures(request(0, 0.01, []))["tpot"] is None  # one token: no TPOT


def test_a_modes_figures_are_medians_and_its_itl_percentiles_pool_every_step():
    reps = [request(r, 0.010 + 0.001 * r, [0.002] * 9 + [0.02 * (r + 1)]) for r in range(5)]
    figures = latency.mode_latency(reps)
    assert figures["ttft"]["median"] == pytest.approx(0.012)
    assert figures["ttft"]["low"] == 0.010 and figures["ttft"]["high"] == 0.014  # five values: their range
    assert figures["itl_p50"] == pytest.approx(0.002) and figures["itl_p99"] > 0.05  # the slow last steps
    assert (figures["requests"], figures["generated"]) == (5, 11)


def test_ratios_to_the_baseline_are_paired_by_rotation():
    """Rotations differ, so the median of per-rotation ratios (2 for TPOT, 2 for TTFT) is not the ratio of
    the medians (3 and 1.5) nor what pairing by list position gives (3 and 1.25); the mode's requests come in
    another order than the baseline's, and its extra rotation 5 has no pair."""
    base_tpot, mine_tpot = [4e-3, 8e-3, 2e-3, 6e-3, 10e-3], [2e-3, 2e-3, 2e-3, 1e-3, 5e-3]
    base_ttft, mine_ttft = [0.010, 0.020, 0.030, 0.040, 0.050], [0.020, 0.010, 0.015, 0.040, 0.025]
    base = [request(r, base_ttft[r], [base_tpot[r]] * 4, "full") for r in range(5)]
    mine = [request(r, mine_ttft[r], [mine_tpot[r]] * 4) for r in (4, 2, 0, 3, 1)] + [request(5, 1.0, [1.0] * 4)]
    tpot = latency.ratio_to_baseline(base, mine, "tpot", between_run=0.0, interval="within")
    ttft = latency.ratio_to_baseline(base, mine, "ttft", between_run=0.0, interval="within")
    assert tpot.ratio == pytest.approx(2.0) and tpot.pairs == 5
    assert (tpot.low, tpot.high) == pytest.approx((1.0, 6.0))  # five ratios 2, 4, 1, 6, 2: the median's range
    assert ttft.ratio == pytest.approx(2.0) and ttft.pairs == 5
    assert (ttft.low, ttft.high) == pytest.approx((0.5, 2.0))  # ratios 0.5, 2, 2, 1, 2


def test_achieved_bandwidth_is_bytes_over_seconds():
    assert latency.achieved_bandwidth(2_000_000, 0.001) == pytest.approx(2e9)


def test_the_matmul_floor_adds_each_product_of_a_forward_at_its_measured_rate_rounds_first():
    from kvbench.config import preset_config

    config = preset_config("llama-mini")  # C 256, I 512, H*D 256, q/k/v 256 + 2 * 64, V 1024, 4 layers
    shapes = {(256, 384), (256, 256), (256, 1024), (512, 256)}
    assert set(latency.step_matmuls(config)) == shapes and len(latency.step_matmuls(config)) == 4 * 4 + 1
    once = {"matmul": [{"shape": [1, k, n], "flops_per_second": {"median": 1e9}} for k, n in shapes]}
    flops = 2 * (4 * (256 * 384 + 256 * 256 + 256 * 1024 + 512 * 256) + 256 * 1024)
    assert latency.matmul_floor(config, 1, once) == pytest.approx(flops / 1e9)
    assert latency.matmul_floor(config, 2, once) is None  # a shape the run did not measure: no floor
    # measured again at every round: their median replaces the one measurement
    rounds = [{"round": r, "triad": 4e9 + r * 1e9, "copy": 1e9,
               "matmul": [{"shape": [1, k, n], "flops_per_second": 2e9 * (r + 1)} for k, n in shapes]} for r in range(3)]
    both = {**once, "rounds": rounds, "memory_bandwidth": {"triad": {"1": {"median": 99e9}}}}
    assert latency.matmul_floor(config, 1, both) == pytest.approx(flops / 4e9)
    assert latency.bandwidth_limit(both, 1) == 5e9 and latency.compute_limit(both) == 4e9


def test_round_limits_are_measured_once_per_round_beside_the_samples():
    from kvbench.measure.machine import RoundLimits
    from kvbench.measure.sampling import sample
    from kvbench.measure.timing import Protocol

    probe = RoundLimits([(1, 64, 32)], 1 << 20)
    found = probe()
    assert found["copy"] > 0 and found["triad"] > 0 and found["matmul"][0]["shape"] == [1, 64, 32]
    state = sample({4: {"full": lambda: None, "static": lambda: None}}, Protocol.fixed(repeats=3), limits=probe)
    assert [entry["round"] for entry in state.limits] == [0, 1, 2]  # one per round, three rounds of one rotation
