# disagg-operator: developer entry points. `make help` lists them.
SHELL := /bin/bash
PYTHON ?= python3
HACK := hack
TOOLS_BIN := $(shell $(HACK)/tools.sh --print)
export PATH := $(TOOLS_BIN):$(PATH)

.PHONY: help install tools cluster-up cluster-down demo demo-down test test-unit test-cluster lint crds bench

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

install: ## install the Python package with its test extras (editable)
	$(PYTHON) -m pip install -q -e '.[test]'

tools: ## build kube-apiserver, controller-manager, scheduler, kubectl, etcd, kwok, kwokctl, helm (cached)
	$(HACK)/tools.sh

cluster-up: tools ## start (or reuse) the local cluster with simulated GPU nodes
	$(HACK)/cluster.sh up
	@echo "export KUBECONFIG=$$($(HACK)/cluster.sh kubeconfig)"

cluster-down: ## delete the local cluster (safe when none runs)
	$(HACK)/cluster.sh down

demo: install tools ## the main job: cluster, operator, emulated fleet under load, dashboard
	$(HACK)/demo.sh up

demo-down: ## stop the demo and delete its cluster
	$(HACK)/demo.sh down

lint: ## ruff
	$(PYTHON) -m ruff check operator tests hack
	$(PYTHON) -m ruff format --check operator tests hack

crds: ## regenerate the CRD from the API models
	disagg crds

test: install tools ## all tests: lint, unit, cluster, Prometheus, browser
	$(PYTHON) -m ruff check operator tests hack
	$(PYTHON) -m pytest -q tests

test-unit: ## pure tests only (no cluster)
	$(PYTHON) -m pytest -q tests/unit

bench: ## benchmarks (print figures, no pass/fail)
	@for b in $(HACK)/bench/bench_*.py; do echo "== $$b"; $(PYTHON) $$b; done
