"""Language models behind the official SDKs, loaded on first use.

``OpenAIChatModel`` and ``OpenAIResponsesModel`` need the ``openai`` extra,
``AnthropicModel`` the ``anthropic`` extra; naming one without its SDK raises
``ConfigError`` saying which extra to install. Most code wants
``threadline.ai.get_model("provider:model")`` instead.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from threadline.ai.providers._anthropic import AnthropicModel
    from threadline.ai.providers._openai_chat import OpenAIChatModel
    from threadline.ai.providers._openai_responses import OpenAIResponsesModel

__all__ = ["AnthropicModel", "OpenAIChatModel", "OpenAIResponsesModel"]

_MODULES = {
    "AnthropicModel": "threadline.ai.providers._anthropic",
    "OpenAIChatModel": "threadline.ai.providers._openai_chat",
    "OpenAIResponsesModel": "threadline.ai.providers._openai_responses",
}


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
