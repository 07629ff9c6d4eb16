"""threadline: durable LLM-agent conversations.

Subpackages: ``threadline.ai`` (messages, models, tools), ``threadline.agent``
(the inner loop), ``threadline.session`` (entries, tree, stores),
``threadline.durable`` (the durable agent), ``threadline.testing`` (helpers
for your own tests), ``threadline.errors`` (the error tree).
"""

from __future__ import annotations

from threadline.errors import ThreadlineError

__all__ = ["ThreadlineError", "__version__"]

__version__ = "0.1.0"
