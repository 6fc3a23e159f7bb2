"""Developer benchmarks: the suite (``run.py``) and the GPU checks (``gpu_check.py``).

A package in the source tree only; the wheel ships ``kernelpick`` alone, so nothing here is
installed. ``kernelpick bench`` (one layer against the linear it replaces) is what ships.
"""

__all__: list[str] = []
