"""The llama family in Hugging Face transformers: the same weights in transformers' own model.

Two questions, one function each: which transformers config describes a kvbench config
(`hf_config`), and which transformers model computes with exactly a kvbench model's
weights (`hf_model`). The oracle tests compare their logits; the `hf-*` modes (`steps`)
run transformers' own caches on them through kvbench's gate, rotations and record. transformers is an optional extra, pinned (pyproject's `hf`
extra): it is imported here only, and only when asked for, and another version is refused,
since its modelling code is what the comparison trusts (but a peer's, PEER_VERSIONS, when its caller names it:
kvpress's environment pins another, docs/kvpress.md).

Which transformers class: Llama (no q/k/v biases, no window), Mistral (a window on every
layer), Qwen2 (q/k/v biases, any per-layer windows through its layer_types). A model with
alternating windows and no biases (Gemma-2's pattern without Gemma-2's other features) maps
onto Qwen2 with zero q/k/v biases, which adds exact zeros. The gpt2 family has no
transformers twin: its head has a bias GPT-2's lacks.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import weakref
from typing import TYPE_CHECKING

from kvbench.config import PlainConfig, dtype_name
from kvbench import modes
from kvbench.kinds import require_compiled

if TYPE_CHECKING:
    from kvbench.model import Decoder

TRANSFORMERS_VERSION = "5.24.0"  # as pinned in pyproject.toml's `hf` extra
INSTALL = "pip install -e '.[hf]'"
# A peer that runs in its own environment, whose tool pins another transformers: accepted only when a caller names
# the peer (`peer=`), never by default. kvpress 0.5.5 requires transformers>=4.56,<5.3 (`make kvpress`,
# scripts/kvpress_peer.py); what hf_config and hf_model read (config fields, parameter names) is the same in 5.2.0,
# and the peer checks its logits against kvbench's on the same weights (docs/kvpress.md).
PEER_VERSIONS = {"kvpress": "5.2.0"}


def require_transformers(peer: str | None = None):
    """The transformers module at the pinned version (or at `peer`'s, PEER_VERSIONS), or ValueError saying what is
    installed instead."""
    if peer is not None and peer not in PEER_VERSIONS:
        raise ValueError(f"peer must be one of {sorted(PEER_VERSIONS)} or None, got {peer!r}")
    accepted = [TRANSFORMERS_VERSION] + ([PEER_VERSIONS[peer]] if peer is not None else [])
    wanted = " or ".join(accepted)
    try:
        version = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        raise ValueError(f"comparing with transformers needs transformers {wanted}, which is not "
                         f"installed: {INSTALL}") from None
    if version not in accepted:
        pins = "kvbench's pin" if peer is None else f"kvbench's pin, or the {peer} peer's"
        raise ValueError(f"comparing with transformers needs transformers {wanted} ({pins}), got {version}: {INSTALL}")
    import transformers

    return transformers


def hf_architecture(config: PlainConfig) -> str:
    """The transformers model class that computes what `config` describes, or ValueError."""
    if config.family != "llama":
        raise ValueError(f"only the llama family has a transformers twin, got family {config.family!r} (kvbench's "
                         "gpt2 head has a bias that GPT-2's lacks)")
    if config.sinks:
        raise ValueError(f"transformers' models have no attention sinks beside a window: expected sinks=0, got "
                         f"{config.sinks}")
    if config.qkv_bias or config.window_pattern == "alternating":
        return "Qwen2ForCausalLM"
    return "MistralForCausalLM" if config.window is not None else "LlamaForCausalLM"


def hf_config(config: PlainConfig, attention: str = "sdpa", peer: str | None = None):
    """A transformers config of the same shapes, positions, norms, windows and head; `attention` is
    transformers' attn_implementation ("sdpa" or "eager"); `peer`: require_transformers'."""
    transformers = require_transformers(peer)
    architecture = hf_architecture(config)
    rope = {"rope_type": "default", "rope_theta": config.rope_theta}
    if config.rope_scaling is not None:
        scaling = config.rope_scaling
        rope.update(rope_type="llama3", factor=scaling.factor, low_freq_factor=scaling.low_freq_factor,
                    high_freq_factor=scaling.high_freq_factor,
                    original_max_position_embeddings=scaling.original_max_length)
    fields = dict(
        vocab_size=config.vocab_size, hidden_size=config.width, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.layers, num_attention_heads=config.heads, num_key_value_heads=config.kv_heads,
        head_dim=config.head_dim, max_position_embeddings=config.max_length, rms_norm_eps=config.norm_eps,
        rope_parameters=rope, tie_word_embeddings=config.tie_embeddings, hidden_act="silu",
        bos_token_id=0, eos_token_id=0, pad_token_id=0, attn_implementation=attention,
    )
    if architecture == "LlamaForCausalLM":
        return transformers.LlamaConfig(**fields, attention_bias=False, mlp_bias=False)
    if architecture == "MistralForCausalLM":
        return transformers.MistralConfig(**fields, sliding_window=config.window)
    layer_types = ["full_attention" if window is None else "sliding_attention" for window in config.layer_windows]
    return transformers.Qwen2Config(**fields, use_sliding_window=config.window is not None,
                                    sliding_window=config.window, layer_types=layer_types)


def hf_state_dict(model: Decoder) -> dict:
    """transformers' parameter names -> kvbench's tensors (q/k/v and gate/up split from their fused matmuls)."""
    import torch

    config = model.config
    HD, KVD, I = config.heads * config.head_dim, config.kv_heads * config.head_dim, config.intermediate_size
    weights = {"model.embed_tokens.weight": model.token.weight, "model.norm.weight": model.final.weight,
               "lm_head.weight": model.token.weight if model.head is None else model.head.weight}
    biased = hf_architecture(config) == "Qwen2ForCausalLM"
    for index, block in enumerate(model.blocks):
        prefix = f"model.layers.{index}."
        q, k, v = block.qkv.weight.split((HD, KVD, KVD))
        gate, up = block.gate_up.weight.split((I, I))
        weights.update({
            prefix + "input_layernorm.weight": block.norm1.weight,
            prefix + "self_attn.q_proj.weight": q, prefix + "self_attn.k_proj.weight": k,
            prefix + "self_attn.v_proj.weight": v, prefix + "self_attn.o_proj.weight": block.out.weight,
            prefix + "post_attention_layernorm.weight": block.norm2.weight,
            prefix + "mlp.gate_proj.weight": gate, prefix + "mlp.up_proj.weight": up,
            prefix + "mlp.down_proj.weight": block.down.weight,
        })
        if biased:
            bias = block.qkv.bias
            if bias is None:
                bias = torch.zeros(HD + 2 * KVD, dtype=q.dtype, device=q.device)
            for name, part in zip("qkv", bias.split((HD, KVD, KVD))):
                weights[prefix + f"self_attn.{name}_proj.bias"] = part
    return weights


def hf_model(model: Decoder, attention: str = "sdpa", peer: str | None = None):
    """transformers' model of the same architecture holding exactly `model`'s weights (copies), in its dtype,
    in eval mode; no weight is downloaded and none is left random. `peer`: require_transformers'."""
    import torch

    transformers = require_transformers(peer)
    config = hf_config(model.config, attention, peer)
    with torch.random.fork_rng(devices=[]):  # transformers initialises weights that are then overwritten
        hf = getattr(transformers, hf_architecture(model.config))(config)
    hf = hf.to(device=model.device, dtype=model.token.weight.dtype).eval()  # on the model's device, as its ids
    expected = hf_state_dict(model)
    missing, unexpected = hf.load_state_dict({name: t.detach().clone() for name, t in expected.items()},
                                             strict=False)
    if unexpected or [name for name in missing if name not in tied_names(hf)]:
        raise ValueError(f"weight mapping mismatch for {type(hf).__name__}: missing {missing}, unexpected {unexpected}")
    hf.requires_grad_(False)
    if dtype_name(next(hf.parameters()).dtype) != dtype_name(model.config.dtype):
        raise ValueError(f"expected the transformers model in {dtype_name(model.config.dtype)}, got "
                         f"{dtype_name(next(hf.parameters()).dtype)}")
    return hf


def tied_names(hf) -> set[str]:
    """Parameter names transformers shares with another (a tied head) and so may not list as loaded."""
    return {"lm_head.weight"} if hf.config.tie_word_embeddings else set()


# -- transformers' caches as kvbench modes ---------------------------------------------------
# `hf-*` modes run the same weights in transformers' model with its own caches, through the same
# gate, rotations and record as kvbench's kinds. The model is built once per kvbench model.

# Each hf-* mode's spec (kvbench.modes) names transformers' cache class, or QuantizedCache's backend and bits.
EXTRAS = {"quanto": ("optimum-quanto", "pip install -e '.[quanto]'"), "hqq": ("hqq", "pip install -e '.[hqq]'")}
_models: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def model_for(model: Decoder):
    """The transformers twin of `model` (hf_model), built on first use and kept while `model` lives."""
    if model not in _models:
        _models[model] = hf_model(model)
    return _models[model]


def require_mode(mode: str, config: PlainConfig) -> None:
    """ValueError unless `mode` can run on `config` here: the llama family, and the mode's backend installed."""
    spec = modes.spec(mode)
    if spec.source != modes.TRANSFORMERS:
        raise ValueError(f"unknown transformers mode {mode!r}: expected one of {list(modes.HF_MODES)}")
    hf_architecture(config)
    require_transformers()
    if spec.compiled:
        require_compiled(mode, config)
    backend = spec.backend
    if backend in EXTRAS:
        package, install = EXTRAS[backend]
        try:
            importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            raise ValueError(f"{mode} needs {package} (transformers' {backend} backend), which is not installed: "
                             f"{install}") from None


def make_hf_cache(mode: str, hf, capacity: int, options: dict | None = None):
    transformers = require_transformers()
    spec = modes.spec(mode)
    if spec.backend == "DynamicCache":
        return transformers.DynamicCache(config=hf.config)
    if spec.backend == "StaticCache":
        return transformers.StaticCache(config=hf.config, max_cache_len=capacity)
    options = options or {}
    return transformers.QuantizedCache(backend=spec.backend, config=hf.config, nbits=spec.bits, axis_key=0, axis_value=0,
                                       q_group_size=options.get("group_size", 32),
                                       residual_length=options.get("residual", 128))


def cache_keyword(hf) -> str:
    """transformers 5 calls the cache argument `cache` (formerly `past_key_values`)."""
    return "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"


class HfCache:
    """A transformers cache as kvbench's footprint reads it: bytes of every tensor it holds."""

    def __init__(self, cache) -> None:
        self.cache = cache

    @property
    def nbytes(self) -> int:
        """Every tensor the cache holds, quantized codes, scales and a StaticCache's preallocation included."""
        seen: set[int] = set()
        return sum(tensor_bytes(value, seen) for layer in getattr(self.cache, "layers", []) for value in
                   vars(layer).values())

    @property
    def reserved_bytes(self) -> int:
        return self.nbytes

    @property
    def quantized_positions(self) -> int | None:
        """A QuantizedCache's positions in its quantized store, the same in every layer (it quantizes the first
        call's positions at once, then everything whenever its float residual would reach residual_length); None
        for transformers' other caches."""
        layers = getattr(self.cache, "layers", None) or []
        if not layers or not hasattr(layers[0], "_quantized_keys"):
            return None
        layer = layers[0]
        residual = layer.keys.shape[-2] if getattr(layer, "keys", None) is not None and layer.keys.dim() == 4 else 0
        return int(layer.cumulative_length) - residual

    def release(self) -> None:
        self.cache = None


def tensor_bytes(value, seen: set[int]) -> int:
    """Bytes of a tensor, of a tensor subclass's inner tensors (quanto's codes and scales), of the tensors
    inside a tuple, list or dict (HQQ keeps its codes beside a dict of scales and zeros), or 0."""
    import torch

    if isinstance(value, (tuple, list)):
        return sum(tensor_bytes(item, seen) for item in value)
    if isinstance(value, dict):
        return sum(tensor_bytes(item, seen) for item in value.values())
    if not isinstance(value, torch.Tensor) or id(value) in seen:
        return 0
    seen.add(id(value))
    if hasattr(value, "__tensor_flatten__") and type(value) is not torch.Tensor:
        names, _ = value.__tensor_flatten__()
        return sum(tensor_bytes(getattr(value, name), seen) for name in names)
    return value.numel() * value.element_size()


def steps(model: Decoder, ids, mode: str, prompt: int, cache=None, options: dict | None = None):
    """The hf-* modes' stepper (kvbench.workloads.decode.steps): yields (logits (B, V), HfCache) for the first `prompt`
    tokens in one call, then one token a step. `cache`, a transformers cache the caller owns, is continued
    from the positions it holds; otherwise a fresh one is made for the whole of ids. A compiled mode compiles
    the one-token steps only, over a StaticCache of whole blocks (kvbench.models.compiled)."""
    hf = model_for(model)
    keyword, T = cache_keyword(hf), ids.shape[1]
    held = 0 if cache is None else cache.get_seq_length()
    capacity, step = T, hf
    if modes.spec(mode).compiled:  # lengths in one block share one program
        from kvbench.models.compiled import capacity_for, compiled_forward

        capacity, step = capacity_for(T, model.config), compiled_forward(hf)
    view = HfCache(make_hf_cache(mode, hf, capacity, options) if cache is None else cache)
    try:
        logits = hf(input_ids=ids[:, held:prompt], use_cache=True, **{keyword: view.cache}).logits
        yield logits[:, -1], view
        for t in range(prompt, T):
            logits = step(input_ids=ids[:, t : t + 1], use_cache=True, **{keyword: view.cache}).logits
            yield logits[:, -1], view
    finally:
        view.release()
