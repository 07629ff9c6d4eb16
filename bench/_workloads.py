"""The conversations the benchmarks store, made the same way in every script.

- ``realistic``: user prompts, assistant messages with thinking, text and a
  tool call, and tool results, in ordinary words (about 600 bytes a line);
- ``payload``: the peers' workload, user and assistant in turn, each one text
  of 400 characters of base64 of random bytes, so compression flatters nobody;
- ``chat``: one short user message, for appends where the content does not matter.
"""

from __future__ import annotations

import base64
import random

from bench._targets import (
    AssistantMessage,
    Message,
    MessageEntry,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
)

PAYLOAD_CHARS = 400
WORDS = (
    "the", "of", "and", "to", "in", "is", "it", "you", "that", "was", "for", "on", "are",
    "with", "as", "his", "they", "be", "at", "one", "have", "this", "from", "or", "had", "by",
    "word", "but", "what", "some", "we", "can", "out", "other", "were", "all", "there", "when",
    "up", "use", "your", "how", "said", "an", "each", "she", "which", "do", "their", "time",
    "if", "will", "way", "about", "many",
)


def realistic(n: int, seed: int = 1) -> list[MessageEntry]:
    """A chain of user / assistant-with-tool-call / tool-result messages."""
    rnd = random.Random(seed)

    def text(words: int) -> str:
        return " ".join(rnd.choice(WORDS) for _ in range(words))

    out: list[MessageEntry] = []
    parent: str | None = None
    for i in range(n):
        message: Message
        if i % 3 == 0:
            message = UserMessage.of(text(rnd.randint(20, 90)))
        elif i % 3 == 1:
            message = AssistantMessage(
                content=(
                    ThinkingPart(thinking=text(25), signature="s" * 48),
                    TextPart(text=text(50)),
                    ToolCall(id=f"call_{i}", name="read_file",
                             arguments={"path": f"src/module_{i}.py", "limit": 200}),
                ),
                model="model-x", provider="openai",
                usage=Usage(input_tokens=900 + i, output_tokens=120), stop_reason="tool_use",
            )
        else:
            message = ToolResultMessage(tool_call_id=f"call_{i - 1}", tool_name="read_file",
                                        content=(TextPart(text=text(rnd.randint(60, 150))),))
        entry = MessageEntry(parent_id=parent, message=message)
        parent = entry.id
        out.append(entry)
    return out


def payload_texts(n: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    return [base64.b64encode(rng.randbytes(PAYLOAD_CHARS * 3 // 4)).decode() for _ in range(n)]


def payload_message(text: str, index: int) -> Message:
    if index % 2 == 0:
        return UserMessage.of(text)
    return AssistantMessage(content=(TextPart(text=text),))


def payload(n: int, seed: int = 7) -> list[MessageEntry]:
    """The peers' workload as a chain of entries."""
    out: list[MessageEntry] = []
    parent: str | None = None
    for i, text in enumerate(payload_texts(n, seed)):
        entry = MessageEntry(parent_id=parent, message=payload_message(text, i))
        parent = entry.id
        out.append(entry)
    return out


def payload_bytes(entries: list[MessageEntry]) -> int:
    return sum(len(e.message.text.encode()) for e in entries)


def chat(parent: str | None, n: int = 0) -> MessageEntry:
    text = f"turn {n}: " + "some ordinary sentence of chat. " * 6
    return MessageEntry(parent_id=parent, message=UserMessage.of(text))


def chain(n: int, parent: str | None = None) -> list[MessageEntry]:
    """``n`` chat entries, each the child of the one before."""
    out = []
    for k in range(n):
        out.append(chat(parent, k))
        parent = out[-1].id
    return out
