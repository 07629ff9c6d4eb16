"""threadline as an OpenAI Agents SDK session (extra ``[openai-agents]``)."""

from threadline.integrations.openai_agents._session import ITEM_KIND, ThreadlineSession

__all__ = ["ITEM_KIND", "ThreadlineSession"]
