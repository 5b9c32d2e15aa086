"""The CLI's argument parser: argparse's, with help as wide as the terminal without importing
``shutil`` (an agent's memory), and each command refusing what it does not know under its own
name."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


class HelpFormatter(argparse.HelpFormatter):
    """argparse's, as wide as argparse makes it (``shutil.get_terminal_size``: ``$COLUMNS``,
    else the terminal on stdout, else 80, less 2) without importing ``shutil``: a parser makes
    formatters as it is built, and ``shutil`` (~0.35 MB) was then an agent's for nothing."""

    def __init__(
        self,
        prog: str,
        indent_increment: int = 2,
        max_help_position: int = 24,
        width: int | None = None,
    ) -> None:
        if width is None:
            width = terminal_columns() - 2
        super().__init__(prog, indent_increment, max_help_position, width)


def terminal_columns() -> int:
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class Parser(argparse.ArgumentParser):
    """An argument parser whose help is formatted by :class:`HelpFormatter`; its subcommands'
    parsers are of this class too (``add_subparsers`` makes them of the parent's class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self._has_commands = False

    def add_subparsers(self, **kwargs: Any) -> Any:
        self._has_commands = True
        return super().add_subparsers(**kwargs)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        """A command's parser refuses what it does not know itself, with its own usage and a
        close flag name if there is one, rather than leaving it to the top-level parser
        (``ravenproxy: error: unrecognized arguments`` under the usage of every command)."""
        parsed, extras = super().parse_known_args(args, namespace)
        if extras and not self._has_commands:
            self.error(f"unrecognized arguments: {' '.join(extras)}{self._close_flag(extras)}")
        return parsed, extras

    def _close_flag(self, extras: list[str]) -> str:
        import difflib  # the error path only

        flags = [flag for action in self._actions for flag in action.option_strings]
        for extra in extras:
            if extra.startswith("--"):
                close = difflib.get_close_matches(extra.partition("=")[0], flags, n=1)
                if close:
                    return f" (did you mean {close[0]}?)"
        return ""
