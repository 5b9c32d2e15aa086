"""review32: the inventory read in a child (:func:`aload_inventory`) tried against the
in-process read (:func:`load_inventory`) beyond test_inventory_child.py: generated inventories
through the child's answer (its pickled pieces, :func:`_answer` / :func:`_model_of_answer`),
texts of every kind through real children, an answer larger than a pipe's buffer, modules
lying in the working directory or on the user's PYTHONPATH, edits landing while a child reads,
and what the merge left different (review32's strict xfails, fixed by childfix: the text read
by the parent and given on the child's stdin, the answer framed, the pickling given the depth
safeyaml's limits allow, a value the constructor cannot build a refusal)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ravenproxy import children
from ravenproxy.errors import InventoryError
from ravenproxy.model import inventory as inventory_module
from ravenproxy.model.inventory import InventoryWatcher, aload_inventory, load_inventory
from ravenproxy.model.snapshot import Model
from ravenproxy.model.store import ModelStore
from tests.helpers import examples
from tests.unit.model.test_inventory_child import both, reaped
from tests.unit.model.test_inventory_limits import large_inventory, node_doc

# --- generated inventories -------------------------------------------------------------------

# Scalars of every type the safe loader makes (and a few it refuses), as YAML text.
SCALARS = st.sampled_from(
    [
        "x",
        "'quoted: yes'",
        '"caf\\u00e9 \\U0001F600"',
        "café",
        "日本",
        "2024-01-02",
        "2024-01-02T03:04:05Z",
        "2024-01-02 03:04:05.123456+05:30",
        "!!binary aGk=",
        "!!binary ''",
        "12345678901234567890123456789012345678901234567890",
        "-0x1F",
        "0o17",
        "1_000",
        "1e400",
        ".nan",
        "-.inf",
        "true",
        "~",
        "null",
        "!!str 1",
        "!!int '7'",
        "!!float '1'",
        "!!set {a, b}",
        "!!omap [{a: 1}, {b: 2}]",
        "!!pairs [{a: 1}, {a: 2}]",
        "!!python/name:os.system",
        "!custom x",
        "!!timestamp 2001-12-14t21:59:43.10-05:00",
        "[]",
        "{}",
        "[1, [2, [3]]]",
    ]
)
NAMES = st.one_of(
    st.from_regex(r"\A[a-z][a-z0-9-]{0,12}\Z"),
    st.sampled_from(["Edge_1", "é", "1.5", "''", "~", "[a]", "{a: b}"]),
)
KINDS = st.sampled_from(["Node", "Gateway", "Pod", "Other", "NodeList", "List"])


@st.composite
def documents(draw: st.DrawFn, anchors: list[str]) -> str:
    """One document's text: a Node, Gateway, Pod, List or other object, with labels whose
    values are any scalar, an alias of an earlier anchor, or a merge of one."""
    kind = draw(KINDS)
    name = draw(NAMES)
    lines = [f"kind: {kind}"] if draw(st.integers(0, 5)) or kind != "Node" else []
    labels = []
    for i in range(draw(st.integers(0, 3))):
        value = draw(SCALARS)
        if anchors and draw(st.booleans()):
            value = f"*{draw(st.sampled_from(anchors))}"
        elif draw(st.integers(0, 3)) == 0:
            anchor = f"a{len(anchors)}"
            anchors.append(anchor)
            value = f"&{anchor} {value}"
        labels.append(f"l{i}: {value}")
    if anchors and draw(st.integers(0, 4)) == 0:
        labels.append(f"<<: {{m: *{draw(st.sampled_from(anchors))}}}")
    if draw(st.integers(0, 5)) == 0 and labels:
        labels.append(labels[0])  # a duplicate key: the last one wins
    lines.append(f"metadata: {{name: {name}, labels: {{{', '.join(labels)}}}}}")
    if kind == "Node" and draw(st.booleans()):
        lines.append("status: {addresses: [{type: InternalIP, address: 10.0.0.1}]}")
    if kind == "Gateway":
        lines.append("spec: {endpoints: [{nodeName: " + draw(NAMES) + ", type: proxy}]}")
    if kind == "Pod":
        lines.append("spec: {nodeName: n}\nstatus: {podIP: 10.1.0.1}")
    if kind.endswith("List"):
        item = st.sampled_from(["{kind: Node, metadata: {name: i}}", "{kind: Pod}", "{}"])
        items = draw(st.lists(item | st.sampled_from(["x", "[]"]), max_size=3))
        lines.append(f"items: [{', '.join(items)}]")
    return "\n".join(lines) + "\n"


@st.composite
def inventories(draw: st.DrawFn) -> bytes:
    # Anchors are a document's own: each starts with none.
    docs = [draw(documents([])) for _ in range(draw(st.integers(0, 4)))]
    text = "---\n".join(docs)
    if draw(st.booleans()):
        text = "# only a comment\n" + text
    if draw(st.integers(0, 5)) == 0:
        text = "\ufeff" + text  # a BOM
    if draw(st.integers(0, 5)) == 0:
        text = text.replace("\n", "\r\n")
    return text.encode()


def outcome(run: object) -> object:
    """A model, or ``("refused", message)``; anything else raised is the test's failure."""
    try:
        return run() if callable(run) else run
    except InventoryError as exc:
        return ("refused", str(exc))


def through_the_answer(path: Path) -> Model:
    """What :func:`aload_inventory` does, without the process: the child's answer
    (:func:`_answer`) read back into a model (:func:`_model_of_answer`)."""
    return inventory_module._model_of_answer(framed(path), path)


def framed(path: Path) -> bytes:
    """The child's output for the file's text (:func:`ravenproxy.model.inventory.main`)."""
    return inventory_module._framed(inventory_module.read_inventory_text(path), str(path))


@settings(
    max_examples=examples(1200),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=inventories())
def test_the_childs_answer_is_the_in_process_model(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "inv.yaml"
    path.write_bytes(data)
    here = outcome(lambda: load_inventory(path))
    assert outcome(lambda: through_the_answer(path)) == here


# One text per shape, through a real child each (a process per text: few of them).
TEXTS: dict[str, bytes] = {
    "non-ascii-names": "kind: Node\nmetadata: {name: nöde, labels: {ключ: 值}}\n".encode(),
    "bom": "\ufeffkind: Node\nmetadata: {name: bom}\n".encode(),
    "crlf": node_doc(1).replace("\n", "\r\n").encode(),
    "nul": b"kind: Node\nmetadata: {name: a\x00b}\n",
    "tab-indent": b"kind: Node\nmetadata:\n\tname: t\n",
    "only-tilde": b"~\n---\n~\n",
    "explicit-end": b"kind: Node\nmetadata: {name: e}\n...\n---\nkind: Other\n",
    "big-int": b"kind: Node\nmetadata: {name: i, labels: {x: " + b"9" * 4000 + b"}}\n",
    "omap-pairs": (
        b"kind: Node\nmetadata: {name: o, labels: !!omap [{a: 1}]}\nx: !!pairs [{a: 1}]\n"
    ),
    "tz-timestamp": b"kind: Node\nmetadata: {name: t, labels: {x: 2001-12-14t21:59:43.10-05:00}}\n",
    "python-tag": b"kind: Node\nmetadata: {name: !!python/object/apply:os.system [true]}\n",
    "local-tag": b"kind: Node\nmetadata: {name: !mine x}\n",
    "merge-list": (
        b"kind: Node\na: &a {x: 1}\nb: &b {y: 2}\nmetadata: {name: m, labels: {<<: [*a, *b]}}\n"
    ),
    "recursive-list": b"&a {kind: List, items: [*a]}\n",
    "node-list": b"kind: NodeList\nitems: [{kind: Node, metadata: {name: n1}}, {kind: Pod}]\n",
    "list-not-a-list": b"kind: List\nitems: {a: 1}\n",
    "undefined-alias": b"kind: Node\nmetadata: {name: *nope}\n",
}


@pytest.mark.parametrize("name", list(TEXTS))
async def test_a_real_child_reads_what_the_process_reads(tmp_path: Path, name: str) -> None:
    path = tmp_path / "inv.yaml"
    path.write_bytes(TEXTS[name])
    here, child = await both(path)
    assert child == here


def deepest_first_chain(links: int) -> str:
    """test_inventory_child's alias chain, but its deepest link also the value of a key met
    first (a duplicate key keeps the first key's place in the mapping): the pickler meets the
    chain from its deep end, 90 * links levels at once. Within every limit of safeyaml."""
    lines = ["kind: Node", "metadata: {name: chained}", "first: 0", "anchors:"]
    lines.append("  a0: &a0 " + "[" * 90 + "x" + "]" * 90)
    for i in range(1, links):
        lines.append(f"  a{i}: &a{i} " + "[" * 90 + f"*a{i - 1}" + "]" * 90)
    lines.append(f"first: *a{links - 1}")
    return "\n".join(lines) + "\n"


async def test_an_alias_chain_met_from_its_deep_end_loads_as_in_process(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(deepest_first_chain(15))
    assert set(load_inventory(path).nodes) == {"chained"}  # in-process: within the limits
    here, child = await both(path)
    assert child == here


@pytest.mark.parametrize(
    "value",
    ["2024-13-45", "2024-02-30 10:00:00", "9" * 5000, "!!bool maybe", "!!timestamp nope"],
    ids=["month", "day", "digits", "bool", "timestamp"],  # the last two: KeyError, AttributeError
)
async def test_a_value_the_constructor_cannot_build_is_one_refusal_both_ways(
    tmp_path: Path, value: str
) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(f"kind: Node\nmetadata: {{name: v, labels: {{x: {value}}}}}\n")
    here, child = await both(path)  # in-process raises ValueError today
    assert isinstance(here, tuple) and child == here
    assert "line 2" in str(here[1])  # where, in one line


async def test_an_answer_larger_than_a_pipe_buffer_comes_whole(tmp_path: Path) -> None:
    """~1 MiB of Nodes: an answer of several pipe buffers (64 KiB each) through the child's
    stdout. (3 MiB said no more, at three times the parse time.)"""
    text, count = large_inventory(2**20)
    path = tmp_path / "inv.yaml"
    path.write_text(text)
    answer = framed(path)
    assert len(answer) > 4 * 65536
    model = await aload_inventory(path)
    assert len(model.nodes) == count
    assert model == load_inventory(path)


def exiting_module(where: Path, name: str, as_package: bool) -> None:
    code = f"import sys\nsys.exit('{name} imported from {where}')\n"
    if as_package:
        (where / name).mkdir(parents=True)
        (where / name / "__init__.py").write_text(code)
    else:
        where.mkdir(parents=True, exist_ok=True)
        (where / f"{name}.py").write_text(code)


async def test_modules_as_files_in_the_working_directory_are_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``yaml.py`` (a module file, not a package) and the child's other imports lying in the
    working directory are not what reads the inventory."""
    cwd = tmp_path / "cwd"
    for name in ("yaml", "_pickle", "io", "logging"):
        exiting_module(cwd, name, as_package=False)
    exiting_module(cwd, "ravenproxy", as_package=True)
    (cwd / "inv.yaml").write_text(node_doc(20))
    monkeypatch.chdir(cwd)
    assert set((await aload_inventory("inv.yaml")).nodes) == {"node-20"}


async def test_a_ravenproxy_on_the_users_pythonpath_is_not_the_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The user's PYTHONPATH is kept, after our own directory: another ``ravenproxy`` on it
    does not read the inventory; the user's own entries still reach the child (a ``yaml``
    there is the one the child imports, as it would be in-process)."""
    site = tmp_path / "site"
    exiting_module(site, "ravenproxy", as_package=True)
    monkeypatch.setenv("PYTHONPATH", f"{site}{os.pathsep}{tmp_path / 'nothing'}")
    path = tmp_path / "inv.yaml"
    path.write_text(node_doc(21))
    assert set((await aload_inventory(path)).nodes) == {"node-21"}
    exiting_module(site, "yaml", as_package=False)
    with pytest.raises(InventoryError, match=r"inventory reader failed \(exit status 1\): yaml"):
        await aload_inventory(path)


# --- edits while a child reads ---------------------------------------------------------------

SLOW_YAML = """\
import os, sys, time
_site = os.path.dirname(os.path.abspath(__file__))
if os.path.exists({mark!r}):
    with open({pids!r}, "a") as f:
        f.write(f"{{os.getpid()}}\\n")
    time.sleep(float(open({mark!r}).read() or 60))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _site]
del sys.modules["yaml"]
import yaml as _real
sys.modules["yaml"] = _real
"""


@contextlib.contextmanager
def slow_children(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Path]]:
    """A ``yaml`` first on the children's path: while the file ``mark`` exists, a child
    records its pid in ``pids`` and sleeps the seconds ``mark`` holds (after it has read the
    inventory's text: the read comes before the import), then reads with the real PyYAML.
    Any child still alive at the end is killed by its pid."""
    site = tmp_path / "slow"
    site.mkdir()
    mark, pids = tmp_path / "slow.mark", tmp_path / "slow.pids"
    (site / "yaml.py").write_text(SLOW_YAML.format(mark=str(mark), pids=str(pids)))
    monkeypatch.setenv("PYTHONPATH", str(site))
    try:
        yield mark, pids
    finally:
        for pid in started(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


def started(pids: Path) -> list[int]:
    try:
        return [int(line) for line in pids.read_text().split()]
    except (OSError, ValueError):
        return []


async def until(check: object, within: float = 30) -> None:
    async with asyncio.timeout(within):
        while not (check() if callable(check) else check):
            await asyncio.sleep(0.02)


def replace(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


async def test_a_file_replaced_or_removed_while_its_child_reads_gives_what_was_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with slow_children(tmp_path, monkeypatch) as (mark, pids):
        path = tmp_path / "inv.yaml"
        path.write_text(node_doc(30))
        mark.write_text("1")
        task = asyncio.create_task(aload_inventory(path))
        await until(lambda: started(pids))
        replace(path, node_doc(31))
        assert set((await task).nodes) == {"node-30"}
        task = asyncio.create_task(aload_inventory(path))
        await until(lambda: len(started(pids)) == 2)
        path.unlink()
        assert set((await task).nodes) == {"node-31"}
        assert all(reaped(pid) for pid in started(pids))


async def test_edits_during_slow_reads_end_with_the_last_edit_never_an_older_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Edits land while the watcher's child reads the one before: the models published go
    forward only, and the last edit is the one in force."""
    with slow_children(tmp_path, monkeypatch) as (mark, pids):
        path = tmp_path / "inv.yaml"
        path.write_text(node_doc(40))
        store = ModelStore()
        published: list[int] = []
        store.subscribe(lambda m: published.append(int(min(m.nodes).split("-")[1])))
        watcher = InventoryWatcher(path, store, interval=0.02)
        await watcher.start()
        mark.write_text("0.4")
        task = asyncio.create_task(watcher.run(), name="test-watch")
        try:
            for i in range(41, 46):
                replace(path, node_doc(i))  # while the child of the edit before reads
                await until(lambda n=i - 40: len(started(pids)) >= n)  # a child is reading
            mark.unlink()
            await until(lambda: published and published[-1] == 45)
            await asyncio.sleep(0.3)  # nothing older comes after it
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert published == sorted(published) and published[-1] == 45, published
        assert set(store.model.nodes) == {"node-45"}
        assert all(reaped(pid) for pid in started(pids))


async def test_a_watcher_cancelled_while_its_child_reads_reaps_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with slow_children(tmp_path, monkeypatch) as (mark, pids):
        path = tmp_path / "inv.yaml"
        path.write_text(node_doc(50))
        store = ModelStore()
        watcher = InventoryWatcher(path, store, interval=0.02)
        await watcher.start()
        mark.write_text("60")
        task = asyncio.create_task(watcher.run(), name="test-watch")
        replace(path, node_doc(51))
        await until(lambda: started(pids))
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled()
        assert all(reaped(pid) for pid in started(pids))
        assert set(store.model.nodes) == {"node-50"}


# --- what the child cannot see, or says besides its answer -----------------------------------


@contextlib.contextmanager
def piped(data: bytes) -> Iterator[str]:
    """``/dev/fd/N`` of a pipe holding ``data`` (what ``--inventory <(kubectl get ...)`` names),
    its ends closed at the end."""
    r, w = os.pipe()
    try:
        os.write(w, data)
        os.close(w)
        w = -1
        yield f"/dev/fd/{r}"
    finally:
        for fd in (r, w):
            if fd >= 0:
                os.close(fd)


async def test_an_inventory_on_an_inherited_descriptor_loads_as_in_process() -> None:
    data = node_doc(60).encode()
    with piped(data) as name:
        here = outcome(lambda: load_inventory(name))
    assert isinstance(here, Model) and set(here.nodes) == {"node-60"}
    with piped(data) as name:
        try:
            child: object = await aload_inventory(name)
        except InventoryError as exc:
            child = ("refused", str(exc))
    assert child == here


def test_an_inventory_on_stdin_is_read_by_a_one_shot_command(tmp_path: Path) -> None:
    """``ravenproxy controller --dry-run --inventory /dev/stdin < nodes.yaml`` (a pipe is
    refused as not a regular file, before and after): the objects of the inventory given on
    stdin, as at 1bb5933."""
    given = tmp_path / "given.yaml"
    given.write_text(
        "kind: Gateway\nmetadata: {name: gw-piped}\n"
        "spec: {endpoints: [{nodeName: node-61, type: proxy}]}\n---\n" + node_doc(61)
    )
    with given.open("rb") as stdin:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "ravenproxy",
                "controller",
                "--dry-run",
                "--inventory",
                "/dev/stdin",
            ],
            stdin=stdin,
            capture_output=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    assert b"gw-piped" in done.stdout, done.stdout


async def test_a_child_that_writes_before_its_answer_still_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("print('hello from sitecustomize')\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    path = tmp_path / "inv.yaml"
    path.write_text(node_doc(62))
    model = await aload_inventory(path)  # the answer is found after what was printed
    assert set(model.nodes) == {"node-62"}


@pytest.mark.parametrize(
    "output",
    [
        b"",
        b"hello",
        inventory_module._TRAILER,
        (10**6).to_bytes(8) + inventory_module._TRAILER,  # longer than the output
        b"\x80\x05garbage" + (9).to_bytes(8) + inventory_module._TRAILER,  # not a pickle
        b"\x80\x05K\x01." + (5).to_bytes(8) + inventory_module._TRAILER,  # 1 document, absent
        b"\x80\x05N." + (4).to_bytes(8) + inventory_module._TRAILER,  # None, not a count
        b"\x80\x05K\x00.K\x00." + (4).to_bytes(8) + inventory_module._TRAILER,  # too short
    ],
    ids=["empty", "noise", "bare-trailer", "too-long", "garbage", "cut", "none", "length"],
)
def test_output_without_a_whole_answer_is_a_one_line_refusal(output: bytes) -> None:
    with pytest.raises(InventoryError) as caught:
        inventory_module._model_of_answer(output, Path("inv.yaml"))
    assert str(caught.value).startswith("inv.yaml: inventory reader: "), caught.value
    assert "\n" not in str(caught.value)


def test_output_after_the_answer_is_a_refusal(tmp_path: Path) -> None:
    """Bytes written after the trailer (an ``atexit`` print): the trailer is not at the end."""
    path = tmp_path / "inv.yaml"
    path.write_text(node_doc(63))
    with pytest.raises(InventoryError, match=r"inventory reader: no answer in its output"):
        inventory_module._model_of_answer(framed(path) + b"bye\n", path)
    assert set(through_the_answer(path).nodes) == {"node-63"}


def test_a_child_whose_parent_is_not_the_one_named_ends_at_once() -> None:
    """The parent died before the child asked to end with it (no signal would come): the
    child sees that its parent is not the one named and ends without running the module."""
    done = subprocess.run(
        [sys.executable, "-P", "-m", "ravenproxy.children", "1", "ravenproxy.model.inventory"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
        check=False,
        env=children._child_env(),  # this ravenproxy, as run_module runs it
    )
    assert done.returncode == 1
    assert done.stderr.strip() == b"ravenproxy.model.inventory: the parent process 1 has ended"
    assert done.stdout == b""
