"""wfsub's loggers: named `wfsub...`, silent by default below WARNING, and the app's structlog when it has one.

wfsub configures no logging and prints nothing by itself. Where an event goes is decided when it is logged:
- the app has configured structlog (`structlog.configure(...)`): the event goes through the app's own processors
  and logger factory, as the app's own events do (`structlog.get_logger("wfsub.runtime")`);
- otherwise it is a plain record of the standard logger of its name (`wfsub.runtime`, `wfsub.store`, ...):
  the message is the event and its fields as `key=value` (no timestamps, levels or colours of its own: the app's
  logging format adds those), so `logging.getLogger("wfsub")` governs them all, and with no logging set up
  Python shows WARNING and above on stderr and nothing below.

structlog is never imported here: an app that configured it has imported it, so it is looked up in
`sys.modules` when an event is logged (importing structlog costs ~90 ms, its console renderer pulling in rich
and pygments, which an app without structlog should not pay).

A case's own failure is the app's business (whoever awaits it gets CaseFailed): it is logged at INFO; WARNING and
above are for trouble in wfsub's own machinery (a sink failing, an effect that ignores cancellation at shutdown).
"""

from __future__ import annotations

import logging
import sys
from typing import Any


class Logger:
    """`debug/info/warning/error/exception(event, **fields)`, routed as the module docstring says."""

    __slots__ = ("name", "_std")

    def __init__(self, name: str) -> None:
        self.name = name
        self._std = logging.getLogger(name)

    def _log(self, level: int, method: str, event: str, fields: dict[str, Any], exc_info: bool = False) -> None:
        structlog = sys.modules.get("structlog")
        if structlog is not None and structlog.is_configured():
            log = structlog.get_logger(self.name)
            if exc_info:
                fields["exc_info"] = True
            getattr(log, method)(event, **fields)
            return
        std = self._std
        if not std.isEnabledFor(level):
            return
        text = " ".join([event, *(f"{key}={value!r}" if isinstance(value, str) and " " in value else f"{key}={value}"
                                  for key, value in fields.items())])
        std.log(level, "%s", text, exc_info=exc_info)

    def debug(self, event: str, **fields: Any) -> None:
        self._log(logging.DEBUG, "debug", event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._log(logging.INFO, "info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log(logging.WARNING, "warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._log(logging.ERROR, "error", event, fields)

    def exception(self, event: str, **fields: Any) -> None:
        self._log(logging.ERROR, "error", event, fields, exc_info=True)


def get_logger(name: str) -> Logger:
    """wfsub's logger `name` (`wfsub.runtime`, `wfsub.trace`, ...)."""
    if name != "wfsub" and not name.startswith("wfsub."):
        raise ValueError(f"wfsub's loggers are named wfsub or wfsub.<part>, got {name!r}")
    return Logger(name)
