"""Hostile or broken inventories cost a one-line refusal: size, encoding, depth, alias bombs.

And the watcher that reloads them keeps the last good model, keeps watching, and parses off the
event loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

import pytest

from ravenproxy.errors import InventoryError
from ravenproxy.model import (
    InventoryWatcher,
    ModelStore,
    load_inventory,
    parse_inventory,
    quote,
    safeyaml,
)
from ravenproxy.model import inventory as inventory_module
from ravenproxy.model.safeyaml import MAX_ALIAS_NODES, MAX_DEPTH, MAX_INVENTORY_BYTES

NODE = """\
---
apiVersion: v1
kind: Node
metadata:
  name: {name}
  labels: {{raven.openyurt.io/gateway: gw, kubernetes.io/hostname: {name}}}
spec: {{podCIDR: 10.{a}.{b}.0/24}}
status:
  addresses:
  - {{type: InternalIP, address: 10.1.{a}.{b}}}
  - {{type: Hostname, address: {name}}}
  daemonEndpoints: {{kubeletEndpoint: {{Port: 10250}}}}
  conditions:
  - {{type: MemoryPressure, status: "False", reason: KubeletHasSufficientMemory}}
  - {{type: Ready, status: "True", reason: KubeletReady, message: kubelet is posting ready status}}
"""


def node_doc(i: int) -> str:
    return NODE.format(name=f"node-{i}", a=i // 250 % 250, b=i % 250)


def large_inventory(size: int) -> tuple[str, int]:
    parts: list[str] = []
    total = 0
    while total < size:
        parts.append(node_doc(len(parts)))
        total += len(parts[-1])
    return "".join(parts), len(parts)


def alias_bomb(levels: int = 9) -> str:
    lines = ["kind: Node", "anchors:", '  l0: &l0 ["lol"' + ',"lol"' * 8 + "]"]
    for i in range(1, levels):
        lines.append(f"  l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]")
    lines += ["metadata:", "  name: bomb", f"  labels: {{x: *l{levels - 1}}}"]
    return "\n".join(lines) + "\n"


def nested(depth: int) -> str:
    return "kind: Node\nmetadata: {name: deep}\nspec: {x: " + "[" * depth + "]" * depth + "}\n"


def _rewrite(path: Path, data: bytes) -> None:
    """Replace the file (new inode), so the watcher's stamp sees every edit."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


# -- refusals ----------------------------------------------------------------------------------
def test_libyaml_does_the_scanning() -> None:
    # Without it a 6 MB inventory takes ~15 s of CPU instead of ~2 s (still off the loop).
    assert safeyaml.LIBYAML


def test_non_utf8_is_refused_naming_the_byte(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_bytes(node_doc(0).encode() + b"# caf\xe9\n")
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    message = str(info.value)
    assert message.startswith(f"{path}: not UTF-8 text: byte 0xe9 at offset")
    assert "\n" not in message


def test_an_oversize_file_is_refused_without_reading_it(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    with path.open("wb") as f:
        f.truncate(MAX_INVENTORY_BYTES + 1)  # sparse: costs no disk
    with pytest.raises(InventoryError, match=r"larger than the limit of 16 MiB \(16777217 bytes\)"):
        load_inventory(path)
    with pytest.raises(InventoryError, match="larger than the limit"):
        parse_inventory(" " * (MAX_INVENTORY_BYTES + 1))


def test_a_file_at_the_limit_is_read(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    head = node_doc(0).encode()
    path.write_bytes(head + b"#" * (MAX_INVENTORY_BYTES - len(head) - 1) + b"\n")
    assert set(load_inventory(path).nodes) == {"node-0"}


def test_deep_nesting_is_refused_in_one_line() -> None:
    started = time.monotonic()
    with pytest.raises(InventoryError) as info:
        parse_inventory(nested(10_000), origin="inv.yaml")
    assert time.monotonic() - started < 5
    assert str(info.value) == f"inv.yaml: line 3: nested deeper than {MAX_DEPTH} levels"
    # Deep but sane nesting (managedFields reach ~15 levels) still loads.
    assert set(parse_inventory(nested(MAX_DEPTH - 5)).nodes) == {"deep"}


def test_an_alias_bomb_is_refused_before_it_expands() -> None:
    text = alias_bomb()
    assert len(text) < 1000
    started = time.monotonic()
    with pytest.raises(InventoryError) as info:
        parse_inventory(text, origin="inv.yaml")
    assert time.monotonic() - started < 5
    message = str(info.value)
    assert f"aliases expand to more than {MAX_ALIAS_NODES} nodes" in message
    assert message.startswith("inv.yaml: line ") and "\n" not in message


def test_modest_aliases_and_merge_keys_still_load() -> None:
    text = """\
kind: Node
defaults: &labels {raven.openyurt.io/gateway: gw, zone: a}
metadata:
  name: n1
  labels: {<<: *labels, role: edge}
status:
  addresses: &addr [{type: InternalIP, address: 10.0.0.1}]
---
kind: Node
defaults: &labels {raven.openyurt.io/gateway: gw}
metadata: {name: n2, labels: *labels}
"""
    model = parse_inventory(text)
    assert model.nodes["n1"].labels == {
        "raven.openyurt.io/gateway": "gw",
        "zone": "a",
        "role": "edge",
    }
    assert model.nodes["n1"].internal_ip == "10.0.0.1"
    assert model.nodes["n2"].gateway == "gw"


def test_anchors_do_not_carry_over_between_documents() -> None:
    with pytest.raises(
        InventoryError, match="not valid YAML: line 4 column 11: found undefined alias 'm'"
    ):
        parse_inventory("kind: Node\nmetadata: &m {name: a}\n---\nmetadata: *m\n")


@pytest.mark.parametrize(
    "text",
    [
        # Within the alias budget, a shared graph of 9**4 leaves reaches a field check.
        alias_bomb(4),
        "kind: Node\nmetadata: {name: n, labels: {x: [" + "1," * 200_000 + "1]}}\n",
        "kind: Node\nmetadata: {name: n}\nstatus: {daemonEndpoints: {kubeletEndpoint: "
        "{Port: " + "x" * 1_000_000 + "}}}\n",
        "kind: Node\nmetadata: {name: " + "n" * 1_000_000 + ", labels: [1]}\n",
    ],
    ids=["aliased-value", "long-list", "long-string", "long-name"],
)
def test_errors_quote_values_briefly(text: str) -> None:
    with pytest.raises(InventoryError) as info:
        parse_inventory(text, origin="inv.yaml")
    message = str(info.value)
    assert message.startswith("inv.yaml: ")
    assert len(message) <= 400 and "\n" not in message, message[:500]


def test_yaml_syntax_errors_are_one_line() -> None:
    with pytest.raises(InventoryError) as info:
        parse_inventory("kind: Node\nmetadata: {name: [\n", origin="inv.yaml")
    message = str(info.value)
    assert message.startswith("inv.yaml: not valid YAML: line ")
    assert "\n" not in message


def test_brief_is_bounded_for_huge_shared_graphs() -> None:
    value: list[object] = ["x"]
    for _ in range(40):  # 2**40 leaves if walked in full
        value = [value, value]
    assert len(quote.brief(value)) <= 60
    text = quote.brief("a" * 10_000)
    assert len(text) <= 60 and "..." in text


# -- the watcher -------------------------------------------------------------------------------
BAD_EDITS = {
    "non-utf8": (b"kind: Node\nmetadata: {name: b}\n# caf\xe9\n", "not UTF-8 text"),
    "deep": (nested(10_000).encode(), "nested deeper than"),
    "alias-bomb": (alias_bomb().encode(), "aliases expand to more than"),
    "broken": (b"kind: Node\nmetadata: {name: [\n", "not valid YAML"),
}


def test_watcher_logs_each_refused_edit_and_keeps_the_last_good_model(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "inv.yaml"
    _rewrite(path, node_doc(0).encode())
    store = ModelStore()
    watcher = InventoryWatcher(path, store)
    good = watcher.load_initial()
    for name, (data, reason) in BAD_EDITS.items():
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="ravenproxy.model.inventory"):
            _rewrite(path, data)
            assert watcher.check() is False, name
        (record,) = caplog.records
        assert record.getMessage() == "inventory edit refused, keeping the last good model"
        fields = record.fields  # type: ignore[attr-defined]
        assert fields["path"] == path and reason in fields["reason"], (name, fields)
        assert not str(fields["reason"]).startswith(str(path))  # the path is its own field
        assert store.model is good, name
    assert watcher.refused == len(BAD_EDITS)
    _rewrite(path, node_doc(1).encode())
    assert watcher.check() is True
    assert set(store.model.nodes) == {"node-1"}


async def test_watcher_run_survives_every_bad_edit(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    _rewrite(path, node_doc(0).encode())
    store = ModelStore()
    watcher = InventoryWatcher(path, store, interval=0.01)
    await watcher.start()
    task = asyncio.create_task(watcher.run())
    try:
        for refused, (data, _) in enumerate(BAD_EDITS.values(), 1):
            _rewrite(path, data)
            async with asyncio.timeout(10):
                while watcher.refused < refused:
                    await asyncio.sleep(0.01)
            assert not task.done()
        since = store.version
        _rewrite(path, node_doc(2).encode())
        model = await asyncio.wait_for(store.wait_changed(since), 10)
        assert set(model.nodes) == {"node-2"}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_watcher_run_outlives_an_unexpected_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The safety net behind the refusals: a bug in one reload is logged, the watch goes on."""
    path = tmp_path / "inv.yaml"
    _rewrite(path, node_doc(0).encode())
    store = ModelStore()
    watcher = InventoryWatcher(path, store, interval=0.01)
    watcher.load_initial()
    real = inventory_module.model_of  # the reload's own step (the YAML is read in a child)
    calls = 0

    def flaky(docs: list[object], origin: str) -> object:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ValueError("a bug")
        return real(docs, origin)

    monkeypatch.setattr(inventory_module, "model_of", flaky)
    task = asyncio.create_task(watcher.run())
    try:
        since = store.version
        _rewrite(path, node_doc(3).encode())
        async with asyncio.timeout(10):
            while calls < 1:
                await asyncio.sleep(0.01)
        _rewrite(path, node_doc(4).encode())
        model = await asyncio.wait_for(store.wait_changed(since), 10)
        assert set(model.nodes) == {"node-4"}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert any(
        r.getMessage() == "inventory reload failed, keeping the last good model"
        for r in caplog.records
    )


async def test_a_large_reload_does_not_block_the_event_loop(tmp_path: Path) -> None:
    """A multi-megabyte inventory took seconds of CPU on the loop (agents' PINGs went
    unanswered); now its YAML is read in a child and its model built in a worker thread, and a
    ticker keeps its pace."""
    path = tmp_path / "inv.yaml"
    _rewrite(path, node_doc(0).encode())
    store = ModelStore()
    watcher = InventoryWatcher(path, store, interval=0.02)
    watcher.load_initial()
    text, count = large_inventory(3_000_000)
    loop = asyncio.get_running_loop()
    gaps: list[float] = []

    async def ticker() -> None:
        last = loop.time()
        while True:
            await asyncio.sleep(0.01)
            now = loop.time()
            gaps.append(now - last)
            last = now

    since = store.version
    watch = asyncio.create_task(watcher.run())
    tick = asyncio.create_task(ticker())
    try:
        started = loop.time()
        _rewrite(path, text.encode())
        model = await asyncio.wait_for(store.wait_changed(since), 120)
        took = loop.time() - started
    finally:
        for task in (watch, tick):
            task.cancel()
        await asyncio.gather(watch, tick, return_exceptions=True)
    assert len(model.nodes) == count
    assert len(gaps) > 10  # the load took long enough for the ticker to measure something
    # Parsed on the loop, one gap was the whole load (seconds). In a worker thread the loop
    # keeps ticking; a loaded machine (GIL, other processes: it flaked at took/3 with eight
    # busy processes on two cores) stretches single ticks, so the bound is relative to the
    # load's length: no single gap may be most of it.
    assert max(gaps) < 0.6 * took, (took, sorted(gaps)[-5:])
