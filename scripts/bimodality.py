"""Why eager steps at a long context fall in two modes by process: one process per sample, each measured.

Each child process builds the model, prefills a static cache of `--context` tokens and times `--steps` steady
steps (thread CPU time and wall time, after warm-up steps). Beside the times it records what could differ
between processes: page faults during the steps (getrusage minflt/majflt), whether the cache's buffers and
the weights sit on transparent huge pages (AnonHugePages of their mappings in /proc/self/smaps; the
system's THP mode), the buffers' addresses modulo 4 KiB and 2 MiB (cache-set placement), and the CPU the
process ran on. The parent writes every child's row to one JSON file and prints them sorted by step time.

    python scripts/bimodality.py --processes 8 --context 1024
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

OUTPUT = Path("results/limit/bimodality.json")


def huge_pages_of(addresses: list[int]) -> dict:
    """AnonHugePages (kB) of the mappings holding each address, from /proc/self/smaps."""
    found, current, huge = {}, None, {}
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(part, 16) for part in head.split("-"))
            current = (start, end)
        elif head == "AnonHugePages:" and current is not None:
            huge[current] = int(line.split()[1])
    for address in addresses:
        found[hex(address)] = next((kb for (start, end), kb in huge.items() if start <= address < end), None)
    return found


def child(context: int, steps: int, preset: str) -> dict:
    import torch

    from kvbench.cache import make_cache
    from kvbench.config import preset_config
    from kvbench.model import build_model
    from kvbench.workloads.decode import token_ids

    torch.set_num_threads(1)
    model = build_model(preset_config(preset), seed=0)
    ids = token_ids(model.config, 1, context + steps)
    cpu_seconds, wall_seconds = [], []
    with torch.inference_mode():
        cache = make_cache("static", model.config, 1, context + steps)
        model(ids[:, :context], cache)
        for t in range(context, context + 8):  # warm-up, then rewind
            model(ids[:, t : t + 1], cache)
        before = resource.getrusage(resource.RUSAGE_SELF)
        for repeat in range(4):
            cache.length = context
            for t in range(context, context + steps):
                wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
                model(ids[:, t : t + 1], cache)
                cpu_seconds.append((time.thread_time_ns() - cpu) / 1e9)
                wall_seconds.append((time.perf_counter_ns() - wall) / 1e9)
        after = resource.getrusage(resource.RUSAGE_SELF)
    buffers = [cache.buffers(layer)[0].data_ptr() for layer in range(model.config.layers)]
    weights = [block.gate_up.weight.data_ptr() for block in model.blocks]
    return {"pid": os.getpid(), "cpu": os.sched_getaffinity(0) and open("/proc/self/stat").read().split()[38],
            "step_cpu_ms": 1e3 * statistics.median(cpu_seconds), "step_wall_ms": 1e3 * statistics.median(wall_seconds),
            "minflt": after.ru_minflt - before.ru_minflt, "majflt": after.ru_majflt - before.ru_majflt,
            "buffer_mod_4k": [a % 4096 for a in buffers], "buffer_mod_2m": [a % (2 << 20) for a in buffers],
            "buffer_huge_kb": huge_pages_of(buffers), "weight_huge_kb": huge_pages_of(weights),
            "weight_mod_4k": [a % 4096 for a in weights]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--preset", default="llama-mini")
    parser.add_argument("--malloc-mmap-threshold", nargs="+", default=["default"],
                        help="glibc's MALLOC_MMAP_THRESHOLD_ for the children, each value its own processes "
                             "('default': glibc's dynamic threshold)")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.context, args.steps, args.preset)))
        return 0
    from kvbench.files import write_json_atomic

    rows = []
    for _ in range(args.processes):
        for threshold in args.malloc_mmap_threshold:  # interleaved, so that no setting gets the quiet minutes
            env = dict(os.environ)
            if threshold != "default":
                env["MALLOC_MMAP_THRESHOLD_"] = threshold
            out = subprocess.run([sys.executable, __file__, "--child", "--context", str(args.context), "--steps",
                                  str(args.steps), "--preset", args.preset], capture_output=True, text=True,
                                 check=True, env=env)
            rows.append({"malloc_mmap_threshold": threshold, **json.loads(out.stdout.strip().splitlines()[-1])})
            print(json.dumps({k: rows[-1][k] for k in ("malloc_mmap_threshold", "step_cpu_ms", "step_wall_ms",
                                                       "minflt", "majflt", "buffer_mod_4k")}), flush=True)
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()
    write_json_atomic({"kind": "bimodality", "command": sys.argv, "transparent_hugepage": thp, "rows": rows},
                      args.output, True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
