"""Adapters for other agent frameworks and importers of their transcripts.

Each integration is a subpackage behind its own extra; this package itself
exports nothing, so importing one integration never pulls in another's peer.
"""

__all__: list[str] = []
