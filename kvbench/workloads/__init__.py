"""What one sample times: the decode loop, a request, contexts; the gate; one run end to end; text quality.

`kvbench.workloads` was one module before it was this package; that module is `kvbench.workloads.workload`
now. Its names still resolve here, imported on first use (PEP 562), so that `from kvbench.workloads import
Contexts` keeps working while `kvbench.workloads.decode` loads nothing more than it needs.
"""

OLD_NAMES = ("Loop", "TimedRequest", "Request", "Contexts", "weights_read_per_step", "linear_weights",
             "matmul_shapes", "footprint", "workload_from")  # kvbench.workloads.workload's, when it was this module


def __getattr__(name: str):
    if name in OLD_NAMES:
        from kvbench.workloads import workload

        return getattr(workload, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
