# One entry point for people and CI. `make test` works on a fresh machine:
# it creates the virtualenv, installs the project, lints, type-checks and
# runs the whole test suite.
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install lint test bench clean

$(BIN)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

install: $(BIN)/.installed

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint
	$(BIN)/pytest -q

bench: install
	$(BIN)/python -m bench.engine_speed
	$(BIN)/python -m bench.quality
	$(BIN)/python -m bench.gang_quality

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
