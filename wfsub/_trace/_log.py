"""wfsub's loggers: structlog bound loggers over standard `logging` loggers named `wfsub...`.

wfsub configures no logging and prints nothing by itself. Each event goes through structlog's processors (the
app's own, when it has configured structlog) and then to the standard logger of its name, so
`logging.getLogger("wfsub")` governs them all: with no logging set up, Python shows WARNING and above on stderr
and nothing below. A case's own failure is the app's business (whoever awaits it gets CaseFailed): it is logged at
INFO; WARNING and above are for trouble in wfsub's own machinery (a sink failing, an effect that ignores
cancellation at shutdown).
"""

from __future__ import annotations

import logging
from typing import Any

import structlog


def get_logger(name: str) -> Any:
    """A structlog logger that ends in `logging.getLogger(name)` (name: `wfsub.runtime`, `wfsub.trace`, ...)."""
    if name != "wfsub" and not name.startswith("wfsub."):
        raise ValueError(f"wfsub's loggers are named wfsub or wfsub.<part>, got {name!r}")
    return structlog.wrap_logger(logging.getLogger(name))
