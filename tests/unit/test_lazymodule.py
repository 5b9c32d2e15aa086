"""A deferred module: imported by the real import system, its code runs on the first read of a
name, once, into the module object the import statement handed out. The modules are real
files in a package of the test's own (a unique name on sys.path), which records each run of
their code in a file."""

from __future__ import annotations

import importlib
import sys
import threading
import types
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ravenproxy import lazymodule


class Package:
    """A package ``name`` in ``root`` whose modules append their name to ``runs`` when their
    code runs."""

    def __init__(self, root: Path) -> None:
        self.name = f"lazy_{uuid.uuid4().hex}"
        self.dir = root / self.name
        self.dir.mkdir()
        (self.dir / "__init__.py").write_text("")
        self.runs = root / "runs.txt"
        self.runs.touch()

    def module(self, name: str, body: str = "") -> str:
        header = f"with open({str(self.runs)!r}, 'a') as _f:\n    _f.write({name!r} + '\\n')\n"
        (self.dir / f"{name}.py").write_text(header + body)
        return f"{self.name}.{name}"

    def ran(self) -> list[str]:
        return self.runs.read_text().split()


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Package]:
    monkeypatch.syspath_prepend(str(tmp_path))
    pkg = Package(tmp_path)
    try:
        yield pkg
    finally:
        for name in [n for n in sys.modules if n == pkg.name or n.startswith(pkg.name + ".")]:
            del sys.modules[name]


def test_import_runs_nothing_and_the_first_read_runs_the_code_once(package: Package) -> None:
    name = package.module("tools", "def double(x):\n    return 2 * x\nSEEN = []\n")
    parent = importlib.import_module(package.name)
    lazymodule.defer(name)
    module = importlib.import_module(name)
    # Both import forms hand out the placeholder without running its code.
    exec(f"import {name}\nfrom {package.name} import tools as alias", {})
    assert parent.tools is module and type(module) is lazymodule.LazyModule
    assert module.__name__ == name and module.__file__ is not None
    assert package.ran() == []

    assert module.double(21) == 42
    assert package.ran() == ["tools"]
    assert type(module) is types.ModuleType
    # The code ran into the object handed out: its functions' globals are that module's.
    assert module.double.__globals__ is module.__dict__
    assert sys.modules[name] is module
    module.SEEN.append(1)
    assert importlib.import_module(name).SEEN == [1]
    assert package.ran() == ["tools"]


def test_stand_ins_are_read_without_a_load_and_replaced_by_the_load(package: Package) -> None:
    name = package.module("real", "def twice(x):\n    return 2 * x\nOTHER = 1\n")
    calls: list[int] = []

    def twice(x: int) -> int:  # answers as the real one, without it
        calls.append(x)
        return 2 * x

    lazymodule.defer(name, {"twice": twice})
    module = importlib.import_module(name)
    held = module.twice  # what a library reads at its import
    assert held(2) == 4 and calls == [2]
    assert package.ran() == [] and type(module) is lazymodule.LazyModule
    assert module.OTHER == 1  # any other name: the code runs, its own function replaces ours
    assert package.ran() == ["real"] and module.twice is not twice
    assert module.twice(3) == 6 and calls == [2]
    assert lazymodule.load(module) is module and package.ran() == ["real"]  # loaded once


def test_load_runs_a_deferred_module_for_a_stand_in_that_needs_it(package: Package) -> None:
    name = package.module("needed", "VALUE = 7\n")
    lazymodule.defer(name, {"value": lambda: lazymodule.load(sys.modules[name]).VALUE})
    module = importlib.import_module(name)
    assert package.ran() == []
    assert module.value() == 7 and package.ran() == ["needed"]


def test_a_name_the_module_lacks_raises_attribute_error_after_the_load(package: Package) -> None:
    name = package.module("plain", "X = 1\n")
    lazymodule.defer(name)
    module = importlib.import_module(name)
    with pytest.raises(AttributeError, match="missing"):
        module.missing  # noqa: B018
    assert package.ran() == ["plain"] and module.X == 1


def test_a_submodule_deferred_before_its_package_is_not_imported_with_it(
    package: Package,
) -> None:
    # The package imports the submodule (as asyncio's __init__ imports sslproto, by way of
    # base_events): deferred first, the package's import runs neither the submodule nor, to
    # find it, the package itself.
    (package.dir / "__init__.py").write_text(
        f"with open({str(package.runs)!r}, 'a') as _f:\n    _f.write('package\\n')\n"
        "from . import user\n"
    )
    package.module("user", "from . import inner\n")
    name = package.module("inner", "VALUE = 3\n")
    lazymodule.defer(name)
    assert package.name not in sys.modules and package.ran() == []
    parent = importlib.import_module(package.name)
    module = sys.modules[name]
    assert type(module) is lazymodule.LazyModule and parent.user.inner is module
    assert package.ran() == ["package", "user"]
    # An import of a module found in sys.modules sets no package attribute: attach() does.
    assert "inner" not in vars(parent)
    lazymodule.attach()
    assert parent.inner is module and package.ran() == ["package", "user"]
    assert module.VALUE == 3 and package.ran() == ["package", "user", "inner"]


def test_imported_or_missing_modules_are_left_alone(package: Package) -> None:
    name = package.module("eager", "Y = 2\n")
    module = importlib.import_module(name)
    lazymodule.defer(name)
    assert sys.modules[name] is module and type(module) is types.ModuleType
    missing = f"{package.name}.nowhere"
    lazymodule.defer(missing)
    assert missing not in sys.modules
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(missing)


def test_code_that_fails_leaves_no_module_behind(package: Package) -> None:
    name = package.module("broken", "raise RuntimeError('broken at load')\n")
    lazymodule.defer(name)
    module = importlib.import_module(name)
    with pytest.raises(RuntimeError, match="broken at load"):
        module.anything  # noqa: B018
    assert name not in sys.modules
    # A later import is a real one again, and fails as the module's code does.
    with pytest.raises(RuntimeError, match="broken at load"):
        importlib.import_module(name)
    assert package.ran() == ["broken", "broken"]


def test_a_deferred_module_read_while_another_loads(package: Package) -> None:
    inner = package.module("inner", "VALUE = 'inner'\n")
    outer = package.module("outer", f"import {inner} as _inner\nVALUE = _inner.VALUE * 2\n")
    lazymodule.defer(inner)
    lazymodule.defer(outer)
    assert importlib.import_module(outer).VALUE == "innerinner"
    assert package.ran() == ["outer", "inner"]


def test_two_threads_reading_at_once_run_the_code_once(package: Package) -> None:
    name = package.module("slow", "import time\ntime.sleep(0.2)\nDONE = True\n")
    lazymodule.defer(name)
    module = importlib.import_module(name)
    seen: list[object] = []
    threads = [threading.Thread(target=lambda: seen.append(module.DONE)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == [True, True]
    assert package.ran() == ["slow"]
