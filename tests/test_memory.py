"""kvbench.memory: peak resident growth of one loop, and the probes it rests on."""

import os

import pytest

from kvbench.decode import decode, token_ids
from kvbench.memory import memory_profile, peak_memory_growth, peak_rss
from kvbench.model import DecoderConfig, build_model


def test_peak_rss_is_the_kernels_high_water_mark():
    peak = peak_rss()
    if not os.path.exists("/proc/self/status"):
        assert peak is None
        return
    with open("/proc/self/status") as status:
        (line,) = [line for line in status if line.startswith("VmHWM:")]
    assert peak == int(line.split()[1]) * 1024


def test_peak_memory_growth_sees_a_transient_allocation():
    def allocate_and_free():
        block = bytearray(64 << 20)  # 64 MiB, touched, then freed before returning
        block[::4096] = b"x" * len(block[::4096])
        return len(block)

    result, peak = peak_memory_growth(allocate_and_free)
    assert result == 64 << 20
    if "VmHWM" in peak["peak_method"]:  # the fallback (RSS after - before) misses transient peaks by design
        assert peak["peak_rss_growth_bytes"] >= 60 << 20


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux's resettable VmHWM")
def test_memory_profile_shows_the_copies_of_concat():
    """Static touches its buffers once; concat's per-step copies show as extra peak growth."""
    model = build_model(DecoderConfig(width=256, heads=8, layers=4, max_length=512), seed=0)
    ids = token_ids(model.config, 1, 512)
    for mode in ("static", "concat"):  # first-use allocations (as the gate does in run_benchmark)
        decode(model, ids, mode)
    static, concat = memory_profile(model, ids, "static"), memory_profile(model, ids, "concat")
    retained = 2 * 4 * 8 * 512 * 32 * 4  # 4 MiB
    assert static["measured_bytes"] == concat["measured_bytes"] == static["expected_bytes"] == retained
    assert retained * 0.9 <= static["peak_rss_growth_bytes"] <= retained * 1.6
    assert concat["peak_rss_growth_bytes"] >= 1.5 * static["peak_rss_growth_bytes"]
    assert "VmHWM" in static["peak_method"]
