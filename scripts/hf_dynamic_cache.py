"""kvbench's cached modes beside Hugging Face transformers' DynamicCache, in one process.

Same tiny configuration as the source document's lab (width 32, 4 heads, 1 layer,
vocabulary 128, float32, one thread), same teacher-forced token ids, kvbench's own
protocol (warmup per mode, rotating order, N repetitions). The transformers models
are GPT-2 (the closest architecture: learned positions, pre-norm, GELU) and Llama,
both with random weights and no download. Writes a JSON record with every sample.

    pip install -e '.[hf]' && python scripts/hf_dynamic_cache.py --length 1024
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

from kvbench import capture
from kvbench.decode import decode, token_ids
from kvbench.files import write_json_atomic
from kvbench.model import DecoderConfig, build_model
from kvbench.record import utc_now
from kvbench.timing import Protocol, measure_loops, set_threads


def hf_models(config: DecoderConfig) -> dict:
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(
        vocab_size=config.vocab_size, n_embd=config.width, n_head=config.heads, n_layer=config.layers,
        n_positions=config.max_length, bos_token_id=0, eos_token_id=0,
    ))
    llama = LlamaForCausalLM(LlamaConfig(
        vocab_size=config.vocab_size, hidden_size=config.width, num_attention_heads=config.heads,
        num_key_value_heads=config.kv_heads, num_hidden_layers=config.layers,
        intermediate_size=config.mlp_ratio * config.width, max_position_embeddings=config.max_length,
        bos_token_id=0, eos_token_id=0, pad_token_id=0,
    ))
    return {"hf-gpt2-dynamic": gpt2.eval(), "hf-llama-dynamic": llama.eval()}


def hf_loop(model, ids: torch.Tensor) -> None:
    from transformers import DynamicCache

    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        for t in range(ids.shape[1]):
            cache = model(input_ids=ids[:, t : t + 1], cache=cache, use_cache=True).past_key_values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=Protocol.repeats)
    parser.add_argument("--output", type=Path, default=Path("results/external/hf-dynamic-cache.json"))
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)

    import transformers

    threads = set_threads(1)
    config = DecoderConfig()
    model = build_model(config, seed=0)
    ids = token_ids(config, 1, args.length)
    loops = {mode: (lambda mode=mode: decode(model, ids, mode)) for mode in ("concat", "static", "paged")}
    for name, hf_model in hf_models(config).items():
        loops[name] = lambda hf_model=hf_model: hf_loop(hf_model, ids)
    samples = measure_loops({args.length: loops}, Protocol(repeats=args.repeats))

    medians = {mode: statistics.median(s.seconds for s in samples if s.mode == mode) for mode in loops}
    fastest_kvbench = min(("concat", "static", "paged"), key=medians.get)
    fastest_hf = min((m for m in loops if m.startswith("hf-")), key=medians.get)
    result = {
        "schema": "kvbench.external/1",
        "created_utc": utc_now(),
        "command": sys.argv,
        "config": config.to_dict(),
        "length": args.length,
        "transformers_version": transformers.__version__,
        "threads_in_effect": threads,
        "environment": capture.collect_environment(),
        "repetitions": [s.to_dict() for s in samples],
        "per_token_median_us": {mode: medians[mode] / args.length * 1e6 for mode in loops},
        "fastest_kvbench_mode": fastest_kvbench,
        "fastest_hf_mode": fastest_hf,
        "ratio_fastest_kvbench_to_fastest_hf": medians[fastest_kvbench] / medians[fastest_hf],
    }
    write_json_atomic(result, args.output, force=args.force)
    for mode in loops:
        print(f"{mode:18s} {result['per_token_median_us'][mode]:8.1f} us/token")
    print(f"{fastest_kvbench} / {fastest_hf} = {result['ratio_fastest_kvbench_to_fastest_hf']:.2f}  -> {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
