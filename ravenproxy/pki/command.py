"""The CLI adapter of ``ravenproxy certs init|status|renew``: parses, calls :mod:`.init`,
:mod:`.status` and :mod:`.renew`, prints. ``cryptography`` is loaded only when one runs."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ravenproxy.log import add_level_flag


def cmd_certs_init(args: argparse.Namespace) -> int:
    from ravenproxy.pki import init_pki

    report = init_pki(
        Path(args.dir),
        args.server_san or ("localhost", "127.0.0.1"),
        args.agent or (),
    )
    for path in report.created:
        print(f"created {path}")
    for path in report.kept:
        print(f"kept    {path}")
    for warning in report.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return 0


def cmd_certs_status(args: argparse.Namespace) -> int:
    from ravenproxy.pki.status import render_json, render_text, status, warnings_of

    report = status(Path(args.dir), warn_days=args.warn_days)
    print(render_json(report) if args.output == "json" else render_text(report), end="")
    if args.output != "json":
        for warning in warnings_of(report):
            print(f"warning: {warning}", file=sys.stderr)
    return report.exit_code


def cmd_certs_renew(args: argparse.Namespace) -> int:
    from ravenproxy.pki.renew import renew
    from ravenproxy.pki.status import iso_utc, serial_hex

    report = renew(Path(args.dir), within_days=args.within, days=args.days, force=args.force)
    if report.ca_extended is not None:
        old, new = report.ca_extended
        print(
            f"extended {report.directory / 'ca.crt'}: same subject and key, valid until "
            f"{iso_utc(new)} (was {iso_utc(old)}); replace every other copy of it before "
            f"{iso_utc(old)}"
        )
    for r in report.renewed:
        capped = " (capped at the CA's end)" if r.capped else ""
        print(
            f"renewed {r.cert_path}: serial {serial_hex(r.old_serial)} -> "
            f"{serial_hex(r.new_serial)}, valid until {iso_utc(r.not_after)}{capped}"
        )
    for k in report.kept:
        print(f"kept    {k.path}: {k.reason}")
    for warning in report.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return 0


def _days(minimum: float, strict: bool) -> Callable[[str], float]:
    """An argparse type: a number of days (argparse names the flag when it is refused)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of days: {text!r}") from None
        if (
            value != value
            or value in (float("inf"), float("-inf"))
            or (value <= minimum if strict else value < minimum)
        ):
            bound = f"more than {minimum:g}" if strict else f"{minimum:g} or more"
            raise argparse.ArgumentTypeError(f"must be {bound} days, not {text}")
        return value

    return parse


def add_parser(sub: Any) -> None:
    certs = sub.add_parser("certs", help="embedded PKI: init, status, renew")
    certs_sub = certs.add_subparsers(dest="certs_command", metavar="ACTION", required=True)
    init = certs_sub.add_parser(
        "init",
        help="write a CA, a server certificate and agent certificates (keeps what exists)",
    )
    init.add_argument("--dir", default="certs", help="output directory (default: certs)")
    init.add_argument(
        "--server-san",
        action="append",
        metavar="NAME|IP",
        help="subject alternative name of the server certificate (repeatable; "
        "default: localhost and 127.0.0.1)",
    )
    init.add_argument(
        "--agent",
        action="append",
        metavar="NODE",
        help="write NODE.crt/NODE.key for an agent node (repeatable)",
    )
    add_level_flag(init, "INFO")
    init.set_defaults(func=cmd_certs_init)

    status = certs_sub.add_parser(
        "status",
        help="print every certificate of a directory with its expiry (exit 1 if one is due)",
        description="Reads every *.crt of DIR (the layout of certs init, or a --cert-dir: "
        "ca.crt, tls.crt, tls.key) and prints its role, subject, SANs, serial and expiry. "
        "Warns about a key readable by others, a key that does not belong to its certificate "
        "and a certificate not issued by the CA in ca.crt. Exit 0 when every certificate "
        "lasts longer than --warn-days, 1 when one expires within --warn-days or has expired, "
        "2 when DIR or a file in it cannot be read.",
    )
    status.add_argument("--dir", default="certs", help="certificate directory (default: certs)")
    status.add_argument(
        "--warn-days",
        type=_days(0, strict=False),
        default=30,
        metavar="N",
        help="exit 1 when a certificate expires within N days (default 30)",
    )
    status.add_argument(
        "--output", choices=("text", "json"), default="text", help="text or json (default text)"
    )
    add_level_flag(status, "WARNING")
    status.set_defaults(func=cmd_certs_status)

    renew = certs_sub.add_parser(
        "renew",
        help="re-issue, from the CA in the directory, every certificate that expires soon",
        description="Re-issues every server and agent certificate of DIR that expires within "
        "--within days (all of them with --force) from the CA in DIR (ca.crt, ca.key): same "
        "subject, SANs and usages, a new key (0600), written atomically, key first. A CA "
        "that itself expires within --within days is extended first: re-signed with its own "
        "key, same subject (old certificates still verify). A new certificate never outlives "
        "the CA. Prints what it renewed and what it kept. See docs/certificates.md.",
    )
    renew.add_argument("--dir", default="certs", help="certificate directory (default: certs)")
    renew.add_argument(
        "--within",
        type=_days(0, strict=False),
        default=30,
        metavar="DAYS",
        help="renew what expires within DAYS days (default 30)",
    )
    renew.add_argument(
        "--days",
        type=_days(0, strict=True),
        default=365,
        metavar="N",
        help="validity of a renewed certificate, in days (default 365)",
    )
    renew.add_argument(
        "--force", action="store_true", help="renew every server and agent certificate"
    )
    add_level_flag(renew, "WARNING")
    renew.set_defaults(func=cmd_certs_renew)
