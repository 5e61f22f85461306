"""What every ROSE configuration shares (the job's, an executor's, a simulated scenario's): the section base,
the one TOML loader, and the field validators.

A config is a tree of msgspec Structs (``ConfigSection``: keyword-only, unknown fields rejected). Fields are
checked in ``__post_init__`` with the ``require_*`` functions below, which raise ``ValueError`` naming the
field and its value; msgspec adds the field's path, and ``parse_toml`` / ``load_toml`` turn any problem
(unreadable file, bad TOML, wrong type, unknown field, value out of range) into one ``ConfigError`` line that
names the source, the field and the fix.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

import msgspec

from rose_core.support.errors import ConfigError

T = TypeVar("T")
SHOW_HINT = "`rose config show` lists every field"
"""The default fix appended to a field error: where to look up the fields."""
MAX_PORT = 65535
ENTRY_POINT_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")


class ConfigSection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Base of every TOML config section: keyword-only, unknown fields rejected."""


# ---------------------------------------------------------------- loading


def load_toml(
    path: str | os.PathLike[str], type_: type[T], *, what: str = "config", hint: str = SHOW_HINT, fix: str = "",
    moved: Mapping[str, str] | None = None,
) -> T:
    """The ``type_`` in the TOML file ``path``; any problem is one ``ConfigError`` line. ``what`` names the
    file in the error (``"the executor config"``), ``hint`` follows a field error, ``fix`` an unreadable file
    (``"fix --config"``)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        suffix = f"; {fix}" if fix else ""
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}{suffix}") from exc
    return parse_toml(data, type_, str(path), hint=hint, moved=moved)


def parse_toml(data: bytes | str, type_: type[T], source: str = "config", *, hint: str = SHOW_HINT,
               moved: Mapping[str, str] | None = None) -> T:
    """Decode TOML into ``type_``; any problem is a one-line ``ConfigError`` naming ``source``, the field
    (and ``hint``, when not empty). ``moved``: old dotted names -> where they live now; a file that still uses
    one is refused with its new place."""
    try:
        if moved:
            _refuse_moved(msgspec.toml.decode(data), moved, source)
        return msgspec.toml.decode(data, type=type_)
    except msgspec.ValidationError as exc:
        suffix = f"; {hint}" if hint else ""
        raise ConfigError(f"{source}: {_humanize(str(exc))}{suffix}") from exc
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{source} is not valid TOML: {exc}") from exc


def _refuse_moved(raw: object, moved: Mapping[str, str], source: str) -> None:
    for old, new in moved.items():
        found, value = _lookup(raw, old.split("."))
        if found and not (new.startswith(old + ".") and isinstance(value, dict)):  # a name now a table's
            section, _, name = new.rpartition(".")
            where = f"`{name}` under [{section}]" if section else f"`{name}` at the top"
            raise ConfigError(f"{source}: `{old}` has moved: write it as {where}")


def _lookup(raw: object, path: list[str]) -> tuple[bool, object]:
    for key in path:
        if not isinstance(raw, dict) or key not in raw:
            return False, None
        raw = raw[key]
    return True, raw


def dump_toml(config: msgspec.Struct) -> str:
    """``config`` as TOML, every field included (what ``rose config show`` prints)."""
    return msgspec.toml.encode(config).decode()


def _humanize(message: str) -> str:
    text, _, where = message.partition(" - at `$")
    field = where.rstrip("`").lstrip(".")
    return f"field `{field}`: {text}" if field else text


# ---------------------------------------------------------------- field validators (for ``__post_init__``)


def require_positive(**values: float) -> None:
    """``ValueError`` naming the first value that is not > 0 (msgspec adds the field's path)."""
    _require(lambda v: v > 0, "> 0", values)


def require_non_negative(**values: float) -> None:
    """``ValueError`` naming the first value that is not >= 0."""
    _require(lambda v: v >= 0, ">= 0", values)


def require_at_least(minimum: float, **values: float) -> None:
    """``ValueError`` naming the first value below ``minimum``."""
    _require(lambda v: v >= minimum, f">= {minimum}", values)


def require_fraction(**values: float) -> None:
    """``ValueError`` naming the first value outside (0, 1]."""
    _require(lambda v: 0 < v <= 1, "in (0, 1]", values)


def require_open_fraction(**values: float) -> None:
    """``ValueError`` naming the first value outside (0, 1) (a share that can be neither nothing nor all)."""
    _require(lambda v: 0 < v < 1, "in (0, 1)", values)


def require_port(**values: int) -> None:
    """``ValueError`` naming the first value that is not a TCP port or 0 (0: pick a free one)."""
    _require(lambda v: 0 <= v <= MAX_PORT, f"in 0..{MAX_PORT}", values)


def require_entry_point_name(**values: str) -> None:
    """``ValueError`` naming the first value that cannot be an entry point's name (a letter, then letters,
    digits, ``_``, ``-`` or ``.``); whether one is installed is checked when it is loaded."""
    for name, value in values.items():
        if not ENTRY_POINT_NAME.fullmatch(value):
            raise ValueError(
                f"`{name}` {value!r} is not an entry-point name: use a letter, then letters, digits, `_`, `-` or `.`"
            )


def _require(ok: Callable[[float], bool], condition: str, values: Mapping[str, float]) -> None:
    for name, value in values.items():
        if not ok(value):
            raise ValueError(f"`{name}` must be {condition} (got {value})")
