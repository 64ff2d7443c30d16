"""scripts/kvpress_peer.py: NVIDIA's kvpress 0.5.5, in its own environment, as the oracle of kvbench's evicting kinds.

Its refusals and its writing are tested here in kvbench's environment (no kvpress needed). The run itself needs
kvpress's environment (`make kvpress`: .venv-kvpress, or KVBENCH_KVPRESS_PYTHON naming another interpreter with
kvpress 0.5.5): the peer prefills the packaged SmolLM2-135M on PROMPT corpus tokens under each press while kvbench
runs its kind of the same name on the same weights and ids, and every layer's KV heads must keep the same
positions, the next token's logits within 1e-4. A head where the two differ passes only as a tie at the cut: every
disputed position's kvpress score within kvbench.models.kvpress_oracle.SCORE_EPSILON (relative) of the cut's, which
the test reports as a warning naming the head and the gap, and then the logits are not held to 1e-4 (the caches
differ); anything else fails.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import warnings
from pathlib import Path

import pytest
import torch

from kvbench.models import kvpress_oracle as oracle

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "kvpress_peer.py"
METHODS = ("knorm", "snapkv", "tova", "h2o", "pyramidkv", "streamingllm")
RATIOS = (0.25, 0.5, 0.75)
PROMPT = 256  # the shortest prompt whose ratio 0.75 still keeps SnapKV's whole window: int(256 * 0.25) = 64
VARIABLE = "KVBENCH_KVPRESS_PYTHON"


def load_script():
    spec = importlib.util.spec_from_file_location("kvpress_peer", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


peer = load_script()


# -- refusals and writing, without kvpress ----------------------------------------------------------------------

@pytest.mark.parametrize(("argv", "message"), [
    (["--presses", "knorm,nope"], "--presses: expected names among knorm, snapkv"),
    (["--presses", "knorm,knorm"], "--presses: expected each press once"),
    (["--ratios", "1"], "--ratios: expected numbers in (0, 1), got 1.0"),
    (["--ratios", "0"], "--ratios: expected numbers in (0, 1), got 0.0"),
    (["--ratios", "half"], "--ratios: expected numbers in (0, 1), got 'half'"),
    (["--ratios", "0.5,0.5"], "--ratios: expected each ratio once"),
    (["--repetitions", "-1"], "--repetitions: expected an integer >= 0, got -1"),
    (["--threads", "0"], "--threads: expected an integer >= 1, got 0"),
    (["--prompt-ids", "ids.json"], "not allowed with argument --prompt-length"),
    (["--nonsense"], "unrecognized arguments: --nonsense"),
])
def test_bad_arguments_are_refused_in_one_line_before_anything_runs(argv, message, tmp_path, capsys):
    output = tmp_path / "peer.json"
    assert peer.run(["--prompt-length", "80", "--output", str(output), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kvpress_peer: error: ") and message in err, err
    assert not output.exists()


def test_a_prompt_is_required_and_so_is_an_output(tmp_path, capsys):
    assert peer.run(["--output", str(tmp_path / "peer.json")]) == 2
    assert "one of the arguments --prompt-ids --prompt-length is required" in capsys.readouterr().err
    assert peer.run(["--prompt-length", "80"]) == 2
    assert "the following arguments are required: --output" in capsys.readouterr().err


def test_the_corpus_is_a_prompt_length_not_a_file(tmp_path, capsys):
    assert peer.run(["--prompt-ids", "ids.json", "--corpus", "--output", str(tmp_path / "peer.json")]) == 2
    assert "--corpus: expected with --prompt-length, got it with --prompt-ids" in capsys.readouterr().err
    args = peer.checked(["--prompt-length", "70", "--corpus", "--output", str(tmp_path / "peer.json")])
    ids, source = peer.prompt_ids(args, vocab=1000, corpus_ids=lambda n: list(range(n)))
    assert ids == list(range(71)) and "corpus" in source


def test_an_existing_output_is_refused_without_force_before_kvpress_is_looked_for(tmp_path, capsys):
    output = tmp_path / "peer.json"
    output.write_text("{}")
    assert peer.run(["--prompt-length", "80", "--output", str(output)]) == 2
    assert f"{output} already exists" in capsys.readouterr().err and output.read_text() == "{}"


def test_another_kvpress_or_none_is_refused_by_name(tmp_path, capsys, monkeypatch):
    real = importlib.metadata.version

    def version(name):
        if name == "kvpress":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    assert peer.run(["--prompt-length", "80", "--output", str(tmp_path / "peer.json")]) == 2
    assert capsys.readouterr().err == "kvpress_peer: error: expected kvpress 0.5.5, got none: make kvpress\n"


@pytest.mark.parametrize(("content", "message"), [
    ("{\"ids\": [1, 2]}", "expected a JSON list of at least 2 integer token ids, got dict"),
    ("[1, 2.5, 3]", "expected a JSON list of at least 2 integer token ids, got a list of 3 items"),
    ("[7]", "got a list of 1 items"),
    ("[1, 2, 99]", "prompt ids: expected ids in [0, 50), got 99"),
    ("[1, 2, 3]", "--presses snapkv: kvpress needs a prompt of at least 65 tokens, got 2"),
])
def test_prompt_ids_are_checked_for_shape_range_and_the_presses_window(content, message, tmp_path):
    path = tmp_path / "ids.json"
    path.write_text(content)
    args = peer.checked(["--prompt-ids", str(path), "--output", str(tmp_path / "peer.json")])
    with pytest.raises(ValueError) as raised:
        peer.prompt_ids(args, vocab=50)
    assert message in str(raised.value)


def test_drawn_prompt_ids_are_a_function_of_the_seed():
    draw = lambda seed: peer.prompt_ids(peer.checked(["--prompt-length", "70", "--seed", str(seed), "--output",  # noqa: E731
                                                      "x.json"]), vocab=1000)
    (ids, source), (again, _), (other, _) = draw(3), draw(3), draw(4)
    assert len(ids) == 71 and ids == again != other and all(0 <= i < 1000 for i in ids) and "seed 3" in source


def test_the_json_is_written_atomically_with_each_list_of_numbers_on_one_line(tmp_path):
    result = {"schema": peer.SCHEMA, "runs": [{"kept": [[[0, 5, 9], [1, 2, 3]]], "cut_margin": [[1e-05, None]],
                                               "top5": [[85, -28.5], [67, 2.5e-07]], "press": "KnormPress"}]}
    output, tensors = tmp_path / "out" / "peer.json", tmp_path / "out" / "peer.pt"
    peer.write_outputs(result, {"knorm@0.5": {"logits": torch.arange(3.0)}}, output, tensors, force=False)
    text = output.read_text()
    assert "[0, 5, 9]" in text and "[1e-05, null]" in text and "[85, -28.5]" in text
    assert json.loads(text) == {**result, "tensors": str(tensors)}
    assert torch.equal(torch.load(tensors, weights_only=True)["knorm@0.5"]["logits"], torch.arange(3.0))
    assert sorted(path.name for path in output.parent.iterdir()) == ["peer.json", "peer.pt"]  # no temporary left
    with pytest.raises(ValueError, match="already exists"):
        peer.write_outputs(result, {}, output, None, force=False)
    peer.write_outputs({"schema": "again"}, {}, output, None, force=True)
    assert json.loads(output.read_text()) == {"schema": "again"}


# -- kvpress itself -------------------------------------------------------------------------------------------

def kvpress_python() -> Path:
    """The interpreter of kvpress's environment, or a skip saying why there is none."""
    named = os.environ.get(VARIABLE)
    python = Path(named) if named else ROOT / ".venv-kvpress" / "bin" / "python"
    if not (python.is_file() and os.access(python, os.X_OK)):
        pytest.skip(f"kvpress's environment is absent: no interpreter at {python} (make kvpress, or {VARIABLE})")
    found = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('kvpress'))"],
                           capture_output=True, text=True, timeout=60)
    if found.returncode != 0 or found.stdout.strip() != peer.KVPRESS_VERSION:
        pytest.skip(f"{python} has no kvpress {peer.KVPRESS_VERSION} ({(found.stdout or found.stderr).strip()[-120:]})")
    return python


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The peer's output and tensors, kvbench's model, and kvbench's own runs of every kind it has, computed
    while the peer runs (one torch thread each: two cores)."""
    from kvbench.models import corpus, gguf

    python = kvpress_python()
    source = gguf.read_gguf(gguf.packaged_path("smollm2-135m"))
    ids = corpus.corpus_ids(gguf.tokenizer(source), 1, PROMPT + 1)
    folder = tmp_path_factory.mktemp("kvpress")
    (folder / "ids.json").write_text(json.dumps(ids[0].tolist()))
    command = [str(python), str(SCRIPT), "--prompt-ids", str(folder / "ids.json"), "--presses", ",".join(METHODS),
               "--ratios", ",".join(map(str, RATIOS)), "--repetitions", "0", "--output", str(folder / "peer.json"),
               "--tensors", str(folder / "peer.pt")]
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's kvbench, whatever the venv holds
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment)
    try:
        model, _ = gguf.build_gguf_model(source, "float32")
        ours = {(method, ratio): oracle.kvbench_run(model, ids, method, ratio)
                for method in METHODS if oracle.unavailable(method) is None for ratio in RATIOS}
        _, err = process.communicate(timeout=600)
    finally:
        process.kill()
        torch.set_num_threads(threads)
    assert process.returncode == 0, f"the peer failed ({process.returncode}): {err[-2000:]}"
    return {"peer": oracle.read_peer(folder / "peer.json"), "tensors": oracle.read_tensors(folder / "peer.pt"),
            "model": model, "ours": ours, "sha256": source.sha256}


@pytest.mark.subprocess
def test_the_peer_runs_kvpress_on_kvbench_weights_which_give_kvbench_logits(runs):
    found = runs["peer"]
    assert (found["environment"]["kvpress"], found["environment"]["transformers"]) == ("0.5.5", "5.2.0")
    oracle.check_same_model(found, runs["sha256"])
    assert found["prompt"]["length"] == PROMPT
    assert oracle.baseline_difference(found, runs["model"], runs["tensors"]) <= oracle.LOGIT_TOLERANCE


@pytest.mark.subprocess
def test_kvpress_keeps_what_its_rules_say(runs):
    """The peer's recovery of the kept positions, read against kvpress's own rules: int(P (1 - r)) per head (the
    pyramid's per-layer budgets aside), SnapKV's window always kept, StreamingLLM's sinks and recent tail."""
    for run in runs["peer"]["runs"]:
        kept, n = run["kept"], int(PROMPT * (1 - run["ratio"]))
        assert all(len(head) == run["n_kept"][layer] and head == sorted(set(head)) and 0 <= head[0]
                   and head[-1] < PROMPT for layer, heads in enumerate(kept) for head in heads)
        if run["method"] != "pyramidkv":
            assert run["n_kept"] == [n] * len(kept), run["method"]
        if run["method"] in ("snapkv", "pyramidkv"):
            assert all(set(range(PROMPT - 64, PROMPT)) <= set(head) for heads in kept for head in heads)
        if run["method"] == "streamingllm":
            assert all(head == [0, 1, 2, 3, *range(PROMPT - n + 4, PROMPT)] for heads in kept for head in heads)


@pytest.mark.subprocess
@pytest.mark.parametrize("ratio", RATIOS)
@pytest.mark.parametrize("method", METHODS)
def test_kvbench_keeps_the_positions_kvpress_keeps(runs, method, ratio):
    reason = oracle.unavailable(method)
    if reason is not None:
        pytest.skip(f"{reason}: kvbench's kind is not merged yet")
    run = next(run for run in runs["peer"]["runs"] if (run["method"], run["ratio"]) == (method, ratio))
    comparison = oracle.compare_run(run, *runs["ours"][method, ratio], runs["tensors"])
    assert comparison.disagreements == [], [f"layer {h.layer} head {h.head}: {h.reason}; kvbench only {h.ours_only}, "
                                            f"kvpress only {h.theirs_only}" for h in comparison.disagreements[:5]]
    for head in comparison.ties:
        warnings.warn(f"{method} @ {ratio}, layer {head.layer} head {head.head}: a tie at the cut (kvbench only "
                      f"{head.ours_only}, kvpress only {head.theirs_only}, {head.gap:.2g} relative from the cut, within "
                      f"{oracle.SCORE_EPSILON:g}): the logits are not held to {oracle.LOGIT_TOLERANCE:g}")
    if not comparison.ties:
        assert comparison.max_logit_difference <= oracle.LOGIT_TOLERANCE
