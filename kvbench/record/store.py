"""Records on disk: built from a run, validated, written atomically, read back safely."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from kvbench.files import OutputExistsError, UnreadableFileError, read_json, write_json_atomic
from kvbench.measure import estimation, stats
from kvbench.record.schema import SCHEMA, RecordError, validate_record
from kvbench.record.summary import summarize
from kvbench.record.upgrade import complete_run

DEFAULT_RECORDS_DIR = Path("results") / "records"


class RecordExistsError(RecordError, OutputExistsError):
    """Writing would replace an existing record, and replacing was not asked for."""


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def build_record(
    *, command: list[str], config: dict, run: dict, protocol: dict, environment: dict,
    checks: list[dict], repetitions: list[dict], memory: list[dict], status: str = "complete",
    per_step: list[dict] | None = None, sampling: dict | None = None, machine_probe: dict | None = None,
    limits: dict | None = None, compile_seconds: dict | None = None, sections: dict | None = None,
) -> dict:
    """A validated record of the current schema. Without `sampling`, every length ran the fixed protocol; a run
    that names no workload, control, plugins or cache options had none (kvbench.record.upgrade.complete_run).
    `sections`: the optional ones a run adds (a real model's `model` and `token_ids`, its `quality` on text)."""
    run = complete_run(run)
    record = {
        "schema": SCHEMA,
        "status": status,
        "created_utc": utc_now(),
        "command": list(command),
        "config": config,
        "run": run,
        "protocol": protocol,
        "environment": environment,
        "checks": checks,
        "repetitions": repetitions,
        "sampling": sampling or fixed_sampling(run, repetitions, status),
        "summary": summarize(repetitions, checks, control=run["control"], estimator=stats.DEFAULT_ESTIMATOR,
                             interval=stats.DEFAULT_INTERVAL, rule=estimation.RULE, threads=run["threads"],
                             workload=run["workload"], batch=run["batch"],
                             between_run={"speedup": protocol.get("between_run", stats.BETWEEN_RUN["speedup"]),
                                          "seconds": stats.BETWEEN_RUN["seconds"]}),
        "memory": memory,
    }
    if per_step is not None:
        record["per_step"] = per_step
    if machine_probe is not None:
        record["machine_probe"] = machine_probe
    if limits is not None:
        record["limits"] = limits
    if compile_seconds:
        record["compile_seconds"] = compile_seconds
    record.update(sections or {})
    validate_record(record)
    return record


def fixed_sampling(run: dict, repetitions: list[dict], status: str) -> dict:
    """The sampling section of a fixed-protocol run: per length, the rotations its repetitions show."""
    rotations = {length: 0 for length in run["lengths"]}
    for rep in repetitions:
        rotations[rep["length"]] = max(rotations.get(rep["length"], 0), rep["repetition"] + 1)
    stop = "fixed" if status == "complete" else "interrupted"
    return {"lengths": [{"length": length, "rotations": count, "stop": stop, "half_width": None}
                        for length, count in rotations.items()],
            "telemetry": {"unavailable": {}, "per_sample_seconds": None}}


def default_record_path(directory: Path | str = DEFAULT_RECORDS_DIR) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    return Path(directory) / f"run-{stamp}.json"


def write_record(record: dict, path: Path | str, force: bool = False) -> Path:
    """Validate, then write atomically; refuse to replace a file unless `force`."""
    validate_record(record)
    try:
        return write_json_atomic(record, path, force)
    except OutputExistsError as error:
        raise RecordExistsError(str(error)) from None


def load_record(path: Path | str) -> dict:
    """Read a record from a regular file (bounded, finite, shallow JSON) and validate it: an older record comes
    back upgraded to the current schema (kvbench.record.upgrade); the file is left as it is."""
    try:
        record = read_json(path, "kvbench record")
    except UnreadableFileError as error:
        raise RecordError(str(error)) from None
    return validate_record(record, str(path))


def record_from_run(outcome, *, command: list[str], preset: str, config, lengths: list[int], modes: list[str],
                    protocol, in_effect: dict, environment: dict, plugins: list[dict] = (),
                    cache_options: dict | None = None, workload: dict | None = None, sections: dict | None = None) -> dict:
    """The record of one run: its settings (a DecoderConfig and a timing.Protocol) beside its outcome
    (a benchmark.RunOutcome); `in_effect`: the threads and CPUs that took effect."""
    sampling = outcome.sampling
    return build_record(
        command=command, config=config.to_dict(),
        run={**protocol.run_section(preset, lengths, modes), "control": outcome.control, "plugins": list(plugins),
             "cache_options": dict(cache_options or {}), "workload": workload or {"kind": "loop"}},
        protocol=protocol.describe(in_effect), environment=environment, checks=outcome.checks,
        repetitions=outcome.repetitions, memory=outcome.memory, per_step=outcome.per_step,
        status="incomplete" if outcome.interrupted else "complete", machine_probe=outcome.machine_probe,
        limits=outcome.limits, compile_seconds=outcome.compile_seconds, sections=sections,
        sampling={"lengths": [state.to_dict() for length, state in sampling.lengths.items() if length in lengths],
                  "telemetry": {"unavailable": sampling.telemetry_unavailable,
                                "per_sample_seconds": sampling.telemetry_seconds,
                                **({"per_step_timer_seconds": sampling.step_timer_seconds}
                                   if sampling.step_timer_seconds is not None else {})},
                  "elapsed": sampling.elapsed},
    )
