"""ravenproxy.pki — the embedded CA, its certificates and their PEM files, and
``certs init|status|renew``.

The names below are loaded on first use (PEP 562): importing a submodule that needs no
``cryptography`` (``x509info``, ``identity``, ``credentials``, ``issuance``) does not load it
through this package (issue 15: an idle agent never loads it).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ravenproxy.pki.authority import (
        generate_ca,
        is_issued_by,
        issue_client_cert,
        issue_server_cert,
        node_name_from_cert,
        parse_san,
        validate_node_name,
    )
    from ravenproxy.pki.init import InitReport, init_pki
    from ravenproxy.pki.pemfiles import (
        load_cert,
        load_certs,
        load_key,
        write_pem_cert,
        write_pem_key,
    )

_FROM = {
    "InitReport": "ravenproxy.pki.init",
    "init_pki": "ravenproxy.pki.init",
    **{
        name: "ravenproxy.pki.authority"
        for name in (
            "generate_ca",
            "is_issued_by",
            "issue_client_cert",
            "issue_server_cert",
            "node_name_from_cert",
            "parse_san",
            "validate_node_name",
        )
    },
    **{
        name: "ravenproxy.pki.pemfiles"
        for name in ("load_cert", "load_certs", "load_key", "write_pem_cert", "write_pem_key")
    },
}

__all__ = [
    "InitReport",
    "generate_ca",
    "init_pki",
    "is_issued_by",
    "issue_client_cert",
    "issue_server_cert",
    "load_cert",
    "load_certs",
    "load_key",
    "node_name_from_cert",
    "parse_san",
    "validate_node_name",
    "write_pem_cert",
    "write_pem_key",
]


def __getattr__(name: str) -> Any:
    module = _FROM.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
