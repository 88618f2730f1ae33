# gpuinfra: the commands a newcomer and CI run. `make help` lists them.
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
PYTHON ?= python3
LAB ?= lab

.PHONY: help install go-build test test-long unit lint format render demo conformance lab-down clean

help:
	@echo "make install  Debian packages for the lab + .venv with gpuinfra (editable) and dev tools,"
	@echo "              and the cluster's Go programs built from go/ (once per machine)"
	@echo "make demo     the main job: lab up, bootstrap the cluster on it, drift + verify reports"
	@echo "make test     every test: unit, then integration on a lab booted for the run"
	@echo "make test-long  the suites past make test's time, by hand (not in CI): faults"
	@echo "              injected into applies, the Kubernetes upgrade by one minor"
	@echo "make unit     unit tests only (no root, no hosts)"
	@echo "make lint     ruff check and format check"
	@echo "make render   render the sample cluster's files into build/render"
	@echo "make conformance  the whole Kubernetes conformance suite on the demo lab (LAB=name),"
	@echo "              after building e2e.test and its images here (docs/conformance.md)"
	@echo "make lab-down take the demo lab down (LAB=name for another)"
	@echo "make bench    benchmarks on lab hosts into docs/benchmarks (BENCH_SIZES, BENCH_REPEATS)"
	@echo "make bench-quick  the benchmark harness end to end: 10 hosts, one run per engine"

install: $(VENV)/.installed go-build

# The cluster's programs (Kubernetes, CoreDNS, CNI plugins, registry, crane) from the pinned Go
# modules in go/, into /var/cache/gpuinfra/go: built once per machine, a no-op afterwards.
go-build: $(VENV)/.installed
	$(BIN)/python -m lab.gobuild

# Re-run when the dependencies change; the Debian packages are idempotent to install.
$(VENV)/.installed: pyproject.toml scripts/install-debian-packages.sh
	bash scripts/install-debian-packages.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

# Unit and integration tests in separate processes: a unit test that runs the CLI in-process
# installs gevent's monkey patching (cli/__init__.py) for the rest of its process, and under
# it lab teardown's rmtree leaks directory descriptors (about 35 per lab host): a whole
# suite in one process reached the 20,000 open-files limit. The integration tests run as two
# processes side by side (scripts/integration-tests.sh).
test: install
	$(BIN)/pytest tests/unit
	PYTEST=$(BIN)/pytest bash scripts/integration-tests.sh

# The two suites that do not fit make test's 45 minutes, side by side (scripts/long-tests.sh);
# run by hand on a change's final commit: CI's 90 minutes do not hold both (.ci/run). The
# upgrade builds the newer Kubernetes release first (about 10 minutes once per machine).
test-long: install
	PYTEST=$(BIN)/pytest bash scripts/long-tests.sh

unit: install
	$(BIN)/pytest tests/unit

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

render: install
	$(BIN)/gpuinfra render inventory/sample --out build/render

# The main job on the embedded default: boot the 16-host lab, converge it (Kubernetes built
# here included), then the CI checks (drift: exit 0 when every host matches the inventory;
# verify: every behaviour check passes) with their JSON and JUnit reports, and the cluster's
# nodes, all Ready, through the operator's kubeconfig.
demo: install
	$(BIN)/gpuinfra lab up --name $(LAB) --inventory inventory/$(LAB)/cluster.yml
	$(BIN)/gpuinfra apply inventory/$(LAB) --yes --report build/demo/apply.json
	$(BIN)/gpuinfra drift inventory/$(LAB) --report build/demo/drift.json --junit build/demo/drift.xml
	$(BIN)/gpuinfra verify inventory/$(LAB) --junit build/demo/verify.xml
	$$($(BIN)/python -m lab.gobuild kubectl) --kubeconfig inventory/$(LAB)/.state/kubernetes/admin.conf \
		wait --for=condition=Ready nodes --all --timeout=300s
	$$($(BIN)/python -m lab.gobuild kubectl) --kubeconfig inventory/$(LAB)/.state/kubernetes/admin.conf \
		get nodes -o wide

# The upstream conformance suite, opt-in: go/conformance-<minor> built once per machine (the
# heaviest Go build here), its images pushed to the lab registry, then every [Conformance]
# test against the lab that `make demo` converged. Results in inventory/$(LAB)/.state/conformance.
# The suite needs two untainted workers. gpu-1 keeps its preflight taint until its GPU checks
# pass, and a lab host has no GPU to pass them: taking the taint off stands in for the gate.
CONFORMANCE_SUBSET ?= all
conformance: install
	$(BIN)/python -m lab.conformance
	$$($(BIN)/python -m lab.gobuild kubectl) --kubeconfig inventory/$(LAB)/.state/kubernetes/admin.conf \
		taint node gpu-1 gpuinfra.io/preflight- 2>/dev/null || true
	$(BIN)/gpuinfra kubernetes conformance inventory/$(LAB) --subset $(CONFORMANCE_SUBSET)

lab-down: install
	$(BIN)/gpuinfra lab down --name $(LAB)

clean:
	rm -rf build .pytest_cache .ruff_cache

# Benchmarks (docs/benchmarks/README.md): one lab at a time, each taken down after its suite.
# BENCH_SIZES="100" reruns one size; results merge into docs/benchmarks/results.json.
BENCH_SIZES ?= 10 50 100 200
BENCH_REPEATS ?= 3
BENCH_SUITES ?= bootstrap,drift,scale,cli
# Simulated nodes of the controlplane suite (BENCH_SUITES=controlplane), grown in this order.
BENCH_CP_SIZES ?= 0 500 1000 2500
BENCH_ARGS ?=
.PHONY: bench bench-quick
bench: install
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	$(BIN)/python -m benchmarks --sizes "$(BENCH_SIZES)" --repeats $(BENCH_REPEATS) --suites $(BENCH_SUITES) \
		--cp-sizes "$(BENCH_CP_SIZES)" $(BENCH_ARGS)

bench-quick: install
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	$(BIN)/python -m benchmarks --quick --out build/bench/quick
