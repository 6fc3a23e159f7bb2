"""Per-platform adapters: probe a device into ``DeviceCaps`` and launch the chosen kernel."""

__all__: list[str] = []
