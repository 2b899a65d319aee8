# disagg-operator: developer entry points. `make help` lists them.
#
# Every target runs from a virtual environment in .venv, which the Makefile creates from the
# first Python >= 3.11 it finds (python3, python3.14 ... python3.11 on PATH) and fills with the
# package and its test extras at the versions pinned in constraints.txt. Choose another Python
# with `make PYTHON=/usr/bin/python3.12 ...` (after `make venv-clean` if .venv already exists).
SHELL := /bin/bash
HACK := hack
VENV := .venv
VENV_PY := $(VENV)/bin/python
CONSTRAINTS := constraints.txt
# The interpreter .venv is built from: $(PYTHON) if given, else the first Python >= 3.11 found.
BASE_PYTHON = $(or $(PYTHON),$(shell $(HACK)/prereqs.sh --find-python))
# Where `make install` links the `disagg` command.
BINDIR ?= $(HOME)/.local/bin
TOOLS_BIN := $(shell $(HACK)/tools.sh --print)
# hack/*.sh and the tests' subprocesses find the venv's `python3` and `disagg` first.
export PATH := $(CURDIR)/$(VENV)/bin:$(TOOLS_BIN):$(PATH)

.PHONY: help venv venv-clean install lock prereqs routers loadgen checkov tools cluster-up cluster-down demo demo-down \
	test test-unit lint crds bench

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

venv: $(VENV)/.installed ## create .venv and install the package with its test extras (pinned)

# Rebuilt when the package's metadata or the pins change.
$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	@PYTHON="$(BASE_PYTHON)" $(HACK)/prereqs.sh venv
	@if [[ ! -x $(VENV_PY) ]] || ! $(VENV_PY) -c '' 2>/dev/null; then \
	  rm -rf $(VENV); echo "creating $(VENV) from $(BASE_PYTHON)"; \
	  "$(BASE_PYTHON)" -m venv $(VENV); \
	fi
	$(VENV_PY) -m pip install -q -c $(CONSTRAINTS) -e '.[test,plot]'
	@touch $@

venv-clean: ## remove .venv (the next target recreates it)
	rm -rf $(VENV)

install: venv ## the venv, plus a `disagg` link in ~/.local/bin (BINDIR=...; or: source .venv/bin/activate)
	@mkdir -p "$(BINDIR)"
	ln -sfn "$(CURDIR)/$(VENV)/bin/disagg" "$(BINDIR)/disagg"
	@case ":$$PATH:" in *":$(BINDIR):"*) ;; *) echo "note: $(BINDIR) is not on your PATH";; esac

# Resolves the newest versions allowed by pyproject.toml in a throw-away venv and writes them
# to constraints.txt. Run the whole suite (`make test`) before committing the new pins.
lock: ## refresh constraints.txt (pinned runtime + test dependencies) from a fresh resolve
	@PYTHON="$(BASE_PYTHON)" $(HACK)/prereqs.sh venv
	@tmp="$$(mktemp -d)"; trap 'rm -rf "$$tmp"' EXIT; \
	"$(BASE_PYTHON)" -m venv "$$tmp/venv" && \
	"$$tmp/venv/bin/python" -m pip install -q '.[test,plot]' && \
	{ echo "# Pinned versions of the tested set (runtime + test + plot extras), used with pip -c"; \
	  echo "# by the Makefile and CI. pyproject.toml keeps the compatible ranges."; \
	  echo "# Regenerate with 'make lock' (resolved with Python $$("$$tmp/venv/bin/python" -c 'import platform; print(platform.python_version())'))."; \
	  "$$tmp/venv/bin/python" -m pip freeze --exclude-editable | grep -v -i '^disagg-operator'; \
	} > $(CONSTRAINTS).new && mv $(CONSTRAINTS).new $(CONSTRAINTS)
	@echo "wrote $(CONSTRAINTS); run 'make test' before committing it"

prereqs: ## check Go, prometheus, chromium, Python venv support and checkov; install what is missing
	@PYTHON="$(BASE_PYTHON)" $(HACK)/prereqs.sh test

routers: ## install the pinned P/D routers (vllm-router, sglang-router) from PyPI (cached)
	$(HACK)/routers.sh >/dev/null

loadgen: ## install the pinned load generator (aiperf) from PyPI into its own venv (cached)
	$(HACK)/loadgen.sh >/dev/null

checkov: ## install the pinned checkov policy scanner into its own cached venv (hack/checkov.sh)
	$(HACK)/checkov.sh >/dev/null

tools: ## build kube-apiserver, controller-manager, scheduler, kubectl, etcd, kwok, kwokctl, helm (cached)
	$(HACK)/tools.sh

cluster-up: tools ## start (or reuse) the local cluster with simulated GPU nodes
	$(HACK)/cluster.sh up
	@echo "export KUBECONFIG=$$($(HACK)/cluster.sh kubeconfig)"

cluster-down: ## delete the local cluster (safe when none runs)
	$(HACK)/cluster.sh down

demo: ## the main job: cluster, operator, emulated fleet under load, dashboard
	@PYTHON="$(BASE_PYTHON)" $(HACK)/prereqs.sh demo
	@$(MAKE) --no-print-directory venv tools routers loadgen
	$(HACK)/demo.sh up

demo-down: ## stop the demo and delete its cluster
	$(HACK)/demo.sh down

lint: venv ## ruff
	$(VENV_PY) -m ruff check operator tests hack
	$(VENV_PY) -m ruff format --check operator tests hack

crds: venv ## regenerate the CRD from the API models
	$(VENV)/bin/disagg crds

test: ## all tests: lint, unit, cluster, Prometheus, browser, chart policy scan (missing prerequisites fail)
	@PYTHON="$(BASE_PYTHON)" $(HACK)/prereqs.sh test
	@$(MAKE) --no-print-directory venv tools routers loadgen
	$(VENV_PY) -m ruff check operator tests hack
	$(VENV_PY) -m pytest -q tests

test-unit: venv ## pure tests only (no cluster, Prometheus or browser needed)
	DISAGG_ALLOW_MISSING_PREREQS=1 $(VENV_PY) -m pytest -q tests/unit

bench: venv ## benchmarks (print figures, no pass/fail)
	@for b in $(HACK)/bench/bench_*.py; do echo "== $$b"; $(VENV_PY) $$b; done
