"""The worked example of docs/extending.md: a cache kind of your own is one cache class and one spec.

`half` keeps keys and values in float16, half the bytes of a float32 cache, and hands them back to
attention in the model's dtype. Rounding to float16 changes the logits a little, so the kind is lossy:
its spec declares the drift limits the gate judges it by, and the byte formula the memory probe and
the record hold its measured bytes to.

    kvbench run --plugin tests/plugins/half.py --modes full,static,half
"""

import torch

from kvbench import modes
from kvbench.cache import Cache

STORED = torch.float16


class HalfCache(Cache):
    """Preallocated (B, KVH, capacity, D) float16 keys and values per layer, written in place."""

    kind = "half"

    def __init__(self, config, batch=1, capacity=None):
        super().__init__(config, batch, capacity)
        shape = (batch, config.kv_heads, self.capacity, config.head_dim)
        self.stored = [(torch.zeros(shape, dtype=STORED), torch.zeros(shape, dtype=STORED))
                       for _ in range(config.layers)]

    def update(self, layer, k, v):
        start, new = self.length, k.shape[-2]
        for buffer, fresh in zip(self.stored[layer], (k, v)):
            buffer.narrow(2, start, new).copy_(fresh)  # beyond the valid prefix: invisible until commit
        return tuple(buffer.narrow(2, 0, start + new).to(k.dtype) for buffer in self.stored[layer])

    def keys(self, layer=0):
        return self.stored[layer][0][:, :, : self.length]

    def values(self, layer=0):
        return self.stored[layer][1][:, :, : self.length]

    @property
    def reserved_bytes(self):
        return sum(t.numel() * t.element_size() for pair in self.stored for t in pair)


def half_bytes(config, batch, length, **options):
    """Keys and values of every layer, sequence, key/value head and position, 2 bytes an element."""
    return 2 * config.layers * batch * config.kv_heads * length * config.head_dim * STORED.itemsize


modes.register(modes.ModeSpec(
    "half", modes.PLUGIN, cache=HalfCache, bytes=half_bytes, exact=False,
    # About 10x the worst seen on the seed lab and llama-tiny (T 16 to 256): |diff| 8.8e-4, KL mean 2.0e-8, KL max
    # 4.4e-8, top-1 1.0. float16 keeps 11 bits of mantissa, so a wrong cast or offset fails them by far.
    drift_limits={"max_abs_diff": 1e-2, "kl_mean": 2e-7, "kl_max": 5e-7, "top1_agreement": 0.99},
))
