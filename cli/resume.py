"""``speceyes resume BATCH``: a cancelled batch's jobs run again (``cli.retry``)."""

from cli.retry import configure_resume as configure

__all__ = ["configure"]
