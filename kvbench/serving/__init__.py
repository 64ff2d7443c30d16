"""Serving: a trace of requests replayed under a KV budget by an iteration-level scheduler.

`kvbench.serving` was one module before it was this package; that module is `kvbench.serving.replay` now.
Its names still resolve here, imported on first use (PEP 562), so that `from kvbench.serving import gate`
keeps working while the torch-free `kvbench.serving.trace` and `kvbench.serving.admission` stay torch-free.
"""

OLD_NAMES = ("Replay", "gate", "serve", "makespan_half_widths")  # kvbench.serving.replay's, when it was this module


def __getattr__(name: str):
    if name in OLD_NAMES:
        from kvbench.serving import replay

        return getattr(replay, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
