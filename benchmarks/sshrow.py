"""The ``ssh -R`` rows' private sshd and forward commands, one definition for throughput.py,
latency.py and idle_cost.py (each starts the processes its own way: asyncio or Popen).

The forward runs a session by default: ``ssh -T -R ... 'exec tail --pid=$PPID -f /dev/null'``.
sshd sets TCP_NODELAY on its end of the connection only when a session starts
(``ssh_packet_set_interactive``, OpenSSH 9.2p1), so under ``ssh -N`` (no session) its writes to
the client are Nagle'd: a small one (the forwarded channels' window adjusts) then waits for the
client's delayed ACK, 40-85 ms (benchmarks/README.md, "The ssh -N stall"). ``session=False``
keeps the ``-N`` form, for the rows that show the difference (``--ssh-n``)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from ravenproxy.demo import free_port

SSHD = "/usr/sbin/sshd"
SSH_CIPHERS = (
    ("aes128-gcm", "aes128-gcm@openssh.com"),
    ("chacha20-poly1305", "chacha20-poly1305@openssh.com"),
)
# The session's remote command: it lasts as long as its connection (tail polls the session's
# sshd once a second; a plain ``sleep`` outlived the connection).
SSH_SESSION = "exec tail --pid=$PPID -f /dev/null"


def describe(session: bool) -> str:
    """What a row's ``ssh`` runs, for the JSON reports."""
    if session:
        return f"ssh -T -R ... '{SSH_SESSION}' (a session: TCP_NODELAY at both ends)"
    return "ssh -N -T -R ... (no session: sshd's writes Nagle'd)"


def ssh_files(base: Path) -> tuple[Path, int, str]:
    """Host and client keys, authorized_keys and sshd_config in ``base/ssh``; returns
    (that directory, the sshd port, the OpenSSH version). Raises RuntimeError when sshd or
    ssh is not installed."""
    if not os.access(SSHD, os.X_OK) or shutil.which("ssh") is None:
        raise RuntimeError(f"{SSHD} or ssh not installed")
    d = base / "ssh"
    d.mkdir()
    for name in ("host_key", "client_key"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)],
            check=True,
            capture_output=True,
        )
    shutil.copy(d / "client_key.pub", d / "authorized_keys")
    port = free_port()
    ciphers = ",".join(c for _, c in SSH_CIPHERS)
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'host_key'}\n"
        f"PidFile {d / 'sshd.pid'}\nAuthorizedKeysFile {d / 'authorized_keys'}\n"
        "UsePAM no\nStrictModes no\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nPubkeyAuthentication yes\n"
        "PermitRootLogin prohibit-password\nAllowTcpForwarding yes\nGatewayPorts no\n"
        f"Ciphers {ciphers}\nLogLevel ERROR\n"
    )
    version = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
    return d, port, version


def sshd_attempts(d: Path) -> list[tuple[str, list[str]]]:
    """The ways to start sshd with ``d``'s config, in order, each with its name: plain, then
    (Debian's sshd needs /run/sshd for privilege separation) with a private /run."""
    plain = [SSHD, "-D", "-e", "-f", str(d / "sshd_config")]
    private_run = "mount -t tmpfs tmpfs /run && mkdir -p /run/sshd && exec " + " ".join(plain)
    return [
        ("plain", plain),
        ("unshare -m, private /run", ["unshare", "-m", "sh", "-c", private_run]),
    ]


def forward_argv(
    sshd_port: int, key: Path, cipher: str, rport: int, target_port: int, session: bool = True
) -> list[str]:
    """``ssh -R 127.0.0.1:rport:127.0.0.1:target_port`` to the private sshd: with a session
    (the remote command :data:`SSH_SESSION`), or ``-N`` when not ``session``."""
    return [
        "ssh", "-F", "/dev/null", *([] if session else ["-N"]), "-T",
        "-R", f"127.0.0.1:{rport}:127.0.0.1:{target_port}",
        "-p", str(sshd_port), "-i", str(key), "-c", cipher,
        "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
        "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "Compression=no",
        "-o", "ExitOnForwardFailure=yes", "-o", "LogLevel=ERROR",
        f"{os.environ.get('USER') or 'root'}@127.0.0.1",
        *([SSH_SESSION] if session else []),
    ]  # fmt: skip
