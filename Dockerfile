# syntax=docker/dockerfile:1
# The ravenproxy image (README "Container image"): build it with `make image`.
#
# Stage 1 installs the hashed runtime lock (requirements.lock) into a venv and adds the project as a
# wheel built with the locked setuptools; stage 2 is a slim Python runtime of the same version with
# that venv and the system tools the L3 route driver runs. Processes run as the non-root user
# `ravenproxy` (uid 10001): the controller, the L7 server and agent, `ravenproxy dns`. Only the L3
# route driver (`ravenproxy routes`, `ravenproxy doctor`) and the charon sidecar need root with NET_ADMIN and NET_RAW: the
# pod spec sets runAsUser: 0 for those containers alone.

ARG PYTHON_VERSION=3.11
ARG DEBIAN_RELEASE=bookworm

FROM python:${PYTHON_VERSION}-slim-${DEBIAN_RELEASE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY requirements.lock ./
# Exact versions, every file checked against its hash; wheels only, so no compiler is needed.
RUN python -m venv /opt/ravenproxy \
 && /opt/ravenproxy/bin/pip install --require-hashes --only-binary=:all: -r requirements.lock
COPY pyproject.toml README.md ./
COPY ravenproxy ./ravenproxy
# The label's version must be the package's: `make image` passes it from pyproject.toml.
ARG VERSION
RUN v="$(python -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')" \
 && if [ "$v" != "$VERSION" ]; then echo "build-arg VERSION=$VERSION but pyproject.toml says $v" >&2; exit 1; fi \
 && /opt/ravenproxy/bin/pip wheel --no-deps --no-build-isolation -w /wheels . \
 && /opt/ravenproxy/bin/pip install --no-deps /wheels/ravenproxy-*.whl \
 && /opt/ravenproxy/bin/pip uninstall -y setuptools

FROM python:${PYTHON_VERSION}-slim-${DEBIAN_RELEASE}
ARG VERSION
ARG SOURCE=""
ARG REVISION=""
LABEL org.opencontainers.image.title="ravenproxy" \
      org.opencontainers.image.description="Cloud-edge networking for Kubernetes clusters whose edge nodes sit behind NAT" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"

# What `ravenproxy routes` runs (ravenproxy/l3): ip (iproute2), iptables-/ip6tables-save/-restore
# (iptables), ipset, conntrack, wg (wireguard-tools) and wireguard-go; for the strongSwan VPN
# driver, charon with the kernel-libipsec plugin (libcharon-extra-plugins) and swanctl — the same
# Debian packages the tests drive (Makefile APT_PACKAGES).
# Debian's stable packages, not pinned to a version: a pin would break the build at the next
# security update of the release (hadolint DL3008).
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      iproute2 iptables ipset conntrack \
      wireguard-tools wireguard-go \
      strongswan-swanctl strongswan-charon strongswan-libcharon libcharon-extra-plugins \
      libstrongswan-standard-plugins libstrongswan-extra-plugins \
 && rm -rf /var/lib/apt/lists/*

RUN groupadd --system --gid 10001 ravenproxy \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/ravenproxy --create-home \
      --shell /usr/sbin/nologin ravenproxy
# The base image's standard library comes without bytecode, and PYTHONDONTWRITEBYTECODE (and a
# user who may not write there) keep it uncached: every process compiled each module it imports
# at every start. Compiled once here: an idle agent is ~2.7 MB smaller (issue 15; the compiler's
# leftovers stayed in its heap) and starts faster. The venv's packages were compiled by pip.
ARG PYTHON_VERSION
RUN python -m compileall -q -j 0 "/usr/local/lib/python${PYTHON_VERSION}"
COPY --from=build /opt/ravenproxy /opt/ravenproxy
ENV PATH=/opt/ravenproxy/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /var/lib/ravenproxy
USER 10001:10001
ENTRYPOINT ["ravenproxy"]
CMD ["--help"]
