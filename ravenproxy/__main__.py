"""The process's entry point: ``python -m ravenproxy`` and the ``ravenproxy`` console script.

``ravenproxy agent`` defers the modules an agent never uses
(:func:`ravenproxy.agent.deferred.defer_unused`) before anything else is imported: some of them
come with the CLI's own imports (``asyncio.sslproto`` with asyncio, ``textwrap`` and
``tokenize`` with logging), so deferring them from :func:`ravenproxy.cli.main` would be too
late (issue 15: an idle agent's memory).
"""

import sys


def prepare(argv: list[str]) -> None:
    """What the process does with its arguments ``argv`` before the CLI is imported."""
    if argv[:1] == ["agent"]:
        from ravenproxy.agent.deferred import defer_unused

        defer_unused()


def main() -> int:
    prepare(sys.argv[1:])
    from ravenproxy.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
