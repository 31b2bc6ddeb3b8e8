# ts_microbatch: everything a fresh machine needs goes through these targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
TORCH_PINS := torch==2.14.1 torchvision==0.29.1

MODEL_NAME ?= resnet-18_mb
MAR := model_store/$(MODEL_NAME).mar
BUILD := build/$(MODEL_NAME)
WEIGHTS ?=
MB_CONFIG ?= configs/micro_batching.json
MODEL_CONFIG ?= examples/image_classifier/model-config.yaml
BATCH_SIZE ?= 32
# The frontend's window, ms, per example: what each example's model-config.yaml ships and
# why is written there (benchmarks/results/latency_window/).
MAX_BATCH_DELAY ?= 2
BERT_MAX_BATCH_DELAY ?= 5
TABULAR_MAX_BATCH_DELAY ?= 1
INFERENCE_PORT ?= 8080
MANAGEMENT_PORT ?= 8081
METRICS_PORT ?= 8082

.PHONY: help venv floor-venv kserve-venv agent test test-floor test-unit fuzz mar serve bert-mar serve-bert tabular-mar serve-tabular stop metrics ab bench bench-latency bench-compare bench-photos bench-detect bench-segment bench-compiled bench-text soak tune kserve-bundle lint clean FORCE

help:
	@echo "make serve   set up, build the .mar, start TorchServe, register the model, send a request"
	@echo "make serve-bert  the same for the BERT text classifier (examples/bert_classifier)"
	@echo "make stop    stop TorchServe"
	@echo "make metrics while it runs: per-stage times and micro-batch sizes every 10 s"
	@echo "make test    set up and run every test, then the floor's part on Python 3.9 / torch 2.4.0"
	@echo "make test-floor  the suite's part that runs on the official image's stack (Python 3.9, torch 2.4.0)"
	@echo "make agent   build the Java agent that fixes TorchServe 0.12.0's asynchronous frontend (needs a JDK)"
	@echo "make fuzz    the generative tests with a long random profile (not in CI)"
	@echo "make mar     build $(MAR)"
	@echo "make bert-mar    build $(BERT_MAR)"
	@echo "make tabular-mar build $(TABULAR_MAR) (make serve-tabular: build, start, send a request)"
	@echo "make bench   run the default benchmark comparison"
	@echo "make bench-compare BASE=<commit>  the working tree against a commit and upstream, interleaved (~45 min)"
	@echo "make bench-latency [WORKLOAD=compute|resnet18|text|tabular] [TUNED=model-config.yaml]  latency against offered load, open loop, 3 rounds (hours: each point at least 1,500 requests, 375 s at 4 req/s)"
	@echo "make bench-photos    upstream vs ours, same stages and best decoder, photo bodies (~17 min)"
	@echo "make bench-detect    the detector on photos of 7 sizes: grouped, ungrouped, upstream, plain (~25 min)"
	@echo "make bench-segment   the segmenter on photos of 10 sizes: groupings, micro-batch 1, plain (~25 min)"
	@echo "make bench-compiled  eager vs torch.compile under the pipeline (~12 min)"
	@echo "make bench-text  BERT: ours vs upstream vs plain on text of variable length (~30 min)"
	@echo "make soak    100,000 requests at concurrency 200, the worker's memory sampled (~8 min)"
	@echo "make tune [SLO_P99_MS=100] [CONFIRM=2]  the settings that hold the most load with P99 within the objective, for the example (a few minutes)"
	@echo "make kserve-bundle  a KServe storage layout in $(KSERVE_OUT) (deploy/kserve/)"
	@echo "make lint    ruff and mypy"

venv: $(STAMP)

$(STAMP): setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet $(TORCH_PINS)
	$(PIP) install --quiet -e '.[tools,images,test,bench,dev,text]' $(TORCH_PINS)
	touch $(STAMP)

# The official TorchServe 0.12.0 image's stack, the oldest this package claims (docs/stacks.md):
# Python 3.9 (pyenv's on these machines) with torch 2.4.0 and torchvision 0.19.0. PyPI's
# torch 2.4.0 is a CUDA build, ~5 GB installed: one copy per machine under FLOOR_TORCH,
# shared by every checkout and CI clone, which each keep a small venv that lists it in a
# .pth file (the package and the rest installed as usual, from pip's cache after the first).
FLOOR_PYTHON ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.9*/bin/python3.9) $(shell command -v python3.9 2>/dev/null))
FLOOR_TORCH_PINS := torch==2.4.0 torchvision==0.19.0
# What else the image holds at v0.12.0 (requirements/common.txt and torch_common.txt), so the
# floor runs on the image's releases and the package installs there without an upgrade;
# numpy and Pillow go beside torch, which would otherwise bring newer ones.
FLOOR_SHARED_PINS := $(FLOOR_TORCH_PINS) numpy==1.24.3 pillow==10.3.0
FLOOR_IMAGE_PINS := numpy==1.24.3 pillow==10.3.0 captum==0.6.0 pyyaml==6.0.1 psutil==5.9.8
# Named by what it holds: other pins, another folder.
FLOOR_TORCH ?= $(HOME)/.cache/ts_microbatch/$(subst ==,,$(subst $(subst ,, ),-,$(FLOOR_SHARED_PINS)))-py3.9
FLOOR_VENV := .venv-floor
FLOOR_STAMP := $(FLOOR_VENV)/.installed
# The part of the suite the floor runs (docs/stacks.md says what it covers): the core; the
# adapter through TorchServe's machinery, compiled models on torch 2.4's inductor among it;
# the image recipe (a TorchServe serving the image example with good, odd and hostile
# bodies); the KServe bundle as the runtime starts it; the Java agent on that stack's
# frontend; the package's own checks of the floor (vermin, every module imported). Left to
# today's stack, for CI's time: the tools' tuner runs in-process, the compiled buckets' 9
# shapes x 3 sizes, the other servers' integration tests.
FLOOR_TESTS ?= tests/core tests/torchserve tests/tools/test_floor.py \
  tests/integration/test_image_recipe.py tests/integration/test_kserve.py \
  tests/integration/test_async_agent.py
FLOOR_LEFT ?= tests/torchserve/test_tune.py tests/torchserve/test_tune_writes.py \
  tests/torchserve/test_slo_tune.py \
  tests/torchserve/test_compiled_buckets.py

$(FLOOR_TORCH)/.installed:
	@test -n "$(FLOOR_PYTHON)" || { echo "no Python 3.9: pyenv install 3.9 (or FLOOR_PYTHON=<a python3.9>)"; exit 2; }
	mkdir -p $(dir $(FLOOR_TORCH))
	@# flock: two checkouts setting up at once install it once
	flock $(FLOOR_TORCH).lock sh -c 'test -f $@ || { rm -rf $(FLOOR_TORCH) && \
	  $(FLOOR_PYTHON) -m venv $(FLOOR_TORCH) && \
	  $(FLOOR_TORCH)/bin/pip install --quiet $(FLOOR_SHARED_PINS) && touch $@; }'

floor-venv: $(FLOOR_STAMP)

$(FLOOR_STAMP): setup.py $(FLOOR_TORCH)/.installed
	rm -rf $(FLOOR_VENV)
	$(FLOOR_PYTHON) -m venv $(FLOOR_VENV)
	$(FLOOR_TORCH)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
	  > "$$($(FLOOR_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/floor_torch.pth"
	$(FLOOR_VENV)/bin/pip install --quiet --upgrade pip
	$(FLOOR_VENV)/bin/pip install --quiet -e '.[tools,images,test]' $(FLOOR_TORCH_PINS) $(FLOOR_IMAGE_PINS)
	touch $@

# The KServe SDK in a venv of its own: it checks deploy/kserve/ and is a real v1/v2 client
# in the tests. Beside TorchServe it would downgrade psutil under the worker.
KSERVE_VENV := .venv-kserve
KSERVE_STAMP := $(KSERVE_VENV)/.installed
kserve-venv: $(KSERVE_STAMP)

$(KSERVE_STAMP):
	test -x $(KSERVE_VENV)/bin/python || $(PYTHON) -m venv $(KSERVE_VENV)
	$(KSERVE_VENV)/bin/pip install --quiet kserve==0.21.0
	touch $(KSERVE_STAMP)

# The Java agent that fixes TorchServe 0.12.0's asynchronous frontend
# (ts_microbatch/agent/README.md): compiled against the installed model-server.jar, shipped
# in the package. Without a JDK it says so and the rest works; its tests skip, naming why.
AGENT_DIR := ts_microbatch/agent
AGENT_JAR := $(AGENT_DIR)/ts-microbatch-agent.jar
AGENT_SRC := $(shell find $(AGENT_DIR)/java -name '*.java' 2>/dev/null | LC_ALL=C sort)
AGENT_BUILD := build/agent
# A fixed date in the jar's entries: the same sources give the same bytes.
AGENT_DATE := 2024-09-30T00:00:00Z
agent: venv
	@if command -v javac >/dev/null && command -v jar >/dev/null; then \
	  $(MAKE) --no-print-directory $(AGENT_JAR); \
	else \
	  echo "make agent: no JDK here (javac and jar, e.g. apt-get install openjdk-17-jdk-headless):" \
	    "$(AGENT_JAR) not built; everything else works, its tests skip"; \
	fi

$(AGENT_JAR): $(AGENT_SRC) $(STAMP)
	rm -rf $(AGENT_BUILD) && mkdir -p $(AGENT_BUILD)/classes $(AGENT_BUILD)/jar/tsmicrobatch/agent/replacements
	javac --release 11 -nowarn -cp "$$($(PY) -c 'import os, ts; print(os.path.join(os.path.dirname(ts.__file__), "frontend", "model-server.jar"))')" \
	  -d $(AGENT_BUILD)/classes $(AGENT_SRC)
	@# The two replacements go where the JVM never looks a class up by name (the agent hands
	@# them over); their nested classes, whose names 0.12.0 does not use, load as usual.
	for c in AsyncBatchAggregator AsyncWorkerThread; do \
	  mv $(AGENT_BUILD)/classes/org/pytorch/serve/wlm/$$c.class $(AGENT_BUILD)/jar/tsmicrobatch/agent/replacements/$$c; \
	done
	cp -R $(AGENT_BUILD)/classes/. $(AGENT_BUILD)/jar/
	printf 'Premain-Class: tsmicrobatch.agent.Agent\n' > $(AGENT_BUILD)/MANIFEST.MF
	jar --create --date=$(AGENT_DATE) --file $@ --manifest $(AGENT_BUILD)/MANIFEST.MF -C $(AGENT_BUILD)/jar .

# Both ends of the range users run, at once: today's stack, the whole suite, in
# TEST_PROCESSES processes (xdist, a file's tests in one); the official image's (Python 3.9,
# torch 2.4.0), the part of it FLOOR_TESTS declares, beside it, its output after. The suites
# mostly wait on servers they start (today's, serial: 17.7 min at 0.4 of a core as
# /usr/bin/time counts; in 3 processes 10.6 min at 0.8). A slower machine took today's to
# 16.7 min in 3 processes, the floor's to 13.5 beside it, CI to 20: 4 processes now.
TEST_PROCESSES ?= 4
FLOOR_LOG := build/test-floor.log
test:
	@# What the suites need, set up side by side (each mostly waits on pip or the disk).
	$(MAKE) --no-print-directory -j4 venv kserve-venv agent floor-venv ab
	@mkdir -p $(dir $(FLOOR_LOG))
	@$(MAKE) --no-print-directory test-floor > $(FLOOR_LOG) 2>&1 & floor=$$!; \
	  $(VENV)/bin/pytest -n $(TEST_PROCESSES) --dist loadfile; today=$$?; \
	  wait $$floor; floor_rc=$$?; \
	  echo "== the official image's stack (Python 3.9, torch 2.4.0): make test-floor, run beside it"; \
	  cat $(FLOOR_LOG); \
	  echo "today's stack: pytest exit $$today; the floor's: make test-floor exit $$floor_rc"; \
	  test $$today -eq 0 && test $$floor_rc -eq 0

test-floor: floor-venv kserve-venv agent ab
	$(FLOOR_VENV)/bin/pytest $(FLOOR_TESTS) $(addprefix --ignore=,$(FLOOR_LEFT))

# The fast part: the core and the adapter in-process, no TorchServe server.
test-unit: venv
	$(VENV)/bin/pytest tests/core tests/torchserve tests/tools

# The generative (hypothesis) tests with a long random profile; CI runs a bounded one.
FUZZ_EXAMPLES ?= 3000
fuzz: venv
	HYPOTHESIS_PROFILE=fuzz FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(VENV)/bin/pytest -m generative -p no:cacheprovider --timeout 3600

# The .mar is rebuilt when the chosen MB_CONFIG or WEIGHTS change, not only when a file
# gets newer: switching back to an older config must not serve the last one built.
BUILD_ARGS := $(BUILD)/.build-args
$(BUILD_ARGS): FORCE
	@mkdir -p $(BUILD)
	@echo '$(abspath $(MB_CONFIG)) $(abspath $(MODEL_CONFIG)) $(WEIGHTS)' | cmp -s - $@ || echo '$(abspath $(MB_CONFIG)) $(abspath $(MODEL_CONFIG)) $(WEIGHTS)' > $@

FORCE:

$(MAR): $(STAMP) handlers/micro_batching_handler.py $(MB_CONFIG) $(MODEL_CONFIG) $(BUILD_ARGS) \
        examples/image_classifier/*.py
	$(PY) examples/image_classifier/build_mar.py --export-path model_store \
	  --model-name $(MODEL_NAME) --micro-batching-json $(MB_CONFIG) \
	  --model-config $(MODEL_CONFIG) $(if $(WEIGHTS),--weights $(WEIGHTS))

mar: $(MAR)

serve: $(MAR)
	$(PY) -m ts_microbatch.tools.serve start --model-store model_store --mar $(MODEL_NAME).mar \
	  --config configs/config.properties --batch-size $(BATCH_SIZE) \
	  --max-batch-delay $(MAX_BATCH_DELAY) --input $(BUILD)/kitten.jpg

# The BERT example (examples/bert_classifier): untrained, or WEIGHTS=<a save_pretrained dir>.
BERT_NAME ?= bert_mb
BERT_MAR := model_store/$(BERT_NAME).mar
BERT_BUILD := build/$(BERT_NAME)
BERT_CONFIG ?= examples/bert_classifier/model-config.yaml
BERT_ARGS := $(BERT_BUILD)/.build-args
$(BERT_ARGS): FORCE
	@mkdir -p $(BERT_BUILD)
	@echo '$(abspath $(BERT_CONFIG)) $(WEIGHTS)' | cmp -s - $@ || echo '$(abspath $(BERT_CONFIG)) $(WEIGHTS)' > $@

$(BERT_MAR): $(STAMP) $(BERT_CONFIG) $(BERT_ARGS) examples/bert_classifier/*.py
	HF_HUB_OFFLINE=1 $(PY) examples/bert_classifier/build_mar.py --export-path model_store \
	  --model-name $(BERT_NAME) --model-config $(BERT_CONFIG) $(if $(WEIGHTS),--weights $(WEIGHTS))

bert-mar: $(BERT_MAR)

serve-bert: $(BERT_MAR)
	$(PY) -m ts_microbatch.tools.serve start --model-store model_store --mar $(BERT_NAME).mar \
	  --config configs/config.properties --batch-size $(BATCH_SIZE) \
	  --max-batch-delay $(BERT_MAX_BATCH_DELAY) --input $(BERT_BUILD)/sample.txt

# The fraud scorer example (examples/tabular_scorer): an MLP over 128 JSON features,
# untrained, or WEIGHTS=<a state dict of its FraudMLP>.
TABULAR_NAME ?= tabular_mb
TABULAR_MAR := model_store/$(TABULAR_NAME).mar
TABULAR_BUILD := build/$(TABULAR_NAME)
TABULAR_ARGS := $(TABULAR_BUILD)/.build-args
$(TABULAR_ARGS): FORCE
	@mkdir -p $(TABULAR_BUILD)
	@echo '$(WEIGHTS)' | cmp -s - $@ || echo '$(WEIGHTS)' > $@

$(TABULAR_MAR): $(STAMP) $(TABULAR_ARGS) examples/tabular_scorer/*.py \
        examples/tabular_scorer/micro_batching.json examples/tabular_scorer/model-config.yaml
	$(PY) examples/tabular_scorer/build_mar.py --export-path model_store \
	  --model-name $(TABULAR_NAME) $(if $(WEIGHTS),--weights $(WEIGHTS))

tabular-mar: $(TABULAR_MAR)

serve-tabular: $(TABULAR_MAR)
	$(PY) -m ts_microbatch.tools.serve start --model-store model_store --mar $(TABULAR_NAME).mar \
	  --config configs/config.properties --batch-size $(BATCH_SIZE) \
	  --max-batch-delay $(TABULAR_MAX_BATCH_DELAY) --input $(TABULAR_BUILD)/sample.json

stop:
	$(PY) -m ts_microbatch.tools.serve stop

# While `make serve` runs: per-stage times, micro-batch sizes and errors every 10 s.
metrics:
	$(PY) -m ts_microbatch.tools.scrape http://127.0.0.1:$(METRICS_PORT)/metrics --model $(MODEL_NAME) \
	  --interval 10

ab:
	@command -v ab >/dev/null || { apt-get update -qq && apt-get install -y -qq apache2-utils; }

# The default comparison (results in benchmarks/runs/<time>/); under 10 minutes here.
bench: $(STAMP) ab
	$(PY) benchmarks/benchmark-ab.py --config benchmarks/config.json $(if $(WEIGHTS),--weights $(WEIGHTS))

# The gate for every change that can move speed: the working tree (or HEAD=<commit>) against
# BASE=<commit> and upstream, in one run, interleaved, on three workloads and two layouts.
BASE ?=
ROUNDS ?= 3
COMPARE_ARGS ?=
# Latency against offered load, open loop (benchmarks/latency_load.py): plain, upstream and
# the example at several windows, and with TUNED=<model-config.yaml> the SLO tuner's choice.
# WORKLOAD=compute or resnet18 (the image example, 720px) or text (the BERT example on the
# long-tailed mix of bench-text, built if missing) or tabular (the fraud scorer example,
# examples/tabular_scorer, on its corpus); each has its own rates and objective.
WORKLOAD ?= compute
LATENCY_OUT ?= benchmarks/results/latency_load/$(WORKLOAD)
bench-latency: $(STAMP)
	$(PY) benchmarks/latency_load.py --workload $(WORKLOAD) --rounds $(ROUNDS) \
	  $(if $(TUNED),--tuned $(TUNED)) --out $(LATENCY_OUT)

bench-compare: $(STAMP) ab
	@test -n "$(BASE)" || { echo "usage: make bench-compare BASE=<commit> [HEAD=<commit>] [ROUNDS=3] [COMPARE_ARGS=...]"; exit 2; }
	$(PY) benchmarks/compare.py --base $(BASE) $(if $(HEAD),--head $(HEAD)) --rounds $(ROUNDS) \
	  --out benchmarks/runs/compare-$$(date +%Y%m%d-%H%M%S) $(COMPARE_ARGS)

# Upstream vs ours on the same stages and with pil-draft, for 720px, 12 MP and the corpus mix.
bench-photos: $(STAMP) ab
	$(PY) benchmarks/benchmark-ab.py --config benchmarks/configs/photos.json --out benchmarks/results/photos

# The detection example on a corpus of photos of 7 sizes: ours as packaged (shape_groups:
# aspect), ours without grouping, upstream's MicroBatching on the same list-returning stages,
# and the handler without micro-batching (benchmark-ab.py --mar's baseline), each round in a
# shuffled order (benchmarks/image_sizes.py, which builds the example's .mar and corpus).
bench-detect: $(STAMP)
	$(PY) benchmarks/image_sizes.py --example object_detector $(if $(WEIGHTS),--weights $(WEIGHTS)) \
	  --variant nogroup='{"shape_groups": null}' \
	  --handler-variant upstream=benchmarks/handlers/upstream_detector_handler.py \
	  --rounds $(ROUNDS) --requests 240 --warmup-requests 40 --out benchmarks/results/detection

# The segmentation example on photos of 10 sizes (7 after its 520 px cap): ours as packaged
# (shape_groups: exact, by the size the model sees), ungrouped, grouped by orientation, and
# at micro-batch 1 (bit-identical answers), against the same handler without micro-batching.
bench-segment: $(STAMP)
	$(PY) benchmarks/image_sizes.py --example image_segmenter $(if $(WEIGHTS),--weights $(WEIGHTS)) \
	  --variant nogroup='{"shape_groups": null}' \
	  --variant orientation='{"shape_groups": "orientation"}' \
	  --variant mb1='{"micro_batch_size": 1}' \
	  --rounds $(ROUNDS) --requests 160 --warmup-requests 32 --out benchmarks/results/segmentation

# Eager vs torch.compile'd ResNet-18, with and without allowed sizes and warm-up.
bench-compiled: $(STAMP) ab
	$(PY) benchmarks/dev/compiled.py --rounds 3 --out benchmarks/results/compiled

# The BERT example on three token-length corpora: ours (length order + token budget), ours in
# arrival order, upstream's MicroBatching on the same stages, the plain handler.
bench-text: $(BERT_MAR)
	$(PY) benchmarks/text_lengths.py run --mar $(BERT_MAR) --rounds $(ROUNDS) $(if $(LOCK),--lock $(LOCK))

# Not part of CI: no failed request, no worker restart, RSS flat after the first chunk.
SOAK_REQUESTS ?= 100000
soak: $(STAMP) ab
	$(PY) benchmarks/soak.py --requests $(SOAK_REQUESTS) --concurrency 200 \
	  --out benchmarks/runs/soak-$$(date +%Y%m%d-%H%M%S)

# KServe's storage layout: config/config.properties and a self-contained .mar in model-store/.
# config.properties names its paths under KSERVE_MOUNT, where the pod mounts the storage URI.
KSERVE_OUT ?= build/kserve/$(MODEL_NAME)
KSERVE_MOUNT ?= /mnt/models
# The .mar is built in build/, never in $(KSERVE_OUT): the bundle tool writes only into a
# folder that is new, empty or its own, and a .mar staged there first made it neither.
KSERVE_STAGING := build/kserve-staging/$(MODEL_NAME)
kserve-bundle: $(STAMP)
	rm -rf $(KSERVE_STAGING)
	$(PY) examples/image_classifier/build_mar.py --export-path $(KSERVE_STAGING) \
	  --model-name $(MODEL_NAME) --micro-batching-json $(MB_CONFIG) --self-contained --kserve \
	  $(if $(WEIGHTS),--weights $(WEIGHTS))
	$(PY) -m ts_microbatch.tools.bundle --out $(KSERVE_OUT) --mar $(KSERVE_STAGING)/$(MODEL_NAME).mar \
	  --model-name $(MODEL_NAME) --mount-path $(KSERVE_MOUNT) \
	  --batch-size $(BATCH_SIZE) --max-batch-delay $(MAX_BATCH_DELAY)
	rm -rf $(KSERVE_STAGING)

# The latency tuner on the example (docs/tuning.md): the settings that hold the most load
# with P99 within SLO_P99_MS. Small grids, a few minutes: the model's best written to
# TUNED_CONFIG, made anew (an earlier one removed: it is this target's). CONFIRM=2 also
# serves the 2 best and what TUNED_CONFIG holds (a copy of MODEL_CONFIG when there is none)
# on a real TorchServe, and merges one into it only if it beat that there (longer: 400
# answers a rate). make serve registers the .mar with BATCH_SIZE
# and MAX_BATCH_DELAY, so the line printed at the end passes the tuned ones.
SLO_P99_MS ?= 100
CONFIRM ?= 0
TUNE_ARGS ?=
TUNED_CONFIG := $(BUILD)/model-config.tuned.yaml
tune: $(MAR)
	$(if $(filter 0,$(CONFIRM)),rm -f $(TUNED_CONFIG),test -f $(TUNED_CONFIG) || cp $(MODEL_CONFIG) $(TUNED_CONFIG))
	$(PY) -m ts_microbatch.tools.tune --mar $(MAR) --input $(BUILD)/kitten.jpg \
	  --slo-p99-ms $(SLO_P99_MS) --micro-batch-sizes 1,2,4 --threads 1,2 --batch-sizes 1,2,4,8,16 \
	  --windows 1,2,5,10 --repeats 2 --confirm $(CONFIRM) --confirm-out $(BUILD)/tune-confirm \
	  --out $(TUNED_CONFIG) $(TUNE_ARGS)
	@$(PY) -c 'import sys, yaml; c = yaml.safe_load(open(sys.argv[1])); \
	  print("Serve it with: make serve MODEL_CONFIG=%s BATCH_SIZE=%s MAX_BATCH_DELAY=%s" \
	  % (sys.argv[1], c["batchSize"], c["maxBatchDelay"]))' $(TUNED_CONFIG)

lint: venv
	$(VENV)/bin/ruff check setup.py ts_microbatch handlers tests benchmarks examples deploy
	$(VENV)/bin/mypy

clean:
	rm -rf build model_store/*.mar logs
