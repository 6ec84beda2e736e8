"""Bad input found before anything starts: its own module, so the config loader and the schema checks that
both raise it need not import each other."""

from __future__ import annotations


class ConfigError(ValueError):
    """Bad input found before anything starts: the CLI prints it as one line and exits 2."""
