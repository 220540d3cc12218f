# Two entry points on a fresh clone (only python3 and make needed):
#   make demo   set up .venv and run the dispatcher demo
#   make test   set up .venv and run ruff, mypy and the whole test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check
# Two stamps: the demo needs only execkit and its two dependencies (attrs, psutil); the
# tests need the whole toolchain. A venv set up for the tests serves the demo too.
BASE_STAMP := $(VENV)/.installed-base
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit chromium bench clean record-vendors record-scenes \
	test-vendors drift-vendors live-github live-linear

$(BASE_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip
	$(PIP) -e .
	touch $(BASE_STAMP)

$(STAMP): $(BASE_STAMP)
	$(PIP) -e '.[test]'
	touch $(STAMP)

demo: $(BASE_STAMP)
	$(PY) -m execkit demo

lint: $(STAMP)
	$(PY) -m ruff check execkit adapters tests benchmarks
	$(PY) -m ruff format --check execkit adapters tests benchmarks

typecheck: $(STAMP)
	$(PY) -m mypy

# The dashboard's browser tests (tests/test_dashboard_browser.py) drive a Chromium through
# Playwright (the `test` extra); Playwright's own browser download is never used.
# tests/chromium.py finds one (PATH, /usr/bin, Playwright's cache, .venv/chromium, or
# $$EXECKIT_CHROMIUM) or installs one: as root Debian's chromium (apt-get, waiting for the
# apt lock); otherwise, without root, the Chromium the npm package @sparticuz/chromium
# ships, into .venv/chromium. A found one costs a `--version` run.
chromium: $(STAMP)
	DEBIAN_FRONTEND=noninteractive $(PY) tests/chromium.py ensure

# The suite runs inside a throwaway PostgreSQL cluster (tests/pgcluster.py), stopped when
# pytest ends however it ends; without server binaries the PostgreSQL tests skip. Two
# pytest-xdist workers share the cluster (each test has a schema of its own).
unit: $(STAMP) chromium
	$(PY) tests/pgcluster.py --run -- $(PY) -m pytest -q -n 2

test: lint typecheck unit

# Every figure in the README's "Figures", each a ratio against a floor measured in the
# same run (minutes; not part of `make test`).
bench: $(STAMP)
	$(PY) benchmarks/bench_exec.py
	$(PY) benchmarks/bench_redact.py
	$(PY) benchmarks/bench_classify.py
	$(PY) benchmarks/bench_cli.py
	$(PY) benchmarks/bench_ledger.py
	$(PY) tests/pgcluster.py --run -- $(PY) benchmarks/bench_postgres.py
	$(PY) benchmarks/bench_remote.py
	$(PY) benchmarks/bench_dashboard.py
	$(PY) benchmarks/bench_bulk.py
	$(PY) benchmarks/bench_http.py
	$(PY) benchmarks/bench_idle.py
	$(PY) benchmarks/bench_notify.py
	$(PY) benchmarks/bench_usage.py
	$(PY) benchmarks/bench_dispatch.py
	$(PY) benchmarks/bench_lanes.py
	$(PY) benchmarks/bench_scenes.py
	$(PY) benchmarks/bench_status.py
	$(PY) benchmarks/bench_github.py
	$(PY) benchmarks/bench_trackers.py
	$(PY) tests/pgcluster.py --run -- $(PY) benchmarks/bench_spend.py

# The GitHub board against real GitHub (issue #47): reads only; SKIP without GITHUB_TOKEN and
# EXECKIT_LIVE_REPO=OWNER/NAME. Never part of `make test`.
live-github: $(STAMP)
	$(PY) tests/live_github.py

live-linear: $(STAMP)
	$(PY) tests/live_linear.py

# The real vendor CLIs (tests/vendors/package.json, exact versions) against a loopback fake
# API; both need node and npm and print SKIP without them. Neither is part of `make test`.
#   make record-vendors   npm ci if needed, then re-record fixtures/recorded (~25 min)
#   make test-vendors     run the same matrix live and compare each cell's shape
#   make drift-vendors    record the newest served versions and name the cells that changed
record-vendors: $(STAMP)
	$(PY) tests/vendors/clis.py install
	$(PY) tests/vendors/record.py
	$(PY) tests/vendors/measure.py --write-corpus --write-matrix --no-table

# Whole dispatches against a vendor that recovers by itself (issues 51, 52): the real
# claude, codex and gemini under `execkit dispatch --until-idle`, into
# fixtures/recorded/scenes (~30 min; replayed by `make test`, measured by `make bench`).
record-scenes: $(STAMP)
	$(PY) tests/vendors/clis.py install
	$(PY) tests/vendors/scenes.py record

test-vendors: $(STAMP)
	$(PY) tests/vendors/clis.py install
	$(PY) tests/vendors/record.py --check

# Version drift: each pin beside the newest the registry serves; the newer ones recorded
# live and classed; fails naming each cell whose class changed (not part of `make test`).
drift-vendors: $(STAMP)
	$(PY) tests/vendors/clis.py install
	$(PY) tests/vendors/record.py --latest
	$(PY) tests/vendors/measure.py --write-matrix --no-table

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
