# atelier: `make dev` runs the whole system locally, `make test` runs every check.
# Both set up the virtual environment first, from constraints.txt (exact versions).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: dev test venv proto lint typecheck pytest breaking deploy-check lock clean chromium promtool

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade 'pip==25.3'
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@

venv: $(STAMP)

dev: $(STAMP)
	$(BIN)/atelier dev

# The checks run side by side: mypy works the CPU while the tests mostly wait on the
# processes they start. Any failure fails `make test`.
test: $(STAMP) chromium promtool
	$(MAKE) --no-print-directory -j3 lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/buf lint
	$(MAKE) --no-print-directory breaking
	$(MAKE) --no-print-directory deploy-check

# Protos must stay wire- and source-compatible with what main has; skipped where there is
# no main branch to compare against (a fresh repository).
breaking: $(STAMP)
	@if git rev-parse --verify --quiet main >/dev/null; then \
		$(BIN)/buf breaking --against '.git#branch=main'; \
	else echo "buf breaking: no main branch to compare against"; fi

# deploy/: hadolint on the image's Dockerfile; every Kubernetes overlay rendered with
# `kubectl kustomize` (no kustomize binary installs from PyPI for this Python; without
# kubectl the manifests are reported unchecked) and validated offline against the
# Kubernetes schemas (kubernetes-validate) and our schemas for KEDA's kinds. The alert
# rules, their unit tests and the dashboard's queries go through promtool.
deploy-check: $(STAMP) promtool
	$(BIN)/python scripts/deploy_check.py

typecheck: $(STAMP)
	$(BIN)/mypy

# The suite runs on PYTEST_WORKERS processes, each taking a whole test module at a time
# (module-scoped stacks stay shared within it; every worker has its own session database).
# Most tests wait on the processes they start, so more workers than cores pays.
# `PYTEST_WORKERS=0 make pytest` runs it in one process.
PYTEST_WORKERS ?= 3
pytest: $(STAMP) chromium promtool
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile

# The playground's browser test (tests/acceptance/test_playground.py) drives Debian's
# Chromium through Playwright; Playwright never downloads a browser of its own. Installed
# here when missing and we are root (CI is); otherwise say how.
CHROMIUM ?= /usr/bin/chromium
chromium:
	@if [ ! -x $(CHROMIUM) ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "installing Debian's chromium for the playground's browser test"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
		else \
			echo "$(CHROMIUM) is missing: install Debian's chromium (sudo apt-get install chromium); the playground's browser test needs it" >&2; \
			exit 1; \
		fi; \
	fi

# Prometheus' promtool checks the alert rules and runs their unit tests (deploy-check, and
# tests/contract/test_observability.py). No PyPI package carries it: it is taken out of
# Debian's prometheus package at exactly this version, without installing the package.
PROMTOOL_VERSION := 2.42.0+ds-5+deb12u1
promtool: $(STAMP)
	@scripts/get-promtool.sh $(BIN)/promtool '$(PROMTOOL_VERSION)'

proto: $(STAMP)
	scripts/gen-protos.sh gen

# Re-resolves every dependency from pyproject.toml into constraints.txt.
lock:
	rm -rf .lock-venv
	$(PYTHON) -m venv .lock-venv
	.lock-venv/bin/python -m pip install --quiet --upgrade 'pip==25.3'
	.lock-venv/bin/python -m pip install --quiet '.[dev]'
	( echo "# Exact versions for every install (make venv). Regenerate with: make lock"; \
	  .lock-venv/bin/python -m pip freeze --exclude-editable | grep -v '^atelier' ) > constraints.txt
	rm -rf .lock-venv build

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache build *.egg-info
