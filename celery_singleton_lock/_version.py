"""Single source of the package version (read by hatchling and by ``__init__``)."""

__version__ = "0.1.0"
