"""Thin adapter: the WireGuard device and its peers, through ``ip`` and ``wg``.

The device is kernel WireGuard when the kernel has it, else ``wireguard-go`` (userspace),
started in its own session so that it outlives an agent restart (a restarted agent finds the
device and its peers in place and changes nothing); its pid is kept next to the key.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from ravenproxy.l3 import wireguard
from ravenproxy.l3.commands import in_netns, run
from ravenproxy.l3.errors import ApplyError
from ravenproxy.l3.plan import Op
from ravenproxy.l3.settings import L3Settings
from ravenproxy.l3.state import NodeState, VpnConnection
from ravenproxy.log import kv

log = logging.getLogger(__name__)

DEVICE_WAIT = 5.0


async def _device_exists(ifname: str, netns: str | None) -> bool:
    try:
        await run(["ip", "link", "show", "dev", ifname], netns=netns)
    except ApplyError:
        return False
    return True


async def read_device(settings: L3Settings, netns: str | None) -> wireguard.Device | None:
    ifname = settings.wireguard_interface
    if not await _device_exists(ifname, netns):
        return None
    return wireguard.parse_dump(await run(["wg", "show", ifname, "dump"], netns=netns))


async def read_actual(
    settings: L3Settings, desired: Sequence[VpnConnection], netns: str | None = None
) -> NodeState:
    device = await read_device(settings, netns)
    if device is None:
        return NodeState()
    try:
        private: str | None = wireguard.key_path(settings).read_text().strip()
    except FileNotFoundError:
        private = None
    ours = [c for c in desired if c.kind == "wireguard"]
    return NodeState.of(wireguard.actual_connections(device, private, ours, settings))


async def ensure_device(settings: L3Settings, netns: str | None) -> None:
    """The device exists, is up, listens on our port with our key."""
    ifname = settings.wireguard_interface
    key = wireguard.ensure_private_key(settings)
    if not await _device_exists(ifname, netns):
        try:
            await run(["ip", "link", "add", "dev", ifname, "type", "wireguard"], netns=netns)
            log.info("wireguard device created", extra=kv(dev=ifname, impl="kernel"))
        except ApplyError:
            await _start_wireguard_go(settings, netns)
    device = await read_device(settings, netns)
    if device is None:
        raise ApplyError(f"wireguard {ifname}", "device vanished after creation")
    if device.private_key != key or device.listen_port != settings.vpn_port:
        # wg reads the key from a file: pass the one we keep (0600), never the key on argv.
        argv = ["wg", "set", ifname, "listen-port", str(settings.vpn_port)]
        argv += ["private-key", str(wireguard.key_path(settings))]
        await run(argv, netns=netns)
    await run(["ip", "link", "set", "dev", ifname, "up"], netns=netns)


async def _start_wireguard_go(settings: L3Settings, netns: str | None) -> None:
    await asyncio.to_thread(_spawn_wireguard_go, settings, netns)


def _spawn_wireguard_go(settings: L3Settings, netns: str | None) -> None:
    ifname = settings.wireguard_interface
    env = {**os.environ, "WG_PROCESS_FOREGROUND": "1"}
    log_path = wireguard.pid_path(settings).with_suffix(".log")
    with open(log_path, "ab") as out:
        # Its own session: it is not ours to take down when the agent stops or restarts.
        proc = subprocess.Popen(
            in_netns(["wireguard-go", ifname], netns),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
    wireguard.pid_path(settings).write_text(f"{proc.pid}\n")
    log.info("wireguard device created", extra=kv(dev=ifname, impl="wireguard-go", pid=proc.pid))
    deadline = time.monotonic() + DEVICE_WAIT
    while not os.path.exists(f"/var/run/wireguard/{ifname}.sock"):
        if proc.poll() is not None:
            raise ApplyError(f"wireguard-go {ifname}", f"exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise ApplyError(f"wireguard-go {ifname}", f"no control socket in {DEVICE_WAIT}s")
        time.sleep(0.02)


async def apply(ops: Sequence[Op], settings: L3Settings, netns: str | None = None) -> None:
    mine = [op for op in ops if isinstance(op.obj, VpnConnection)]
    if not mine:
        return
    ifname = settings.wireguard_interface
    if any(op.action != "del" for op in mine):
        await ensure_device(settings, netns)
    elif not await _device_exists(ifname, netns):
        return
    for op in mine:
        conn = op.obj
        assert isinstance(conn, VpnConnection)
        log.info("vpn", extra=kv(op=op.action, conn=conn.name, driver="wireguard"))
        for old in op.old:
            assert isinstance(old, VpnConnection)
            # A peer cannot lose its endpoint in place; a changed key is another peer.
            if old.remote_public_key != conn.remote_public_key or (
                old.remote_addr and not conn.remote_addr
            ):
                await run(wireguard.remove_peer_command(ifname, old.remote_public_key), netns=netns)
        if op.action == "del":
            await run(wireguard.remove_peer_command(ifname, conn.remote_public_key), netns=netns)
        else:
            await run(wireguard.peer_command(ifname, conn, settings), netns=netns)


async def remove_device(settings: L3Settings, netns: str | None = None) -> None:
    """Cleanup: delete the device; stop the wireguard-go we started for it."""
    ifname = settings.wireguard_interface
    if await _device_exists(ifname, netns):
        await run(["ip", "link", "del", "dev", ifname], netns=netns)
    await asyncio.to_thread(_stop_wireguard_go, settings)


def _stop_wireguard_go(settings: L3Settings) -> None:
    pidfile = wireguard.pid_path(settings)
    try:
        pid = int(pidfile.read_text().strip())
    except (FileNotFoundError, ValueError):
        return
    with contextlib.suppress(OSError):
        # Only if that pid is still our wireguard-go (pids are reused).
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if b"wireguard-go" in cmdline[0] and settings.wireguard_interface.encode() in cmdline:
            os.kill(pid, signal.SIGTERM)
    pidfile.unlink(missing_ok=True)
