# shardsmith: `make demo` sets everything up and converts a bundled sample;
# `make test` runs the test suite. Both start from a clean clone.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
EXTRAS ?= test,dicom,demo,bench

INPUT ?=
OUTPUT ?=
ARGS ?=
DEMO_DIR := build/demo

.PHONY: help venv demo test convert verify bench clean

help:
	@echo "make demo      set up .venv, build a sample photo folder, convert it, print the summary"
	@echo "make test      set up .venv if needed and run the tests"
	@echo "make convert INPUT=DIR OUTPUT=DIR [ARGS='--split train=0.8,validation=0.2']"
	@echo "make verify OUTPUT=DIR   re-read and check every record of a dataset"
	@echo "make bench     run the benchmarks in bench/"

venv: $(STAMP)

$(STAMP): setup.py
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), sys.version' 
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[$(EXTRAS)]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m bench.corpus demo $(DEMO_DIR)/images
	$(PY) -m beam_jobs.convert --input_dir $(DEMO_DIR)/images --output_dir $(DEMO_DIR)/dataset \
	    --split train=0.8,validation=0.2 --overwrite
	$(PY) -m beam_jobs.verify $(DEMO_DIR)/dataset
	$(PY) -m beam_jobs.inspect_dataset $(DEMO_DIR)/dataset

test: $(STAMP)
	$(PY) -m pytest -q tests

convert: $(STAMP)
	@test -n "$(INPUT)" || { echo "usage: make convert INPUT=DIR OUTPUT=DIR"; exit 2; }
	@test -n "$(OUTPUT)" || { echo "usage: make convert INPUT=DIR OUTPUT=DIR"; exit 2; }
	$(PY) -m beam_jobs.convert --input_dir "$(INPUT)" --output_dir "$(OUTPUT)" \
	    --direct_num_workers 0 --direct_running_mode multi_processing $(ARGS)

verify: $(STAMP)
	@test -n "$(OUTPUT)" || { echo "usage: make verify OUTPUT=DIR"; exit 2; }
	$(PY) -m beam_jobs.verify "$(OUTPUT)" --direct_num_workers 0 --direct_running_mode multi_processing

bench: $(STAMP)
	$(PY) -m bench.convert
	$(PY) -m bench.read

clean:
	rm -rf build .pytest_cache
