"""What the integration tells the ``kernelpick`` logger about the kernels it selects.

Records go to ``logging.getLogger("kernelpick.integration")``, which propagates to
``"kernelpick"``. kernelpick adds no handler and sets no level: as the standard library
advises for libraries, the application decides where records go and how many it wants.
An engine that shows only its own logger's records (vLLM) names that logger as a second
destination: the same records, remembered apart, so each destination gets each one once.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Hashable

from kernelpick.core import DEGRADED_NOTE, DeviceCaps, QuantConfig, Selected

__all__ = ["LOGGER", "SELECTIONS_LOGGER", "forget_logged", "log_selection"]

SELECTIONS_LOGGER = "kernelpick.integration"  # the name the package documents
LOGGER = logging.getLogger(SELECTIONS_LOGGER)

# A model repeats a handful of layer shapes many times (224 layers of 7 shapes), so each
# (device, config, kernel) is logged once per process to each destination logger.
# Bounded, oldest forgotten first, so a long-running server that sees endless shapes does
# not grow without limit. The value is the most verbose level already logged for the key:
# DEBUG turned on later still gets the trace of a selection first logged at INFO.
_MAX_REMEMBERED = 1024
_logged: OrderedDict[Hashable, int] = OrderedDict()
_lock = threading.Lock()  # engines may create layers from several threads


def _still_to_log(logger: logging.Logger, key: Hashable, summary: int) -> tuple[bool, bool]:
    """Whether to log ``key``'s summary (at level ``summary``) and its DEBUG trace to
    ``logger`` now: each once per process and logger, and only once the logger lets it
    through, so a selection nobody listened to is logged when someone does."""
    trace = logger.isEnabledFor(logging.DEBUG)
    if not trace and not logger.isEnabledFor(summary):
        return False, False
    wanted = logging.DEBUG if trace else summary
    key = (logger.name, key)  # one destination's record never stands in for another's
    with _lock:
        done = _logged.get(key)
        if done is not None:
            _logged.move_to_end(key)
            if done <= wanted:
                return False, False
        _logged[key] = wanted
        if len(_logged) > _MAX_REMEMBERED:
            _logged.popitem(last=False)
    return done is None, trace


def forget_logged() -> None:
    """Forget which selections were logged, so the next of each is logged again."""
    with _lock:
        _logged.clear()


def log_selection(
    scheme: str,
    caps: DeviceCaps,
    config: QuantConfig,
    decision: Selected,
    layer: str,
    logger: logging.Logger = LOGGER,
) -> None:
    """Log one selection to ``logger``, the first time this process tells it this
    (device, config, kernel): WARNING for a degraded choice or one with speed warnings (an
    emulation, a faster kernel turned down for a missing tool), INFO for any other, then
    the full trace at DEBUG."""
    warned = decision.degraded or bool(decision.warnings)
    # The warnings are in the key: the same kernel selected under another policy or catalog
    # may carry others (a faster kernel turned down for a missing tool), said once each.
    key = (caps, config, decision.kernel, decision.degraded, decision.warnings)
    summary, trace = _still_to_log(logger, key, logging.WARNING if warned else logging.INFO)
    where = f" (first at layer {layer!r})" if layer else ""
    if summary and warned:
        notes = ([DEGRADED_NOTE] if decision.degraded else []) + [
            warning.render() for warning in decision.warnings
        ]
        logger.warning(
            'quantization="%s": %s selected on %s for %s%s; %s',
            scheme, decision.kernel, caps.name, config.render(), where, "; ".join(notes),
        )  # fmt: skip
    elif summary:
        logger.info(
            'quantization="%s": %s selected on %s for %s%s',
            scheme, decision.kernel, caps.name, config.render(), where,
        )  # fmt: skip
    if trace:
        logger.debug(
            'quantization="%s" on %s for %s:\n%s',
            scheme, caps.render(), config.render(), decision.render(),
        )  # fmt: skip
