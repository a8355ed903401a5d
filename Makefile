# The README's two commands: `make demo` and `make test`. Both start from a fresh clone.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint unit bench clean node_modules node-test browser

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

# The pinned Pi coding agent (package.json, package-lock.json) that agent steps run as
# `pi --mode rpc`. `npm ci` runs again whenever the lock file is newer than the stamp.
# Without npm the rest of the suite still runs, and the real-pi tests fail saying what
# to install.
NODE_STAMP := node_modules/.pi-workflows-installed

$(NODE_STAMP): package.json package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
		npm ci --ignore-scripts --no-audit --no-fund && touch $@; \
	else \
		echo "make: npm not found: install Node.js >= 20.6 with npm (e.g. apt-get install nodejs npm); the real-pi tests will fail" >&2; \
	fi

node_modules: $(NODE_STAMP)

# The bridge extension's TypeScript tests alone (make unit runs them too, from pytest).
node-test: node_modules
	node --import jiti/register --test tests/node/*.test.ts

# Headless Chromium for the browser test of `piw serve` (tests/cli/test_relay_browser.py);
# Debian's package, installed with apt-get (as root) when it is missing.
browser:
	@if command -v chromium >/dev/null 2>&1; then \
		chromium --version; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -qq && apt-get install -y -qq chromium; \
	else \
		echo "make: chromium not found: install it as root (apt-get install -y chromium); the browser test will fail" >&2; \
		exit 1; \
	fi

demo: $(STAMP) node_modules
	$(PY) -m pi_workflows.demo

lint: $(STAMP)
	$(VENV)/bin/ruff check pi_workflows tests benchmarks
	$(VENV)/bin/mypy

unit: $(STAMP) node_modules
	$(PY) -m pytest

test: lint unit

bench: $(STAMP) node_modules
	for b in benchmarks/bench_*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis node_modules
