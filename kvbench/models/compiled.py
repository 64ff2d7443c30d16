"""Compiled decode steps: kvbench's static cache stepped by one inductor-compiled function, and transformers'
StaticCache with its forward compiled as its documentation says.

Why a functional step, not `torch.compile(model)`: kvbench's model reads the cache's length as a Python
int (positions, the slice of valid keys), and dynamo guards on it, so the compiled model recompiles at
every step (about 2.5 s each on 2 cores) until its recompile limit, then raises (or, without fullgraph,
falls back to eager). `decode_one` keeps every step the same program: the position is a tensor, keys and
values are written with `index_copy_`, the rotary tables read with `index_select`, and attention runs
over a span of the buffer with a position mask. One compile serves every step, every context and every
cache of a model (the span's length is a dynamic dimension), once per process.

The span: the positions written so far rounded up to a block of BLOCK, so that attention reads at most
BLOCK - 1 positions that hold nothing (masked) instead of the whole capacity. The cost, stated in
docs/compiled.md: at a context c, ceil((c + 1) / BLOCK) * BLOCK keys instead of c + 1.

The prefill is eager (kvbench's model on the same cache, or transformers' forward), so a prompt of any
length costs no compile; only the one-token step is compiled.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from kvbench.cache import StaticCache
from kvbench.config import PlainConfig
from kvbench.kinds import require_compiled
from kvbench.model import Decoder, apply_rotary, rms_norm

STATIC_COMPILED = "static-compiled"
HF_STATIC_COMPILED = "hf-static-compiled"
BLOCK = 64  # positions: the granularity of the attended span (at most BLOCK - 1 empty positions read)




@dataclass(frozen=True)
class Compiling:
    """How a device compiles a step: torch.compile's `mode`, and what each call of a compiled function needs around
    it. On CUDA "reduce-overhead" captures the step into CUDA graphs (captured on its first calls, in the gate and
    the warm-up, never inside a sample); a graph's outputs are overwritten by its next replay, so each step's
    logits are copied out, and each step is marked as a new one (torch.compiler.cudagraph_mark_step_begin)."""

    mode: str | None = None
    begin: Callable[[], None] = lambda: None
    keep: Callable[[Tensor], Tensor] = lambda logits: logits


COMPILING = {"cpu": Compiling(),  # device type -> how it compiles (a device without an entry: the CPU's way)
             "cuda": Compiling("reduce-overhead", lambda: torch.compiler.cudagraph_mark_step_begin(), Tensor.clone)}


def compiling(device: torch.device) -> Compiling:
    return COMPILING.get(device.type, COMPILING["cpu"])


compile_seconds: dict[str, list[float]] = {}  # mode -> the first call of each compiled function, compile included
_steps: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its compiled decode_one
_forwards: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # transformers model -> its compiled forward


def span(position: int, capacity: int) -> int:
    """Keys attention reads at `position`: the positions up to it rounded up to a block, within the buffer."""
    return min(-(-(position + 1) // BLOCK) * BLOCK, capacity)


def capacity_for(length: int, config: PlainConfig) -> int:
    """Whole blocks for `length` positions, within max_length."""
    return min(-(-length // BLOCK) * BLOCK, config.max_length)


def decode_one(model: Decoder, ids: Tensor, position: Tensor, keys: list[Tensor], values: list[Tensor]) -> Tensor:
    """One token at `position` (a (1,) long tensor) through the llama block, written into keys and values
    (B, KVH, S, D) per layer (a span of each buffer) in place: the logits (B, V). The same arithmetic as
    kvbench.model.LlamaBlock on one position, with nothing read from Python state that changes per step."""
    config = model.config
    B, H, KVH, D = ids.shape[0], config.heads, config.kv_heads, config.head_dim
    x = F.embedding(ids, model.token.weight)  # (B, 1, C)
    cos, sin = model.cos.index_select(0, position), model.sin.index_select(0, position)  # (1, 1, D)
    key_positions = torch.arange(keys[0].shape[2], device=ids.device)  # (S,)
    for layer, block in enumerate(model.blocks):
        visible = key_positions <= position
        if block.window is not None:
            visible = visible & (key_positions > position - block.window)
        qkv = F.linear(rms_norm(x, block.norm1.weight, block.eps), block.qkv.weight, block.qkv.bias)
        qkv = qkv.view(B, 1, H + 2 * KVH, D)
        q, k = apply_rotary(qkv[:, :, : H + KVH], cos, sin).transpose(1, 2).split((H, KVH), dim=1)
        v = qkv[:, :, H + KVH :].transpose(1, 2)  # (B, KVH, 1, D)
        keys[layer].index_copy_(2, position, k)
        values[layer].index_copy_(2, position, v)
        # The query heads sharing a key/value head are that head's queries (kvbench.attention.one_query).
        y = F.scaled_dot_product_attention(q.reshape(B, KVH, H // KVH, D), keys[layer], values[layer],
                                           attn_mask=visible[None, :])  # (B, KVH, H / KVH, D)
        x = x + F.linear(y.reshape(B, 1, H * D), block.out.weight)
        gate, up = F.linear(rms_norm(x, block.norm2.weight, block.eps), block.gate_up.weight).chunk(2, dim=-1)
        x = x + F.linear(F.silu(gate) * up, block.down.weight)
    return model.logits(x)[:, -1]


def timed_first_call(mode: str, function, *args, **kwargs):
    """Call a freshly compiled function once, its compile time kept in compile_seconds[mode]."""
    start = time.perf_counter()
    result = function(*args, **kwargs)
    compile_seconds.setdefault(mode, []).append(time.perf_counter() - start)
    return result


class CompiledStep:
    """decode_one compiled for one model: fullgraph (a graph break raises), shapes dynamic (the span's length
    and the buffer's stride are symbols: one program for every span, context and cache; the weights'
    shapes stay static, and a batch of 1 is specialized, as dynamo does)."""

    def __init__(self, how: Compiling = Compiling()) -> None:
        self.function = torch.compile(decode_one, fullgraph=True, dynamic=True, mode=how.mode)
        self.compiled, self.how = False, how

    def __call__(self, model: Decoder, ids: Tensor, position: Tensor, keys: list[Tensor], values: list[Tensor]):
        self.how.begin()
        if self.compiled:
            return self.how.keep(self.function(model, ids, position, keys, values))
        self.compiled = True
        return self.how.keep(timed_first_call(STATIC_COMPILED, self.function, model, ids, position, keys, values))


def compiled_step(model: Decoder) -> CompiledStep:
    if model not in _steps:
        _steps[model] = CompiledStep(compiling(model.device))
    return _steps[model]


def steps(model: Decoder, ids: Tensor, prompt: int = 1) -> Iterator[tuple[Tensor, StaticCache]]:
    """Yields (logits (B, V), the cache) for the first `prompt` tokens in one eager call, then one compiled
    step per token, as kvbench.workloads.requests.request_steps does for every mode. Drive it inside
    torch.inference_mode()."""
    require_compiled(STATIC_COMPILED, model.config)
    B, T = ids.shape
    # One spare position past the capacity: a span is then never the whole buffer, so every span the step
    # sees has the same layout (a contiguous one would be another program to dynamo, a recompile).
    cache = StaticCache(model.config, batch=B, capacity=capacity_for(T, model.config), spare=1, device=model.device)
    step = compiled_step(model)
    position = torch.zeros(1, dtype=torch.long, device=model.device)
    try:
        logits, cache = model(ids[:, :prompt], cache)
        yield logits[:, -1], cache
        buffers = [cache.buffers(layer) for layer in range(model.config.layers)]
        for t in range(prompt, T):
            cache.check_append(model.config, batch=B, length=1)
            position.fill_(t)
            S = span(t, cache.capacity)
            keys = [key.narrow(2, 0, S) for key, _ in buffers]
            values = [value.narrow(2, 0, S) for _, value in buffers]
            logits = step(model, ids[:, t : t + 1], position, keys, values)
            cache.commit(1)
            yield logits, cache
    finally:
        cache.release()


def compiled_forward(hf):
    """transformers' forward compiled as its documentation shows for StaticCache
    (`torch.compile(model.forward, fullgraph=True)`; mode "reduce-overhead" is CUDA graphs, not on a CPU),
    once per transformers model; its first call is timed into compile_seconds."""
    if hf not in _forwards:
        how = compiling(hf.device)
        function = torch.compile(hf.forward, fullgraph=True, mode=how.mode)
        first = [True]

        def forward(**inputs):
            how.begin()
            if first[0]:
                first[0] = False
                output = timed_first_call(HF_STATIC_COMPILED, function, **inputs)
            else:
                output = function(**inputs)
            output.logits = how.keep(output.logits)
            return output

        _forwards[hf] = forward
    return _forwards[hf]


def mode_steps(model: Decoder, ids: Tensor, mode: str, prompt: int, cache, options: dict):
    """static-compiled's stepper (kvbench.workloads.decode.steps): a StaticCache of whole blocks it makes and
    releases."""
    if cache is not None:
        raise ValueError(f"{mode} steps a cache sized for its compiled program: expected cache=None, got "
                         f"{type(cache).__name__}")
    return steps(model, ids, prompt)
