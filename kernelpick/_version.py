"""The version, stated once: the facade re-exports it, the CLI prints it and the build
reads it (pyproject.toml, [tool.hatch.version])."""

__version__ = "0.2.0"
