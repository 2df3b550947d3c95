"""One module per REST resource; each exposes ``router``."""

__all__: list[str] = []
