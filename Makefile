# Two commands matter: `make demo` and `make test`. Everything else is a helper for them.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
NODE_STAMP := node_modules/.installed-stamp

.PHONY: demo test bench lint format install clean

install: $(STAMP) $(NODE_STAMP)

$(STAMP): requirements.txt requirements-dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $@

$(NODE_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

test: install lint
	$(BIN)/python -m pytest -q

demo: install
	$(BIN)/python -m functions.local.demo

bench: install
	$(BIN)/python -m tests.bench

clean:
	rm -rf $(VENV) node_modules .pytest_cache .ruff_cache
