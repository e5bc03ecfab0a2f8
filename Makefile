# atelier: `make dev` runs the whole system locally, `make test` runs every check.
# Both set up the virtual environment first, from constraints.txt (exact versions).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: dev test venv proto lint typecheck pytest breaking deploy-check lock clean chromium promtool node-deps ts-client container-runtime

# uv installs what pip would from the same constraints, in seconds rather than a minute
# and more (a clean clone's venv took 74 s with pip on this machine, 7 s with uv). It
# compiles the bytecode as pip does: without it every process the suite starts compiled
# its imports anew (uv's files are not written to), 2.5 times the CPU of each start.
UV_VERSION := 0.13.9
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check 'uv==$(UV_VERSION)'
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -c constraints.txt -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@

venv: $(STAMP)

dev: $(STAMP)
	$(BIN)/atelier dev

# The checks run side by side: mypy works the CPU while the tests mostly wait on the
# processes they start. Any failure fails `make test`.
test: $(STAMP) chromium promtool node-deps
	$(MAKE) --no-print-directory -j3 lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/buf lint
	$(MAKE) --no-print-directory breaking
	$(MAKE) --no-print-directory deploy-check

# Protos must stay wire- and source-compatible with every released contract (each
# contract/*.binpb, written by scripts/tag-contract.sh when a version is released) and
# with main (so a field added after a release is not removed again either). The image
# check needs no git history; the main check is skipped where there is no main branch.
breaking: $(STAMP)
	@for image in contract/*.binpb; do \
		echo "buf breaking against $$image"; \
		$(BIN)/buf breaking protos --against "$$image" || exit 1; \
	done
	@if git rev-parse --verify --quiet main >/dev/null; then \
		$(BIN)/buf breaking --against '.git#branch=main'; \
	else echo "buf breaking: no main branch to compare against"; fi

# deploy/: hadolint on the image's Dockerfile; every Kubernetes overlay rendered with
# `kubectl kustomize` (no kustomize binary installs from PyPI for this Python; without
# kubectl the manifests are reported unchecked) and validated offline against the
# Kubernetes schemas (kubernetes-validate) and our schemas for KEDA's kinds. The alert
# rules, their unit tests and the dashboard's queries go through promtool.
deploy-check: $(STAMP) promtool
	$(BIN)/python -m scripts.deploy_check

typecheck: $(STAMP)
	$(BIN)/mypy

# The suite runs on PYTEST_WORKERS processes, each taking a whole test module at a time
# (module-scoped stacks stay shared within it; every worker has its own session database).
# Most tests wait on the processes they start, so more workers than cores pays.
# `PYTEST_WORKERS=0 make pytest` runs it in one process.
#
# It runs against a PostgreSQL server of its own (scripts/suite_postgres.py: the machine's
# PostgreSQL binaries, a free loopback port, room for 300 connections), started here and
# stopped after: the machine's server allows 100, which 4 workers reach. Where no binaries
# are installed, or ATELIER_TEST_POSTGRES_URL names a server, the suite uses that choice.
PYTEST_WORKERS ?= 4
TEST_POSTGRES_DIR ?= /tmp/atelier-test-postgres-$(shell echo '$(CURDIR)' | cksum | cut -d' ' -f1)
pytest: $(STAMP) chromium promtool node-deps container-runtime
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		export ATELIER_REQUIRE_CONTAINER_RUNTIME=1; fi; \
	if [ -z "$$ATELIER_TEST_POSTGRES_URL" ]; then \
		url=$$($(BIN)/python -m scripts.suite_postgres start $(TEST_POSTGRES_DIR)) || exit 1; \
		if [ -n "$$url" ]; then echo "the suite's own PostgreSQL: $$url"; \
			export ATELIER_TEST_POSTGRES_URL=$$url; fi; \
	fi; \
	ATELIER_DOCKER_DIR=$(CONTAINER_RUNTIME_DIR) $(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile; \
	status=$$?; $(BIN)/python -m scripts.suite_postgres stop $(TEST_POSTGRES_DIR); exit $$status

# The pod tests (tests/deploy/) run the image and the manifests' pods in a real container
# runtime: Debian's docker.io, its daemon on a private socket, a base image made offline
# with debootstrap (no registry answers here). As root on Debian (CI is) it is installed,
# started and built here once; the daemon's data root is a cache outside the checkout, so
# clean clones and later runs reuse the base and the image's layers. Elsewhere it says why
# not and how, and those tests skip (under root on Debian they fail instead).
# `scripts/container-runtime.sh stop` stops the daemon.
CONTAINER_RUNTIME_DIR ?= /var/cache/atelier-docker
container-runtime:
	@ATELIER_DOCKER_DIR=$(CONTAINER_RUNTIME_DIR) scripts/container-runtime.sh

# The playground's browser test (tests/acceptance/test_playground.py) drives Debian's
# Chromium through Playwright; Playwright never downloads a browser of its own. Installed
# here when missing and we are root (CI is); otherwise say how.
CHROMIUM ?= /usr/bin/chromium
chromium:
	@if [ ! -x $(CHROMIUM) ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "installing Debian's chromium for the playground's browser test"; \
			apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq chromium >/dev/null; \
		else \
			echo "$(CHROMIUM) is missing: install Debian's chromium (sudo apt-get install chromium); the playground's browser test needs it" >&2; \
			exit 1; \
		fi; \
	fi

# The TypeScript client (clients/typescript/): its npm packages exactly as its
# package-lock.json pins them (npm ci), for its tests (tests/acceptance/
# test_typescript_client.py runs them in Node) and its drift check (tests/contract/
# test_typescript_generated.py). Node (18 or later) and npm come from the machine; when
# missing and we are root, Debian's nodejs and npm are installed (as Chromium is above).
TS_CLIENT := clients/typescript
node-deps: $(TS_CLIENT)/node_modules/.installed

$(TS_CLIENT)/node_modules/.installed: $(TS_CLIENT)/package.json $(TS_CLIENT)/package-lock.json
	@if ! command -v node >/dev/null || ! command -v npm >/dev/null; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "installing Debian's nodejs and npm for the TypeScript client"; \
			apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq nodejs npm >/dev/null; \
		else \
			echo "node and npm are missing: install them (sudo apt-get install nodejs npm); the TypeScript client's tests need them" >&2; \
			exit 1; \
		fi; \
	fi
	@node -e 'if (+process.versions.node.split(".")[0] < 18) { console.error("Node " + process.version + " is too old: the TypeScript client needs 18 or later"); process.exit(1) }'
	cd $(TS_CLIENT) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

# Regenerates the TypeScript client's types from gen/openapi.json (run after `make proto`
# when the document changed; the drift check fails until the result is committed).
ts-client: node-deps
	cd $(TS_CLIENT) && node node_modules/openapi-typescript/bin/cli.js ../../gen/openapi.json --output src/generated/openapi.ts

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
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache build *.egg-info $(TS_CLIENT)/node_modules $(TS_CLIENT)/dist
