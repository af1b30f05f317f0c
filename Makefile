# The two commands a newcomer needs: `make demo` (the whole story on a local cluster) and
# `make test` (every test, against a real control plane). Both set themselves up from scratch
# through tools/setup.sh (Debian packages when missing, .venv, the Go-built binaries, the image's
# root filesystem; each step cached and narrated), which is also what CI runs: .ci/run is
# `make lint` + `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=
# pytest-xdist workers: the suite runs on 2 against one shared control plane (tests that act
# cluster-wide run one at a time: tests/e2e/conftest.py); PYTEST_WORKERS=0 runs it in one process
PYTEST_WORKERS ?= 2
DIST := dist

.PHONY: demo test setup lint controlplane kueue venv lock release clean

# the runtime dependencies exactly as the image has them (requirements/runtime.lock, hash-checked),
# then the project and its dev tools
$(BIN)/vkprovider: pyproject.toml requirements/runtime.lock
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --require-hashes -r requirements/runtime.lock
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

venv: $(BIN)/vkprovider

# every step, printing the exports the tests read (eval "$(bash tools/setup.sh)" in a shell)
setup:
	@bash tools/setup.sh

controlplane:
	@bash tools/setup.sh controlplane >/dev/null

kueue:
	@bash tools/setup.sh kueue >/dev/null

# the demo's way out goes through Kueue with the pre-warm check (vkprovider demo --no-kueue: not)
demo:
	@env=$$(bash tools/setup.sh system venv controlplane kueue) && eval "$$env" \
	  && $(BIN)/vkprovider demo

# PYTEST_ARGS picks tests: make test PYTEST_ARGS='tests/image -k entrypoint'
test:
	@env=$$(bash tools/setup.sh) && eval "$$env" \
	  && $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

lint: venv
	bash tools/image/lint.sh
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# requirements/runtime.lock from pyproject.toml's dependencies: every version pinned, every file
# hashed, for Python 3.11 on any platform (uv, pinned, installed into the venv)
UV_VERSION := 0.13.9
lock: venv
	$(BIN)/pip install -q 'uv==$(UV_VERSION)'
	$(BIN)/uv pip compile pyproject.toml --quiet --generate-hashes --universal --python-version 3.11 \
	  --custom-compile-command 'make lock' -o requirements/runtime.lock

# the chart package and the image's root filesystem, versions checked to agree (docs/releasing.md)
release:
	@bash tools/release.sh $(DIST)

clean:
	rm -rf $(VENV) .artifacts .mypy_cache .ruff_cache .pytest_cache $(DIST)
