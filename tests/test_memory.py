"""kvbench.measure.memory: peak resident growth of one loop, and the probes it rests on."""

import os

import pytest

from kvbench.measure.memory import available_bytes, cgroup_headroom, peak_memory_growth, peak_rss
from kvbench.model import DecoderConfig, build_model
from kvbench.workloads.decode import decode, token_ids
from kvbench.workloads.workload import memory_profile


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


def cgroup_tree(tmp_path, membership: str, files: dict[str, str]):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "cgroup").write_text(membership)
    return dict(root=str(tmp_path), membership=str(tmp_path / "cgroup"))


@pytest.mark.parametrize("membership, files, headroom", [
    ("0::/job\n", {"job/memory.max": "4294967296\n", "job/memory.current": "1073741824\n"}, 3 << 30),  # v2
    ("0::/job\n", {"job/memory.max": "max\n", "job/memory.current": "1073741824\n"}, None),
    ("0::/job\n", {"memory.max": "2147483648\n", "memory.current": "0\n"}, 2 << 30),  # the container's root
    ("4:memory:/job\n0::/\n", {"memory/job/memory.limit_in_bytes": "1073741824\n",  # v1
                                 "memory/job/memory.usage_in_bytes": "536870912\n"}, 1 << 29),
    ("4:memory:/job\n", {"memory/memory.limit_in_bytes": "9223372036854771712\n",  # v1's "no limit"
                         "memory/memory.usage_in_bytes": "1\n"}, None),
    ("4:cpu:/job\n", {}, None),
])
def test_cgroup_headroom_reads_the_limit_less_the_usage(tmp_path, membership, files, headroom):
    assert cgroup_headroom(**cgroup_tree(tmp_path, membership, files)) == headroom


def test_available_memory_is_at_most_what_the_machine_has():
    import psutil

    assert 0 < available_bytes() <= psutil.virtual_memory().available


def test_the_run_estimate_counts_the_llama_familys_weights():
    """A preset that cannot fit is refused before it is built: its weights are counted from its shapes."""
    from kvbench.config import PlainConfig
    from kvbench.kinds import parameter_count
    from kvbench.measure.memory import estimate_run_bytes

    small = PlainConfig.from_preset("llama-tiny")
    model = build_model(DecoderConfig.from_preset("llama-tiny"), seed=0)
    assert parameter_count(small) == sum(p.numel() for p in model.parameters())
    assert estimate_run_bytes(small, 1, [16], ["full"])["weights"] == (
        sum(p.numel() * p.element_size() for p in model.parameters()) + model.cos.nbytes + model.sin.nbytes)
    big = estimate_run_bytes(PlainConfig.from_preset("llama-3.1-8b", dtype="bfloat16"), 1, [16], ["static"])
    assert big["weights (built in float32)"] >= 4 * 8_030_261_248


def test_a_stated_limit_lowers_the_available_memory_and_never_raises_it(monkeypatch):
    monkeypatch.setenv("KVBENCH_AVAILABLE_MEMORY", "12345")
    assert available_bytes() == 12345
    monkeypatch.setenv("KVBENCH_AVAILABLE_MEMORY", "1KiB")
    assert available_bytes() == 1024
    monkeypatch.setenv("KVBENCH_AVAILABLE_MEMORY", "1024TiB")  # more than any machine here: the machine's figure
    assert available_bytes() < 1 << 50
    monkeypatch.setenv("KVBENCH_AVAILABLE_MEMORY", "lots")
    with pytest.raises(ValueError, match="KVBENCH_AVAILABLE_MEMORY: expected a size like 24GiB, 80GB or 1e9, "
                                         "got 'lots'"):
        available_bytes()
