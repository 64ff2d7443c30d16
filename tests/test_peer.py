"""The serving peer: transformers' continuous batching on kvbench's weights and trace, gated by token equality
with the full path's greedy continuation, which the teacher-forced kinds then feed."""

import json

import pytest
import torch

pytest.importorskip("transformers", reason="the peer needs the hf extra (make test installs it)")

from kvbench.cli import main  # noqa: E402
from kvbench.model import build_model, preset_config  # noqa: E402
from kvbench.serving import admission  # noqa: E402
from kvbench.serving.peer import PeerReplay, greedy_continuation, greedy_continuations, peer_gate  # noqa: E402
from kvbench.serving.replay import gate  # noqa: E402
from kvbench.serving.scheduler import TokenSource  # noqa: E402
from kvbench.serving.trace import make_trace, parse_arrivals, parse_lengths  # noqa: E402

LLAMA = preset_config("llama-tiny", vocab_size=128, max_length=96)
MODEL = build_model(LLAMA, seed=0)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def small_trace(requests=4, **more):
    spec = {**parse_lengths("uniform:3-20,2-10"), **parse_arrivals("all"), "requests": requests, **more}
    return make_trace(spec, 0, LLAMA.max_length)


def test_the_greedy_continuation_is_the_full_paths_argmax_at_every_step():
    prompt = torch.randint(0, 128, (1, 7), generator=torch.Generator().manual_seed(3))
    ids = prompt
    with torch.inference_mode():
        for _ in range(9):  # no cache: one causal forward per token
            ids = torch.cat((ids, MODEL(ids)[0][:, -1].argmax(-1, keepdim=True)), dim=1)
    assert greedy_continuation(MODEL, prompt, 9) == ids[0, 7:].tolist()


def test_the_peer_generates_every_requests_continuation_and_the_kinds_feed_the_same_ids():
    trace = small_trace(cancel_fraction=0.5, cancel_after=1)
    source = TokenSource(LLAMA.vocab_size, trace.seed, trace.prefix)
    continuations = greedy_continuations(MODEL, trace, source.prompt)
    budget = 3 * admission.minimum_budget("paged", LLAMA, trace, block_size=4)
    peer = PeerReplay(MODEL, trace, budget, {"block_size": 4, "max_batched_tokens": 16}, source.prompt)
    check = peer_gate(peer, continuations)
    peer()  # a second replay on the same manager: the same tokens again
    peer.close()
    assert peer.outputs == {r.id: continuations[r.id][: r.emits] for r in trace.requests}
    assert check["passed"], check
    assert check["tokens_checked"] == sum(r.emits for r in trace.requests)
    forced = TokenSource(LLAMA.vocab_size, trace.seed, trace.prefix, continuations)
    for request in trace.requests:  # the teacher-forced kinds feed prompt + continuation
        ids = forced.ids(request)
        assert ids.shape[1] == request.positions and ids[0, request.prompt :].tolist() == continuations[request.id][
            : request.output - 1]
    assert gate(MODEL, trace, "paged", budget, {"block_size": 4}, continuations)["passed"]


def test_a_continuation_the_peer_did_not_generate_fails_its_gate():
    trace = small_trace()
    source = TokenSource(LLAMA.vocab_size, trace.seed, trace.prefix)
    continuations = greedy_continuations(MODEL, trace, source.prompt)
    wrong = {rid: list(ids) for rid, ids in continuations.items()}
    wrong[2][1] = (wrong[2][1] + 1) % LLAMA.vocab_size
    peer = PeerReplay(MODEL, trace, 10**6, {"block_size": 4}, source.prompt)
    check = peer_gate(peer, wrong)
    peer.close()
    assert not check["passed"] and check["failed_requests"] == [{"request": 2, "position": 1}]


def run_main(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_peer_as_a_mode_end_to_end(capsys, tmp_path):
    record = tmp_path / "peer.json"
    code, out, err = run_main(capsys, "run", "--preset", "llama-tiny", "--trace", "fixed:6,5", "--requests", "3",
                              "--modes", "paged,hf-continuous", "--repeats", "1", "--output", record)
    assert code == 0, err
    data = json.loads(record.read_text())
    assert {check["mode"]: check["passed"] for check in data["checks"]} == {"hf-continuous": True, "paged": True}
    outputs = data["serving"]["outputs"]
    assert outputs["source"].startswith("the full path's greedy") and len(outputs["ids"]) == 3
    peer = [s for s in data["repetitions"] if s["mode"] == "hf-continuous"]
    assert peer and all(len(r["token_times"]) == 5 for r in peer[0]["replay"]["requests"])
    assert "hf-continuous" in out and "output tok/s" in out
    code, out, err = run_main(capsys, "report", record)
    assert code == 0 and "hf-continuous" in out, err


@pytest.mark.parametrize("args, fragment", [
    (["--preset", "llama-tiny", "--arrivals", "closed:2"], "the peer replays arrivals all or poisson"),
    ([], "only the llama family has a transformers twin"),
])
def test_what_the_peer_cannot_run_is_one_line_exit_2(capsys, tmp_path, args, fragment):
    code, _, err = run_main(capsys, "run", "--trace", "fixed:6,5", "--modes", "hf-continuous", *args,
                            "--output", tmp_path / "r.json")
    assert code == 2 and len(err.splitlines()) == 1 and fragment in err, err
