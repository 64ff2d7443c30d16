import json

import pytest

from kvbench.budget import kv_budget, parse_size
from kvbench.cli import main

GIB = 2**30


def test_llama_like_bfloat16_at_4096_tokens():
    # 2 (K and V) x 32 layers x 8 KV heads x 128 head width x 2 bytes = 131,072 bytes per token.
    budget = kv_budget(32, 8, 128, "bfloat16", tokens=4096, memory_bytes=80 * GIB)
    assert budget.bytes_per_token == 131_072
    assert budget.request_bytes == 4096 * 131_072 == 512 * 2**20
    assert budget.paged_request_bytes == budget.request_bytes  # 4096 is a whole number of blocks
    assert budget.paged_waste_bytes == 0
    assert budget.exact_requests == budget.contiguous_requests == budget.paged_requests == 160


def test_paged_last_block_waste_and_contiguous_preallocation():
    budget = kv_budget(32, 8, 128, "bfloat16", tokens=1000, memory_bytes=24 * GIB, block_size=16, max_length=4096)
    assert budget.paged_request_bytes == 63 * 16 * 131_072  # ceil(1000 / 16) = 63 blocks
    assert budget.paged_waste_bytes == 8 * 131_072
    assert budget.contiguous_request_bytes == 4096 * 131_072
    assert budget.exact_requests == 24 * GIB // (1000 * 131_072) == 196
    assert budget.paged_requests == 24 * GIB // (1008 * 131_072) == 195
    assert budget.contiguous_requests == 48


def test_quantized_representations_count_codes_scales_and_the_full_precision_residual():
    """1000 tokens, G=32, R=128: 864 quantized (27 groups), 136 kept in bfloat16; 32 layers, 8 KV heads, D=128."""
    int8 = kv_budget(32, 8, 128, "bfloat16", tokens=1000, memory_bytes=24 * GIB, quantize="int8")
    codes = 2 * 8 * 864 * 128  # keys and values, one byte each
    scales = 8 * 27 * 128 * 2 * 2 + 8 * 864 * (128 // 32) * 2 * 2  # per channel per group; per token per 32 channels
    recent = 2 * 8 * 136 * 128 * 2
    assert int8.request_bytes == 32 * (codes + scales + recent)
    assert int8.full_precision_bytes == 1000 * 131_072
    int4 = kv_budget(32, 8, 128, "bfloat16", tokens=1000, memory_bytes=24 * GIB, quantize="int4")
    assert int4.request_bytes == 32 * (codes // 2 + scales + recent)
    assert int4.request_bytes < int8.request_bytes < int8.full_precision_bytes
    assert int8.paged_request_bytes is None and int8.exact_requests == 24 * GIB // int8.request_bytes
    assert "newest 128 to 159 positions in bfloat16" in int8.assumptions


def test_float32_seed_lab_matches_the_source_document():
    budget = kv_budget(1, 4, 8, "float32", tokens=128, memory_bytes=2**20)
    assert budget.bytes_per_token == 256
    assert budget.request_bytes == 32_768


def test_reserved_memory_is_subtracted():
    budget = kv_budget(32, 8, 128, "bfloat16", tokens=4096, memory_bytes=80 * GIB, reserved_bytes=16 * GIB)
    assert budget.exact_requests == 128


@pytest.mark.parametrize("text, expected", [("24GiB", 24 * GIB), ("80GB", 80 * 10**9), ("1.5e9", 1_500_000_000), ("512 MiB", 512 * 2**20)])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GB", "12XB", "-1GB", "0"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError, match="size"):
        parse_size(text)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"layers": 0}, "layers must be a positive integer, got 0"),
        ({"dtype": "float8"}, r"dtype must be one of .*got 'float8'"),
        ({"quantize": "int3"}, r"quantize must be one of \['int8', 'int4'\] or None, got 'int3'"),
        ({"quantize": "int4", "head_dim": 7}, "even head width, got 7"),
        ({"max_length": 10}, r"max_length must be >= tokens per request \(4096\), got 10"),
        ({"reserved_bytes": 100 * GIB}, "reserved bytes must be in"),
    ],
)
def test_bad_input(kwargs, message):
    args = dict(layers=32, kv_heads=8, head_dim=128, dtype="bfloat16", tokens=4096, memory_bytes=80 * GIB)
    with pytest.raises(ValueError, match=message):
        kv_budget(**{**args, **kwargs})


BASE = ["budget", "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--tokens", "4096", "--memory", "80GiB"]


def test_cli_json(capsys):
    assert main([*BASE, "--json"]) == 0
    numbers = json.loads(capsys.readouterr().out)
    assert numbers["bytes_per_token"] == 131_072 and numbers["paged_requests"] == 160


def test_cli_table(capsys):
    assert main(BASE) == 0
    out = capsys.readouterr().out
    assert "bytes per token: 131,072" in out and "512.0 MiB" in out and "160" in out


@pytest.mark.parametrize(
    "change",
    [["--layers", "0"], ["--memory", "lots"], ["--dtype", "float8"], ["--max-length", "5"], ["--reserved", "90GiB"],
     ["--quantize", "int2"]],
)
def test_cli_bad_input_exits_2_with_one_line(capsys, change):
    argv = list(BASE)
    if change[0] in argv:
        argv[argv.index(change[0]) + 1] = change[1]
    else:
        argv += change
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_cli_quantized_table(capsys):
    assert main([*BASE, "--quantize", "int4"]) == 0
    out = capsys.readouterr().out
    assert "int4: int4 codes" in out and "of the bfloat16 cache" in out and "paged" not in out


@pytest.mark.parametrize("options, message", [
    (dict(quantize="int4", head_dim=7), "int4 packs two values per byte: expected an even head width, got 7"),
    (dict(quantize="int8", group_size=0), "group_size must be an integer >= 1, got 0"),
    (dict(quantize="int8", residual=-1), "residual must be an integer >= 0, got -1"),
])
def test_a_representation_the_cache_would_refuse_is_refused_the_same_way(options, message):
    """kvbench budget and the quantized kinds share one check: the same words from both."""
    from kvbench.cache import make_cache
    from kvbench.model import DecoderConfig

    arguments = dict(layers=2, kv_heads=2, head_dim=8, dtype="float32", tokens=64, memory_bytes=GIB) | options
    with pytest.raises(ValueError, match=message):
        kv_budget(**arguments)
    head_dim = arguments["head_dim"]
    config = DecoderConfig(width=2 * head_dim, heads=2)
    cache_options = {name: arguments[name] for name in ("group_size", "residual") if name in options}
    with pytest.raises(ValueError, match=message):
        make_cache(f"quantized-{arguments['quantize']}", config, **cache_options)


# --- model presets: shapes, windows and weights from the published configs -----------------

def preset_json(capsys, *extra):
    assert main(["budget", *extra, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_llama_3_1_8b_in_bfloat16_retains_128_kib_per_token_and_its_weights_come_off_first(capsys):
    numbers = preset_json(capsys, "--preset", "llama-3.1-8b", "--dtype", "bfloat16", "--tokens", "8192",
                          "--memory", "80GiB")
    assert numbers["bytes_per_token"] == 128 * 1024 == 2 * 32 * 8 * 128 * 2
    assert numbers["request_bytes"] == 8192 * 128 * 1024 == GIB
    assert numbers["parameters"] == 8_030_261_248 and numbers["weights_bytes"] == 2 * 8_030_261_248
    assert numbers["kv_memory_bytes"] == 80 * GIB - numbers["weights_bytes"]
    assert numbers["exact_requests"] == (80 * GIB - 2 * 8_030_261_248) // GIB == 65


def test_a_windowed_layer_stops_growing_at_w():
    """Mistral-7B: every layer keeps 4096 positions at most; Gemma-2-2B: half its layers do."""
    from kvbench.budget import model_budget
    from kvbench.config import PlainConfig

    mistral = model_budget(PlainConfig.from_preset("mistral-7b", dtype="bfloat16"), 8192, 80 * GIB, preset="mistral-7b")
    assert mistral.request_bytes == 4096 * 128 * 1024 and mistral.full_precision_bytes == 8192 * 128 * 1024
    assert mistral.paged_request_bytes == 8192 * 128 * 1024  # the paged kind keeps every position
    short = model_budget(PlainConfig.from_preset("mistral-7b", dtype="bfloat16"), 4096, 80 * GIB)
    assert short.request_bytes == short.full_precision_bytes  # below W nothing is evicted
    gemma = model_budget(PlainConfig.from_preset("gemma-2-2b", dtype="bfloat16"), 8192, 80 * GIB, preset="gemma-2-2b")
    per_layer_position = 2 * 4 * 256 * 2
    assert gemma.request_bytes == (13 * 8192 + 13 * 4096) * per_layer_position
    assert gemma.sliding_layers == 13 and gemma.window == 4096


def test_quantized_budget_of_a_preset_counts_every_position_and_gqa():
    from kvbench.budget import model_budget
    from kvbench.config import PlainConfig
    from kvbench.kinds import quantized_cache_bytes

    config = PlainConfig.from_preset("qwen2.5-7b", dtype="bfloat16")
    budget = model_budget(config, 8192, 80 * GIB, quantize="int4", preset="qwen2.5-7b")
    assert budget.request_bytes == quantized_cache_bytes(config, 1, 8192, bits=4)
    assert budget.kv_heads == 4 and budget.head_dim == 128 and budget.request_bytes < budget.full_precision_bytes / 3


def test_budget_table_names_the_preset_and_its_weights(capsys):
    assert main(["budget", "--preset", "gemma-2-2b", "--tokens", "8192", "--memory", "24GiB"]) == 0
    out = capsys.readouterr().out
    assert "gemma-2-2b: 2.61B parameters" in out and "13 of 26 layers slide over 4096 positions" in out
    assert "of the bfloat16 cache keeping every position" in out


@pytest.mark.parametrize("preset, parameters", [("seed", "seed: 86.6K parameters, weights 169.2 KiB"),
                                                ("llama-mini", "llama-mini: 2.75M parameters"),
                                                ("qwen2.5-0.5b", "qwen2.5-0.5b: 494M parameters")])
def test_a_small_model_is_counted_in_thousands_or_millions_not_as_0_00b(capsys, preset, parameters):
    assert main(["budget", "--preset", preset, "--tokens", "64", "--memory", "24GiB"]) == 0
    assert parameters in capsys.readouterr().out


@pytest.mark.parametrize("count, text", [(932, "932"), (86_624, "86.6K"), (999_999, "1M"), (2_600_000, "2.6M"),
                                         (134_515_008, "135M"), (8_030_261_248, "8.03B"), (1.5e12, "1,500B")])
def test_parameters_text_keeps_three_significant_figures(count, text):
    from kvbench.kinds import parameters_text

    assert parameters_text(count) == text


@pytest.mark.parametrize("argv, message", [
    (["--preset", "nonesuch"], "--preset"),
    (["--tokens", "4096"], "budget needs --preset NAME or all of --layers, --kv-heads and --head-dim"),
    (["--preset", "gemma-2-2b", "--tokens", "9000"], "tokens per request must be <= the model's max_length 8192"),
    (["--preset", "llama-3.1-8b", "--memory", "8GiB"], "--memory: memory limit 8,589,934,592 bytes leaves nothing"),
    (["--preset", "llama-3.1-8b", "--kv-heads", "5"], "kv_heads must divide heads"),
])
def test_bad_preset_budgets_are_one_line_exit_2(capsys, argv, message):
    base = {"--tokens": "4096", "--memory": "80GiB"}
    for option, value in zip(argv[::2], argv[1::2]):
        base[option] = value
    assert main(["budget", *[part for pair in base.items() for part in pair]]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err


# --- errors name what the user gave; the cost does not grow with the layer count ------------------------------


def test_weights_larger_than_the_memory_blame_memory_not_the_reserve_nobody_gave(capsys):
    assert main(["budget", "--preset", "llama-3.1-8b", "--tokens", "8192", "--memory", "1GiB"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvbench: error: --memory: memory limit 1,073,741,824 bytes leaves nothing for KV caches: "
                          "the weights of llama-3.1-8b alone take 16,060,522,496 bytes")
    assert "reserved" not in err and err.count("\n") == 1


@pytest.mark.parametrize("argv, option", [
    (["--preset", "llama-3.1-8b", "--tokens", "8192", "--memory", "20GiB", "--reserved", "10GiB"], "--reserved"),
    ([*BASE[1:], "--reserved", "90GiB"], "--reserved"),
    ([*BASE[1:], "--max-length", "5"], "--max-length"),
    (["--preset", "llama-tiny", "--tokens", "100000", "--memory", "1GiB"], "--tokens"),
])
def test_each_refusal_names_the_option_at_fault(capsys, argv, option):
    assert main(["budget", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvbench: error: {option}: ") and err.count("\n") == 1


def test_a_hundred_million_layers_cost_what_one_layer_costs(monkeypatch):
    """Counted, not listed: no formula may walk the layers (a tuple of 10**8 windows is 800 MB and a minute)."""
    import tracemalloc

    from kvbench.budget import model_budget
    from kvbench.config import PlainConfig

    def listed(self):
        raise AssertionError("the budget listed every layer's window")

    monkeypatch.setattr(PlainConfig, "layer_windows", property(listed))
    config = PlainConfig.from_preset("gemma-2-2b", dtype="bfloat16", layers=10**8)  # alternating windows of 4096
    tracemalloc.start()
    budget = model_budget(config, 8192, 2**64, preset="gemma-2-2b")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20
    per_position = 2 * config.kv_heads * config.head_dim * 2  # keys and values, bfloat16
    assert budget.sliding_layers == 5 * 10**7
    assert budget.request_bytes == per_position * (5 * 10**7 * 4096 + 5 * 10**7 * 8192)


def test_the_cli_refuses_or_answers_a_huge_layer_count_at_once(capsys):
    assert main(["budget", "--layers", "100000000", "--kv-heads", "8", "--head-dim", "128", "--tokens", "4096",
                 "--memory", "80GiB", "--json"]) == 0
    numbers = json.loads(capsys.readouterr().out)
    assert numbers["request_bytes"] == 10**8 * 2 * 8 * 128 * 2 * 4096 and numbers["exact_requests"] == 0
