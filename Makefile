# One entry point for people and CI, on a fresh machine: `make demo` installs
# the project and runs the service with a simulated cluster; `make test`
# installs, lints, type-checks and runs the whole test suite.
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install lint test demo bench proto clean

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

demo: install
	$(BIN)/topoplace serve --demo

bench: install
	$(BIN)/python -m bench.engine_speed
	$(BIN)/python -m bench.quality
	$(BIN)/python -m bench.gang_quality
	$(BIN)/python -m bench.service_speed
	$(BIN)/python -m bench.grpc_vs_rest
	$(BIN)/python -m bench.k8s_extender
	$(BIN)/python -m bench.device_plugin
	$(BIN)/python -m bench.federation_routing

# Regenerate service/grpc/gen/ after changing openapi/topoplace/v1/topoplace.proto, and
# agent/deviceplugin/gen/ after changing the kubelet's .proto files beside it.
proto: install
	$(BIN)/python -m service.grpc.codegen
	$(BIN)/python -m agent.deviceplugin.codegen

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
