# stagewright — every target creates the virtual environment it needs.
# `make help` lists the targets.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-dev

.DEFAULT_GOAL := help

.PHONY: help run test lint typecheck unit bench clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)  ## the main job: plan GPT-3 96B on 32 A100s and show why
	$(BIN)/stagewright plan examples/gpt3-96b-32xa100.json

lint: $(STAMP)  ## ruff (lint + format check)
	$(BIN)/ruff check planner api executor tests benchmarks
	$(BIN)/ruff format --check planner api executor tests benchmarks

typecheck: $(STAMP)  ## mypy --strict on planner and api
	$(BIN)/mypy

unit: $(STAMP)  ## the pytest suite only
	$(BIN)/python -m pytest

test: lint typecheck unit  ## everything CI runs: lint, types, the whole test suite

bench: $(STAMP)  ## schedule table, simulator and planner speed, paper reproduction (slow)
	$(BIN)/python benchmarks/schedules.py
	$(BIN)/python benchmarks/planner_speed.py
	$(BIN)/python benchmarks/paper_reproduction.py

clean:  ## remove the virtual environment and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
