"""The VPN daemons of a lab gateway, as the e2e tests run them: charon (strongSwan with the
kernel-libipsec plugin: userspace ESP over a TUN device, so no kernel ESP is needed) with its
own ``strongswan.conf``, VICI socket and private ``/run``; wireguard-go is started by the route
driver itself and stopped here by the PID file it keeps next to the key.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from ravenproxy.l3 import wireguard
from ravenproxy.l3.settings import L3Settings

CHARON = "/usr/lib/ipsec/charon"

CHARON_CONF = """\
charon {{
  load = random nonce aes sha1 sha2 hmac kdf pem pkcs1 x509 pubkey openssl gmp curve25519 \
kernel-libipsec kernel-netlink socket-default vici
  install_routes = {install_routes}
  port = 500
  port_nat_t = 4500
  retransmit_tries = 3
  retransmit_timeout = 1.0
  plugins {{
    vici {{
      socket = unix://{dir}/charon.vici
    }}
  }}
  filelog {{
    log {{
      path = {dir}/charon.log
      default = 1
      flush_line = yes
    }}
  }}
}}
"""


def write_charon_conf(d: Path, install_routes: bool = True) -> Path:
    """``d/strongswan.conf`` for a charon whose VICI socket is ``d/charon.vici``."""
    d.mkdir(exist_ok=True)
    conf = d / "strongswan.conf"
    conf.write_text(CHARON_CONF.format(dir=d, install_routes="yes" if install_routes else "no"))
    return conf


def charon_argv() -> list[str]:
    """charon's pidfile path is fixed (/var/run/charon.pid): each instance gets a private /run
    (``ip netns exec`` gives each command its own mount namespace)."""
    return ["sh", "-c", f"mount -t tmpfs tmpfs /run && exec {CHARON}"]


def stop_wireguard_go(settings: L3Settings) -> bool:
    """Kill the wireguard-go the driver started for ``settings`` and remove its control socket
    (wireguard-go's sockets share one host-wide directory); whether one was running."""
    killed = False
    with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
        pid = int(wireguard.pid_path(settings).read_text())
        if b"wireguard-go" in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.kill(pid, signal.SIGKILL)
            killed = True
    with contextlib.suppress(FileNotFoundError):
        Path(f"/var/run/wireguard/{settings.wireguard_interface}.sock").unlink()
    return killed
