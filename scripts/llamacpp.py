"""llama.cpp as kvbench's outside anchor (issue 28, point 6): the same random weights, one thread, the same contexts.

    python scripts/llamacpp.py build                 # llama-bench (and llama-eval-callback) from source, cached
    python scripts/llamacpp.py verify                # llama.cpp's activations and logits against kvbench's
    python scripts/llamacpp.py collect --alternations 4 --output results/limit/llamacpp.json

`build` compiles llama.cpp from the source vendored in llama-cpp-python's sdist (LLAMA_CPP_PYTHON, so the
commit is fixed: 0c1e570), with gcc 12, -DGGML_NATIVE=ON, only the two targets, two jobs, into
$KVBENCH_CACHE_DIR/llama.cpp/<version> (else ~/.cache/kvbench/...), and reuses a finished build. It
resolves the cache directory to its real path first (issue 28: build from the real path, not through a symlink).

kvbench's model is written once, beside the build, as llama.cpp's converter would (kvbench.models.gguf_writer).
`verify` compares what llama-eval-callback prints (first and last three values of the first and last three
rows of every layer's output and of the logits, 4 decimals) with kvbench's full forward of the same ids.

`collect` alternates llama-bench (-t 1 -p 0 -n 32 -d C; its K and V in F16, kvbench's in F32) with `kvbench
run --contexts` (full, static), each alternation started by the other engine, with one-thread triad measured
(kvbench.measure.machine) before every llama-bench call; kvbench's run measures its own every round. A share of
bandwidth: the bytes a step reads (weights once, the cache at that context) over its time, over that triad.
`--dtype bfloat16`: kvbench's bfloat16 model against a GGUF of its matrices in BF16 (the converter's --outtype bf16).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np

LLAMA_CPP_PYTHON = "0.3.36"  # its sdist vendors llama.cpp at commit 0c1e570
TARGETS = ("llama-bench", "llama-eval-callback")
CONTEXTS = (256, 1024)
GENERATED = 32  # llama-bench -n: tokens decoded after the context, timed together
PRESET = "llama-mini"
OUTPUT = Path("results/limit/llamacpp.json")


# -- the build -----------------------------------------------------------------------------------------


def cache_root() -> Path:
    base = os.environ.get("KVBENCH_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvbench"
    return Path(base).resolve() / "llama.cpp" / LLAMA_CPP_PYTHON


def binary(name: str, root: Path | None = None) -> Path:
    return (root or cache_root()) / "build" / "bin" / name


def build(root: Path | None = None, jobs: int = 2) -> Path:
    """The build directory, compiled if any target is missing (a finished build is reused as it is)."""
    root = (root or cache_root()).resolve()  # the real path, not through a symlink (issue 28)
    if all(binary(target, root).is_file() for target in TARGETS):
        return root / "build"
    root.mkdir(parents=True, exist_ok=True)
    sdist = root / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
    if not sdist.is_file():
        run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", str(root)])
    source = root / f"llama_cpp_python-{LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"
    if not (source / "CMakeLists.txt").is_file():
        with tarfile.open(sdist) as archive:
            archive.extractall(root, filter="data")
    compilers = {"CMAKE_C_COMPILER": "gcc-12" if shutil.which("gcc-12") else "gcc",
                 "CMAKE_CXX_COMPILER": "g++-12" if shutil.which("g++-12") else "g++"}
    options = {"CMAKE_BUILD_TYPE": "Release", "GGML_NATIVE": "ON", "BUILD_SHARED_LIBS": "OFF", "LLAMA_CURL": "OFF",
               "LLAMA_OPENSSL": "OFF", "LLAMA_BUILD_TESTS": "OFF", "LLAMA_BUILD_SERVER": "OFF", **compilers}
    if not (root / "build" / "build.ninja").is_file():  # configured once; ninja then rebuilds only what is missing
        run(["cmake", "-S", str(source), "-B", str(root / "build"), "-G", "Ninja",
             *[f"-D{name}={value}" for name, value in options.items()]])
    run(["ninja", "-C", str(root / "build"), f"-j{jobs}", *TARGETS])
    return root / "build"


def run(command: list[str], **options) -> subprocess.CompletedProcess:
    print("+", " ".join(command), file=sys.stderr, flush=True)
    return subprocess.run(command, check=True, **options)


# -- the weights ----------------------------------------------------------------------------------------


def model_gguf(preset: str = PRESET, seed: int = 0, root: Path | None = None,
               dtype: str = "float32") -> tuple[object, Path]:
    """kvbench's model and its GGUF, kept beside the build (written once per preset, seed and dtype, atomically)."""
    from kvbench.model import build_model, preset_config
    from kvbench.models import gguf_writer

    model = build_model(preset_config(preset, dtype=dtype), seed=seed)
    path = (root or cache_root()) / "gguf" / f"{preset}-seed{seed}-{'bf16' if dtype == 'bfloat16' else 'f32'}.gguf"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        gguf_writer.write_gguf(model, partial, name=f"kvbench {preset} seed {seed}")
        os.replace(partial, path)
    return model, path


# -- the check that both engines compute the same numbers ------------------------------------------------

AGREEMENT = 2e-4  # llama-eval-callback prints 4 decimals (5e-5), and float32 sums in another order differ by less
TENSOR_LINE = re.compile(r"common_debug_cb_eval:\s+(\S+) = \(")
ROW_LINE = re.compile(r"^\s*\[([^\[\]]+)\],\s*$")


def printed_tensors(text: str) -> dict[str, dict]:
    """llama-eval-callback's printout: per tensor, its printed rows (the first and last 3 values of the first
    and last 3 rows, None where it elides) and the sum of all its values."""
    tensors, current = {}, None
    for line in text.splitlines():
        if found := TENSOR_LINE.search(line):
            shape = [int(n) for n in re.findall(r"\{([\d, ]+)\}", line)[-1].split(",")]  # ggml's ne: columns first
            current = tensors[found.group(1)] = {"shape": shape, "rows": [], "sum": None}
        elif current is not None and (row := ROW_LINE.match(line)):
            current["rows"].append([None if cell.strip() == "..." else float(cell) for cell in
                                    row.group(1).split(",") if cell.strip()])
        elif current is not None and (total := re.match(r"^\s*sum = (\S+)", line)):
            current["sum"] = float(total.group(1))
            current = None
    return tensors


def printed_token_ids(text: str) -> list[int]:
    lines = text.splitlines()
    start = next(index for index, line in enumerate(lines) if "number of input tokens" in line)
    count = int(lines[start].rsplit("=", 1)[1])
    return [int(line.strip().split()[-1]) for line in lines[start + 1 : start + 1 + count]]


def compare_rows(printed: dict, reference: np.ndarray) -> float:
    """Largest |difference| between llama.cpp's printed values and kvbench's (rows, columns) reference, taking
    the printed rows as the first and last of the reference's as llama.cpp elides them. A tensor of fewer rows
    holds the last positions only (llama.cpp keeps only the rows it outputs from the last layer's attention on)."""
    reference = reference[-printed["shape"][1]:]
    rows, shown = reference.shape[0], printed["rows"]
    indices = list(range(rows)) if rows == len(shown) else list(range(3)) + list(range(rows - 3, rows))
    worst = 0.0
    for index, values in zip(indices, shown):
        columns = list(range(3)) + list(range(reference.shape[1] - 3, reference.shape[1])) if None in values else \
            list(range(reference.shape[1]))
        kept = [value for value in values if value is not None]
        worst = max(worst, float(np.max(np.abs(reference[index, columns] - np.asarray(kept)))))
    return worst


def eval_callback(path: Path, prompt: str, layers: list[str], attempts: int = 10) -> tuple[list[int], dict]:
    """The prompt's token ids and the printed tensors of one llama-eval-callback run on one thread, K and V in F32.
    Its logger is asynchronous and never drained at exit (llama.cpp issue 22142), so the last tensors are lost in
    about one run of three on a busy machine: a run missing one is repeated."""
    command = [str(binary("llama-eval-callback")), "-m", str(path), "-p", prompt, "-t", "1", "-c", "128", "--seed", "0",
               "-ctk", "f32", "-ctv", "f32", "-fa", "off"]
    for _ in range(attempts):
        completed = subprocess.run(command, capture_output=True, text=True, check=True)
        text = completed.stdout + completed.stderr
        printed = printed_tensors(text)
        if all(printed.get(name, {}).get("sum") is not None for name in [*layers, "result_output"]):
            return printed_token_ids(text), printed
    raise ValueError(f"llama-eval-callback printed {sorted(printed)} in {attempts} runs, expected {layers} and "
                     "result_output")


def verify(prompt: str = "The quick brown fox jumps over the lazy dog.", preset: str = PRESET) -> dict:
    """llama.cpp's residual stream after every layer and logits (llama-eval-callback) against kvbench's forward."""
    import torch

    model, path = model_gguf(preset)
    ids, printed = eval_callback(path, prompt, [f"l_out-{layer}" for layer in range(model.config.layers)])
    residuals = []
    hooks = [block.register_forward_hook(lambda _module, _inputs, output: residuals.append(output[0]))  # batch 0
             for block in model.blocks]
    with torch.no_grad():
        logits, _ = model(torch.tensor([ids]))
    for hook in hooks:
        hook.remove()
    found = {f"l_out-{layer}": compare_rows(printed[f"l_out-{layer}"], residual.numpy())
             for layer, residual in enumerate(residuals)}
    output = logits[0, -printed["result_output"]["shape"][1]:].numpy()
    found["result_output"] = compare_rows(printed["result_output"], output)
    return {"prompt": prompt, "token_ids": ids, "gguf": str(path), "max_abs_diff": found,
            "result_output_sum": {"llama.cpp": printed["result_output"]["sum"], "kvbench": float(output.sum())},
            "tolerance": AGREEMENT, "agree": max(found.values()) <= AGREEMENT}


# -- the interleaved timing ------------------------------------------------------------------------------


def llama_bench(path: Path, context: int, repetitions: int, generated: int = GENERATED) -> dict:
    """llama-bench on one thread, decode only, at one context: every repetition's wall seconds per token, and
    the CPU seconds the whole process used (model load, warm-up and the untimed prefill of the context included)."""
    import resource

    command = [str(binary("llama-bench")), "-m", str(path), "-t", "1", "-p", "0", "-n", str(generated),
               "-d", str(context), "-r", str(repetitions), "-o", "json"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    completed = subprocess.run(command, capture_output=True, text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    (entry,) = json.loads(completed.stdout)
    return {"context": entry["n_depth"], "generated": entry["n_gen"],
            "per_token_seconds": [ns / 1e9 / entry["n_gen"] for ns in entry["samples_ns"]],
            "process_cpu_seconds": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
            **{key: entry.get(key) for key in ("build_commit", "cpu_info", "flash_attn", "type_k", "type_v",
                                                "n_threads", "model_size")}}


def llama_cpu_per_token(path: Path, context: int, repetitions: int) -> dict:
    """CPU seconds per decoded token, which a shared machine's waits leave out: the process's CPU time decoding
    GENERATED tokens per repetition, less the same run's decoding one (load, warm-up, prefill cancel out),
    over the tokens between them. llama-bench's own figure is the wall clock, kept beside it."""
    long, short = llama_bench(path, context, repetitions), llama_bench(path, context, repetitions, generated=1)
    tokens = repetitions * (GENERATED - 1)
    return {**long, "short_process_cpu_seconds": short["process_cpu_seconds"],
            "cpu_per_token_seconds": (long["process_cpu_seconds"] - short["process_cpu_seconds"]) / tokens}


def bandwidth_now(repeats: int = 3) -> dict[str, float]:
    """One-thread copy and triad (bytes/s, medians of `repeats`) past the last-level cache, as kvbench measures."""
    from kvbench.measure import machine

    measured = machine.memory_bandwidth([1], machine.buffer_bytes(machine.last_level_cache_bytes()), repeats)
    return {kernel: measured[kernel]["1"]["median"] for kernel in ("copy", "triad")}


def kvbench_run(output: Path, arguments: argparse.Namespace) -> None:
    run([sys.executable, "-m", "kvbench", "run", "--preset", arguments.preset, "--contexts", ",".join(map(
        str, arguments.contexts)), "--modes", arguments.modes, "--repeats", str(arguments.kvbench_repeats),
         "--threads", "1", "--dtype", arguments.dtype, "--no-progress", "--output", str(output)])


def kvbench_figures(path: Path, contexts: tuple[int, ...]) -> dict:
    """A kvbench contexts record's steady steps per context and mode on both clocks (per sample: the mean of its
    timed steps, and the thread's CPU time over them per step), the triad of its rounds, the bytes a step reads."""
    from kvbench.measure import latency
    from kvbench.record import RecordView

    view = RecordView.load(path)
    workload, limits = view.workload, view.limits
    figures = {"record": str(path), "triad": [entry["triad"] for entry in limits.get("rounds", [])],
               "weight_bytes": limits["weight_bytes_per_step"], "steps": {}, "cache_bytes": {}}
    for context in contexts:
        figures["steps"][str(context)] = {mode: {
            "wall": [latency.context_figures(rep, workload.warmup_steps)["step"] for rep in view.repetitions(mode, context)],
            "cpu": [rep["cpu_seconds"] / workload.timed_steps for rep in view.repetitions(mode, context)]}
            for mode in view.modes}
        figures["cache_bytes"][str(context)] = view.memory("static", context)["measured_bytes"]
    return figures


CACHE_ELEMENT_BYTES = {"f32": 4, "f16": 2, "bf16": 2}


def cache_bytes(config, context: int, element: str) -> int:
    """K and V of every layer at `context` positions (llama-bench's cache is F16 by default; -ctk takes no f32)."""
    return 2 * config.layers * config.kv_heads * config.head_dim * CACHE_ELEMENT_BYTES[element] * context


load_average = lambda: [round(value, 2) for value in os.getloadavg()]  # noqa: E731


def alternate(path: Path, out_dir: Path, arguments: argparse.Namespace) -> list[dict]:
    """`alternations` pairs of llama-bench and kvbench run, the first engine alternating."""
    found, contexts = [], tuple(arguments.contexts)
    for index in range(arguments.alternations):
        entry = {"index": index, "first": "llama.cpp" if index % 2 == 0 else "kvbench", "load_before": load_average()}
        order = ("llama.cpp", "kvbench") if index % 2 == 0 else ("kvbench", "llama.cpp")
        for engine in order:
            if engine == "llama.cpp":
                entry["llama_triad_before"] = bandwidth_now()
                entry["llama"] = {str(context): llama_cpu_per_token(path, context, arguments.repetitions)
                                  for context in contexts}
            else:
                record = out_dir / f"kvbench-{index}.json"
                kvbench_run(record, arguments)
                entry["kvbench"] = kvbench_figures(record, contexts)
        entry["load_after"] = load_average()
        found.append(entry)
        print(f"alternation {index}: load {entry['load_before']} -> {entry['load_after']}", file=sys.stderr)
    return found


CLOCKS = ("cpu", "wall")


def engine_samples(alternations: list[dict], context: int, clock: str) -> dict[str, dict[int, list[float]]]:
    """Per engine, per alternation: its per-token seconds on `clock` (llama.cpp's CPU figure is one per alternation)."""
    llama = {entry["index"]: entry["llama"][str(context)] for entry in alternations}
    steps = {entry["index"]: entry["kvbench"]["steps"][str(context)] for entry in alternations}
    found = {"llama.cpp": {index: ([run["cpu_per_token_seconds"]] if clock == "cpu" else run["per_token_seconds"])
                           for index, run in llama.items()}}
    for mode in steps[alternations[0]["index"]]:
        found[f"kvbench {mode}"] = {index: by_mode[mode][clock] for index, by_mode in steps.items()}
    return found


def summary(alternations: list[dict], contexts: tuple[int, ...], config) -> list[dict]:
    """Per context and clock: each engine's per-token time (the median over every sample of every alternation, with
    its 95% interval), kvbench's static step over llama.cpp's token per alternation, and each one's share of the
    triad measured beside it (the bytes a step reads over its median time)."""
    from kvbench.measure.latency import median_with_interval

    weights = alternations[0]["kvbench"]["weight_bytes"]
    triad = {"llama.cpp": statistics.median(entry["llama_triad_before"]["triad"] for entry in alternations),
             "kvbench static": statistics.median(t for entry in alternations for t in entry["kvbench"]["triad"])}
    rows = []
    for context in contexts:
        element = alternations[0]["llama"][str(context)]["type_k"]
        reads = {"llama.cpp": weights + cache_bytes(config, context + GENERATED // 2, element),
                 "kvbench static": weights + alternations[0]["kvbench"]["cache_bytes"][str(context)]}
        for clock in CLOCKS:
            samples = engine_samples(alternations, context, clock)
            ratios = [statistics.median(samples["kvbench static"][index]) / statistics.median(samples["llama.cpp"][index])
                      for index in samples["llama.cpp"]]
            figures = {engine: median_with_interval([t for values in by_index.values() for t in values])
                       for engine, by_index in samples.items()}
            rows.append({"context": context, "clock": clock, "per_token_seconds": figures,
                         "kvbench_static_over_llama_cpp": {**median_with_interval(ratios), "per_alternation": ratios},
                         "bytes_per_step": reads, "triad": triad,
                         "share_of_triad": {engine: reads[engine] / figures[engine]["median"] / triad[engine]
                                            for engine in reads}})
    return rows


def table(rows: list[dict]) -> str:
    """The summary as a markdown table (milliseconds, medians [95% interval])."""
    ms = lambda figure: f"{figure['median'] * 1e3:.3f} [{figure['low'] * 1e3:.3f}, {figure['high'] * 1e3:.3f}]"  # noqa: E731
    lines = ["| c | clock | llama.cpp ms/token | kvbench static ms/step | kvbench full ms/step | static / llama.cpp | "
             "share of triad: llama.cpp, kvbench |", "|--:|---|---|---|---|---|---|"]
    for row in rows:
        ratio, share, figures = row["kvbench_static_over_llama_cpp"], row["share_of_triad"], row["per_token_seconds"]
        lines.append(f"| {row['context']} | {row['clock']} | {ms(figures['llama.cpp'])} | {ms(figures['kvbench static'])} | "
                     f"{ms(figures['kvbench full']) if 'kvbench full' in figures else ''} | "
                     f"{ratio['median']:.2f} [{ratio['low']:.2f}, {ratio['high']:.2f}] | "
                     f"{share['llama.cpp']:.0%}, {share['kvbench static']:.0%} |")
    triad = rows[0]["triad"]
    lines.append(f"\nOne-thread triad: {triad['llama.cpp'] / 1e9:.1f} GB/s beside llama-bench, "
                 f"{triad['kvbench static'] / 1e9:.1f} GB/s in kvbench's rounds (medians).")
    return "\n".join(lines)


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def collect(arguments: argparse.Namespace) -> dict:
    """Build (or reuse), write the GGUF, check both engines agree, then time them alternately; the record."""
    import torch

    from kvbench.files import check_output, write_json_atomic
    from kvbench.models.gguf import file_sha256
    from kvbench.record import utc_now

    contexts, out_dir = tuple(arguments.contexts), arguments.output.with_suffix("")
    check_output(arguments.output, arguments.force)
    for index in range(arguments.alternations):
        check_output(out_dir / f"kvbench-{index}.json", arguments.force)
    started, load = utc_now(), uptime()
    build()
    model, path = model_gguf(arguments.preset, dtype=arguments.dtype)
    checked = verify(preset=arguments.preset)  # on the F32 file: a bfloat16 model holds the same weights rounded
    torch.set_num_threads(1)
    alternations = alternate(path, out_dir, arguments)
    rows = summary(alternations, contexts, model.config)
    first_run = alternations[0]["llama"][str(contexts[0])]
    record = {"schema": "kvbench.llamacpp/1", "created_utc": started, "finished_utc": utc_now(),
              "command": ["python", "scripts/llamacpp.py", *sys.argv[1:]], "preset": arguments.preset, "seed": 0,
              "dtype": arguments.dtype,
              "llama_cpp": {"source": f"llama-cpp-python {LLAMA_CPP_PYTHON} sdist, vendor/llama.cpp",
                            "commit": first_run["build_commit"], "targets": list(TARGETS),
                            "bench": f"llama-bench -t 1 -p 0 -n {GENERATED} (and -n 1) -d C -r {arguments.repetitions}",
                            **{key: first_run[key] for key in ("cpu_info", "flash_attn", "type_k", "model_size")}},
              "gguf": {"path": str(path), "size": path.stat().st_size, "sha256": file_sha256(path)},
              "verify": checked, "uptime": {"before": load, "after": uptime()},
              "alternations": alternations, "summary": rows}
    write_json_atomic(record, arguments.output, force=arguments.force)
    print(table(rows))
    return record


def parser() -> argparse.ArgumentParser:
    parsed = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parsed.add_subparsers(dest="command", required=True)
    commands.add_parser("build", help="build llama-bench and llama-eval-callback (reused when present)")
    commands.add_parser("verify", help="llama.cpp's activations and logits against kvbench's")
    timing = commands.add_parser("collect", help="build, write, verify, then time both engines alternately")
    timing.add_argument("--alternations", type=int, default=4)
    timing.add_argument("--repetitions", type=int, default=20, help="llama-bench -r")
    timing.add_argument("--kvbench-repeats", type=int, default=7, help="kvbench run --repeats")
    timing.add_argument("--contexts", type=lambda text: [int(n) for n in text.split(",")], default=list(CONTEXTS))
    timing.add_argument("--modes", default="full,static", help="kvbench run --modes")
    timing.add_argument("--preset", default=PRESET, help="a llama-family preset without a window")
    timing.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="kvbench run --dtype")
    timing.add_argument("--output", type=Path, default=OUTPUT)
    timing.add_argument("--force", action="store_true")
    return parsed


def main() -> int:
    arguments = parser().parse_args()
    try:
        if arguments.command == "build":
            print(build())
        elif arguments.command == "verify":
            print(json.dumps(verify(), indent=2))
        else:
            collect(arguments)
    except (ValueError, subprocess.CalledProcessError) as error:
        print(f"llamacpp: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
