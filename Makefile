# Two commands matter: `make demo` and `make test`. Everything else is a helper for them.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
NODE_STAMP := node_modules/.installed-stamp
CHECKOV_VENV  := .venv-checkov
CHECKOV_STAMP := $(CHECKOV_VENV)/.installed-stamp

.PHONY: demo test bench bench-quick lint format install clean infra-check browser

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

# Offline IaC scan of infra/: checkov (own venv, its pins clash with ours) must report no
# failed check, every skip inline with a reason; the relay cloud-init must be valid YAML.
infra-check: $(CHECKOV_STAMP)
	$(CHECKOV_VENV)/bin/python tests/infra/checkov_gate.py

$(CHECKOV_STAMP): infra/requirements-checkov.txt
	test -x $(CHECKOV_VENV)/bin/python || $(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r infra/requirements-checkov.txt
	touch $@

# The demo report's test opens it in Debian's chromium; install it when missing (as root on
# a fresh machine; `apt-get update` only if the first try fails). Without it that test skips
# (outside CI) and says why.
browser:
	@command -v chromium >/dev/null 2>&1 || apt-get install -y -q chromium \
	  || (apt-get update -q && apt-get install -y -q chromium) \
	  || echo "make: could not install chromium; the report's browser test will skip"

test: install lint infra-check browser
	$(BIN)/python -m pytest -q

demo: install
	$(BIN)/python -m local.demo

bench: install
	$(BIN)/python -m tests.bench $(if $(QUICK),--quick)

# A 30 s smoke run of the same measurements (also: make bench QUICK=1).
bench-quick: install
	$(BIN)/python -m tests.bench --quick

clean:
	rm -rf $(VENV) $(CHECKOV_VENV) node_modules .pytest_cache .ruff_cache
