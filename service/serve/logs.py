"""The server's log lines on stderr: one JSON object per line with any `extra` fields (for
collectors: Kubernetes, Loki), or text a person reads at a terminal; `auto` writes text when stderr
is a terminal, JSON otherwise."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any, TextIO

LOG_FORMATS = ("auto", "json", "text")
RESERVED = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


def extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a call gave with `extra=`."""
    return {k: v for k, v in record.__dict__.items() if k not in RESERVED}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and any `extra` fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(extra_fields(record))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """One line per record: time, level, logger, message, then the `extra` fields as key=value."""

    def format(self, record: logging.LogRecord) -> str:
        line = (
            f"{self.formatTime(record, '%H:%M:%S')} {record.levelname:<7} "
            f"{record.name}: {record.getMessage()}"
        )
        extra = extra_fields(record)
        if extra:
            line += "  " + " ".join(f"{k}={v}" for k, v in extra.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def resolve_format(name: str, stream: TextIO) -> str:
    """`auto` → text on a terminal, json elsewhere; json and text as they are."""
    if name not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {LOG_FORMATS}, got {name!r}")
    if name == "auto":
        return "text" if stream.isatty() else "json"
    return name


def configure_logging(level: str, fmt: str = "auto") -> None:
    handler = logging.StreamHandler(sys.stderr)
    chosen = resolve_format(fmt, sys.stderr)
    handler.setFormatter(TextFormatter() if chosen == "text" else JsonFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
