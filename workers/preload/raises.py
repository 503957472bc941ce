"""Importing this module raises `RuntimeError`."""

raise RuntimeError("preload refused: no config")
