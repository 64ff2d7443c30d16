"""Hostile GGUF metadata: a sound file written by kvbench.gguf_writer, then one metadata key changed or dropped.

kvbench builds the model from the metadata, so a file can make it do anything there: a billion blocks (the
reader looped over their tensor names until memory ran out), zero heads (ZeroDivisionError), an array where
a count belongs (TypeError), a vocabulary without what its tokenizer is built from (KeyError, after the
weights were dequantized). Each must be one ValueError naming the file, the key, what was expected and what
was found, before a tensor is looked at; and from `kvbench run --gguf` one line on stderr and exit 2.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from kvbench import gguf as kvgguf
from kvbench.cli import main
from kvbench.gguf_writer import write_gguf
from kvbench.model import build_model, preset_config

gguf = pytest.importorskip("gguf", reason="reading GGUF files needs the gguf extra (make venv installs it)")

CONFIG = preset_config("llama-tiny", vocab_size=64, max_length=128, rope_scaling=None)  # 4 heads of 16, 2 kv heads
T = gguf.GGUFValueType
DROP = object()


@pytest.fixture(scope="module")
def sound(tmp_path_factory):
    """A file kvbench reads: llama architecture, a SentencePiece vocabulary with scores and no merges."""
    return write_gguf(build_model(CONFIG, seed=3), tmp_path_factory.mktemp("sound") / "sound.gguf")


def rewritten(source, target, changes: dict):
    """`source` with metadata keys replaced ((value, type) or (values, ARRAY, item type)) or dropped (DROP)."""
    reader = gguf.GGUFReader(source)
    writer = gguf.GGUFWriter(str(target), reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if not name.startswith("GGUF.") and name != "general.architecture":
            writer.add_key_value(name, field.contents(), field.types[0],
                                 field.types[-1] if field.types[0] == T.ARRAY else None)
    for key, change in changes.items():
        if change is DROP:
            del writer.kv_data[0][key]
        else:
            writer.add_key_value(key, *change)
    for tensor in reader.tensors:  # every tensor of the sound file is F32: its array in torch's order
        writer.add_tensor(tensor.name, tensor.data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


# (the change, the words the one error must hold: the key first, then what was expected or found)
HOSTILE = {
    "a billion blocks": ({"llama.block_count": (10**9, T.UINT32)}, ["llama.block_count", "1000000000"]),
    "blocks beyond the bound": ({"llama.block_count": (5000, T.UINT32)}, ["llama.block_count", "1 to 1024", "5000"]),
    "zero heads": ({"llama.attention.head_count": (0, T.UINT32)}, ["llama.attention.head_count", "got UINT32 0"]),
    "heads as an array": ({"llama.attention.head_count": ([4, 4], T.ARRAY, T.UINT32)},
                          ["llama.attention.head_count", "an integer", "an array of 2 UINT32"]),
    "width as a string": ({"llama.embedding_length": ("64", T.STRING)}, ["llama.embedding_length", "got '64'"]),
    "layers as a float": ({"llama.block_count": (2.0, T.FLOAT32)}, ["llama.block_count", "an integer", "FLOAT32"]),
    "a negative width": ({"llama.embedding_length": (-64, T.INT32)}, ["llama.embedding_length", "got INT32 -64"]),
    "no feed-forward length": ({"llama.feed_forward_length": DROP}, ["llama.feed_forward_length", "lacks"]),
    "a context of 10**12": ({"llama.context_length": (10**12, T.UINT64)},
                            ["llama.context_length", "1 to 16777216", "1000000000000"]),
    "kv heads that do not divide": ({"llama.attention.head_count_kv": (3, T.UINT32)},
                                    ["llama.attention.head_count_kv", "divides", "4", "got UINT32 3"]),
    "an odd head width": ({"llama.attention.key_length": (15, T.UINT32)}, ["llama.attention.key_length", "even", "15"]),
    "a head width beyond the bound": ({"llama.attention.key_length": (1 << 20, T.UINT32)},
                                      ["llama.attention.key_length", "2 to 1024", str(1 << 20)]),
    "a partial rotary": ({"llama.rope.dimension_count": (8, T.UINT32)},
                         ["llama.rope.dimension_count", "16", "got UINT32 8"]),
    "a width heads do not divide": ({"llama.attention.key_length": DROP, "llama.embedding_length": (66, T.UINT32)},
                                    ["llama.embedding_length", "multiple of", "4", "66"]),
    "a zero epsilon": ({"llama.attention.layer_norm_rms_epsilon": (0.0, T.FLOAT32)},
                       ["llama.attention.layer_norm_rms_epsilon", "got FLOAT32 0.0"]),
    "a NaN rotary base": ({"llama.rope.freq_base": (float("nan"), T.FLOAT32)}, ["llama.rope.freq_base", "nan"]),
    "an integer epsilon": ({"llama.attention.layer_norm_rms_epsilon": (1, T.UINT32)},
                           ["llama.attention.layer_norm_rms_epsilon", "a float", "got UINT32 1"]),
    "a vocabulary size that is a string": ({"llama.vocab_size": ("x", T.STRING)}, ["llama.vocab_size", "got 'x'"]),
    "a window as an array": ({"llama.attention.sliding_window": ([8], T.ARRAY, T.UINT32)},
                             ["llama.attention.sliding_window", "an array of 1 UINT32"]),
    "a name that is a number": ({"general.name": (7, T.UINT32)}, ["general.name", "a string", "UINT32 7"]),
    "no scores and no merges": ({"tokenizer.ggml.scores": DROP},
                                ["tokenizer.ggml.scores", "tokenizer.ggml.merges", "lacks"]),
    "too few scores": ({"tokenizer.ggml.scores": ([0.0] * 10, T.ARRAY, T.FLOAT32)},
                       ["tokenizer.ggml.scores", "64", "got 10"]),
    "merges of numbers": ({"tokenizer.ggml.merges": ([1, 2], T.ARRAY, T.UINT32)},
                          ["tokenizer.ggml.merges", "an array of strings", "an array of 2 UINT32"]),
    "no tokenizer model": ({"tokenizer.ggml.model": DROP}, ["tokenizer.ggml.model", "lacks"]),
    "a tokenizer transformers cannot build": ({"tokenizer.ggml.model": ("bert", T.STRING)},
                                              ["tokenizer.ggml.model", "gpt2", "llama", "'bert'"]),
    "tokens of numbers": ({"tokenizer.ggml.tokens": (list(range(64)), T.ARRAY, T.INT32)},
                          ["tokenizer.ggml.tokens", "an array of strings", "an array of 64 INT32"]),
    "no tokens": ({"tokenizer.ggml.tokens": DROP}, ["tokenizer.ggml.tokens", "lacks"]),
    "a token type too few": ({"tokenizer.ggml.token_type": ([1] * 63, T.ARRAY, T.INT32)},
                             ["tokenizer.ggml.token_type", "64", "got 63"]),
    "a bos beyond the vocabulary": ({"tokenizer.ggml.bos_token_id": (64, T.UINT32)},
                                    ["tokenizer.ggml.bos_token_id", "0 to 63", "got UINT32 64"]),
    "a flag that is a string": ({"tokenizer.ggml.add_bos_token": ("yes", T.STRING)},
                                ["tokenizer.ggml.add_bos_token", "a BOOL", "got 'yes'"]),
}


def hostile_file(sound, tmp_path, case: str):
    return rewritten(sound, tmp_path / "hostile.gguf", HOSTILE[case][0])


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_metadata_is_one_value_error_naming_the_file_and_the_key(sound, tmp_path, case):
    path = hostile_file(sound, tmp_path, case)
    with pytest.raises(ValueError) as refused:
        kvgguf.read_gguf(path)
    message = str(refused.value)
    assert type(refused.value) is ValueError and message.startswith(f"{path}: ") and "\n" not in message
    words = HOSTILE[case][1]
    assert all(word in message for word in words), (message, words)
    assert message.index(words[0]) < len(str(path)) + 12, f"the key comes first: {message}"


@pytest.mark.parametrize("case", ["a billion blocks", "zero heads", "heads as an array", "no scores and no merges",
                                  "a context of 10**12", "a tokenizer transformers cannot build"])
def test_kvbench_run_refuses_hostile_metadata_in_one_line(sound, tmp_path, case, capsys):
    path, output = hostile_file(sound, tmp_path, case), tmp_path / "record.json"
    status = main(["run", "--gguf", str(path), "--lengths", "4", "--output", str(output), "--no-progress"])
    err = capsys.readouterr().err
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"kvbench: error: --gguf: {path}: {HOSTILE[case][1][0]}"), err
    assert "preset" not in err and not output.exists()


# Every value a key can be given that is not what it should be: each GGUF type, and numbers no model has.
ANY_VALUE = [DROP, ("x", T.STRING), ([1, 2], T.ARRAY, T.UINT32), (["a"], T.ARRAY, T.STRING), (2.5, T.FLOAT32),
             (-1, T.INT32), (0, T.UINT32), (2**40, T.UINT64), (True, T.BOOL), (1, T.UINT32)]


def sound_keys() -> list[str]:
    path = write_gguf(build_model(CONFIG, seed=3), Path(tempfile.mkdtemp()) / "keys.gguf")
    return [name for name in gguf.GGUFReader(path).fields if not name.startswith("GGUF.")]


@pytest.mark.parametrize("key", sound_keys())
def test_any_value_of_any_key_is_refused_in_one_value_error_or_builds_and_tokenizes(sound, tmp_path, key,
                                                                                    monkeypatch):
    """Not only the cases above: every key the sound file has, given each value in turn, is either refused by
    read_gguf (one ValueError, one line, the file first) or read, built into a model and a tokenizer that
    encodes text. Nothing in between: no other exception, from kvbench or from transformers' loaders."""
    monkeypatch.setenv(kvgguf.CACHE_VARIABLE, str(tmp_path / "cache"))
    for value in ANY_VALUE:
        path = rewritten(sound, tmp_path / "any.gguf", {key: value})
        try:
            model = kvgguf.read_gguf(path)
        except ValueError as error:
            assert type(error) is ValueError and str(error).startswith(f"{path}: ") and "\n" not in str(error)
            continue
        kvgguf.build_gguf_model(model)
        kvgguf.tokenizer(model).encode("t1 t2")  # the toy vocabulary has no byte tokens: its ids may be none
        shutil.rmtree(tmp_path / "cache")  # the next file has another sha256, but keep the folder small


def test_the_sound_file_reads_and_its_tokenizer_fields_pass(sound):
    """The checks refuse nothing kvbench's own writer writes (its vocabulary: scores, no merges)."""
    model = kvgguf.read_gguf(sound)
    assert model.config["layers"] == CONFIG.layers and model.config["vocab_size"] == CONFIG.vocab_size
    assert model.config["head_dim"] == CONFIG.head_dim and model.config["window"] is None


def test_a_window_of_zero_is_none(sound, tmp_path):
    """llama.cpp's converters write sliding_window 0 for a model without one."""
    path = rewritten(sound, tmp_path / "zero.gguf", {"llama.attention.sliding_window": (0, T.UINT32)})
    assert kvgguf.read_gguf(path).config["window"] is None


def test_weights_beyond_the_memory_available_are_refused_before_they_are_built(sound, monkeypatch):
    """The estimate (every parameter dequantized to float32, and the rotary tables) against kvbench.memory's
    available bytes, stated here so that the refusal does not depend on the machine."""
    model = kvgguf.read_gguf(sound)
    monkeypatch.setenv("KVBENCH_AVAILABLE_MEMORY", "100KiB")
    with pytest.raises(ValueError) as refused:
        kvgguf.build_gguf_model(model)
    message = str(refused.value)
    parameters = CONFIG.vocab_size * CONFIG.width + CONFIG.layers * (
        CONFIG.width * (CONFIG.heads + 2 * CONFIG.kv_heads) * CONFIG.head_dim + CONFIG.heads * CONFIG.head_dim
        * CONFIG.width + 3 * CONFIG.width * CONFIG.intermediate_size + 2 * CONFIG.width) + CONFIG.width
    assert message.startswith(f"{model.path}: ") and f"{parameters:,} parameters" in message
    assert "102,400 bytes" in message and "llama.block_count 2" in message


@pytest.mark.parametrize("argv, words", [
    (["--lengths", "200"], "length 200 exceeds max_length 128 of GGUF file {path}"),
    (["--prompt", "100", "--generate", "50"], "holds 149 positions, beyond max_length 128 of GGUF file {path}"),
    (["--contexts", "120"], "positions, beyond max_length 128 of GGUF file {path}")])
def test_a_run_too_long_for_the_file_names_the_file_not_a_preset(sound, tmp_path, capsys, argv, words):
    status = main(["run", "--gguf", str(sound), *argv, "--output", str(tmp_path / "r.json"), "--no-progress"])
    err = capsys.readouterr().err
    assert status == 2 and len(err.strip().splitlines()) == 1 and words.format(path=sound.resolve()) in err, err
    assert "preset" not in err


def test_a_run_beyond_the_memory_available_names_the_file_not_a_preset(sound, tmp_path, capsys, monkeypatch):
    """A context length inside the bound (2**24 positions) whose token ids and rotary tables cannot fit."""
    path = rewritten(sound, tmp_path / "long.gguf", {"llama.context_length": (1 << 24, T.UINT32)})
    monkeypatch.setenv("KVBENCH_AVAILABLE_MEMORY", "1GiB")
    status = main(["run", "--gguf", str(path), "--lengths", "4", "--output", str(tmp_path / "r.json"), "--no-progress"])
    err = capsys.readouterr().err
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"kvbench: error: GGUF file {path.resolve()} (")
    assert "but 1.0 GiB of memory is available" in err
    assert "preset" not in err
