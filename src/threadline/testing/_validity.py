"""A checker for model context: is this message list acceptable to every provider?

Use it in your own tests on whatever you send to a model (the output of
``build_context``, a hand-made prompt, a transcript after crash repair).
"""

from __future__ import annotations

from collections.abc import Sequence

from threadline.ai._messages import AssistantMessage, Message, ToolResultMessage
from threadline.session._context import sent_to_model

__all__ = ["assert_valid_for_providers"]


def assert_valid_for_providers(messages: Sequence[Message]) -> None:
    """Raise ``AssertionError`` naming the first position that breaks a rule.

    The rules are the strictest the OpenAI- and Anthropic-style APIs share:

    - an assistant message neither failed (``stop_reason="error"``) nor empty;
    - its tool call ids are distinct;
    - right after it come exactly its tool results, one per call, nothing in
      between and nothing missing;
    - no tool result appears anywhere else.
    """
    i = 0
    n = len(messages)
    while i < n:
        m = messages[i]
        if isinstance(m, ToolResultMessage):
            raise AssertionError(
                f"message {i}: tool result for call {m.tool_call_id!r} does not directly "
                "follow the assistant message that made the call"
            )
        i += 1
        if not isinstance(m, AssistantMessage):
            continue
        if not sent_to_model(m):
            raise AssertionError(f"message {i - 1}: " + (
                "assistant message with stop_reason 'error'" if m.stop_reason == "error"
                else "empty assistant message"))
        call_ids = [c.id for c in m.tool_calls]
        if len(set(call_ids)) != len(call_ids):
            raise AssertionError(f"message {i - 1}: repeated tool call ids {call_ids}")
        pending = set(call_ids)
        while pending:
            result = messages[i] if i < n else None
            if not isinstance(result, ToolResultMessage):
                raise AssertionError(
                    f"message {i}: tool calls {sorted(pending)} have no result "
                    "right after their assistant message"
                )
            if result.tool_call_id not in pending:
                raise AssertionError(
                    f"message {i}: tool result for {result.tool_call_id!r} answers no open "
                    f"call of the preceding assistant message (open: {sorted(pending)})"
                )
            pending.discard(result.tool_call_id)
            i += 1
