"""Engine integration: the fp8_per_channel linear method, selecting before allocating."""

__all__: list[str] = []
