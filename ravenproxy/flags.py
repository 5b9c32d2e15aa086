"""Settings declared once: a dataclass field's metadata is its flag.

Each setting is a field of a frozen settings dataclass whose default is *the* default, and
whose metadata (:func:`setting`, or a plain dict in the lower layers that import nothing from
here) names its flag, help text and metavar. From that one declaration come:

- the argparse flag, its help ending in ``(default X)`` with the real default (:func:`add_flags`);
- the ``--config`` keys, the flag names in ``snake_case`` (:func:`gather`);
- the checks of a value from either source, errors naming the flag (:func:`read`);
- the usual command line read without argparse (:func:`plain_values`).

A field holding a nested settings object (the tunnel's ``SessionConfig``, the L3 driver's
``L3Settings``) lends some or all of that object's declared settings to the command with
``metadata={"options": ("ping_interval", ...)}`` (or ``"*"``); their defaults stay where they
are declared.

Kinds (from the field's type unless ``kind`` is given): ``number`` (float > 0), ``count``
(int > 0), ``duration`` (seconds, or with a unit s/m/h/d), ``address`` (``H:P``), ``switch`` (a
flag without value), ``list`` (repeatable), ``ports`` (repeatable port), ``file`` (an existing
file), ``choice`` and ``text``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ravenproxy import config as cfg
from ravenproxy.errors import ConfigError

if TYPE_CHECKING:
    import argparse

_MISSING: Any = dataclasses.MISSING


def setting(
    default: Any = _MISSING,
    flag: str = "",
    metavar: str | None = None,
    help: str = "",
    **extra: Any,
) -> Any:
    """A dataclass field declared as a setting: ``default`` (omitted: required), its flag and
    help; ``extra``: ``kind``, ``key`` (the ``--config`` key and argparse dest when it is not the
    flag's name in ``snake_case``), ``default_text`` (how the default is shown), ``choices``."""
    meta = {"flag": flag, "metavar": metavar, "help": help, **extra}
    return dataclasses.field(default=default, metadata=meta)


@dataclass(frozen=True)
class Option:
    """One setting as a command sees it."""

    path: tuple[str, ...]
    """Attribute path from the command's settings class (``("session", "ping_interval")``)."""
    flag: str
    key: str
    help: str
    metavar: str | None
    kind: str
    default: Any
    default_text: str | None = None
    choices: tuple[str, ...] | None = None

    @property
    def shown_default(self) -> str | None:
        """The default as ``--help`` shows it; None when there is nothing to show."""
        if self.default_text is not None:
            return self.default_text
        if self.kind == "switch" or self.default in (_MISSING, None, (), ""):
            return None
        return show(self.default)

    @property
    def full_help(self) -> str:
        shown = self.shown_default
        text = f"{self.help} (default {shown})" if shown is not None else self.help
        return text.replace("%", "%%")  # argparse %-formats help


def show(value: Any) -> str:
    """A default as written in help: whole floats without ``.0`` (hours of seconds also in
    hours), whole MiB of bytes also in MiB, addresses as ``H:P``."""
    if isinstance(value, float) and value.is_integer():
        seconds = int(value)
        hours = seconds > 0 and seconds % 3600 == 0
        return f"{seconds}: {seconds // 3600} h" if hours else str(seconds)
    if (
        isinstance(value, int)
        and not isinstance(value, bool)
        and value > 0
        and value % (1 << 20) == 0
    ):
        return f"{value}: {value >> 20} MiB"
    return str(value)


def _bare(hint: Any) -> Any:
    """``X`` of ``X | None``; any other type as it is."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


def _kind(hint: Any) -> str:
    base = _bare(hint)
    if base is bool:
        return "switch"
    if base is float:
        return "number"
    if base is int:
        return "count"
    if base is cfg.Address:
        return "address"
    if typing.get_origin(base) is tuple:
        return "ports" if typing.get_args(base)[0] is int else "list"
    return "text"


def options(cls: type) -> list[Option]:
    """Every setting a settings class declares, nested ones it lends included, in order."""
    return list(_options(cls, ()))


def _options(cls: type, prefix: tuple[str, ...]) -> Iterator[Option]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        meta = f.metadata
        path = (*prefix, f.name)
        if meta.get("flag"):
            default = f.default
            if default is _MISSING and f.default_factory is not _MISSING:
                default = None  # an object built from the options it lends
            yield Option(
                path=path,
                flag=meta["flag"],
                key=meta.get("key") or meta["flag"].removeprefix("--").replace("-", "_"),
                help=meta.get("help", ""),
                metavar=meta.get("metavar"),
                kind=meta.get("kind") or _kind(hints[f.name]),
                default=default,
                default_text=meta.get("default_text"),
                choices=meta.get("choices"),
            )
        lent = meta.get("options")
        if lent:
            inner = list(_options(_bare(hints[f.name]), path))
            yield from (o for o in inner if lent == "*" or o.key in lent)
        elif not meta and dataclasses.is_dataclass(hints[f.name]):
            yield from _options(hints[f.name], path)  # e.g. SessionConfig.wire


def add_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    """One argparse flag per declared setting of ``cls``. No argparse types or defaults: what
    is not given comes from ``--config`` or the declaration, checked by :func:`read`."""
    for o in options(cls):
        kwargs: dict[str, Any] = {"dest": o.key, "help": o.full_help}
        if o.kind == "switch":
            kwargs.update(action="store_true", default=None)
        else:
            kwargs["metavar"] = o.metavar
            if o.kind in ("list", "ports"):
                kwargs["action"] = "append"
            if o.choices:
                kwargs["choices"] = o.choices
        parser.add_argument(o.flag, **kwargs)


def plain_values(
    argv: Sequence[str], cls: type, common: Mapping[str, tuple[str, str | None]]
) -> dict[str, Any] | None:
    """What argparse reads from ``argv`` for the flags :func:`add_flags` gives ``cls`` and the
    plain flags ``common`` (flag: its dest and default), when ``argv`` is written plainly: each
    word a flag written out whole, a switch alone, any other flag with its value (``--flag
    value``, ``--flag=value``) not starting with ``-`` and one of its choices, if it has any.
    Anything else is None (``--help``, an abbreviated, unknown or misplaced word, a value
    argparse refuses or reads otherwise): argparse reads it, with its messages. A process that
    runs a command for its life need not import argparse for the usual case (issue 15: with
    gettext ~0.3 MB of an idle agent's heap)."""
    by_flag = {o.flag: o for o in options(cls)}
    values: dict[str, Any] = {o.key: None for o in by_flag.values()}
    values.update(dict(common.values()))
    words = iter(argv)
    for word in words:
        flag, eq, value = word.partition("=")
        o = by_flag.get(flag)
        plain = common.get(flag)
        if o is None and plain is None:
            return None
        if o is not None and o.kind == "switch":
            if eq:
                return None  # argparse: "ignored explicit argument"
            values[o.key] = True
            continue
        if not eq:
            value = next(words, "-")  # none left: as a flag-like word, argparse's to refuse
        if value.startswith("-"):
            return None
        if o is None:
            assert plain is not None
            values[plain[0]] = value
        elif o.choices and value not in o.choices:
            return None
        elif o.kind in ("list", "ports"):
            values[o.key] = [*(values[o.key] or ()), value]
        else:
            values[o.key] = value
    return values


def gather(args: object, cls: type) -> dict[str, Any]:
    """The values given for ``cls``'s settings: its flags (``args``) over its ``--config`` file,
    whose keys are the same names; an unknown key is an error naming it."""
    keys = {o.key for o in options(cls)}
    flags = {key: getattr(args, key, None) for key in keys}
    return cfg.merge(flags, cfg.load_config_file(getattr(args, "config", None)), keys)


def read(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """Each declared setting of ``cls`` by key: the given value checked (errors name the flag),
    or the declared default (None for a required one that is missing: the caller decides)."""
    out: dict[str, Any] = {}
    for o in options(cls):
        value = values.get(o.key)
        given = value is not None and value != "" and value != []
        out[o.key] = check(o, value) if given else _absent(o)
    return out


def _absent(o: Option) -> Any:
    if o.kind == "switch":
        return False
    if o.kind in ("list", "ports"):
        return ()
    return None if o.default is _MISSING else o.default


def check(o: Option, value: Any) -> Any:
    """One given value, checked as its kind asks."""
    if o.kind == "number":
        return cfg.positive(value, o.flag)
    if o.kind == "count":
        return int(cfg.positive(value, o.flag, integer=True))
    if o.kind == "duration":
        return cfg.duration(value, o.flag)
    if o.kind == "address":
        return cfg.parse_address(str(value), o.flag)
    if o.kind == "switch":
        return bool(value)
    if o.kind == "list":
        return cfg.string_list(value)
    if o.kind == "ports":
        return cfg.port_list(value, o.flag)
    if o.kind == "file":
        return cfg.existing_file(value, o.flag)
    if o.choices and str(value) not in o.choices:
        raise ConfigError(o.flag, f"{value!r} is not one of {', '.join(o.choices)}")
    return str(value)


def build(cls: type[Any], values: Mapping[str, Any]) -> Any:
    """``cls`` from the settings it declares itself (no nested ones); what was not given keeps
    the class's default, so ``__post_init__`` checks still apply."""
    given = {
        o.path[-1]: check(o, values[o.key])
        for o in options(cls)
        if len(o.path) == 1 and values.get(o.key) not in (None, "", [], ())
    }
    return cls(**given)
