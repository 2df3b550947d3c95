# stagewright — every target creates the virtual environment it needs.
# `make help` lists the targets.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-dev

.DEFAULT_GOAL := help

.PHONY: help run plan migrate test lint typecheck browser unit bench clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)  ## the service on http://127.0.0.1:8000 (docs at /docs), embedded SQLite
	$(BIN)/stagewright serve

plan: $(STAMP)  ## plan GPT-3 96B on 32 A100s on the command line and show why
	$(BIN)/stagewright plan examples/gpt3-96b-32xa100.json

migrate: $(STAMP)  ## alembic upgrade head on STAGEWRIGHT_DATABASE_URL (default stagewright.db)
	$(BIN)/alembic upgrade head

lint: $(STAMP)  ## ruff (lint + format check)
	$(BIN)/ruff check planner api executor cli tests benchmarks migrations
	$(BIN)/ruff format --check planner api executor cli tests benchmarks migrations

typecheck: $(STAMP)  ## mypy --strict on planner, api, executor and cli
	$(BIN)/mypy

# Test files run in TEST_WORKERS processes (one file stays on one worker: its module
# fixtures, e.g. a live server, are built once, and tests that count what the file ran see
# all of it). TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 2

unit: $(STAMP)  ## the pytest suite only (TEST_WORKERS processes, default 2)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

browser:  ## Debian's chromium for the dashboard tests (installed with apt-get when missing)
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "install chromium (apt-get install chromium) for the dashboard tests" >&2; fi; }

test: lint typecheck browser unit  ## everything CI runs: lint, types, the whole test suite

bench: $(STAMP)  ## schedules, planner speed, the papers' figures, cpsat, service load, executor (slow)
	$(BIN)/python benchmarks/schedules.py
	$(BIN)/python benchmarks/planner_speed.py
	$(BIN)/python benchmarks/paper_reproduction.py
	$(BIN)/python benchmarks/vshape_table5.py
	$(BIN)/python benchmarks/vshape_layout.py
	$(BIN)/python benchmarks/megatron_fig16.py
	$(BIN)/python benchmarks/cpsat_vs_grid.py
	$(BIN)/python benchmarks/service_load.py
	$(BIN)/python benchmarks/executor_vs_torch.py

clean:  ## remove the virtual environment and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
