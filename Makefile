# Every target makes .venv itself, so each works on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test typecheck stress bench docs wheel-check clean

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

# The type check runs first; --durations names the slowest tests at the end.
test: typecheck $(STAMP) $(CHROMIUM)
	$(BIN)/pytest --durations=15

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

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test,bench,nats]'
	$(BIN)/python -m benchmarks

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
