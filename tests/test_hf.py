"""The oracle no one here wrote: kvbench's llama family against transformers' own models, same weights.

transformers' LlamaForCausalLM, Qwen2ForCausalLM and MistralForCausalLM get exactly the
weights of a kvbench model (kvbench.models.hf maps them) and must give the same logits, float32
within atol = rtol = 1e-5: over the whole prefix, and decoding through transformers'
DynamicCache in chunks of every shape, on the scaled-down presets of each family. Every
kvbench cache kind is held to transformers' full-prefix logits too, so the caches are
checked against code from outside, not only against kvbench's own full path.

Nothing the oracle compares is left at a value that would hide a mistake: every RMSNorm weight
is drawn at random away from 1 (kvbench initialises them to 1, where ignoring them changes
nothing), and which layers slide comes from the published models' configs as transformers
defines them, never from kvbench's own layer_windows.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys
from pathlib import Path

import pytest
import torch

from kvbench.config import PlainConfig
from kvbench.model import build_model, preset_config
from kvbench.models import hf
from kvbench.modes import spec
from kvbench.workloads.decode import decode_cached, token_ids

transformers = pytest.importorskip("transformers", reason="the oracle needs the hf extra (make test installs it)")

TOLERANCE = dict(atol=1e-5, rtol=1e-5)
ARCHITECTURES = {"llama-tiny": "LlamaForCausalLM", "llama-mini": "LlamaForCausalLM", "qwen-tiny": "Qwen2ForCausalLM",
                 "mistral-tiny": "MistralForCausalLM", "gemma-tiny": "Qwen2ForCausalLM"}
TINY = ["llama-tiny", "llama-mini", "qwen-tiny", "mistral-tiny", "gemma-tiny"]
SLIDING, FULL_ATTENTION = "sliding_attention", "full_attention"
# Which layers slide in the published models, as their configs on the Hugging Face hub and transformers'
# config classes (5.24.0) define them. google/gemma-2-2b: config.json has sliding_window 4096 and 26 layers,
# and transformers' Gemma2Config makes layer i slide when i is even ("sliding_attention" if (i + 1) % 2).
# mistralai/Mistral-7B-v0.1: sliding_window 4096 on all 32 layers (MistralConfig has no per-layer types).
# Qwen/Qwen2.5-0.5B and Qwen2.5-7B: "use_sliding_window": false, so no layer slides. meta-llama's: no window.
PUBLISHED_LAYER_TYPES = {
    "gemma-2-2b": [SLIDING, FULL_ATTENTION] * 13,
    "mistral-7b": [SLIDING] * 32,
    "qwen2.5-0.5b": [FULL_ATTENTION] * 24,
    "qwen2.5-7b": [FULL_ATTENTION] * 28,
    "llama-3.2-1b": [FULL_ATTENTION] * 16,
    "llama-3.1-8b": [FULL_ATTENTION] * 32,
}
# The scaled-down presets follow their published model's convention on their own number of layers.
TINY_LAYER_TYPES = {"gemma-tiny": [SLIDING, FULL_ATTENTION] * 2, "mistral-tiny": [SLIDING] * 2}
LONGEST = 150  # beyond the windowed presets' 64 positions: their windows slide
CHUNKINGS = {"one token a step": [1] * 24, "a prompt then steps": [17, 1, 1, 1, 5, 1], "uneven": [3, 30, 2, 64, 1, 50]}


def with_random_norms(model, seed: int = 11):
    """`model` with every RMSNorm weight drawn from [0.5, 1.5), seeded: a block that ignored them would differ."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if name.endswith(("norm1.weight", "norm2.weight")) or name == "final.weight":
                weight.copy_(0.5 + torch.rand(weight.shape, generator=generator))
    return model


def published_twin(model, layer_types: list[str] | None):
    """transformers' model holding `model`'s weights, its sliding layers set to the published `layer_types`."""
    config = hf.hf_config(model.config)
    if layer_types is not None and hasattr(config, "layer_types"):
        config.layer_types = list(layer_types)
    with torch.random.fork_rng(devices=[]):
        twin = getattr(transformers, hf.hf_architecture(model.config))(config).to(model.config.dtype).eval()
    weights = {name: tensor.detach().clone() for name, tensor in hf.hf_state_dict(model).items()}
    missing, unexpected = twin.load_state_dict(weights, strict=False)
    assert not unexpected and set(missing) <= hf.tied_names(twin)
    return twin


@pytest.fixture(scope="module", params=TINY)
def pair(request):
    """(kvbench model with random norm weights, transformers model with its weights) for a preset."""
    model = with_random_norms(build_model(preset_config(request.param), seed=0))
    return model, published_twin(model, TINY_LAYER_TYPES.get(request.param))


def ids_for(model, length: int, batch: int = 2):
    return token_ids(model.config, batch, length, seed=3)


def hf_full(hf_model, ids):
    with torch.inference_mode():
        return hf_model(input_ids=ids, use_cache=False).logits


def hf_chunked(hf_model, ids, chunks: list[int]):
    """transformers' decoding through its own DynamicCache, chunk by chunk."""
    cache = transformers.DynamicCache(config=hf_model.config)
    pieces, start = [], 0
    with torch.inference_mode():
        for size in chunks:
            pieces.append(hf_model(input_ids=ids[:, start : start + size], cache=cache, use_cache=True).logits)
            start += size
    return torch.cat(pieces, dim=1)


@pytest.mark.parametrize("preset", list(ARCHITECTURES))
def test_each_family_maps_onto_its_transformers_architecture(preset):
    assert hf.hf_architecture(preset_config(preset)) == ARCHITECTURES[preset]
    config = hf.hf_config(preset_config(preset))
    kv = preset_config(preset)
    assert (config.hidden_size, config.num_key_value_heads, config.head_dim, config.intermediate_size) == (
        kv.width, kv.kv_heads, kv.head_dim, kv.intermediate_size)
    assert config.tie_word_embeddings == kv.tie_embeddings


@pytest.mark.parametrize("preset", list(PUBLISHED_LAYER_TYPES))
def test_the_published_models_slide_on_the_layers_their_configs_name(preset):
    config = preset_config(preset)
    published = PUBLISHED_LAYER_TYPES[preset]
    assert [SLIDING if window else FULL_ATTENTION for window in config.layer_windows] == published
    assert {window for window in config.layer_windows} <= {None, 4096}  # both windowed models slide over 4096


def test_the_published_gemma_convention_is_transformers_own():
    """The literal lists above are transformers' Gemma-2 rule, read from transformers itself."""
    assert transformers.Gemma2Config(num_hidden_layers=26).layer_types == PUBLISHED_LAYER_TYPES["gemma-2-2b"]
    assert transformers.Gemma2Config(num_hidden_layers=4).layer_types == TINY_LAYER_TYPES["gemma-tiny"]
    assert transformers.Gemma2Config().sliding_window == 4096


def test_random_norm_weights_reach_the_logits(pair):
    """The oracle's norm weights matter: with every one reset to 1 the logits move well beyond the tolerance."""
    model, hf_model = pair
    ids = ids_for(model, 7)
    unit = build_model(model.config, seed=0)
    with torch.inference_mode():
        assert (unit(ids)[0] - hf_full(hf_model, ids)).abs().max() > 1e-3


@pytest.mark.parametrize("length", [1, 7, 64, 65, LONGEST])
def test_full_prefix_logits_match_transformers(pair, length):
    model, hf_model = pair
    ids = ids_for(model, length)
    with torch.inference_mode():
        ours = model(ids)[0]
    torch.testing.assert_close(ours, hf_full(hf_model, ids), **TOLERANCE)


@pytest.mark.parametrize("chunking", list(CHUNKINGS))
def test_transformers_dynamic_cache_decoding_matches_kvbench(pair, chunking):
    """transformers' cached path and kvbench's full prefix agree, whatever the chunks."""
    model, hf_model = pair
    chunks = CHUNKINGS[chunking]
    ids = ids_for(model, sum(chunks))
    with torch.inference_mode():
        ours = model(ids)[0]
    torch.testing.assert_close(hf_chunked(hf_model, ids, chunks), ours, **TOLERANCE)


def test_every_exact_kind_matches_transformers_full_prefix(pair):
    """Keys stored after rotation at their absolute positions, windows per layer: checked from outside."""
    model, hf_model = pair
    ids = ids_for(model, LONGEST)
    reference = hf_full(hf_model, ids)
    kinds = ["concat", "static", "paged"] + (["window"] if model.config.window is not None else [])
    for kind in kinds:
        cached = decode_cached(model, ids, kind, keep_logits=True)  # one token a step, last-position logits
        torch.testing.assert_close(cached, reference, **TOLERANCE, msg=lambda m, kind=kind: f"{kind}: {m}")


def test_the_mapping_copies_every_weight_and_leaves_none_random():
    model = build_model(preset_config("qwen-tiny"), seed=1)
    hf_model = hf.hf_model(model)
    theirs = dict(hf_model.named_parameters())
    for name, tensor in hf.hf_state_dict(model).items():
        if name in theirs:
            assert torch.equal(theirs[name], tensor), name
    assert set(theirs) <= set(hf.hf_state_dict(model))  # nothing transformers holds is left out
    assert theirs["model.layers.0.self_attn.q_proj.bias"].abs().sum() > 0  # Qwen2's biases are kvbench's


def test_alternating_windows_without_biases_map_to_qwen2_with_zero_biases():
    model = build_model(preset_config("gemma-tiny"), seed=0)
    assert model.blocks[0].qkv.bias is None
    weights = dict(hf.hf_model(model).named_parameters())
    assert all(weights[f"model.layers.{i}.self_attn.k_proj.bias"].abs().sum() == 0 for i in range(model.config.layers))
    assert hf.hf_config(model.config).layer_types == ["sliding_attention", "full_attention"] * 2


def test_a_config_without_a_transformers_twin_is_refused_by_name():
    with pytest.raises(ValueError, match="only the llama family has a transformers twin, got family 'gpt2'"):
        hf.hf_architecture(PlainConfig())


def test_another_transformers_version_is_refused(monkeypatch):
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "4.0.0")
    with pytest.raises(ValueError, match=rf"needs transformers {re.escape(hf.TRANSFORMERS_VERSION)} .*got 4.0.0"):
        hf.require_transformers()


def test_the_kvpress_peers_transformers_is_accepted_only_when_the_peer_is_named(monkeypatch):
    version = hf.PEER_VERSIONS["kvpress"]
    monkeypatch.setattr(importlib.metadata, "version", lambda name: version)
    with pytest.raises(ValueError, match=rf"needs transformers {re.escape(hf.TRANSFORMERS_VERSION)} \(kvbench's pin\), "
                                         rf"got {re.escape(version)}"):
        hf.require_transformers()
    assert hf.require_transformers(peer="kvpress") is not None
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "4.0.0")
    with pytest.raises(ValueError, match=rf"needs transformers {re.escape(hf.TRANSFORMERS_VERSION)} or "
                                         rf"{re.escape(version)} \(kvbench's pin, or the kvpress peer's\), got 4.0.0"):
        hf.require_transformers(peer="kvpress")
    with pytest.raises(ValueError, match=r"peer must be one of \['kvpress'\] or None, got 'vllm'"):
        hf.require_transformers(peer="vllm")


def test_missing_transformers_is_refused(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    with pytest.raises(ValueError, match=r"needs transformers .*which is not installed: pip install"):
        hf.require_transformers()


def test_the_hf_extra_pins_the_version_kvbench_requires():
    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert pyproject["project"]["optional-dependencies"]["hf"] == [f"transformers=={hf.TRANSFORMERS_VERSION}"]


def test_nothing_else_in_kvbench_imports_transformers():
    import ast

    root = Path(hf.__file__).resolve().parents[1]  # kvbench/, every package of it
    importers, at_top = set(), []
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(name.split(".")[0] == "transformers" for name in names):
                importers.add(path.relative_to(root).as_posix())
                if node in tree.body:
                    at_top.append(f"{path.name}:{node.lineno}")
    # models/hf.py: transformers' caches and twin, inside require_transformers; serving/peer.py: its continuous
    # batching, the serving peer. Both import it inside the functions a comparison calls, never at import.
    assert sorted(importers) == ["models/hf.py", "serving/peer.py"] and at_top == []


@pytest.mark.subprocess  # a real interpreter: CI runs it (make test)
def test_importing_kvbench_hf_imports_no_transformers():
    import subprocess

    code = "import sys, kvbench.models.hf, kvbench.model; print('transformers' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_the_transformers_comparison_refuses_another_version_in_one_line(monkeypatch, capsys, tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("hf_peers", Path(__file__).resolve().parents[1] / "scripts/hf_peers.py")
    hf_peers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hf_peers)
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "4.0.0")
    output = tmp_path / "peers.json"
    assert hf_peers.run(["dynamic", "--length", "8", "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "needs transformers 5.24.0" in err and "got 4.0.0" in err
    assert not output.exists()


def test_the_transformers_comparison_sends_the_llama_family_to_its_modes(capsys, tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("hf_peers", Path(__file__).resolve().parents[1] / "scripts/hf_peers.py")
    hf_peers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hf_peers)
    output = tmp_path / "peers.json"
    assert hf_peers.run(["dynamic", "--preset", "llama-tiny", "--length", "8", "--output", str(output)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--modes full,static,hf-dynamic,hf-static" in err and "llama family" in err
    assert not output.exists()


# -- transformers' caches as kvbench modes --------------------------------------------------

QUANTO = importlib.util.find_spec("optimum.quanto") is not None


@pytest.fixture(scope="module")
def tiny():
    return with_random_norms(build_model(preset_config("llama-tiny"), seed=0))


@pytest.mark.parametrize("mode", ["hf-dynamic", "hf-static"])
def test_transformers_exact_caches_pass_kvbenchs_gate_on_the_same_weights(tiny, mode):
    from kvbench.workloads.decode import check_equivalence

    ids = ids_for(tiny, 24)
    result = check_equivalence(tiny, ids, ["full", mode])[mode]
    assert result.passed and result.exact and result.max_abs_diff <= 1e-5, result


HQQ = importlib.util.find_spec("hqq") is not None
QUANTIZED = [pytest.param("hf-quantized-int4", 4, marks=pytest.mark.skipif(not QUANTO, reason="needs optimum-quanto")),
             pytest.param("hf-quantized-int8", 8, marks=pytest.mark.skipif(not HQQ, reason="needs hqq"))]


@pytest.mark.parametrize(("mode", "bits"), QUANTIZED)  # make test installs both extras
def test_transformers_quantized_caches_are_judged_by_kvbenchs_limits_of_the_same_bits(tiny, mode, bits):
    from kvbench.cache import expected_cache_bytes
    from kvbench.workloads.decode import check_equivalence
    from kvbench.workloads.workload import cache_footprint

    ids = ids_for(tiny, 200, batch=1)  # past the 128-position residual: codes are in use
    options = {mode: {"group_size": 32, "residual": 128}}
    result = check_equivalence(tiny, ids, ["full", mode], options=options)[mode]
    assert result.exact is False and result.limits == spec(f"quantized-int{bits}").limits_for(tiny.config)
    assert result.passed, result
    assert result.max_abs_diff > 0  # it quantized
    c = tiny.config
    codes = 2 * c.layers * c.kv_heads * 200 * c.head_dim * bits // 8  # keys and values, every position
    measured = cache_footprint(tiny, ids, mode, options)["measured_bytes"]
    assert codes < measured < expected_cache_bytes(c, 1, 200)  # codes plus scales, below float32's bytes


@pytest.mark.parametrize(("mode", "bits"), QUANTIZED)
def test_a_transformers_quantized_cache_counts_the_positions_it_quantized(tiny, mode, bits):
    """transformers quantizes the first call's positions at once, then everything whenever its float residual
    would reach residual_length: with R = 16 one token a step, 1 of 8 positions, then 33 of 40 (1 + 16 + 16)."""
    from kvbench.workloads.workload import cache_footprint

    options = {mode: {"group_size": 16, "residual": 16}}
    assert cache_footprint(tiny, ids_for(tiny, 8, batch=1), mode, options)["quantized_positions"] == 1
    assert cache_footprint(tiny, ids_for(tiny, 40, batch=1), mode, options)["quantized_positions"] == 33
    assert "quantized_positions" not in cache_footprint(tiny, ids_for(tiny, 8, batch=1), "hf-dynamic")


@pytest.mark.parametrize("mode", ["hf-dynamic", "hf-static"])
def test_a_transformers_request_and_context_step_follow_the_full_prefix(tiny, mode):
    from kvbench.workloads.decode import FULL, decode_full
    from kvbench.workloads.requests import ContextSteps, check_context, request_logits

    ids = ids_for(tiny, 20)
    full = decode_full(tiny, ids, keep_logits=True)
    torch.testing.assert_close(request_logits(tiny, ids, mode, prompt=9), full[:, 8:], **TOLERANCE)
    stepping = ContextSteps(tiny, ids, mode, context=15, warmup=1, timed=3)
    stepping.prepare()
    stepping()
    assert len(stepping.detail()["step_seconds"]) == 4
    stepping.finish()
    checks = check_context(tiny, ids, [FULL, mode], 15, warmup=1, timed=3)
    assert checks[mode]["passed"] and checks[mode]["length"] == 5, checks  # the prefill and four steps after it


def test_a_transformers_cache_counts_the_bytes_of_its_tensors(tiny):
    from kvbench.cache import expected_cache_bytes
    from kvbench.workloads.workload import cache_footprint

    ids = ids_for(tiny, 12, batch=1)
    dynamic = cache_footprint(tiny, ids, "hf-dynamic")
    assert dynamic["measured_bytes"] == dynamic["expected_bytes"] == expected_cache_bytes(tiny.config, 1, 12)
    static = cache_footprint(tiny, ids, "hf-static")  # preallocated for the 12 positions asked
    assert static["measured_bytes"] == static["reserved_bytes"] >= expected_cache_bytes(tiny.config, 1, 12)


def test_a_transformers_mode_on_a_model_without_a_twin_is_one_line_exit_2(capsys, tmp_path):
    from kvbench.cli import main

    assert main(["run", "--modes", "full,hf-dynamic", "--lengths", "4", "--output", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--modes hf-dynamic: only the llama family has a transformers twin" in err


def test_a_transformers_mode_runs_into_a_record(tiny, tmp_path, capsys):
    """hf-dynamic through `kvbench run`: checked against full by the gate, timed, and kept in the record."""
    from kvbench.cli import main
    from kvbench.record import load_record

    output = tmp_path / "hf.json"
    assert main(["run", "--preset", "llama-tiny", "--modes", "full,hf-dynamic", "--lengths", "6,12", "--repeats", "3",
                 "--warmup", "0", "--no-progress", "--output", str(output)]) == 0, capsys.readouterr().err
    record = load_record(output)
    assert record["status"] == "complete"
    checks = {(c["mode"], c["length"]): c for c in record["checks"]}
    assert set(checks) == {(mode, length) for mode in ("full", "hf-dynamic") for length in (6, 12)}
    for length in (6, 12):
        check = checks[("hf-dynamic", length)]
        assert check["passed"] and check["first_divergent_position"] is None and check["non_finite"] == 0
        assert 0 <= check["max_abs_diff"] <= check["atol"] == 1e-5
    samples = [(r["mode"], r["length"], r["repetition"]) for r in record["repetitions"] if r["mode"] == "hf-dynamic"]
    assert sorted(samples) == [("hf-dynamic", length, r) for length in (6, 12) for r in range(3)]
    assert all(r["seconds"] > 0 for r in record["repetitions"])
    memory = {(m["mode"], m["length"]): m for m in record["memory"]}
    c = preset_config("llama-tiny")
    assert memory[("hf-dynamic", 12)]["measured_bytes"] == 2 * c.layers * c.kv_heads * 12 * c.head_dim * 4
