"""Option tables: the options of a checkpoint's configuration that an importer reads, checked at once.

As CTranslate2's converters declare theirs (converters/opennmt_py.py, marian.py, transformers.py),
each importer declares one table: per option, the values it rebuilds (or a predicate over the
value and the other options), its value where a checkpoint does not record it, and the field of
ModelConfig or TransformerShape it becomes. `check` reads the whole table and refuses a checkpoint
once, naming every option that is off (as the toolkit's users write it, the value found, what is
accepted), so that one run tells a user everything to change; what it returns is what the table
mapped, for export/importers/config_builder.py.
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from export.importers.common import ImportRefused

MISSING = object()


class Options:
    """A checkpoint's configuration as a table reads it: `options[name]` is the option's value, or
    the table's default where the checkpoint does not record it. A dotted name walks nested
    sections (Joey NMT's `model.encoder.type`); a Namespace (OpenNMT-py's opt) is read by attribute."""

    def __init__(self, table: OptionTable, config: Any) -> None:
        self.table = table
        self.config = config

    def __getitem__(self, name: str) -> Any:
        option = self.table.named(name)
        if option is None:
            return self.get(name)
        default = self[option.default_from] if option.default_from else option.default
        return self.get(name, default)

    def get(self, name: str, default: Any = None) -> Any:
        node: Any = self.config
        if not isinstance(node, Namespace | Mapping):
            return default
        if isinstance(node, Namespace):
            return getattr(node, name, default)
        *sections, last = name.split(".")
        for section in sections:
            node = node.get(section) if isinstance(node, Mapping) else None
            node = node or {}
        return node.get(last, default) if isinstance(node, Mapping) else default


Predicate = Callable[[Any, Options], bool]


@dataclass(frozen=True)
class Option:
    """One option the importer reads. `accepts`: the values rebuilt, a predicate over the value and
    the other options, or None (any value: an option only read); `accepted`: what is accepted, in
    words (by default the values' list), or a function of the options that says it; `to`:
    "ModelConfig.<field>" or "TransformerShape.<field>", the field the value becomes, through
    `convert` (a mapping or a function; the value itself where None); `default_from`: the option
    whose value is this one's default; `when`: checked only where it holds; `flag`: the name shown,
    where it is not `name`."""

    name: str
    accepts: tuple[Any, ...] | Predicate | None = None
    default: Any = None
    accepted: str | Callable[[Options], str] = ""
    to: str = ""
    convert: Mapping[Any, Any] | Callable[[Any], Any] | None = None
    default_from: str = ""
    when: Callable[[Options], bool] | None = None
    flag: str = ""

    def allows(self, value: Any, options: Options) -> bool:
        if self.accepts is None:
            return True
        if isinstance(self.accepts, tuple):
            return value in self.accepts
        try:
            return bool(self.accepts(value, options))
        except (TypeError, ValueError):  # a predicate's int() of a value that is no number
            return False

    def what_is_accepted(self, options: Options) -> str:
        if callable(self.accepted):
            return self.accepted(options)
        if self.accepted:
            return self.accepted
        values = self.accepts if isinstance(self.accepts, tuple) else ()
        return f"the importer supports {list(values)}"

    def mapped(self, value: Any) -> Any:
        if self.convert is None:
            return value
        if isinstance(self.convert, Mapping):
            return self.convert[value]
        return self.convert(value)


@dataclass(frozen=True)
class OptionTable:
    """A toolkit's options, in the order they are reported. `prefix`: how its users write an
    option ("-" for OpenNMT-py, "--" for Marian, "" for a config file's keys)."""

    toolkit: str
    prefix: str
    options: tuple[Option, ...]
    _index: dict[str, Option] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        index: dict[str, Option] = {}
        for option in self.options:
            index.setdefault(option.name, option)  # a name checked twice: its first row's default
        object.__setattr__(self, "_index", index)

    def named(self, name: str) -> Option | None:
        return self._index.get(name)

    def __add__(self, more: tuple[Option, ...]) -> OptionTable:
        return OptionTable(self.toolkit, self.prefix, self.options + more)


def problem(table: OptionTable, option: Option, value: Any, options: Options) -> str:
    """One refused option, on one line: its name as written, the value found, what is accepted."""
    flag = f"{table.prefix}{option.flag or option.name}"
    return f"{flag} {value!r} ({option.what_is_accepted(options)})".replace("\n", " ")


def check(table: OptionTable, config: Any, where: str = "") -> dict[str, Any]:
    """Every option of `table` read from `config`; refused once (ImportRefused), naming every option
    that is off, else the fields the table maps to ("ModelConfig.<field>" or
    "TransformerShape.<field>" → value). `where`: the file the options came from, for the message."""
    options = Options(table, config)
    problems: list[str] = []
    mapped: dict[str, Any] = {}
    for option in table.options:
        if option.when is not None and not option.when(options):
            continue
        value = options[option.name]
        if not option.allows(value, options):
            problems.append(problem(table, option, value, options))
        elif option.to:
            try:
                mapped[option.to] = option.mapped(value)
            except (KeyError, TypeError, ValueError) as err:
                problems.append(problem(table, option, value, options) + f": {err}")
    if problems:
        plural = "s" if len(problems) > 1 else ""
        source = f" in {where}" if where else ""
        raise ImportRefused(
            f"unsupported {table.toolkit} option{plural}{source}: " + "; ".join(problems)
        )
    return mapped
