"""What a client sees, per commit: time to first token and time per output token of one request.

The llama family's tiny preset serves a request of ``PROMPT`` prompt tokens and ``GENERATE``
generated ones (``kvbench.workloads.requests``, teacher-forced, every step timed); each value is the
median over ``REQUESTS`` requests after one untimed, in milliseconds (lower is better, as asv
assumes), rounded to the digits its 95% interval supports (``common.round_to_interval``). TTFT is the prefill; TPOT is vLLM's (E2E - TTFT) / (N - 1). A cached mode whose
request fails the gate is not timed (RuntimeError, as in every suite).
"""

import statistics

from . import common

try:  # kvbench's packages by concern
    from kvbench.measure import latency
    from kvbench.workloads import requests
except ImportError:
    try:  # commits before the request workload skip these
        from kvbench import latency, requests
    except ImportError:
        latency = requests = None
try:  # kvbench's packages by concern
    from kvbench.measure.stats import median_interval
except ImportError:
    try:  # commits before the median's interval: the median to four significant digits
        from kvbench.measure.stats import median_interval
    except ImportError:
        median_interval = None

MODEL = "llama-tiny"
PROMPT, GENERATE, REQUESTS = 64, 16, 9
MODES = ("full", "concat", "static", "paged")  # the exact kinds every commit since the request workload has


class TrackRequest:
    """TTFT and TPOT of one request on the tiny llama preset, per mode."""

    params = (MODES,)
    param_names = ("mode",)
    unit = "ms"
    version = "kvbench-request-1"
    timeout = 300

    def setup(self, mode):
        if requests is None:
            raise NotImplementedError("no request workload at this commit")
        model, ids = common.model_and_ids(MODEL, mode, PROMPT + GENERATE - 1)
        check = requests.check_request(model, ids, ["full", mode], PROMPT)[mode]
        if not check["passed"]:
            raise RuntimeError(f"{mode}'s request failed the equivalence gate: {check}")
        requests.time_request(model, ids, mode, PROMPT)  # untimed: first use
        self.figures = [latency.request_figures(requests.time_request(model, ids, mode, PROMPT))
                        for _ in range(REQUESTS)]

    def track_ttft(self, mode):
        return rounded_median([f["ttft"] * 1e3 for f in self.figures])

    def track_tpot(self, mode):
        return rounded_median([f["tpot"] * 1e3 for f in self.figures])


def rounded_median(values: list[float]) -> float:
    median = statistics.median(values)
    low, high = median_interval(values) if median_interval else (median, median)
    return common.round_to_interval(median, low, high)
