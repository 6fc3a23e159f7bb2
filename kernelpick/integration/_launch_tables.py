"""The kernel tables a layer's steps select from and bind with: ``launches`` checked entry by
entry, and every kernel the catalog may select known to have a row, before any layer is
made."""

from __future__ import annotations

from collections.abc import Mapping

from kernelpick.adapters import LAUNCHES, Launch
from kernelpick.core import default_catalog
from kernelpick.core._errors import InvalidValueError
from kernelpick.core._specs import Catalog

__all__ = ["check_rows", "launch_table"]


def launch_table(launches: object) -> dict[str, Launch] | None:
    """``launches`` as a plain dict (None stays None), or ``InvalidValueError`` naming the
    first entry that is not a kernel id with its ``Launch`` row."""
    if launches is None:
        return None
    if not isinstance(launches, Mapping):
        expected = "None or a mapping of kernel id to kernelpick.adapters.Launch (LAUNCHES)"
        raise InvalidValueError("launches", type(launches).__name__, expected)
    for key, row in launches.items():  # the first bad entry, named: a table has dozens
        if not isinstance(key, str):
            raise InvalidValueError("launches key", key, "a kernel id (a str) of the catalog")
        if not isinstance(row, Launch):
            family = row.__name__ if isinstance(row, type) else "YourKernelFamily"
            found = f"class {row.__name__}" if isinstance(row, type) else type(row).__name__
            raise InvalidValueError(
                f"launches[{key!r}]", found, f"a kernelpick.adapters.Launch, e.g. Launch({family})"
            )
    # Copied into a plain dict: a later change to the caller's table cannot reach layers
    # already made, and a model holding it can still be deep-copied (a mappingproxy cannot).
    return dict(launches)


def check_rows(catalog: Catalog | None, launches: Mapping[str, Launch] | None) -> None:
    """Every kernel ``catalog`` may select has a row in ``launches``, or ``InvalidValueError``
    naming the first that has none and how to add it. Checked for the whole catalog
    once, not per selection: a cast or a move selects again in the middle of torch's walk
    over the model, after the modules before the layer changed, so the tables must be
    known to fit before the first layer is made."""
    rows = LAUNCHES if launches is None else launches
    for spec in (default_catalog() if catalog is None else catalog).kernels:
        if spec.id not in rows:
            # Not a misspelling: the catalog names a kernel the table cannot run.
            expected = (
                f"a launch row for every catalog id: add {{**LAUNCHES, {spec.id!r}: "
                "Launch(<family>)} to launches, or leave the id out of the catalog"
            )
            raise InvalidValueError("launches", f"no row for {spec.id!r}", expected)
