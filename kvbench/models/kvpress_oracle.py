"""kvpress as the oracle of kvbench's evicting kinds: on the same weights and ids, the same positions kept per head?

NVIDIA's kvpress 0.5.5 runs in its own environment (it pins transformers<5.3; `make kvpress`), so its side is a
file: scripts/kvpress_peer.py prefills the packaged SmolLM2-135M under each press and writes the positions every
layer and KV head kept, the next token's logits and each layer's scores (`--tensors`). This module is kvbench's
side: it runs kvbench's kind of the same name (the peer's `method`) on the same model and ids through the public
cache contract (make_cache, one prefill whose commit compresses, one token) and says, per (method, ratio, layer,
KV head), whether the positions kept are the same, and how far the next token's logits are apart.

Where the two sides keep different positions the scores decide whether that is a tie or a bug: kvpress's scores
for the positions only one side kept must all lie within SCORE_EPSILON (relative) of the score at kvpress's cut.
Two float32 computations of the same softmax (kvbench's attention and transformers' eager or sdpa, or kvpress's
re-projected SnapKV window) differ by a few units in the last place, so a position that close to the cut may fall
either way; anything farther is a real disagreement. Such a head is reported as a tie with the gap it had, never
counted as identical; its logits cannot be held to LOGIT_TOLERANCE, since the caches differ.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from kvbench import modes

PEER_SCHEMA = "kvbench.kvpress-peer/1"
LOGIT_TOLERANCE = 1e-4  # the next token's logits of two float32 paths through 30 trained layers
# How close (relative to the cut's own score) a position's kvpress score must be to the cut for a disagreement
# about it to be a tie: float32 softmax weights of the same logits along two paths differ by ~1e-7 relative.
SCORE_EPSILON = 1e-5


def unavailable(method: str) -> str | None:
    """Why kvbench cannot run `method` here (not registered, or not an evicting kind), or None."""
    found = modes.SPECS.get(method)
    if found is None:
        return f"kvbench has no mode {method!r} registered (expected an evicting kind of that name)"
    if not found.evicts:
        return f"mode {method!r} is registered but does not evict (its spec says evicts=False)"
    return None


def read_peer(path: Path | str) -> dict:
    """The peer's JSON, checked for its schema and the fields compared; ValueError naming what is wrong."""
    from kvbench.files import read_json

    peer = read_json(path, "kvpress peer output")
    if not isinstance(peer, dict) or peer.get("schema") != PEER_SCHEMA:
        found = peer.get("schema") if isinstance(peer, dict) else type(peer).__name__
        raise ValueError(f"{path}: expected a kvpress peer output of schema {PEER_SCHEMA}, got {found!r}")
    for key in ("model", "prompt", "runs"):
        if key not in peer:
            raise ValueError(f"{path}: expected the key {key!r} in the peer output, which lacks it")
    for index, run in enumerate(peer["runs"]):
        missing = [key for key in ("method", "ratio", "options", "n_kept", "kept") if key not in run]
        if missing:
            raise ValueError(f"{path}: runs[{index}] lacks {missing}")
    return peer


def read_tensors(path: Path | str) -> dict:
    """The peer's `--tensors` file: "method@ratio" -> {"logits": (V,), "scores": (layers, KVH, P)}."""
    import torch

    return torch.load(path, weights_only=True)


def prompt_tensor(peer: dict, device=None):
    """(1, P + 1): the prompt's ids, then the token fed to the compressed cache."""
    import torch

    return torch.tensor([peer["prompt"]["ids"] + [peer["prompt"]["next_id"]]], dtype=torch.long, device=device)


def kvbench_run(model, ids, method: str, ratio: float, options: dict | None = None):
    """kvbench's kind `method` at `ratio`: its prefill of ids[:, :-1], then the last token. Returns the positions of
    the prompt kept per layer, [layer][kv_head][...] ascending, and the next token's logits (V,).

    The positions are read after the one-token step, the prompt's among them: a kind may compress when the prefill
    commits or when the first token after it comes (before it attends, kvbench.cache.scored), and either way what
    that token saw is what kvpress's press left after its prefill."""
    import torch

    from kvbench.cache import make_cache

    reason = unavailable(method)
    if reason is not None:
        raise ValueError(reason)
    known = modes.spec(method).options
    extra = {key: value for key, value in (options or {}).items() if key in known}
    cache = make_cache(method, model.config, batch=1, capacity=ids.shape[1], device=model.device,
                       evict_ratio=ratio, **extra)
    prompt = ids.shape[1] - 1
    with torch.inference_mode():
        _, cache = model(ids[:, :-1], cache)
        logits, cache = model(ids[:, -1:], cache)
        kept = [[[p for p in head if p < prompt] for head in cache.positions(layer)[0].tolist()]
                for layer in range(model.config.layers)]
    return kept, logits[0, -1].float()


def full_logits(model, ids):
    """The next token's logits with every position kept (kvbench's concat cache): the floor of the comparison."""
    import torch

    with torch.inference_mode():
        _, cache = model(ids[:, :-1])
        logits, _ = model(ids[:, -1:], cache)
    return logits[0, -1].float()


@dataclass(frozen=True)
class Head:
    """One layer's KV head: identical, a tie at the cut (`gap`: the farthest of the disagreeing positions' scores
    from the cut, relative), or a disagreement (`reason`)."""

    layer: int
    head: int
    ours_only: tuple[int, ...] = ()
    theirs_only: tuple[int, ...] = ()
    tie: bool = False
    gap: float | None = None
    reason: str | None = None

    @property
    def identical(self) -> bool:
        return not self.ours_only and not self.theirs_only and self.reason is None


def judge_head(layer: int, head: int, ours: list[int], theirs: list[int], scores=None,
               epsilon: float = SCORE_EPSILON) -> Head:
    """Compare one head's kept positions; where they differ, `scores` (kvpress's, (P,)) says whether every
    position in dispute is within `epsilon` of the cut (relative to the cut's score)."""
    ours_only = tuple(sorted(set(ours) - set(theirs)))
    theirs_only = tuple(sorted(set(theirs) - set(ours)))
    if len(ours) != len(theirs):
        return Head(layer, head, ours_only, theirs_only, reason=f"kvbench keeps {len(ours)} positions, kvpress "
                                                                f"{len(theirs)}")
    if not ours_only:
        return Head(layer, head)
    if scores is None:
        return Head(layer, head, ours_only, theirs_only, reason="positions differ and no kvpress scores were given "
                                                                "to tell a tie from a disagreement")
    ordered = sorted((float(value) for value in scores), reverse=True)
    cut = ordered[len(theirs) - 1]
    scale = abs(cut) if cut != 0 else 1.0
    gap = max(abs(float(scores[p]) - cut) / scale for p in ours_only + theirs_only)
    if gap <= epsilon:
        return Head(layer, head, ours_only, theirs_only, tie=True, gap=gap)
    return Head(layer, head, ours_only, theirs_only, gap=gap,
                reason=f"a disputed position's score is {gap:.3g} (relative) from kvpress's cut {cut:.9g}, beyond "
                       f"the tie epsilon {epsilon:g}")


@dataclass
class Comparison:
    """One (method, ratio): every head judged, and the next token's logits against the peer's."""

    method: str
    ratio: float
    heads: list[Head] = field(default_factory=list)
    max_logit_difference: float | None = None  # None without the peer's full logits
    top5_ours: list = field(default_factory=list)
    top5_theirs: list = field(default_factory=list)

    @property
    def identical(self) -> int:
        return sum(head.identical for head in self.heads)

    @property
    def ties(self) -> list[Head]:
        return [head for head in self.heads if head.tie]

    @property
    def disagreements(self) -> list[Head]:
        return [head for head in self.heads if not head.identical and not head.tie]

    def logits_hold(self, tolerance: float = LOGIT_TOLERANCE) -> bool | None:
        """Whether the logits are within `tolerance`; None when they cannot be held to it (no peer logits, or the
        caches differ by a tie)."""
        if self.max_logit_difference is None or self.ties or self.disagreements:
            return None
        return self.max_logit_difference <= tolerance

    def summary(self) -> dict:
        return {"method": self.method, "ratio": self.ratio, "heads": len(self.heads), "identical": self.identical,
                "ties": [asdict(head) for head in self.ties],
                "disagreements": [asdict(head) for head in self.disagreements],
                "max_logit_difference": self.max_logit_difference, "top5_kvbench": self.top5_ours,
                "top5_kvpress": self.top5_theirs}


def compare_run(run: dict, kept: list, logits, tensors: dict | None = None,
                epsilon: float = SCORE_EPSILON) -> Comparison:
    """kvbench's kind, its positions kept and next-token logits (kvbench_run's), against one of the peer's runs."""
    theirs = (tensors or {}).get(f"{run['method']}@{run['ratio']}", {})
    layers = len(run["kept"])
    if len(kept) != layers:
        raise ValueError(f"{run['method']} @ {run['ratio']}: the peer has {layers} layers, kvbench's model "
                         f"{len(kept)}")
    comparison = Comparison(run["method"], run["ratio"])
    for layer in range(layers):
        for head, positions in enumerate(run["kept"][layer]):
            scores = theirs["scores"][layer, head] if "scores" in theirs else None
            comparison.heads.append(judge_head(layer, head, kept[layer][head], positions, scores, epsilon))
    values, indices = logits.topk(5)
    comparison.top5_ours = [[int(i), float(v)] for i, v in zip(indices, values)]
    comparison.top5_theirs = run.get("next_token", {}).get("top5", [])
    if "logits" in theirs:
        comparison.max_logit_difference = float((logits - theirs["logits"].to(logits)).abs().max())
    return comparison


def check_same_model(peer: dict, sha256: str) -> None:
    if peer["model"].get("sha256") != sha256:
        raise ValueError(f"the peer ran on the model file of sha256 {peer['model'].get('sha256')}, kvbench's model "
                         f"is of {sha256}: the comparison needs the same weights")


def compare(peer: dict, model, tensors: dict | None = None, methods: list[str] | None = None,
            epsilon: float = SCORE_EPSILON) -> list[Comparison]:
    """Every run of the peer whose method kvbench has (or those of `methods`), in the peer's order."""
    ids = prompt_tensor(peer, model.device)
    runs = [run for run in peer["runs"] if (methods is None or run["method"] in methods)
            and unavailable(run["method"]) is None]
    return [compare_run(run, *kvbench_run(model, ids, run["method"], run["ratio"], run["options"]), tensors, epsilon)
            for run in runs]


def baseline_difference(peer: dict, model, tensors: dict) -> float:
    """The largest difference of the next token's logits with nothing evicted: the two models' own floor."""
    logits = full_logits(model, prompt_tensor(peer, model.device))
    return float((logits - tensors["baseline"]["logits"].to(logits)).abs().max())
