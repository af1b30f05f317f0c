# The two commands a newcomer needs: `make demo` (the whole story on a local cluster) and
# `make test` (every test, against a real control plane). Both set themselves up from scratch.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint controlplane kueue venv clean

$(BIN)/vkprovider: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

venv: $(BIN)/vkprovider

controlplane:
	@bash tools/controlplane/build.sh >/dev/null

kueue:
	@bash tools/kueue/build.sh >/dev/null

# the demo's way out goes through Kueue with the pre-warm check (vkprovider demo --no-kueue: not)
demo: venv controlplane kueue
	VKP_KUEUE_BIN=$$(bash tools/kueue/build.sh) $(BIN)/vkprovider demo

test: venv controlplane
	$(BIN)/python -m pytest

lint: venv
	bash tools/image/lint.sh
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) .artifacts .mypy_cache .ruff_cache .pytest_cache
