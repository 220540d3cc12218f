# Two entry points on a fresh clone (only python3 and make needed):
#   make demo   set up .venv and run the dispatcher demo
#   make test   set up .venv and run ruff, mypy and the whole test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m execkit demo

lint: $(STAMP)
	$(PY) -m ruff check execkit adapters tests benchmarks
	$(PY) -m ruff format --check execkit adapters tests benchmarks

typecheck: $(STAMP)
	$(PY) -m mypy

unit: $(STAMP)
	$(PY) -m pytest -q

test: lint typecheck unit

bench: $(STAMP)
	$(PY) benchmarks/bench_exec.py
	$(PY) benchmarks/bench_classify.py
	$(PY) benchmarks/bench_ledger.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
