"""kvbench's caches beside Hugging Face transformers' caches where they cannot share weights: the gpt2 family.

    dynamic    kvbench's exact kinds against transformers' DynamicCache
    quantized  kvbench's quantized kinds against transformers' QuantizedCache (quanto, 4 and 2 bits)

A llama-family model has a transformers twin with exactly its weights, so its transformers caches
are modes of `kvbench run` (hf-dynamic, hf-static, hf-quantized-int4, hf-quantized-int8), paired
in the same rotations and gated against the same full path; this script refuses that family and
says so. What remains here cannot be a mode: for a gpt2-family preset, transformers' GPT-2 (the
closest architecture: learned positions, pre-norm, GELU) and Llama of the same size, random
weights of their own, and quanto's 2-bit cache. No download; the same teacher-forced token ids,
kvbench's protocol (a warmup per mode, random order, whole rotations). Every path is checked
against its own model's full-prefix logits first, with kvbench's metrics: an exact cache by
the tolerance, a quantized one by its drift (KL of next-token distributions, top-1
agreement). Writes one JSON record with every sample.

    pip install -e '.[hf]'          # '.[quanto]' for the quantized comparison
    python scripts/hf_peers.py dynamic --length 1024
    python scripts/hf_peers.py quantized --preset medium --length 1024
"""

from __future__ import annotations

import argparse
import importlib.metadata
import inspect
import statistics
import sys
from pathlib import Path

import torch

from kvbench.config import DecoderConfig, preset_config
from kvbench.files import check_output, write_json_atomic
from kvbench.measure import capture
from kvbench.measure.sampling import measure_loops
from kvbench.measure.timing import Protocol, set_threads
from kvbench.model import build_model
from kvbench.models import hf
from kvbench.modes import spec
from kvbench.record import utc_now
from kvbench.workloads.decode import check_equivalence, compare_drift, compare_logits, decode, token_ids, tolerances

OUTPUTS = {"dynamic": Path("results/external/hf-dynamic-cache.json"),
           "quantized": Path("results/external/hf-quantized-cache.json")}
KVBENCH_MODES = {"dynamic": ("concat", "static", "paged"), "quantized": ("static", "quantized-int8", "quantized-int4")}


def hf_models(config: DecoderConfig, families: tuple[str, ...] = ("gpt2", "llama")) -> dict:
    """transformers models of the same size as a gpt2-family `config`, random weights of their own."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    models = {}
    if "gpt2" in families:
        models["gpt2"] = GPT2LMHeadModel(GPT2Config(
            vocab_size=config.vocab_size, n_embd=config.width, n_head=config.heads, n_layer=config.layers,
            n_positions=config.max_length, bos_token_id=0, eos_token_id=0,
        )).eval()
    if "llama" in families:
        models["llama"] = LlamaForCausalLM(LlamaConfig(
            vocab_size=config.vocab_size, hidden_size=config.width, num_attention_heads=config.heads,
            num_key_value_heads=config.kv_heads, num_hidden_layers=config.layers,
            intermediate_size=config.mlp_ratio * config.width, max_position_embeddings=config.max_length,
            bos_token_id=0, eos_token_id=0, pad_token_id=0,
        )).eval()
    return models


def dynamic_cache(model):
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def quantized_cache(model, nbits: int, group_size: int, residual: int):
    from transformers import QuantizedCache

    return QuantizedCache(backend="quanto", config=model.config, nbits=nbits, axis_key=0, axis_value=0,
                          q_group_size=group_size, residual_length=residual)


def hf_decode(model, ids: torch.Tensor, make_cache, keep_logits: bool = False) -> torch.Tensor | None:
    """One teacher-forced loop, one token a step, through a transformers cache."""
    kept = []
    keyword = cache_keyword(model)
    with torch.inference_mode():
        cache = make_cache(model)  # updated in place by every forward
        for t in range(ids.shape[1]):
            output = model(input_ids=ids[:, t : t + 1], use_cache=True, **{keyword: cache})
            if keep_logits:
                kept.append(output.logits[:, -1])
    return torch.stack(kept, dim=1) if keep_logits else None


def cache_keyword(model) -> str:
    """transformers 5.x renamed `past_key_values` to `cache` (the old name warns, then goes away)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def hf_reference(model, ids: torch.Tensor) -> torch.Tensor:
    """Full-prefix logits of every step: one causal forward over the whole sequence."""
    with torch.inference_mode():
        return model(input_ids=ids, use_cache=False).logits


def peers(kind: str, models: dict, args) -> dict:
    """label -> (model, cache factory) of the transformers paths compared."""
    if kind == "dynamic":
        return {f"hf-{family}-dynamic": (model, dynamic_cache) for family, model in models.items()}
    return {f"hf-{family}-quanto-int{bits}": (model, lambda m, bits=bits: quantized_cache(m, bits, args.group, args.residual))
            for family, model in models.items() for bits in (4, 2)}


def checks(kind: str, model, ids, paths: dict, options: dict) -> dict:
    """Every path against its own model's full prefix, with kvbench's metrics."""
    out = {mode: result.to_dict() for mode, result in check_equivalence(model, ids, KVBENCH_MODES[kind],
                                                                           options=options).items()}
    atol, rtol = tolerances(torch.float32)
    limits = spec("quantized-int4").limits_for(model.config)
    references = {id(hf_model): hf_reference(hf_model, ids) for hf_model, _ in paths.values()}  # once per model
    for label, (hf_model, make_cache) in paths.items():
        candidate, reference = hf_decode(hf_model, ids, make_cache, keep_logits=True), references[id(hf_model)]
        result = compare_logits(label, candidate, reference, atol, rtol) if kind == "dynamic" else \
            compare_drift(label, candidate, reference, limits, atol, rtol)
        out[label] = result.to_dict()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=sorted(OUTPUTS))
    parser.add_argument("--preset", default="seed")
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--group", type=int, default=32, help="quantized: tokens per group, as kvbench's default")
    parser.add_argument("--residual", type=int, default=128, help="quantized: positions kept in full precision")
    parser.add_argument("--output", type=Path)
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    output = args.output or OUTPUTS[args.kind]
    check_output(output, args.force)  # before anything is measured
    config = preset_config(args.preset)
    hf.require_transformers()  # before anything is built or set: one line when it is missing or another version
    if config.family != "gpt2":
        raise ValueError(f"--preset {args.preset} is of the {config.family} family, whose transformers caches are "
                         f"modes of kvbench run on the same weights: kvbench run --preset {args.preset} "
                         "--modes full,static,hf-dynamic,hf-static")
    threads = set_threads(1)
    model = build_model(config, seed=0)
    ids = token_ids(config, 1, args.length)
    options = {kind: {"group_size": args.group, "residual": args.residual} for kind in KVBENCH_MODES["quantized"][1:]}
    hf_paths = peers(args.kind, hf_models(config), args)
    found = checks(args.kind, model, ids, hf_paths, options)
    loops = {mode: (lambda mode=mode: decode(model, ids, mode, options=options)) for mode in KVBENCH_MODES[args.kind]}
    for label, (hf_model, make_cache) in hf_paths.items():
        loops[label] = lambda hf_model=hf_model, make_cache=make_cache: hf_decode(hf_model, ids, make_cache)
    samples = measure_loops({args.length: loops}, Protocol.fixed(args.repeats, control="none"))

    medians = {mode: statistics.median(s.seconds for s in samples if s.mode == mode) for mode in loops}
    fastest_kvbench = min(KVBENCH_MODES[args.kind][-2 if args.kind == "quantized" else 0:], key=medians.get)
    fastest_hf = min((m for m in loops if m.startswith("hf-")), key=medians.get)
    result = {
        "schema": "kvbench.external/1",
        "created_utc": utc_now(),
        "command": sys.argv,
        "kind": args.kind,
        "preset": args.preset,
        "config": config.to_dict(),
        "length": args.length,
        "cache_options": options,
        "transformers_version": importlib.metadata.version("transformers"),
        "optimum_quanto_version": _version("optimum-quanto"),
        "threads_in_effect": threads,
        "environment": capture.collect_environment(),
        "checks": found,
        "repetitions": [s.to_dict() for s in samples],
        "per_token_median_us": {mode: medians[mode] / args.length * 1e6 for mode in loops},
        "fastest_kvbench_mode": fastest_kvbench,
        "fastest_hf_mode": fastest_hf,
        "ratio_fastest_kvbench_to_fastest_hf": medians[fastest_kvbench] / medians[fastest_hf],
        "ratio_fastest_kvbench_to_each_hf": {m: medians[fastest_kvbench] / medians[m] for m in loops if m.startswith("hf-")},
        "same_weights": False,
    }
    write_json_atomic(result, output, force=args.force)
    print_summary(result, output)
    return 0


def print_summary(result: dict, output: Path) -> None:
    for mode, per_token in result["per_token_median_us"].items():
        check = result["checks"][mode]
        verdict = ("exact" if check.get("exact", True) else f"KL {check['kl_mean']:.1e}, top-1 {check['top1_agreement']:.1%}")
        print(f"{mode:24s} {per_token:9.1f} us/token  {'ok' if check['passed'] else 'FAILED'} {verdict}")
    for label, ratio in result["ratio_fastest_kvbench_to_each_hf"].items():
        print(f"{result['fastest_kvbench_mode']} / {label} = {ratio:.2f}")
    print(f"-> {output}")


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def run(argv: list[str] | None = None) -> int:
    """main, with kvbench's rule for bad input: one line on stderr, exit status 2."""
    try:
        return main(argv)
    except ValueError as error:
        print(f"hf_peers: error: {str(error).splitlines()[0]}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(run())
