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
BATCH_SIZE ?= 32
MAX_BATCH_DELAY ?= 50
INFERENCE_PORT ?= 8080
MANAGEMENT_PORT ?= 8081
METRICS_PORT ?= 8082

.PHONY: help venv test test-unit mar serve stop ab bench tune lint clean

help:
	@echo "make serve   set up, build the .mar, start TorchServe, register the model, send a request"
	@echo "make stop    stop TorchServe"
	@echo "make test    set up and run every test"
	@echo "make mar     build $(MAR)"
	@echo "make bench   run the default benchmark comparison"
	@echo "make tune    find the best micro_batching.json for the example in-process"
	@echo "make lint    ruff and mypy"

venv: $(STAMP)

$(STAMP): setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet $(TORCH_PINS)
	$(PIP) install --quiet -e '.[test,bench,dev]' $(TORCH_PINS)
	touch $(STAMP)

test: venv
	$(VENV)/bin/pytest

test-unit: venv
	$(VENV)/bin/pytest tests/unit

$(MAR): $(STAMP) handlers/micro_batching_handler.py $(MB_CONFIG) \
        examples/image_classifier/*.py examples/image_classifier/model-config.yaml
	$(PY) examples/image_classifier/build_mar.py --export-path model_store \
	  --model-name $(MODEL_NAME) --micro-batching-json $(MB_CONFIG) $(if $(WEIGHTS),--weights $(WEIGHTS))

mar: $(MAR)

serve: $(MAR)
	$(PY) -m ts_microbatch.serve start --model-store model_store --mar $(MODEL_NAME).mar \
	  --config configs/config.properties --batch-size $(BATCH_SIZE) \
	  --max-batch-delay $(MAX_BATCH_DELAY) --input $(BUILD)/kitten.jpg

stop:
	$(PY) -m ts_microbatch.serve stop

ab:
	@command -v ab >/dev/null || { apt-get update -qq && apt-get install -y -qq apache2-utils; }

# The default comparison (results in benchmarks/runs/<time>/); under 10 minutes here.
bench: $(STAMP) ab
	$(PY) benchmarks/benchmark-ab.py --config benchmarks/config.json $(if $(WEIGHTS),--weights $(WEIGHTS))

tune: $(MAR)
	$(PY) -m ts_microbatch.tune --mar $(MAR) --input $(BUILD)/kitten.jpg --batch-size $(BATCH_SIZE) \
	  --out $(BUILD)/micro_batching.tuned.json
	@echo "Serve it with: make serve MB_CONFIG=$(BUILD)/micro_batching.tuned.json"

lint: venv
	$(VENV)/bin/ruff check setup.py ts_microbatch handlers tests benchmarks examples
	$(VENV)/bin/mypy

clean:
	rm -rf build model_store/*.mar logs
