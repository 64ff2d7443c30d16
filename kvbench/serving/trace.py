"""A serving trace: who arrives when, with how long a prompt and how many tokens to generate.

Seeded and plain data (torch-free), so a trace is built, checked, saved and replayed the same
way everywhere: `make_trace` draws one from a spec, `trace_from_dict` checks a saved one
(`--trace FILE`), and the record keeps the trace it was measured on.

Lengths:
  fixed:P,N          every prompt P tokens, every output N
  uniform:P0-P1,N0-N1  both drawn uniformly from the closed ranges
  chat / alpaca      log-normal with the mean input and output lengths the PagedAttention paper
                     (Kwon et al., SOSP 2023, Fig. 11) reports for ShareGPT (161.31 in, 337.99 out)
                     and Alpaca (19.31 in, 58.45 out). The paper gives means and histograms, not a
                     shape: the log-normal's sigma (LOGNORMAL_SIGMA) is this module's assumption.
Arrivals:
  all        every request at time 0 (offline throughput)
  poisson:R  exponential gaps at R requests per second (at most MAX_RATE; the trace within MAX_ARRIVAL s)
  closed:C   C clients, each sending its next request when its previous one ends (no think time);
             request i belongs to client i % C, so times are known only at replay
Options: a shared prefix (a system prompt of S tokens) on a fraction of the requests, and
cancellation of a fraction after k output tokens (k < the request's output).
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass

from kvbench.config import positive_int, positive_number

TRACE_SCHEMA = "kvbench.trace/1"
LENGTHS = ("chat", "alpaca", "fixed", "uniform")
ARRIVALS = ("all", "poisson", "closed")
PUBLISHED_MEANS = {  # (mean input, mean output) tokens: Kwon et al., SOSP 2023, Fig. 11
    "chat": (161.31, 337.99),  # ShareGPT
    "alpaca": (19.31, 58.45),  # Alpaca
}
LOGNORMAL_SIGMA = 0.8  # assumed (the paper publishes no shape): a right tail a few times the mean
SOURCE = "Kwon et al., Efficient Memory Management for LLM Serving with PagedAttention, SOSP 2023, Fig. 11"
FIELDS = ("id", "prompt", "output", "arrival", "client", "prefix", "cancel_after")
STRUCTURE = ("group", "parent")  # optional fields of a trace that reuses prefixes (kvbench.serving.sharing)
SHAPES = ("multi-turn", "shared-prefix")  # traces drawn by kvbench.serving.sharing, whose prompts reuse prefixes
MAX_REQUESTS = 100_000  # the most `kvbench run --requests` draws: a saved trace may hold no more
# Arrivals are seconds after the replay starts, kept to the microsecond. Float seconds resolve a nanosecond
# below about 1e7 s (116 days); far beyond, a request's token stamps collapse onto its arrival (1e300 + 0.1 is
# 1e300) and every latency reads 0. The scheduler skips idle gaps, so a long trace costs no waiting.
MAX_ARRIVAL = 1e7
MAX_RATE = 1e6  # requests/s: faster, the gaps are below the microsecond arrivals are kept to and all round to 0


@dataclass(frozen=True)
class TraceRequest:
    id: int
    prompt: int  # tokens prefilled, the shared prefix included
    output: int  # tokens generated (teacher-forced), unless cancelled
    arrival: float | None  # seconds after the replay starts; None for a closed-loop client's request
    client: int | None = None  # the closed-loop client that sends it
    prefix: int = 0  # leading prompt tokens shared with every other request that has a prefix
    cancel_after: int | None = None  # the client cancels after this many output tokens
    group: int | None = None  # which shared prefix it carries (its system prompt's tokens); None: group 0
    parent: int | None = None  # the earlier turn of its conversation: its prompt begins with that turn's prompt and
    # whole output (kvbench.serving.sharing); None: a conversation's first turn, or no conversation

    @property
    def positions(self) -> int:
        """Positions its cache holds at most: the prompt, then every output token but the last fed back."""
        return self.prompt + self.output - 1

    @property
    def emits(self) -> int:
        """Output tokens it gets before it finishes or is cancelled."""
        return self.output if self.cancel_after is None else self.cancel_after


@dataclass(frozen=True)
class Trace:
    requests: tuple[TraceRequest, ...]
    arrivals: str
    clients: int | None
    seed: int
    spec: dict  # how it was drawn (or where it was read from)

    def to_dict(self) -> dict:
        """The saved trace; the structure fields only where they are set (a trace without them reads as before)."""
        rows = [{name: value for name, value in asdict(request).items() if name not in STRUCTURE or value is not None}
                for request in self.requests]
        return {"schema": TRACE_SCHEMA, "seed": self.seed, "arrivals": self.arrivals, "clients": self.clients,
                "spec": dict(self.spec), "requests": rows}

    @property
    def prefix(self) -> int:
        return max((request.prefix for request in self.requests), default=0)


def _fraction(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"{name} must be a fraction in [0, 1], got {value!r}")


def parse_lengths(text: str) -> dict:
    """'chat', 'alpaca', 'fixed:P,N' or 'uniform:P0-P1,N0-N1' as a spec dict."""
    name, _, rest = text.partition(":")
    try:
        if name in PUBLISHED_MEANS and not rest:
            return {"lengths": name}
        if name == "fixed":
            prompt, output = (int(part) for part in rest.split(","))
            return {"lengths": name, "prompt": [prompt, prompt], "output": [output, output]}
        if name == "uniform":
            prompt, output = ([int(end) for end in part.split("-")] for part in rest.split(","))
            return {"lengths": name, "prompt": prompt, "output": output}
    except ValueError:
        pass
    raise ValueError(f"lengths must be one of 'chat', 'alpaca', 'fixed:P,N' or 'uniform:P0-P1,N0-N1', got {text!r}")


def parse_arrivals(text: str) -> dict:
    """'all', 'poisson:R' (requests per second) or 'closed:C' (clients) as a spec dict."""
    name, _, rest = text.partition(":")
    try:
        if name == "all" and not rest:
            return {"arrivals": "all"}
        if name == "poisson":
            return {"arrivals": name, "rate": float(rest)}
        if name == "closed":
            return {"arrivals": name, "clients": int(rest)}
    except ValueError:
        pass
    raise ValueError(f"arrivals must be 'all', 'poisson:R' (requests/s) or 'closed:C' (clients), got {text!r}")


def check_spec(spec: dict, max_positions: int) -> None:
    """Every count, rate and length positive and finite, ranges ordered, a request within max_positions."""
    positive_int("requests", spec["requests"])
    if spec["requests"] > MAX_REQUESTS:
        raise ValueError(f"requests must be at most {MAX_REQUESTS}, got {spec['requests']}")
    for part in ("prompt", "output"):
        if part in spec:
            low, high = spec[part]
            positive_int(f"{part} length", low)
            positive_int(f"{part} length", high)
            if low > high:
                raise ValueError(f"{part} range must be low-high with low <= high, got {low}-{high}")
    if spec["arrivals"] == "poisson":
        check_rate(spec["rate"], spec["requests"])
    if spec["arrivals"] == "closed":
        positive_int("closed-loop clients", spec["clients"])
    prefix, share = spec.get("prefix", 0), spec.get("prefix_fraction", 1.0)
    if prefix:
        positive_int("shared prefix", prefix)
    _fraction("prefix fraction", share)
    _fraction("cancel fraction", spec.get("cancel_fraction", 0.0))
    if spec.get("cancel_fraction"):
        positive_int("cancel after", spec.get("cancel_after"))
    longest = spec["prompt"][1] + spec["output"][1] - 1 if "prompt" in spec else None
    if longest is not None and longest + prefix > max_positions:
        raise ValueError(f"a request of prompt {spec['prompt'][1]} + prefix {prefix} + output {spec['output'][1]} "
                         f"holds {longest + prefix} positions, beyond max_length {max_positions}")


def check_rate(rate: object, requests: int) -> None:
    """A Poisson rate whose trace stays within MAX_ARRIVAL seconds and whose gaps survive rounding to 1 µs."""
    positive_number("poisson rate", rate)
    if rate > MAX_RATE:
        raise ValueError(f"poisson rate must be at most {MAX_RATE:g} requests/s (arrivals are kept to the "
                         f"microsecond), got {rate:g}")
    if requests / rate > MAX_ARRIVAL:
        raise ValueError(f"poisson rate {rate:g} requests/s spreads {requests} requests over about "
                         f"{requests / rate:.3g} s, beyond the {MAX_ARRIVAL:g} s a trace may span: expected a rate "
                         f">= {requests / MAX_ARRIVAL:g}")


def _draw_length(rng: random.Random, spec: dict, part: str, cap: int) -> int:
    if "prompt" in spec:
        low, high = spec[part]
        return rng.randint(low, high)
    mean = PUBLISHED_MEANS[spec["lengths"]][part == "output"]
    mu = math.log(mean) - LOGNORMAL_SIGMA**2 / 2  # a log-normal's mean is exp(mu + sigma^2 / 2)
    return max(1, min(cap, round(rng.lognormvariate(mu, LOGNORMAL_SIGMA))))


def make_trace(spec: dict, seed: int, max_positions: int) -> Trace:
    """Draw a trace from a spec (parse_lengths and parse_arrivals merged, plus requests, prefix, cancel)."""
    check_spec(spec, max_positions)
    rng = random.Random(f"kvbench.trace/{seed}")
    prefix, cancel_after = spec.get("prefix", 0), spec.get("cancel_after")
    clock, requests = 0.0, []
    for index in range(spec["requests"]):
        shared = prefix if prefix and rng.random() < spec.get("prefix_fraction", 1.0) else 0
        output = _draw_length(rng, spec, "output", max_positions // 2)
        prompt = _draw_length(rng, spec, "prompt", max_positions - output - shared) + shared
        cancel = cancel_after if rng.random() < spec.get("cancel_fraction", 0.0) and cancel_after < output else None
        if spec["arrivals"] == "poisson":
            clock += rng.expovariate(spec["rate"])
        closed = spec["arrivals"] == "closed"
        requests.append(TraceRequest(index, prompt, output, None if closed else round(clock, 6),
                                     index % spec["clients"] if closed else None, shared, cancel))
    trace = Trace(tuple(requests), spec["arrivals"], spec.get("clients"), seed, dict(spec, source=SOURCE))
    check_trace(trace, max_positions)
    return trace


def check_trace(trace: Trace, max_positions: int) -> None:
    """A trace's requests consistent with each other and with the model, or ValueError naming the first wrong."""
    if not trace.requests:
        raise ValueError("a trace needs at least one request, got none")
    if len(trace.requests) > MAX_REQUESTS:
        raise ValueError(f"a trace holds at most {MAX_REQUESTS} requests, got {len(trace.requests)}")
    if not isinstance(trace.arrivals, str) or trace.arrivals not in ARRIVALS:
        raise ValueError(f"arrivals must be one of {list(ARRIVALS)}, got {trace.arrivals!r}")
    if trace.arrivals != "closed" and trace.clients is not None:  # only closed-loop clients send requests
        raise ValueError(f"clients: a trace with arrivals {trace.arrivals!r} has no clients (null), "
                         f"got {trace.clients!r}")
    last = 0.0
    for index, request in enumerate(trace.requests):
        where = f"request {index}"
        if isinstance(request.id, bool) or request.id != index:
            raise ValueError(f"{where}: ids must count from 0 in order, got id {request.id}")
        positive_int(f"{where} prompt", request.prompt)
        positive_int(f"{where} output", request.output)
        if request.positions > max_positions:
            raise ValueError(f"{where}: prompt {request.prompt} + output {request.output} - 1 = {request.positions} "
                             f"positions, beyond max_length {max_positions}")
        if isinstance(request.prefix, bool) or not isinstance(request.prefix, int) or not 0 <= request.prefix < request.prompt:
            raise ValueError(f"{where}: shared prefix must be in [0, prompt {request.prompt}), got {request.prefix!r}")
        if request.cancel_after is not None:
            positive_int(f"{where} cancel_after", request.cancel_after)
            if request.cancel_after >= request.output:
                raise ValueError(f"{where}: cancellation after {request.cancel_after} tokens is beyond its output of "
                                 f"{request.output} (expected fewer than {request.output})")
        _check_arrival(trace, request, where, last)
        last = request.arrival if request.arrival is not None else last
    prefixes = {request.prefix for request in trace.requests if request.prefix}  # each an int by now
    if len(prefixes) > 1:
        raise ValueError(f"a trace shares one prefix: expected one prefix length, got {sorted(prefixes)}")
    for request in trace.requests:
        check_structure(trace, request)


def check_structure(trace: Trace, request: TraceRequest) -> None:
    """A group is a count; a turn extends its history: its parent is an earlier request, and its prompt holds the
    parent's prompt and whole output and at least one token more (its new message)."""
    where = f"request {request.id}"
    if request.group is not None:
        positive_int(f"{where} group", request.group, lowest=0)
        if not request.prefix:
            raise ValueError(f"{where}: group {request.group} names a shared prefix, and its prefix is 0")
    if request.parent is None:
        return
    if isinstance(request.parent, bool) or not isinstance(request.parent, int) or not 0 <= request.parent < request.id:
        raise ValueError(f"{where}: a turn's parent is an earlier request (0 to {request.id - 1}), got "
                         f"{request.parent!r}")
    parent = trace.requests[request.parent]
    history = parent.prompt + parent.output
    if request.prefix or request.group is not None:
        raise ValueError(f"{where}: a later turn carries its conversation's prefix in its history: expected prefix "
                         f"0 and no group, got prefix {request.prefix} and group {request.group!r}")
    if parent.cancel_after is not None or request.prompt <= history:
        raise ValueError(f"{where}: a turn is its history's extension: its prompt must hold request {parent.id}'s "
                         f"prompt {parent.prompt} and whole output {parent.output} ({history} tokens, not cancelled) "
                         f"and a new message, got prompt {request.prompt}"
                         + (" after a cancelled parent" if parent.cancel_after is not None else ""))


def _check_arrival(trace: Trace, request: TraceRequest, where: str, last: float) -> None:
    if trace.arrivals == "closed":
        positive_int("clients", trace.clients)
        if (request.arrival is not None or isinstance(request.client, bool)
                or request.client != request.id % trace.clients):
            raise ValueError(f"{where}: a closed-loop request has no arrival time and client id % {trace.clients}, "
                             f"got arrival {request.arrival!r} and client {request.client!r}")
        return
    if request.client is not None:
        raise ValueError(f"{where}: client is only a closed-loop request's (null with arrivals {trace.arrivals!r}), "
                         f"got {request.client!r}")
    arrival = request.arrival
    if isinstance(arrival, bool) or not isinstance(arrival, (int, float)) or not math.isfinite(arrival) or arrival < 0:
        raise ValueError(f"{where}: arrival must be a finite number of seconds >= 0, got {arrival!r}")
    if arrival > MAX_ARRIVAL:
        raise ValueError(f"{where}: arrival must be at most {MAX_ARRIVAL:g} s after the start, got {arrival:g}")
    if arrival < last:
        raise ValueError(f"{where}: arrivals must not decrease, got {arrival} after {last}")
    if trace.arrivals == "all" and arrival != 0:
        raise ValueError(f"{where}: arrivals 'all' means every arrival at 0, got {arrival}")


def trace_from_dict(data: object, max_positions: int) -> Trace:
    """A saved trace (Trace.to_dict's shape), checked, or ValueError saying what is wrong."""
    if not isinstance(data, dict) or data.get("schema") != TRACE_SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"a trace file has schema {TRACE_SCHEMA!r}, got {found!r}")
    rows, spec = data.get("requests"), data.get("spec")
    spec = {} if spec is None else spec  # a hand-written trace may say nothing of how it was drawn
    if not isinstance(rows, list) or not all(isinstance(row, dict) and set(FIELDS) <= set(row) <= {*FIELDS, *STRUCTURE}
                                             for row in rows):
        raise ValueError(f"a trace's requests are a list of objects with exactly the fields {list(FIELDS)}, and "
                         f"optionally {list(STRUCTURE)}")
    if len(rows) > MAX_REQUESTS:  # refused before a request is built: a hostile file may hold millions
        raise ValueError(f"a trace holds at most {MAX_REQUESTS} requests, got {len(rows)}")
    if not isinstance(spec, dict):
        raise ValueError(f"spec: expected an object (how the trace was drawn), got {type(spec).__name__}")
    seed = data.get("seed")
    positive_int("a trace's seed", seed, lowest=0)
    trace = Trace(tuple(TraceRequest(**row) for row in rows), data.get("arrivals"), data.get("clients"), seed,
                  dict(spec))
    check_trace(trace, max_positions)
    return trace
