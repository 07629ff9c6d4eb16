"""pydantic-ai message history in a threadline session.

pydantic-ai keeps no history of its own: a run takes ``message_history`` and
returns ``new_messages()``. ``PydanticAIHistory`` stores those messages and
hands the active path back for the next run. Each ``ModelMessage`` is one
custom entry holding pydantic-ai's own JSON for it (``ModelMessagesTypeAdapter``),
byte for byte, so it loads back equal; the parts threadline's message model
can say (prompts, text, thinking, tool calls and returns) follow it as message
entries, which ``threadline show``, ``export`` and the viewer display.
Branches and forks are threadline's: the history is the active path.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from threadline import durable
from threadline.ai import (
    AssistantContent,
    AssistantMessage,
    Message,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from threadline.durable import DurableAgent
from threadline.errors import AgentError
from threadline.session import CustomEntry, Entry, MessageEntry, register_custom
from threadline.stores import Store

try:
    from pydantic_ai import messages as pm
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "threadline.integrations.pydantic_ai needs pydantic-ai: "
        "pip install 'threadline[pydantic-ai]'"
    ) from exc

__all__ = ["MESSAGE_KIND", "PydanticAIHistory"]

MESSAGE_KIND = "pydantic_ai.message"
"""The custom entry kind that holds one pydantic-ai ``ModelMessage``."""


class _Stored(msgspec.Struct, frozen=True):
    message: msgspec.Raw  # pydantic-ai's JSON for the message, untouched


register_custom(MESSAGE_KIND, _Stored)


class PydanticAIHistory:
    """The message history of one session. Build it with ``await PydanticAIHistory.open(...)``."""

    def __init__(self, agent: DurableAgent) -> None:
        self.agent = agent
        """The durable agent over the session: tree, ``branch_to``, ``fork``, compaction."""

    @classmethod
    async def open(cls, store: Store, session_id: str | None = None) -> PydanticAIHistory:
        """Resume the session ``session_id`` or create it (a new id if ``None``)."""
        return cls(await durable.open(None, store=store, session_id=session_id, repair=False))

    @property
    def session_id(self) -> str:
        return self.agent.session_id

    def messages(self) -> list[pm.ModelMessage]:
        """The history on the active path, for ``message_history=``."""
        raws = [bytes(e.data.message) for e in self._stored()]
        return pm.ModelMessagesTypeAdapter.validate_json(b"[" + b",".join(raws) + b"]")

    async def save(self, messages: Sequence[pm.ModelMessage]) -> list[Entry]:
        """Append a run's ``new_messages()`` at the leaf, in one write."""
        if not messages:
            return []
        try:
            raws = [pm.ModelMessagesTypeAdapter.dump_json([m]) for m in messages]
        except Exception as exc:  # pydantic raises its own types for what it cannot dump
            raise AgentError(f"session {self.session_id!r}: these are not pydantic-ai "
                             f"messages ({type(exc).__name__}: {exc}); nothing was saved"
                             ) from exc
        entries: list[Entry] = []
        for message, raw in zip(messages, raws, strict=True):
            entries.append(CustomEntry(kind=MESSAGE_KIND, data=_Stored(msgspec.Raw(raw[1:-1]))))
            entries.extend(MessageEntry(message=m) for m in to_messages(message))
        return await self.agent.append(*entries)

    async def rewind(self, keep: int) -> None:
        """Keep the first ``keep`` messages on the active path; the rest stay in the
        log on the branch left behind (a durable branch)."""
        stored = self._stored()
        if not 0 <= keep <= len(stored):
            raise AgentError(f"session {self.session_id!r} has {len(stored)} pydantic-ai "
                             f"messages on its path; cannot keep {keep}")
        if keep < len(stored):
            await self.agent.branch_to(stored[keep].parent_id)

    async def fork(self, session_id: str | None = None) -> PydanticAIHistory:
        """A child session with a copy of this history."""
        return PydanticAIHistory(await self.agent.fork(session_id))

    def _stored(self) -> list[CustomEntry[_Stored]]:
        return [e for e in self.agent.path() if isinstance(e, CustomEntry)
                and e.kind == MESSAGE_KIND and isinstance(e.data, _Stored)]


def to_messages(message: pm.ModelMessage) -> list[Message]:
    """What ``message`` says in threadline's message model (possibly nothing)."""
    if isinstance(message, pm.ModelResponse):
        content: list[AssistantContent] = []
        for part in message.parts:
            if isinstance(part, pm.TextPart):
                content.append(TextPart(text=part.content))
            elif isinstance(part, pm.ThinkingPart):
                content.append(ThinkingPart(thinking=part.content, signature=part.signature))
            elif isinstance(part, pm.ToolCallPart):
                content.append(ToolCall(id=part.tool_call_id, name=part.tool_name,
                                        arguments=part.args_as_dict()))
        calls = any(isinstance(c, ToolCall) for c in content)
        return [AssistantMessage(content=tuple(content), model=message.model_name or "",
                                 provider=message.provider_name or "",
                                 stop_reason="tool_use" if calls else "stop")] if content else []
    out: list[Message] = []
    for req in message.parts:
        if isinstance(req, pm.UserPromptPart):
            text = req.content if isinstance(req.content, str) else "".join(
                c for c in req.content if isinstance(c, str))
            out.append(UserMessage.of(text))
        elif isinstance(req, pm.ToolReturnPart):
            out.append(ToolResultMessage(tool_call_id=req.tool_call_id, tool_name=req.tool_name,
                                         content=(TextPart(text=req.model_response_str()),)))
        elif isinstance(req, pm.RetryPromptPart) and req.tool_name is not None:
            out.append(ToolResultMessage(tool_call_id=req.tool_call_id, tool_name=req.tool_name,
                                         content=(TextPart(text=req.model_response()),),
                                         is_error=True))
    return out
