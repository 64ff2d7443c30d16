"""Shared fixtures: a tiny model and the synthetic-record builder of tests/records.py."""

import gc
import os
from pathlib import Path

import pytest
from hypothesis import settings
from machine_stubs import canned_environment, cheap_probe_calls
from records import synthetic_record

from kvbench.model import DecoderConfig, build_model, preset_config

TEST_WINDOW = 5  # shorter than the tests' sequences, so the window really slides
# Per family, a tiny model and a windowed one. The llama family's carry every feature the presets do:
# Llama 3's rotary scaling and tied head; the windowed one Gemma-2's alternating windows and a head width
# that is not width / heads, with Qwen2's q/k/v biases.
TINY = {"gpt2": DecoderConfig(max_length=64), "llama": preset_config("llama-tiny", vocab_size=128, max_length=64)}
WINDOWED = {"gpt2": DecoderConfig(max_length=64, window=TEST_WINDOW),
            "llama": preset_config("gemma-tiny", vocab_size=128, max_length=64, window=TEST_WINDOW, qkv_bias=True)}


# The machine probe's calls and the environment capture, as a `kvbench run` in a test makes them: cheap stand-ins
# (autouse, below; tests/machine_stubs.py, which a test's child process installs too). Tests of the probe or the
# capture themselves, or that assert on what they measured, opt out with @pytest.mark.real_machine
# (a module: pytestmark = pytest.mark.real_machine).
@pytest.fixture(autouse=True)
def cheap_machine(request, monkeypatch):
    if request.node.get_closest_marker("real_machine") is not None:
        return
    from kvbench.measure import capture, machine

    monkeypatch.setattr(machine, "probe_calls", cheap_probe_calls)
    monkeypatch.setattr(capture, "collect_environment", canned_environment)


# The packaged model's GGUF file (SmolLM2, ~100 MiB), read once per test process: gguf's reader parses its
# metadata (a 49,152-token vocabulary and its merges) in 2-3 s of CPU, and about twenty tests run `kvbench run
# --model smollm2-135m` or read the file, most of them to check a refusal. read_gguf is a pure function of the
# file: a read is kept under the file's path, size and modification time, and any other file (the tests that
# write or break a GGUF file) is read afresh every time.
_GGUF_READS: dict = {}


@pytest.fixture(autouse=True)
def gguf_read_once(monkeypatch):
    from kvbench.models import gguf as kvgguf

    if "read" not in _GGUF_READS:
        _GGUF_READS["read"] = kvgguf.read_gguf
        try:
            _GGUF_READS["packaged"] = str(kvgguf.packaged_path("smollm2-135m").resolve())
        except ValueError:  # not installed: every read is a fresh one (the tests that need it skip)
            _GGUF_READS["packaged"] = None
    read = _GGUF_READS["read"]

    def read_gguf(path):
        file = Path(path).resolve()
        if str(file) != _GGUF_READS["packaged"] or not file.is_file():
            return read(path)
        stat = file.stat()
        key = (str(file), stat.st_size, stat.st_mtime_ns)
        if key not in _GGUF_READS:
            _GGUF_READS[key] = read(path)
        return _GGUF_READS[key]

    monkeypatch.setattr(kvgguf, "read_gguf", read_gguf)


@pytest.fixture(scope="session", params=list(TINY))
def family(request):
    """Every test that takes a model through tiny_model, windowed_model or model_for runs on both families."""
    return request.param


@pytest.fixture(scope="session")
def tiny_model(family):
    return build_model(TINY[family], seed=0)


@pytest.fixture(scope="session")
def windowed_model(family):
    return build_model(WINDOWED[family], seed=0)


@pytest.fixture(scope="session")
def model_for(tiny_model, windowed_model):
    """model_for(mode) -> the tiny model, or for the window kind the same model with a sliding window."""
    return lambda mode: windowed_model if mode == "window" else tiny_model


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module's tests, as kvbench runs: on a shared 2-core machine more threads make small
    calls 10x slower. Modules opt in with `pytestmark = pytest.mark.usefixtures("one_torch_thread")`."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def compiled_config():
    """The compile-marked tests' model (tests/test_compiled.py, tests/test_asv_steps.py): one config, so inductor's
    cache holds one program for all of them. max_length 130: the last block is cut by max_length (128 + 2), the
    case the compiled step's spare position exists for."""
    return preset_config("llama-tiny", vocab_size=128, max_length=130)


@pytest.fixture(scope="module")
def inductor_cache(request, tmp_path_factory):
    """One inductor cache for every run of the compile-marked tests, so that only the first run pays a cold compile
    (in this session's temporary folder when pytest runs without its cache, `-p no:cacheprovider`)."""
    patch = pytest.MonkeyPatch()
    cache = getattr(request.config, "cache", None)
    folder = cache.mkdir("inductor") if cache is not None else tmp_path_factory.mktemp("inductor")
    patch.setenv("TORCHINDUCTOR_CACHE_DIR", str(folder))
    yield
    patch.undo()


@pytest.fixture
def clean_kinds():
    """The registry of modes as it was before the test: a plugin a test loads registers kinds for the process."""
    from kvbench import modes

    before = dict(modes.SPECS)
    yield
    for name in [name for name in modes.SPECS if name not in before]:
        modes.unregister(name)
    for spec in before.values():  # in place: the registry keeps its order
        modes.register(spec, replace_existing=True)


@pytest.fixture
def make_record():
    """make_record({(mode, length): [seconds, ...]}, failed={(mode, length)}, status=...) -> record dict."""
    return synthetic_record


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # an xdist worker starts with COLUMNS=80 (set by its start, not by the user), which kvbench's console honours
        # (kvbench.report.format); the tests expect what a piped stdout gets in one process: 200 columns
        os.environ.pop("COLUMNS", None)
        # one torch thread per worker: two workers of torch's default (a thread per core) oversubscribe 2 cores,
        # which made the suite slower in CPU and wall time than one process (tests that set threads restore them)
        import torch

        torch.set_num_threads(1)


def pytest_collection_finish(session):
    """Everything alive once the tests are collected (torch, transformers, every test module: ~10^6 objects) is
    frozen out of the collector (gc.freeze): kvbench collects before every timed call (measure.timing), and in a
    test process each full collection walked that heap again (tens of ms, hundreds of times a run). kvbench's own
    freezes (measure.timing.heap_frozen, around a run and its sampling) keep this one: until they did, the first run
    in a worker thawed it, and full collections took 144 s of the suite's CPU (docs/testing.md). What is alive when
    a run starts then stays frozen with it; what the tests allocate between runs is collected as before."""
    gc.collect()
    gc.freeze()


@pytest.fixture
def thawed_heap():
    """No object frozen, as in a program that never calls gc.freeze; then the suite's freeze again (above)."""
    gc.unfreeze()
    yield
    gc.collect()
    gc.freeze()


def pytest_addoption(parser):
    parser.addoption("--run-virtualenv", action="store_true", default=False,
                     help="also run tests marked virtualenv (asv builds a virtualenv per commit: minutes)")


# Under pytest-xdist (make test: -n 2 --dist loadgroup), what measures time or sends signals runs on one worker, one
# test at a time ("timing"): its bounds were set for a process that has a core to itself, not one that shares it with
# another test of the suite. The compile-marked tests share one worker too ("compile"), so inductor's cold compile of
# their one program is paid once, not by both workers at the same moment.
TIMING_MODULES = {"test_timing.py", "test_telemetry.py", "test_requests.py", "test_estimation.py", "test_sampling.py"}
SIGNAL_MODULES = {"test_cli_hostile.py", "test_serving_hostile.py", "test_history_hostile.py"}
# Modules whose module-scoped fixtures cost seconds of CPU: their tests share one worker (a group per module), so the
# fixture is built once, not once per worker -- test_asv's two asv runs (~27 s of CPU), test_real_model's transformers
# load of the GGUF file (~15 s), test_cli_hostile's real run of the record it spoils (~2.5 s).
# test_kvpress_peer's fixture runs kvpress in its own environment beside kvbench's runs of every kind (about a minute,
# where .venv-kvpress exists: make kvpress).
MODULE_GROUPS = {"test_asv.py", "test_real_model.py", "test_cli_hostile.py", "test_kvpress_peer.py"}


# Module-scoped fixtures that cost a second or more of CPU (pytest --setup-only --durations): the tests that use one run
# on one worker (a group per module), so it is built once. --dist loadgroup schedules every test without a group on its
# own, and a module's tests landed on both workers, each building the fixture: test_export's contexts run (3.3 s),
# test_hf's transformers pair (1.2 s a preset), test_quality's measured texts (1.0 s), test_goodput's sweep (0.9 s).
# Only the tests that use it: the module's other tests still spread.
SHARED_FIXTURES = {"test_export.py": {"contexts_record"}, "test_hf.py": {"pair"}, "test_quality.py": {"measured"},
                   "test_goodput.py": {"swept"}, "test_report_layouts.py": {"record_file"},
                   "test_cli.py": {"forced_run"}}


def uses_shared_fixture(item) -> bool:
    return bool(SHARED_FIXTURES.get(item.path.name, set()) & set(item.fixturenames))


def xdist_group(item) -> str | None:
    module = item.path.name
    if item.get_closest_marker("compile") is not None:
        return "compile"
    if (module in TIMING_MODULES or item.get_closest_marker("timing") is not None
            or (module in SIGNAL_MODULES and ("signal" in item.name or "subprocess" in item.keywords))):
        return "timing"
    if module in MODULE_GROUPS or uses_shared_fixture(item):
        return module.removesuffix(".py")
    return None


def no_cuda() -> str | None:
    """Why the tests marked gpu cannot run here (None: torch sees a CUDA device)."""
    import torch

    return None if torch.cuda.is_available() else f"torch {torch.__version__} sees no CUDA device"


# pytest-xdist (--dist loadgroup) sends the tests of one group to one worker by the "@group" suffix its own
# pytest_collection_modifyitems adds to each marked item's node id (item._nodeid). Under pytest 9.2 a node id is
# str(item._id) and that assignment changes nothing: no group reached the scheduler, and the timing, compile and
# per-module groups below ran on both workers at once. So the marks are added first (tryfirst) and, where the node
# id is item._id, the suffix is set here as xdist would set it (pytest-dev/pytest-xdist#1386; a suffix set twice by a
# fixed xdist still names the same group: the scheduler reads what follows the last "@").
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    suffix = bool(getattr(config.option, "loadgroup", False))
    for item in items:
        if item.path.name == "test_cli_hostile.py" and "in_process" not in item.fixturenames:
            item.add_marker(pytest.mark.subprocess)  # every test of that module but the in-process refusals
        if item.get_closest_marker("compile") is not None or item.get_closest_marker("subprocess") is not None:
            item.add_marker(pytest.mark.slow)  # `-m "not slow"`: a quick loop; make test and CI run them all
        group = xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
            if suffix and hasattr(item, "_id") and "@" not in item.nodeid:
                from _pytest.nodeid import NodeId

                item._id = NodeId.parse(f"{item.nodeid}@{group}")
    skip_gpu = pytest.mark.skip(reason=f"needs a CUDA device: {no_cuda()} (scripts/gpu_check.sh runs these)")
    for item in items:
        if item.get_closest_marker("gpu") is not None and no_cuda():
            item.add_marker(skip_gpu)
    if config.getoption("--run-virtualenv"):
        return
    skip = pytest.mark.skip(reason="builds asv virtualenvs per commit; run with --run-virtualenv (make test-virtualenv)")
    for item in items:
        if item.get_closest_marker("virtualenv") is not None:
            item.add_marker(skip)


# CI runs every property test on the same examples (derandomized), so a near-tie a fresh draw may hit -- int4's
# top-1 agreement on random weights, docs/drift.md -- cannot turn a green commit red; a local run explores anew.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
