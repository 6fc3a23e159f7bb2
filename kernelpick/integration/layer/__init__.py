"""One layer."""
