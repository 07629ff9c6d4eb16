"""Adapters for other agent frameworks, each behind its own extra."""

__all__: list[str] = []
