# shardsmith: `make demo` sets everything up and converts a bundled sample;
# `make test` runs the test suite. Both start from a clean clone.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# `cpu`: the CPU-only TensorFlow build (setup.py explains why it is an extra).
EXTRAS ?= cpu,test,dicom,demo,bench

INPUT ?=
OUTPUT ?=
ARGS ?=
DEMO_DIR := build/demo

.PHONY: help venv demo test test-fast convert verify bench bench-gpu clean

help:
	@echo "make demo      set up .venv, build a sample photo folder, convert it, print the summary"
	@echo "make test      set up .venv if needed and run the tests (the README's and CI's command)"
	@echo "make test-fast the pure modules' unit tests and the cheapest end-to-end path (< 1 min)"
	@echo "make venv      create .venv and install shardsmith with its extras (EXTRAS=...)"
	@echo "make convert INPUT=DIR OUTPUT=DIR [ARGS='--split train=0.8,validation=0.2']"
	@echo "make verify OUTPUT=DIR   re-read and check every record of a dataset"
	@echo "make bench     run the benchmarks in bench/"
	@echo "make bench-gpu train a small model on every visible GPU (or the CPU), both readers"
	@echo "make cluster-up / cluster-down   a local Dask cluster (DASK_WORKERS=2)"
	@echo "make convert-dataflow PROJECT=... BUCKET=... INPUT=gs://... OUTPUT=gs://..."
	@echo "make clean     remove build/ (demo output, Dask logs) and pytest's cache"
	@echo "make help      this list"

venv: $(STAMP)

$(STAMP): setup.py
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), sys.version' 
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[$(EXTRAS)]'
	touch $(STAMP)

# The `shardsmith` command rather than `python -m beam_jobs.X`: it quiets Beam's import-time
# BigQuery notice too, which is logged before any `main` runs.
demo: $(STAMP)
	$(PY) -m bench.corpus demo $(DEMO_DIR)/images
	$(PY) -m shardsmith convert --input_dir $(DEMO_DIR)/images --output_dir $(DEMO_DIR)/dataset \
	    --split train=0.8,validation=0.2 --overwrite
	$(PY) -m shardsmith verify $(DEMO_DIR)/dataset
	$(PY) -m shardsmith inspect $(DEMO_DIR)/dataset
	$(PY) -m shardsmith preview $(DEMO_DIR)/dataset --split train --output $(DEMO_DIR)/preview.png

# On pytest-xdist workers, one per core (at most 4, none on one core: tests/conftest.py), each
# test module on one worker so that its module-scoped fixtures run once, the longest modules
# first (tests/conftest.py; xdist's own reordering, by test count, off). TEST_WORKERS=0: one process.
TEST_WORKERS ?= auto

test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests

# The fast lane while editing: unit tests of the pure modules (planning, imaging, formats,
# boxes, patches), the recorded output bytes and the cheapest end-to-end path (files to
# batches). Under a minute on 2 cores; `make test` stays the full suite (README, CI).
FAST_TESTS := tests/test_conversion_plan.py tests/test_imaging_patches.py \
    tests/test_imaging_tiff_strips.py tests/test_imaging_formats.py tests/test_imaging_boxes.py \
    tests/test_imaging_formats_jpeg.py tests/test_golden.py tests/test_end_to_end.py \
    tests/test_makefile.py

test-fast: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(FAST_TESTS)

convert: $(STAMP)
	@test -n "$(INPUT)" || { echo "usage: make convert INPUT=DIR OUTPUT=DIR"; exit 2; }
	@test -n "$(OUTPUT)" || { echo "usage: make convert INPUT=DIR OUTPUT=DIR"; exit 2; }
	$(PY) -m shardsmith convert --input_dir "$(INPUT)" --output_dir "$(OUTPUT)" \
	    $(ARGS)

verify: $(STAMP)
	@test -n "$(OUTPUT)" || { echo "usage: make verify OUTPUT=DIR"; exit 2; }
	$(PY) -m shardsmith verify "$(OUTPUT)"

bench: $(STAMP)
	$(PY) -m bench.convert
	$(PY) -m bench.small
	$(PY) -m bench.read
	$(PY) -m bench.read_stages
	$(PY) -m bench.targets_read
	$(PY) -m bench.append
	$(PY) -m bench.scale
	$(PY) -m bench.photos_large
	$(PY) -m bench.rasters
	$(PY) -m bench.targets_convert
	$(PY) -m bench.patches
	$(PY) -m bench.service --dtype uint8
	$(PY) -m bench.service

# Also for GPU machines: `make venv EXTRAS=gpu,test,bench` first (docs/performance.md).
bench-gpu: $(STAMP)
	$(PY) -m bench.gpu $(ARGS)

clean:
	rm -rf build .pytest_cache

# A local Dask cluster for `--runner DaskRunner` (docs/scaling-out.md).
DASK_DIR := build/dask
DASK_PORT ?= 8786
DASK_WORKERS ?= 2
DASK_THREADS ?= 1
DASK_ADDRESS := tcp://127.0.0.1:$(DASK_PORT)

.PHONY: cluster-up cluster-down

cluster-up: $(STAMP)
	@mkdir -p $(DASK_DIR)
	@! $(PY) -c 'import socket; socket.create_connection(("127.0.0.1", $(DASK_PORT)), 1)' 2>/dev/null \
	    || { echo "port $(DASK_PORT) is taken: make cluster-down, or DASK_PORT=..."; exit 1; }
	$(VENV)/bin/dask scheduler --host 127.0.0.1 --port $(DASK_PORT) --no-dashboard \
	    --scheduler-file $(DASK_DIR)/scheduler.json > $(DASK_DIR)/scheduler.log 2>&1 & echo $$! > $(DASK_DIR)/scheduler.pid
	for i in $$(seq $(DASK_WORKERS)); do \
	  DASK_LOGGING__SHARDSMITH=info $(VENV)/bin/dask worker $(DASK_ADDRESS) --host 127.0.0.1 \
	    --nworkers 1 --nthreads $(DASK_THREADS) --no-dashboard --local-directory $(DASK_DIR)/worker$$i \
	    > $(DASK_DIR)/worker$$i.log 2>&1 & echo $$! > $(DASK_DIR)/worker$$i.pid; \
	done
	$(PY) -c 'from distributed import Client; Client("$(DASK_ADDRESS)", timeout=60).wait_for_workers($(DASK_WORKERS), timeout=120)'
	@echo "Dask cluster up at $(DASK_ADDRESS), logs in $(DASK_DIR). Convert on it with:"
	@echo "  make convert INPUT=... OUTPUT=... ARGS='--runner DaskRunner --dask_client_address $(DASK_ADDRESS)'"

cluster-down:
	-@test ! -f $(DASK_DIR)/scheduler.pid || $(PY) -c 'from distributed import Client; \
	    Client("$(DASK_ADDRESS)", timeout=5).shutdown()' 2>/dev/null
	-@for f in $(DASK_DIR)/*.pid; do test -f $$f && kill $$(cat $$f) 2>/dev/null; done; true
	rm -rf $(DASK_DIR)

# Conversion on Google Cloud Dataflow (docs/scaling-out.md).
PROJECT ?=
REGION ?= us-central1
BUCKET ?=
DATAFLOW_REQUIREMENTS := build/dataflow-requirements.txt

.PHONY: convert-dataflow

# The workers' extras (they install the sdist without any): the CPU-only
# TensorFlow and the DICOM codecs, for Linux x86_64 workers.
$(DATAFLOW_REQUIREMENTS): setup.py $(STAMP)
	@mkdir -p $(dir $@)
	$(PY) -c 'import importlib.metadata as m; from packaging.requirements import Requirement as R; \
	    workers = {"platform_machine": "x86_64", "platform_system": "Linux", "sys_platform": "linux"}; \
	    reqs = [R(r) for r in m.requires("shardsmith")]; \
	    print("\n".join(sorted(f"{r.name}{r.specifier}" for r in reqs if r.marker and not r.marker.evaluate({**workers, "extra": ""}) \
	        and any(r.marker.evaluate({**workers, "extra": e}) for e in ("cpu", "dicom")))))' > $@

convert-dataflow: $(STAMP) $(DATAFLOW_REQUIREMENTS)
	@test -n "$(PROJECT)" -a -n "$(BUCKET)" -a -n "$(INPUT)" -a -n "$(OUTPUT)" || { echo \
	    "usage: make convert-dataflow PROJECT=my-project BUCKET=my-bucket INPUT=gs://.../images OUTPUT=gs://.../dataset [REGION=us-central1] [ARGS=...]"; exit 2; }
	$(PY) -m shardsmith convert --input_dir "$(INPUT)" --output_dir "$(OUTPUT)" \
	    --runner DataflowRunner --project $(PROJECT) --region $(REGION) \
	    --temp_location gs://$(BUCKET)/tmp --staging_location gs://$(BUCKET)/staging \
	    --setup_file $(CURDIR)/setup.py --requirements_file $(DATAFLOW_REQUIREMENTS) \
	    --experiments=upload_graph $(ARGS)
