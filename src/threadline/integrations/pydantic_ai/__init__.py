"""pydantic-ai message history kept in a threadline session (extra ``[pydantic-ai]``)."""

from threadline.integrations.pydantic_ai._history import MESSAGE_KIND, PydanticAIHistory

__all__ = ["MESSAGE_KIND", "PydanticAIHistory"]
