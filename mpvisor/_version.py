"""Which mpvisor is this? The one place the version is written (pyproject.toml reads it here)."""

__version__ = "0.1.0"
