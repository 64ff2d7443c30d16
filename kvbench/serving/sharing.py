"""Traces whose prompts reuse earlier tokens, and the best hit rate a prefix cache could reach on them. Torch-free.

  shared-prefix:G,P,S,Q,O   SGLang's generated shared-prefix benchmark (bench_serving, "generated-shared-prefix"):
                            G groups of P requests; each group's requests share a system prompt of S tokens, each
                            adds its own question of Q tokens and generates O. Every request arrives at 0, in a
                            seeded shuffle (the groups interleave).
  multi-turn:C,T,U,O        vLLM's multi-turn benchmark (benchmarks/multi_turn): C conversations of T turns; each
                            turn's prompt is the conversation's whole history (every earlier prompt and output) and a
                            new user message of U tokens, and it generates O. Closed loop per conversation: turn t + 1
                            is sent when turn t ends (no think time), so conversation c is closed-loop client c and
                            turn t of it is request t * C + c.

A request's tokens are a list of segments (what, key, length): a group's system prompt ("prefix", g), a request's
own tokens ("own", id) and a turn's last output token ("last", id), which the next turn's history holds but the
turn itself never feeds. Two requests share a token exactly where their segments agree, which is how the
TokenSource draws them (kvbench.serving.prefix_cache.SharedSource: one seeded draw per segment), so the best hit
rate is computed from the trace alone: with an infinite cache and requests served one after another in id order,
a request finds cached every leading full block of its prompt (but the block of its last prompt token, which is
always computed) that an earlier request's cache held, and that is all it can find.
"""

from __future__ import annotations

import random

from kvbench.serving.trace import SHAPES, Trace, TraceRequest, check_trace

DEFAULTS = {  # scaled to a CPU: (SGLang 64 groups x 16 of 2048 + 128 -> 256; vLLM's multi-turn dozens of turns)
    "shared-prefix": {"groups": 4, "prompts": 16, "system": 512, "question": 32, "output": 16},
    "multi-turn": {"conversations": 8, "turns": 4, "message": 64, "output": 32},
}
SOURCES = {"shared-prefix": "SGLang bench_serving, dataset generated-shared-prefix (groups x prompts, S, Q, O)",
           "multi-turn": "vLLM benchmarks/multi_turn (conversations whose every turn carries its whole history)"}

__all__ = ["DEFAULTS", "best_hit_tokens", "make_shaped", "parse_shape", "segments"]


def parse_shape(text: str) -> dict:
    """'shared-prefix[:G,P,S,Q,O]' or 'multi-turn[:C,T,U,O]' as a spec dict, the defaults where not given."""
    name, _, rest = text.partition(":")
    if name not in SHAPES:
        raise ValueError(f"a shaped trace is one of {list(SHAPES)}, got {name!r}")
    fields = list(DEFAULTS[name])
    try:
        values = [int(part) for part in rest.split(",")] if rest else list(DEFAULTS[name].values())
    except ValueError:
        values = []
    if len(values) != len(fields) or any(value < 1 for value in values):
        raise ValueError(f"--trace {name}:{','.join(field[0].upper() for field in fields)} takes {len(fields)} "
                         f"positive integers ({', '.join(fields)}), got {text!r}")
    return {"lengths": name, **dict(zip(fields, values)), "source": SOURCES[name]}


def make_shaped(spec: dict, seed: int, max_positions: int) -> Trace:
    """The trace of a parse_shape spec, checked against the model's max_length."""
    if spec["lengths"] == "shared-prefix":
        rng = random.Random(f"kvbench.sharing/{seed}")
        order = [(group, index) for group in range(spec["groups"]) for index in range(spec["prompts"])]
        rng.shuffle(order)
        prompt = spec["system"] + spec["question"]
        requests = [TraceRequest(index, prompt, spec["output"], 0.0, prefix=spec["system"], group=group)
                    for index, (group, _) in enumerate(order)]
        trace = Trace(tuple(requests), "all", None, seed, dict(spec))
    else:
        count, requests = spec["conversations"], []
        for turn in range(spec["turns"]):
            for conversation in range(count):
                index = turn * count + conversation
                history = requests[index - count].prompt + spec["output"] if turn else 0
                requests.append(TraceRequest(index, history + spec["message"], spec["output"], None, conversation,
                                             parent=index - count if turn else None))
        trace = Trace(tuple(requests), "closed", count, seed, dict(spec))
    check_trace(trace, max_positions)
    return trace


def segments(trace: Trace, request: TraceRequest, whole: bool = False) -> list[tuple[str, int, int]]:
    """The (what, key, length) segments of a request's ids (prompt + output - 1 tokens), or with `whole` of its
    prompt and whole output (what a later turn's history holds)."""
    if request.parent is not None:
        parent = trace.requests[request.parent]
        head = segments(trace, parent, whole=True)
        held = parent.prompt + parent.output
    elif request.prefix:
        head, held = [("prefix", request.group or 0, request.prefix)], request.prefix
    else:
        head, held = [], 0
    own = [("own", request.id, request.positions - held)]
    return head + own + ([("last", request.id, 1)] if whole else [])


def _blocks(parts: list[tuple[str, int, int]], count: int, size: int) -> list[tuple]:
    """The identity of each of the first `count` full blocks: the segments from position 0 to its end."""
    found = []
    for block in range(count):
        end, covered, head = (block + 1) * size, 0, []
        for what, key, length in parts:
            if covered >= end:
                break
            head.append((what, key, min(length, end - covered)))
            covered += head[-1][2]
        found.append(tuple(head))
    return found


def best_hit_tokens(trace: Trace, block_size: int) -> list[int]:
    """Each request's hit tokens with an infinite cache, requests served one after another in id order: the leading
    full blocks of its prompt (up to the one holding its last prompt token) that an earlier request's cache held
    (the full blocks of its prompt and of the outputs it fed back)."""
    seen: set[tuple] = set()
    hits = []
    for request in trace.requests:
        parts = segments(trace, request)
        asked = _blocks(parts, (request.prompt - 1) // block_size, block_size)
        hit = next((index for index, block in enumerate(asked) if block not in seen), len(asked))
        hits.append(hit * block_size)
        seen.update(_blocks(parts, (request.prompt + request.emits - 1) // block_size, block_size))
    return hits
