"""ravenproxy.pki — the embedded CA, its certificates, and ``certs init|status|renew``."""

from ravenproxy.pki.authority import (
    generate_ca,
    is_issued_by,
    issue_client_cert,
    issue_server_cert,
    load_cert,
    load_certs,
    load_key,
    node_name_from_cert,
    parse_san,
    validate_node_name,
    write_pem_cert,
    write_pem_key,
)
from ravenproxy.pki.init import InitReport, init_pki

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
