"""Modules an agent's libraries import but an agent does not use: deferred by
:func:`defer_unused` before the agent's code is imported, their code runs only if something
reads a name of them (issue 15: an idle agent as shipped in <= 30 MB). Each one's saving was
measured on an idle agent (benchmarks/idle_cost.py, Python 3.11, websockets 17); a module used
after all just loads then, as it would have at its import.
"""

from __future__ import annotations

from ravenproxy import lazymodule

UNUSED: dict[str, str] = {
    "importlib.metadata": "websockets.version reads its own version from the package metadata "
    "in a development checkout of websockets only; with it come email.message, zipfile, csv, "
    "importlib.resources (~0.8 MB)",
    "email.utils": "websockets.server (the server side's Date header): email's charset and "
    "header encoders, calendar and quopri come with it (~0.3 MB)",
    "uuid": "websockets.protocol, for an id per connection that only websockets' own "
    "connection classes read (the agent's client protocol is made without it: "
    "ravenproxy.transport.ws_client.client_protocol); uuid imports platform (~0.28 MB)",
    "stringprep": "the idna codec (host names given to getaddrinfo) for non-ASCII labels "
    "only (~0.1 MB)",
    "bz2": "shutil's archive formats (argparse imports shutil for the terminal's width; the "
    "CLI defers these before it builds its parser)",
    "lzma": "shutil's archive formats",
    # Imported by the CLI's own imports: deferred before them (ravenproxy.__main__.main).
    "asyncio.sslproto": "the event loop's TLS over memory BIOs (asyncio.base_events): the "
    "agent runs uvloop, whose TLS is its own, and the tunnel's TLS is on the socket "
    "(ravenproxy.transport.tls_socket) (~0.1 MB)",
    "textwrap": "argparse's help formatting and traceback's exception notes (logging imports "
    "traceback): its regular expressions are compiled at import (~0.2 MB)",
    "tokenize": "linecache's reading of a source file, for a traceback's lines (~0.1 MB)",
    "queue": "concurrent.futures.thread's work queue (uvloop imports it): a default executor "
    "(the --inventory load) loads it",
}
"""Module name: who imports it, and what for."""


def defer_unused() -> None:
    """Defer :data:`UNUSED` (those not imported yet). Called first thing by the entry point
    (before the CLI's imports), then again by the CLI: the second call makes each deferred
    submodule its package's attribute (:func:`ravenproxy.lazymodule.attach`), the package
    being imported by then."""
    for name in UNUSED:
        lazymodule.defer(name)
    lazymodule.attach()
