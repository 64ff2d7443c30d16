"""The model a run measures: a preset's random weights, or a trained model's GGUF file (--model, --gguf), read
and checked before anything is measured. The timed workloads and a serving run (kvbench.cli.serve) read it alike."""

from __future__ import annotations

import argparse

from kvbench.cli.commands import config_from_args
from kvbench.cli.parser import CliError
from kvbench.config import PlainConfig

QUALITY_CHUNKS = 4  # runs of --quality tokens each: the perplexity difference's interval is over them
SHAPE_OPTIONS = ("width", "heads", "kv_heads", "layers", "vocab_size")  # what a GGUF file fixes


def model_config(args: argparse.Namespace) -> PlainConfig:
    """The preset's config with the options' overrides, or a GGUF file's (--model, --gguf), read and checked
    before anything is measured: args.real_model is the file read (or None) and args.model_name the record's name."""
    args.real_model, args.model_name = None, args.preset
    if args.model is None and args.gguf is None:  # --quality without either is refused already (usage.NEEDS)
        return config_from_args(args)
    given = (["--model"] if args.model else []) + (["--gguf"] if args.gguf else [])
    given += [f"--{name.replace('_', '-')}" for name in SHAPE_OPTIONS if getattr(args, name) is not None]
    if args.preset != "seed":
        given.append("--preset")
    if len(given) > 1:
        raise CliError(f"{given[0]} fixes the model's shapes: it cannot be combined with {', '.join(given[1:])}")
    from kvbench.models import gguf

    try:
        path = gguf.packaged_path(args.model) if args.model else args.gguf
        args.real_model = gguf.read_gguf(path)
        overrides = {"dtype": args.dtype, "window": args.window, "window_pattern": args.window_pattern,
                     "sinks": args.sinks, "max_length": args.max_length}
        config = args.real_model.plain_config(**{name: value for name, value in overrides.items() if value is not None})
    except ValueError as error:
        raise CliError(f"{given[0]}: {error}") from None
    args.model_name = args.model or "gguf"
    if args.quality is not None and args.quality * QUALITY_CHUNKS > 40000:
        raise CliError(f"--quality {args.quality}: {QUALITY_CHUNKS} runs of it exceed the corpus's 40,000 tokens")
    return config


def model_named(args: argparse.Namespace) -> str:
    """The model a refusal names: the preset, or the GGUF file its shapes came from (its preset is not used)."""
    if args.real_model is None:
        return f"preset {args.preset!r}"
    return f"{'model ' + repr(args.model) + ', ' if args.model else ''}GGUF file {args.real_model.path}"


def load_weights(args: argparse.Namespace, config: PlainConfig, seed: int, device, batch: int, positions: int,
                 console) -> tuple:
    """(model, ids, tokenizer, record sections) on `device`: the preset's random weights from `seed` (ids drawn
    later, tokenizer None), or the GGUF file's weights with the corpus's token ids (batch, positions) through its
    tokenizer, with a line on `console` while they load (the first load of a file dequantizes it: a minute and
    more of a blank screen)."""
    if args.real_model is None:
        from kvbench.config import DecoderConfig
        from kvbench.model import build_model

        return build_model(DecoderConfig.from_dict(config.to_dict()), seed=seed, device=device), None, None, {}
    from kvbench.cli.progress import stage
    from kvbench.models import corpus, gguf

    with stage(console, f"loading {args.model_name}", disabled=args.no_progress) as update:
        model, ids, tokenizer, described = gguf.load(args.real_model, config, batch, positions, on_progress=lambda
                                                     done, total, what: update(done, total,
                                                                               f"loading {args.model_name}: {what}"))
    model = model.to(device)  # dequantized on the host, then moved whole (its ids move with each run)
    return model, ids, tokenizer, {"model": described, "token_ids": {"source": "corpus", **corpus.describe()}}


def load_served(args: argparse.Namespace, config: PlainConfig, seed: int, console, device="cpu") -> tuple:
    """(model, text, record sections) of a serving run: load_weights' model and sections, and the text every
    request's prompt and outputs are cut from (kvbench.serving.tokens): the whole corpus's token ids through the
    model's tokenizer (1-D, on the host: the scheduler moves them), None on random weights (random ids)."""
    model, _, tokenizer, sections = load_weights(args, config, seed, device, 1, 1, console)
    if tokenizer is None:
        return model, None, sections
    import torch

    from kvbench.models import corpus

    return model, torch.tensor(corpus.corpus_tokens(tokenizer), dtype=torch.long), sections
