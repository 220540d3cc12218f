"""The installed version, read from the distribution's metadata (pyproject.toml is the one
place it is written). Read on demand: `importlib.metadata` costs more than `import execkit`."""

from __future__ import annotations

__all__ = ["DISTRIBUTION", "installed_version"]

DISTRIBUTION = "execkit-runner"
"""The distribution that installs `execkit` and `adapters` (`pip install execkit-runner`)."""


def installed_version() -> str:
    """The installed distribution's version; "0+unknown" (PEP 440's local form) for a source
    tree used without installing, rather than an invented number."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "0+unknown"
