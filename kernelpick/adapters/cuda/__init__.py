"""The cuda adapter: a pure translate of device properties, a one-line probe, launch glue."""

__all__: list[str] = []
