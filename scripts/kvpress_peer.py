"""NVIDIA's kvpress 0.5.5 on kvbench's weights: the positions each press keeps and the next token it then gives.

kvpress compresses a transformers cache once, at the end of the prefill; kvbench's evicting kinds (knorm, snapkv,
tova, h2o, pyramidkv, streamingllm, random) claim to keep what its presses keep. This script is kvpress's side of
that claim, run in kvpress's own environment (`make kvpress`: kvpress pins transformers<5.3, kvbench 5.24.0):

- the packaged SmolLM2-135M-Instruct GGUF is read by kvbench's own loader (kvbench.models.gguf) and mapped onto
  transformers' LlamaForCausalLM by kvbench.models.hf.hf_model, so both sides compute with bit-identical weights;
- for each press and compression ratio, the prompt is prefilled under the press as kvpress's pipeline does
  (`with press(model): model.model(ids, past_key_values=DynamicCache())`); the press's `score` and `compress`
  are wrapped on the instance to capture each layer's scores, and the kept indices are recomputed as
  ScorerPress.compress and PyramidKVPress.compress compute them (`scores.topk(n_kept).indices`, n_kept read
  from the compressed keys), then checked against the keys the press kept: a recovery that differs stops the run;
- the next token is fed at its absolute position (the pipeline's position_ids) on the compressed cache, and its
  logits are kept;
- the compressed prefill and that one decode step are timed (perf_counter_ns, `--repetitions` fresh caches).

Output: one JSON (atomic), kept positions per layer and KV head (ascending), n_kept per layer, the margin of each
head's cut, the next token's top-5 logits, timings; `--tensors FILE.pt` adds every layer's scores and the full
next-token logits (what kvbench.models.kvpress_oracle compares within 1e-4 and explains ties with).

    make kvpress
    .venv-kvpress/bin/python scripts/kvpress_peer.py --prompt-length 256 --corpus --output results/eviction/kvpress-peer.json
    .venv-kvpress/bin/python scripts/kvpress_peer.py --prompt-ids ids.json --output peer.json --tensors peer.pt
    .venv-kvpress/bin/python scripts/kvpress_peer.py --prompt-length 256 --seed 0 --ratios 0.5 --presses knorm,tova \\
        --output peer.json

Bad input is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import json
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path

SCHEMA = "kvbench.kvpress-peer/1"
MODEL = "smollm2-135m"
KVPRESS_VERSION = "0.5.5"
# kvbench's mode -> kvpress's press, and the attention it runs under: ObservedAttentionPress reads the attention
# weights, which only eager attention returns; the others use sdpa, kvpress's default on CPU.
PRESSES = {"knorm": ("KnormPress", "sdpa"), "snapkv": ("SnapKVPress", "sdpa"), "tova": ("TOVAPress", "sdpa"),
           "h2o": ("ObservedAttentionPress", "eager"), "pyramidkv": ("PyramidKVPress", "sdpa"),
           "streamingllm": ("StreamingLLMPress", "sdpa"), "random": ("RandomPress", "sdpa")}
# Prompts kvpress refuses by assertion: SnapKV and PyramidKV need more than their 64-position window, StreamingLLM
# more than its 4 sinks.
SHORTEST = {"snapkv": 65, "pyramidkv": 65, "streamingllm": 5}
TOP = 5
DEFAULT_RATIOS = (0.25, 0.5, 0.75)


class OneLineParser(argparse.ArgumentParser):
    """argparse's refusals as a ValueError: the caller prints one line and exits 2, as for every other bad input."""

    def error(self, message: str):
        raise ValueError(message)


def parser() -> OneLineParser:
    found = OneLineParser(prog="kvpress_peer", description=__doc__.splitlines()[0])
    found.add_argument("--presses", default=",".join(PRESSES),
                       help=f"comma-separated kvbench mode names, of {', '.join(PRESSES)}")
    found.add_argument("--ratios", default=",".join(map(str, DEFAULT_RATIOS)),
                       help="comma-separated compression ratios in (0, 1): the fraction of positions a press drops")
    prompt = found.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt-ids", type=Path, help="a JSON list of P + 1 token ids: the prompt's P, then the "
                                                        "one token fed to the compressed cache")
    prompt.add_argument("--prompt-length", type=int, help="P: draw P + 1 ids uniformly over the vocabulary")
    found.add_argument("--seed", type=int, default=0, help="the generator seed of --prompt-length's ids")
    found.add_argument("--corpus", action="store_true", help="with --prompt-length: the corpus's first P + 1 tokens "
                                                              "(kvbench.models.corpus, the file's own tokenizer)")
    found.add_argument("--press-seed", type=int, default=0, help="RandomPress(seed=...)")
    found.add_argument("--repetitions", type=int, default=5, help="timed prefill + decode pairs per press and ratio "
                                                                  "(0: none, positions and logits only)")
    found.add_argument("--threads", type=int, default=1, help="torch's threads, as kvbench run's default")
    found.add_argument("--output", type=Path, required=True)
    found.add_argument("--tensors", type=Path, help="also write scores and full logits (torch.save) here")
    found.add_argument("--force", action="store_true", help="replace existing output files")
    return found


def ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"--ratios: expected numbers in (0, 1), got {text!r}") from None
    if not 0 < value < 1:
        raise ValueError(f"--ratios: expected numbers in (0, 1), got {value}")
    return value


def checked(argv: list[str] | None) -> argparse.Namespace:
    """The parsed arguments, each checked: ValueError naming what was expected and what was given."""
    args = parser().parse_args(argv)
    args.presses = [name.strip() for name in args.presses.split(",") if name.strip()]
    unknown = [name for name in args.presses if name not in PRESSES]
    if unknown or not args.presses:
        raise ValueError(f"--presses: expected names among {', '.join(PRESSES)}, got {unknown or 'none'}")
    if len(set(args.presses)) != len(args.presses):
        raise ValueError(f"--presses: expected each press once, got {args.presses}")
    args.ratios = [ratio(text.strip()) for text in args.ratios.split(",")]
    if len(set(args.ratios)) != len(args.ratios):
        raise ValueError(f"--ratios: expected each ratio once, got {args.ratios}")
    if args.corpus and args.prompt_length is None:
        raise ValueError("--corpus: expected with --prompt-length, got it with --prompt-ids")
    for name, least in (("--repetitions", 0), ("--threads", 1), ("--prompt-length", 1)):
        value = getattr(args, name[2:].replace("-", "_"))
        if value is not None and value < least:
            raise ValueError(f"{name}: expected an integer >= {least}, got {value}")
    return args


def read_prompt(path: Path) -> list[int]:
    from kvbench.files import read_json

    ids = read_json(path, "prompt ids")
    if not isinstance(ids, list) or len(ids) < 2 or not all(type(i) is int for i in ids):
        shown = type(ids).__name__ if not isinstance(ids, list) else f"a list of {len(ids)} items"
        raise ValueError(f"{path}: expected a JSON list of at least 2 integer token ids, got {shown}")
    return ids


def prompt_ids(args, vocab: int, corpus_ids=None) -> tuple[list[int], str]:
    """P + 1 token ids and where they came from; ValueError for ids outside the vocabulary or a prompt too short
    for a press. `corpus_ids(n)`: the corpus's first n token ids (--corpus)."""
    import torch

    if args.prompt_ids is not None:
        ids, source = read_prompt(args.prompt_ids), f"file {args.prompt_ids}"
    elif args.corpus:
        ids = corpus_ids(args.prompt_length + 1)
        source = "the corpus's first tokens (kvbench.models.corpus), by the model file's tokenizer"
    else:
        generator = torch.Generator().manual_seed(args.seed)
        ids = torch.randint(0, vocab, (args.prompt_length + 1,), generator=generator).tolist()
        source = f"torch.randint over the vocabulary, seed {args.seed}"
    outside = [i for i in ids if not 0 <= i < vocab]
    if outside:
        raise ValueError(f"prompt ids: expected ids in [0, {vocab}), got {outside[0]}")
    for name in args.presses:
        if len(ids) - 1 < SHORTEST.get(name, 1):
            raise ValueError(f"--presses {name}: kvpress needs a prompt of at least {SHORTEST[name]} tokens, "
                             f"got {len(ids) - 1}")
    return ids, source


def make_press(name: str, compression: float, seed: int):
    import kvpress

    press = getattr(kvpress, PRESSES[name][0])
    return press(compression_ratio=compression, seed=seed) if name == "random" else press(compression_ratio=compression)


def capture(press) -> dict:
    """Wrap `press`'s score and compress on the instance: layer -> its scores (B, KVH, P) and the indices kept,
    recomputed from the scores as compress computes them and checked against the keys compress kept."""
    import torch

    seen: dict[int, dict] = {}
    score, compress = press.score, press.compress

    def scoring(module, *args, **kwargs):
        scores = score(module, *args, **kwargs)
        seen[module.layer_idx] = {"scores": scores.detach().clone()}
        return scores

    def compressing(module, hidden_states, keys, values, attentions, kwargs):
        kept_keys, kept_values = compress(module, hidden_states, keys, values, attentions, kwargs)
        entry = seen[module.layer_idx]
        indices = entry["scores"].topk(kept_keys.shape[2], dim=-1).indices
        gathered = keys.gather(2, indices.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1]))
        if not torch.equal(gathered, kept_keys):
            raise RuntimeError(f"{type(press).__name__}, layer {module.layer_idx}: the kept indices recomputed from "
                               "the scores do not give the keys the press kept (kvpress's compress changed?)")
        entry["indices"] = indices
        return kept_keys, kept_values

    press.score, press.compress = scoring, compressing
    return seen


def prefill(model, press, ids):
    """The compressed cache of the prompt `ids` (1, P), as kvpress's pipeline prefills: the model without its head."""
    from transformers import DynamicCache

    cache = DynamicCache()
    with press(model):
        model.model(input_ids=ids, past_key_values=cache)
    return cache


def decode(model, cache, token, position: int):
    """The next token's logits (V,) on the compressed cache, at its absolute position (the pipeline's
    position_ids: the cache's own length is now n_kept)."""
    import torch

    positions = torch.tensor([[position]], dtype=torch.long)
    return model(input_ids=token, past_key_values=cache, position_ids=positions).logits[0, -1].float()


def timed(call):
    start = time.perf_counter_ns()
    result = call()
    return result, time.perf_counter_ns() - start


def timings(model, press, prompt, token, repetitions: int) -> dict:
    """Per repetition, a fresh compressed prefill and one decode step on it, each timed alone."""
    prefill_ns, decode_ns = [], []
    for _ in range(repetitions):
        cache, elapsed = timed(lambda: prefill(model, press, prompt))
        prefill_ns.append(elapsed)
        decode_ns.append(timed(lambda: decode(model, cache, token, prompt.shape[1]))[1])
    summary = lambda values: {"median_ns": statistics.median(values), "ns": values} if values else None  # noqa: E731
    return {"prefill": summary(prefill_ns), "decode": summary(decode_ns)}


def top(logits) -> dict:
    values, indices = logits.topk(TOP)
    return {"top5": [[int(i), float(v)] for i, v in zip(indices, values)], "argmax": int(indices[0]),
            "max_abs": float(logits.abs().max())}


def cut_margins(scores, kept: int) -> list[float | None]:
    """Per KV head of `scores` (1, KVH, P), the score of the last position kept minus the best one dropped (None when
    none is dropped): how far the cut is from a tie."""
    ordered = scores[0].sort(dim=-1, descending=True).values
    return [float(row[kept - 1] - row[kept]) if kept < row.shape[0] else None for row in ordered]


def run_press(model, name: str, compression: float, ids, args, tensors: dict) -> dict:
    import torch

    press_class, attention = PRESSES[name]
    model.set_attn_implementation(attention)
    prompt, token = ids[:, :-1], ids[:, -1:]
    press = make_press(name, compression, args.press_seed)
    seen = capture(press)
    with torch.inference_mode():
        logits = decode(model, prefill(model, press, prompt), token, prompt.shape[1])
        layers = [seen[layer] for layer in sorted(seen)]
        timing = timings(model, make_press(name, compression, args.press_seed), prompt, token, args.repetitions)
    tensors[f"{name}@{compression}"] = {"logits": logits.clone(),
                                        "scores": torch.stack([layer["scores"][0] for layer in layers])}
    return {"method": name, "press": press_class, "ratio": compression, "attention": attention,
            "options": {key: value for key, value in vars(press).items() if not callable(value)},
            "n_kept": [int(layer["indices"].shape[-1]) for layer in layers],
            "kept": [layer["indices"][0].sort(dim=-1).values.tolist() for layer in layers],
            "cut_margin": [cut_margins(layer["scores"], layer["indices"].shape[-1]) for layer in layers],
            "next_token": top(logits), "timings": timing}


def baseline(model, ids, tensors: dict) -> dict:
    """No press: the next token's logits on the whole cache, the floor every press's logits are read against."""
    import torch
    from transformers import DynamicCache

    model.set_attn_implementation("sdpa")
    with torch.inference_mode():
        cache = DynamicCache()
        model.model(input_ids=ids[:, :-1], past_key_values=cache)
        logits = decode(model, cache, ids[:, -1:], ids.shape[1] - 1)
    tensors["baseline"] = {"logits": logits.clone()}
    return {"next_token": top(logits)}


def environment(threads: int) -> dict:
    import torch

    return {"python": platform.python_version(), "platform": platform.platform(), "torch": torch.__version__,
            "transformers": version("transformers"), "kvpress": version("kvpress"), "gguf": version("gguf"),
            "kvbench": version("kvbench"), "torch_threads": threads, "processor": platform.processor() or None,
            "cpus": os.cpu_count(), "load_average_at_start": list(os.getloadavg())}


def version(package: str) -> str | None:
    """The installed version, or None (kvbench run from a checkout by PYTHONPATH is not installed)."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def first_tokens(source, n: int) -> list[int]:
    """The corpus's first n token ids by the file's tokenizer, read from kvbench's cache (the ids kvbench run
    --model smollm2-135m reads). Never built here: transformers 5.2.0's GGUF loader builds another tokenizer.json
    than kvbench's 5.24.0 (its decoder, normalizer and post-processor differ), which would then sit in the cache
    kvbench's own runs read."""
    from kvbench.models import corpus, gguf

    try:
        reader = gguf.tokenizer(source)
    except ValueError:  # not cached: building it needs kvbench's transformers
        raise ValueError(f"--corpus: expected the file's tokenizer in kvbench's cache {gguf.cache_dir()}, got none: "
                         "run `.venv/bin/kvbench run --model smollm2-135m` once, or give --prompt-ids") from None
    return corpus.corpus_ids(reader, 1, n)[0].tolist()


def load_model(source):
    """transformers' twin of kvbench's decoder of the GGUF file `source` (kvbench.models.gguf.read_gguf's): the
    weights kvbench reads, copied (the decoder itself is then let go)."""
    from kvbench.models import gguf, hf

    decoder, _ = gguf.build_gguf_model(source, "float32")
    return hf.hf_model(decoder, "sdpa", peer="kvpress")


def compact_json(result: dict) -> bytes:
    """Indented JSON whose lists of numbers each take one line: a head's kept positions are read as one row."""
    text = json.dumps(result, indent=1, allow_nan=False)
    numbers = re.compile(r"\[(?:\s*(?:-?[\d.eE+-]+|null),)*\s*(?:-?[\d.eE+-]+|null)\s*\]")
    return (numbers.sub(lambda found: re.sub(r"\s+", "", found.group()).replace(",", ", "), text) + "\n").encode()


def main(argv: list[str] | None = None) -> int:
    args = checked(argv)
    from kvbench.files import check_output
    from kvbench.models import gguf

    for path in (args.output, args.tensors):
        if path is not None:
            check_output(path, args.force)  # before minutes of work
    if version("kvpress") != KVPRESS_VERSION:
        raise ValueError(f"expected kvpress {KVPRESS_VERSION}, got {version('kvpress') or 'none'}: make kvpress")
    import torch

    torch.set_num_threads(args.threads)
    source = gguf.read_gguf(gguf.packaged_path(MODEL))
    ids, origin = prompt_ids(args, source.config["vocab_size"], lambda n: first_tokens(source, n))
    model = load_model(source)
    batch, tensors = torch.tensor([ids], dtype=torch.long), {}
    result = {"schema": SCHEMA, "command": ["scripts/kvpress_peer.py", *(sys.argv[1:] if argv is None else argv)],
              "environment": environment(torch.get_num_threads()), "model": {**source.describe("float32"), "name": MODEL},
              "prompt": {"ids": ids[:-1], "next_id": ids[-1], "length": len(ids) - 1, "source": origin},
              "repetitions": args.repetitions, "prefill_call": "model.model(input_ids, past_key_values=DynamicCache())"
              " under the press (kvpress's pipeline: no head)", "baseline": baseline(model, batch, tensors), "runs": []}
    for name in args.presses:
        for compression in args.ratios:
            result["runs"].append(run_press(model, name, compression, batch, args, tensors))
            print(f"{name} @ {compression}: n_kept {result['runs'][-1]['n_kept'][0]}", file=sys.stderr)
    result["environment"]["load_average_at_end"] = list(os.getloadavg())  # a shared machine's timings read beside it
    write_outputs(result, tensors, args.output, args.tensors, args.force)
    return 0


def write_outputs(result: dict, tensors: dict, output: Path, tensors_path: Path | None, force: bool) -> None:
    """The tensors (when asked for), then the JSON naming them, each atomically (kvbench.files: a temporary file
    renamed into place), so a reader never finds a JSON whose tensors are not yet there."""
    import torch

    from kvbench.files import write_bytes_atomic

    if tensors_path is not None:
        buffer = io.BytesIO()
        torch.save(tensors, buffer)
        write_bytes_atomic(tensors_path, buffer.getvalue(), force=force)
        result = {**result, "tensors": str(tensors_path)}
    write_bytes_atomic(output, compact_json(result), force=force)


def run(argv: list[str] | None = None) -> int:
    """main, with kvbench's rule for bad input: one line on stderr, exit status 2."""
    try:
        return main(argv)
    except ValueError as error:
        print(f"kvpress_peer: error: {(str(error).splitlines() or [type(error).__name__])[0]}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(run())
