"""Service plumbing: settings from the environment and the database connection."""

__all__: list[str] = []
