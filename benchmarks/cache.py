"""Facts that are not time: cache bytes and numerical equivalence, per mode and length.

asv compares every tracked number between commits, so a commit that makes a cache
hold more bytes, or drift further from the full-prefix logits, is flagged by
``asv compare`` just as a slowdown is.
"""

# asv runs today's suites on older commits: the footprint's home at this commit, then before it moved beside the
# workloads' footprints, then before the packages by concern (flat modules).
try:
    from kvbench.workloads.workload import cache_footprint
except ImportError:
    try:
        from kvbench.workloads.decode import cache_footprint
    except ImportError:
        from kvbench.decode import cache_footprint

from . import common


class TrackCacheBytes(common.Cells):
    """Bytes of key/value storage held after a loop (measured from the cache's tensors).

    For ``full`` this is the throwaway cache of its last step. The exact float kinds
    hold the same positions, so they report the same number; the quantized kinds hold
    fewer bytes once a group leaves the residual, the window kind at most W positions;
    each equals its kind's formula. Bytes are a fact about the layout, so they are
    tracked even for a mode that fails the gate.
    """

    unit = "bytes"
    version = "kvbench-cache-bytes-2"

    def setup(self, gate, model, mode, length):
        self.model, self.ids = common.model_and_ids(model, mode, length)

    def track_cache_bytes(self, gate, model, mode, length):
        return cache_footprint(self.model, self.ids, mode)["measured_bytes"]


class TrackEquivalence(common.Cells):
    """max |cached - full| over the last-position logits of every step (the gate's number).

    Computed once per commit by the shared setup_cache; a mode that raises fails here.
    """

    params = (common.MODELS, common.CACHED_MODES, common.LENGTHS)
    unit = "max abs diff"
    version = "kvbench-equivalence-2"

    def setup(self, gate, model, mode, length):
        common.model_and_ids(model, mode, length)  # skips a model, mode or length this commit does not have

    def track_max_abs_diff(self, gate, model, mode, length):
        check = gate[(model, mode, length)]
        if "error" in check:
            raise RuntimeError(f"{mode} at length {length}: {check['error']}")
        return check["max_abs_diff"]


class TrackDrift(common.Cells):
    """How far a lossy kind's logits drift from the full prefix's (the gate's metrics, per commit).

    A commit that makes a quantized cache less faithful shows here as an increase, which
    asv compare flags as it flags a slowdown. Exact kinds have no drift to track.
    """

    params = (common.MODELS, common.LOSSY_MODES, common.LENGTHS)
    version = "kvbench-drift-2"

    def setup(self, gate, model, mode, length):
        common.model_and_ids(model, mode, length)  # skips a model, mode or length this commit does not have

    def track_kl_mean(self, gate, model, mode, length):
        """Mean KL divergence of the next-token distributions, KL(full || kind), in nats."""
        return common.drift(gate, model, mode, length)["kl_mean"]

    track_kl_mean.unit = "nats"

    def track_top1_disagreement(self, gate, model, mode, length):
        """Share of steps whose most likely next token differs from the full prefix's."""
        return 1.0 - common.drift(gate, model, mode, length)["top1_agreement"]

    track_top1_disagreement.unit = "share"
