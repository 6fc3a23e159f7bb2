"""The rules a kernel declares in its catalog row: small pure values with
``check(caps, config) -> Reason | None`` and ``render() -> str``.

``kp.rules.KIND_RULES`` are the rules the core adds to every kernel of a kind, so a new
weight-only kernel cannot forget the per-token check; both read ``kp.rules.KIND_TABLE``,
which says how each kind serves each ``ActivationGrouping``. A rule of your own is any
frozen class with the same two methods (the ``Requirement`` protocol).
"""

from kernelpick.core.rules import *  # noqa: F403  # the names, stated once: kernelpick.core.rules
from kernelpick.core.rules import __all__ as __all__
