"""Converting a model."""
