"""The inventory read in a child (:func:`aload_inventory`, what the agent, server and dns run:
PyYAML never resident in them, issue 15) is what it is in-process (:func:`load_inventory`): the
same model, or the same refusal word for word; a child that crashes is one line, one that
outlives its time is killed and reaped."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ravenproxy.errors import InventoryError
from ravenproxy.model import inventory as inventory_module
from ravenproxy.model.inventory import aload_inventory, load_inventory
from ravenproxy.model.safeyaml import MAX_INVENTORY_BYTES
from tests.unit.model.test_inventory_limits import BAD_EDITS, alias_bomb, nested, node_doc

EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "inventory-example.yaml"


def alias_chain(links: int) -> str:
    """Aliases nesting one another 90 levels at a time: within the composer's depth and alias
    limits, 90 * links levels deep once expanded (pickled in the text's order, each anchor
    before its alias: the child's pickling never recurses through more than one link)."""
    lines = ["kind: Node", "metadata: {name: chained}", "anchors:", "  a0: &a0 " + "[" * 90 + "x"]
    lines[-1] += "]" * 90
    for i in range(1, links):
        lines.append(f"  a{i}: &a{i} " + "[" * 90 + f"*a{i - 1}" + "]" * 90)
    return "\n".join(lines) + "\n"


TEXTS: dict[str, bytes] = {
    "example": EXAMPLE.read_bytes(),
    "nodes": (node_doc(0) + node_doc(1)).encode(),
    "empty": b"",
    "comments": b"# nothing\n---\n",
    "list": b"kind: List\nitems:\n- {kind: Node, metadata: {name: a}}\n- {kind: Other}\n",
    # Values of every type the safe loader makes, where a field reads them and where not.
    "timestamps": b"kind: Node\nmetadata: {name: t, creationTimestamp: 2024-01-02T03:04:05Z}\n",
    "date-as-label": b"kind: Node\nmetadata: {name: t, labels: {a: 2024-01-02}}\n",
    "binary-port": (
        b"kind: Node\nmetadata: {name: b}\n"
        b"status: {daemonEndpoints: {kubeletEndpoint: {Port: !!binary aGk=}}}\n"
    ),
    "set-addresses": b"kind: Node\nmetadata: {name: s}\nstatus: {addresses: !!set {a, b}}\n",
    "float-name": b"kind: Node\nmetadata: {name: 1.5}\n",
    "merge-keys": (
        b"kind: Node\nbase: &b {raven.openyurt.io/gateway: gw}\n"
        b"metadata: {name: m, labels: {<<: *b, x: y}}\n"
    ),
    "alias-chain": alias_chain(40).encode(),
    "alias-bomb": alias_bomb().encode(),
    "deep": nested(10_000).encode(),
    "duplicate": (node_doc(3) + node_doc(3)).encode(),
    "scalar-doc": b"just a string\n",
    "missing-kind": b"metadata: {name: x}\n",
    **{f"bad-{name}": data for name, (data, _) in BAD_EDITS.items()},
}


def reaped(pid: int) -> bool:
    """No such process, not even a zombie: its parent waited for it."""
    return not Path(f"/proc/{pid}").exists()


async def both(path: Path) -> tuple[object, object]:
    """(in-process, in a child): each a model or ``("refused", message)``."""
    results: list[object] = []
    for run in (lambda: asyncio.to_thread(load_inventory, path), lambda: aload_inventory(path)):
        try:
            results.append(await run())
        except InventoryError as exc:
            results.append(("refused", str(exc)))
    return results[0], results[1]


@pytest.mark.parametrize("name", list(TEXTS))
async def test_a_child_reads_what_the_process_reads(tmp_path: Path, name: str) -> None:
    path = tmp_path / "inv.yaml"
    path.write_bytes(TEXTS[name])
    here, child = await both(path)
    assert child == here


async def test_files_refused_before_the_parse_are_refused_alike(tmp_path: Path) -> None:
    over = tmp_path / "over.yaml"
    with over.open("wb") as f:
        f.truncate(MAX_INVENTORY_BYTES + 1)  # sparse: costs no disk
    folder = tmp_path / "folder.yaml"
    folder.mkdir()
    for path in (over, folder, tmp_path / "missing.yaml"):
        here, child = await both(path)
        assert isinstance(here, tuple) and child == here, path


async def test_a_relative_path_is_read_from_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "inv.yaml").write_text(node_doc(7))
    monkeypatch.chdir(tmp_path)
    assert set((await aload_inventory("inv.yaml")).nodes) == {"node-7"}
    with pytest.raises(InventoryError, match=r"^nope\.yaml: cannot read inventory"):
        await aload_inventory("nope.yaml")


async def test_the_child_ignores_modules_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python -m`` puts the working directory first on the path: a ``yaml`` (or another
    ``ravenproxy``) lying there must not be what reads the inventory."""
    for name in ("yaml", "ravenproxy"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(
            f"import sys\nsys.exit('{name} imported from the working directory')\n"
        )
    (tmp_path / "inv.yaml").write_text(node_doc(8))
    monkeypatch.chdir(tmp_path)
    assert set((await aload_inventory(tmp_path / "inv.yaml")).nodes) == {"node-8"}


async def test_a_crashing_child_is_one_line_naming_the_file_and_the_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = tmp_path / "site" / "yaml"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('yaml is broken here')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    path = tmp_path / "inv.yaml"
    path.write_text(node_doc(9))
    with pytest.raises(InventoryError) as caught:
        await aload_inventory(path)
    assert str(caught.value) == (
        f"{path}: inventory reader failed (exit status 1): ImportError: yaml is broken here"
    )


def hanging_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``yaml`` first on the children's path that writes its process id into the file
    returned, then sleeps: a child that hangs."""
    site = tmp_path / "site" / "yaml"
    site.mkdir(parents=True)
    pidfile = tmp_path / "child.pid"
    (site / "__init__.py").write_text(
        f"import os, time\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    return pidfile


async def test_a_child_past_its_time_is_a_refusal_and_is_reaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child that hangs is killed at :data:`TIMEOUT`; the refusal names the file."""
    pidfile = hanging_yaml(tmp_path, monkeypatch)
    monkeypatch.setattr(inventory_module, "TIMEOUT", 2.0)
    path = tmp_path / "inv.yaml"
    path.write_text(node_doc(10))
    with pytest.raises(InventoryError) as caught:
        await aload_inventory(path)
    assert str(caught.value) == f"{path}: inventory reader: no answer within 2s"
    assert reaped(int(pidfile.read_text()))  # killed and waited for


async def test_a_cancelled_load_kills_and_reaps_its_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shutdown while the child reads: it does not outlive the watcher."""
    pidfile = hanging_yaml(tmp_path, monkeypatch)
    path = tmp_path / "inv.yaml"
    path.write_text(node_doc(11))
    task = asyncio.create_task(aload_inventory(path))
    async with asyncio.timeout(30):
        while not pidfile.exists() or not pidfile.read_text():
            await asyncio.sleep(0.02)
    pid = int(pidfile.read_text())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert reaped(pid)
