"""Structured logs: one JSON object per line on stderr (or plain text when asked)."""

from __future__ import annotations

import json
import logging
import sys
import time


class JsonFormatter(logging.Formatter):
    """`{"ts", "level", "logger", "msg", ...}`; `key=value` pairs in the message stay readable."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, separators=(",", ":"))


def setup_logging(level: str = "info", fmt: str = "json") -> None:
    """Log to stderr at LEVEL, as JSON lines (FMT "json") or plain text ("text")."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def warn_once(log: logging.Logger, warned: set[str], key: str, msg: str, *args: object) -> None:
    """Log MSG % ARGS as a warning the first time KEY (a source: a netdev, a URL) fails, as
    kept in WARNED: a source that stays down is logged once, not every window."""
    if key not in warned:
        warned.add(key)
        log.warning(msg, *args)
