"""The server's log lines: JSON objects for collectors (Kubernetes), text a person reads at a
terminal; auto picks text when stderr is a terminal."""

from __future__ import annotations

import io
import json
import logging

import pytest

from service.serve import logs
from service.serve.config import load_settings


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def record(message: str, **extra: object) -> logging.LogRecord:
    r = logging.LogRecord("s2s.server", logging.INFO, __file__, 1, message, None, None)
    r.__dict__.update(extra)
    return r


def test_auto_writes_text_to_a_terminal_and_json_elsewhere() -> None:
    assert logs.resolve_format("auto", Terminal()) == "text"
    assert logs.resolve_format("auto", io.StringIO()) == "json"
    assert logs.resolve_format("json", Terminal()) == "json"
    assert logs.resolve_format("text", io.StringIO()) == "text"
    with pytest.raises(ValueError, match="log format"):
        logs.resolve_format("xml", io.StringIO())


def test_a_text_line_reads_as_a_sentence_with_its_fields_after_it() -> None:
    line = logs.TextFormatter().format(record("serving", port=50051, model="numbers-en-fr"))
    assert line.endswith(" INFO    s2s.server: serving  port=50051 model=numbers-en-fr")
    assert not line.startswith("{")
    entry = json.loads(logs.JsonFormatter().format(record("serving", port=50051)))
    assert entry["message"] == "serving" and entry["port"] == 50051


def test_configure_logging_writes_the_format_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    for stream, expect_json in ((Terminal(), False), (io.StringIO(), True)):
        monkeypatch.setattr("sys.stderr", stream)
        logs.configure_logging("INFO", "auto")
        logging.getLogger("s2s.test").info("hello", extra={"n": 1})
        out = stream.getvalue().strip()
        assert out.startswith("{") is expect_json, out
        assert "hello" in out
    logging.basicConfig(force=True)


def test_the_log_format_is_a_setting() -> None:
    assert load_settings([]).server.log_format == "auto"
    assert load_settings(["--log-format", "text"]).server.log_format == "text"
    assert load_settings([], {"S2S_LOG_FORMAT": "json"}).server.log_format == "json"
    with pytest.raises(ValueError):
        load_settings(["--log-format", "xml"])
