"""The one error type of the builder."""

from __future__ import annotations


class BuildError(ValueError):
    """The build cannot go on; the message names the file, line or field and why (the
    command line prints it without a traceback and exits with status 2)."""
