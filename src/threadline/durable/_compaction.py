"""Compaction: fold the old part of a conversation into a model-written summary.

The pure core takes entries or messages and returns values:

- ``estimate_path``: how big the context of a path is, preferring the token
  count a provider reported (``estimate_tokens`` is the heuristic for one
  message);
- ``plan_compaction``: where the kept tail starts, at a point that never
  separates a tool call from its result, and what is folded.

At the edge, ``summarize`` asks a ``LanguageModel`` for the summary, and
``compact_agent`` / ``maybe_compact`` drive a ``DurableAgent`` (they back
``DurableAgent.compact_with`` and automatic compaction before a run).

Token heuristic. Without a provider's count, a message costs
``MESSAGE_OVERHEAD_TOKENS`` plus one token per four bytes of UTF-8 in its text,
reasoning, tool name and tool-call arguments (as compact JSON), plus
``IMAGE_TOKENS`` per image. Counting bytes rather than characters keeps
scripts that need more tokens per character (CJK, Cyrillic) from being
underestimated. It is a rough guide (real tokenizers differ by model), so
thresholds should leave headroom.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import msgspec

from threadline.ai import _trace as trace
from threadline.ai._messages import (
    AssistantMessage,
    BlobPart,
    ImagePart,
    Message,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from threadline.ai._model import DoneEvent, ErrorEvent, LanguageModel, Request, StreamOptions
from threadline.durable._usage import compaction_details
from threadline.errors import ConfigError, ModelError
from threadline.session._context import build_context, model_view, visible_entries
from threadline.session._entries import CompactionEntry, Entry, MessageEntry

if TYPE_CHECKING:
    import asyncio


class _Compactable(Protocol):
    """What compaction needs of a durable agent (so this module need not import it)."""

    @property
    def session_id(self) -> str: ...

    def path(self) -> list[Entry]: ...

    async def compact(
        self, summary: str, first_kept_entry_id: str, *, tokens_before: int = 0,
        details: Any = None,
    ) -> CompactionEntry: ...

__all__ = [
    "IMAGE_TOKENS",
    "MESSAGE_OVERHEAD_TOKENS",
    "SUMMARY_SYSTEM_PROMPT",
    "TRUNCATE_CHARS",
    "CompactionPlan",
    "CompactionPolicy",
    "TokenEstimate",
    "compact_agent",
    "estimate_path",
    "estimate_tokens",
    "maybe_compact",
    "plan_compaction",
    "summarize",
]

IMAGE_TOKENS = 1_200
"""Flat cost of one image: providers bill roughly this for a mid-sized picture."""

MESSAGE_OVERHEAD_TOKENS = 4
"""Role markers and framing every message costs."""

TRUNCATE_CHARS = 2_000
"""Tool results, tool-call arguments and reasoning longer than this are cut to
this many characters (head and tail kept) in what is sent for summarising."""


# -- token estimates -----------------------------------------------------------


def _bytes(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def estimate_tokens(message: Message) -> int:
    """A heuristic token count for one message (see the module docstring)."""
    size = 0
    images = 0
    if isinstance(message, ToolResultMessage):
        size += _bytes(message.tool_name)
    for part in message.content:
        if isinstance(part, TextPart):
            size += _bytes(part.text)
        elif isinstance(part, ImagePart) or (
                isinstance(part, BlobPart) and part.media_type.startswith("image/")):
            images += 1
        elif isinstance(part, BlobPart):
            size += part.size  # a file a provider sends inline costs about its size
        elif isinstance(part, ThinkingPart):
            size += _bytes(part.thinking)
        elif isinstance(part, ToolCall):
            size += _bytes(part.name) + len(msgspec.json.encode(part.arguments))
    return MESSAGE_OVERHEAD_TOKENS + -(-size // 4) + images * IMAGE_TOKENS


@dataclass(frozen=True, slots=True)
class TokenEstimate:
    """A context size: what a provider reported plus a heuristic for the rest.

    ``usage_tokens`` is the total usage of the last assistant message that
    carries one (its input, cached input and output: the whole context up to
    and including that reply); ``estimated_tokens`` is the heuristic for the
    messages after it, or for all messages when no usage applies.
    """

    usage_tokens: int = 0
    estimated_tokens: int = 0

    @property
    def tokens(self) -> int:
        return self.usage_tokens + self.estimated_tokens

    @property
    def method(self) -> Literal["usage+heuristic", "heuristic"]:
        return "usage+heuristic" if self.usage_tokens else "heuristic"


def _usage(message: AssistantMessage) -> int:
    # A failed or aborted reply may report partial usage, or none at all.
    if message.stop_reason in ("error", "aborted"):
        return 0
    return message.usage.total_tokens


def _estimate(
    messages: Sequence[Message], trusted: Callable[[AssistantMessage], bool]
) -> TokenEstimate:
    estimated = 0
    for message in reversed(messages):
        if isinstance(message, AssistantMessage) and trusted(message):
            used = _usage(message)
            if used:
                return TokenEstimate(usage_tokens=used, estimated_tokens=estimated)
        estimated += estimate_tokens(message)
    return TokenEstimate(estimated_tokens=estimated)


def estimate_path(path: Sequence[Entry]) -> TokenEstimate:
    """Estimated size of the context ``build_context(path)`` gives.

    A provider's usage is trusted only for replies written after the latest
    compaction on the path: replies in the kept tail were billed for the
    larger context that existed before it.
    """
    messages = build_context(path)
    fresh = {id(e.message) for e in visible_entries(path).recent if isinstance(e, MessageEntry)}
    return _estimate(messages, lambda m: id(m) in fresh)


# -- where to cut --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CompactionPlan:
    """What a compaction of a path would do, before asking any model."""

    first_kept_entry_id: str
    """Where the kept tail starts; everything visible before it is folded."""
    messages: tuple[Message, ...]
    """The context being folded (provider-valid), without the previous summary."""
    previous_summary: str | None
    """The summary of the latest compaction on the path, to be folded in too."""
    tokens_before: TokenEstimate
    """Estimated size of the whole context now."""
    kept_tokens: int
    """Heuristic size of the kept tail."""


def plan_compaction(path: Sequence[Entry], keep_recent_tokens: int) -> CompactionPlan | None:
    """Plan a compaction that keeps about ``keep_recent_tokens`` of recent context.

    The kept tail starts at the latest safe point whose tail (by the heuristic)
    holds at least ``keep_recent_tokens``. A safe point is a user message, a
    custom message, a branch summary or an assistant message (which starts a
    turn of the loop) such that no tool result at or after it answers a call
    made before it: so a call and its result are folded or kept together, and
    a run of results is never split. Only what the current context shows
    verbatim is considered, which is the tail an earlier compaction kept plus
    everything after it; that compaction's summary is carried in
    ``previous_summary``. None when nothing would be folded.
    """
    if keep_recent_tokens < 0:
        raise ConfigError(f"keep_recent_tokens must be >= 0, got {keep_recent_tokens}")
    visible = visible_entries(path)
    live = visible.entries
    previous_summary = visible.compaction.summary if visible.compaction is not None else None
    # A result answers the most recent open call with its id (as in
    # normalize_tool_pairs); every point after that call up to the result is
    # unsafe. Counted with a difference array over positions in ``live``.
    blocked = [0] * (len(live) + 1)
    open_calls: dict[str, int] = {}
    seen: list[Message | None] = []
    for pos, entry in enumerate(live):
        m = model_view(entry)
        seen.append(m)
        if isinstance(m, AssistantMessage):
            for call in m.tool_calls:
                open_calls[call.id] = pos
        elif isinstance(m, ToolResultMessage):
            call_pos = open_calls.pop(m.tool_call_id, None)
            if call_pos is not None:
                blocked[call_pos + 1] += 1
                blocked[pos + 1] -= 1
    cut: int | None = None
    tail = 0
    depth = 0  # coverage at ``pos``: the prefix sum, walked back from its total (0)
    for pos in range(len(live) - 1, -1, -1):
        depth -= blocked[pos + 1]
        m = seen[pos]
        if m is None:
            continue
        tail += estimate_tokens(m)
        if tail >= keep_recent_tokens and depth == 0 and not isinstance(m, ToolResultMessage):
            cut = pos
            break
    if cut is None:
        return None
    folded = build_context(live[:cut])
    if not folded:
        return None
    return CompactionPlan(
        first_kept_entry_id=live[cut].id,
        messages=tuple(folded),
        previous_summary=previous_summary,
        tokens_before=estimate_path(path),
        kept_tokens=tail,
    )


# -- the summary request -------------------------------------------------------

SUMMARY_SYSTEM_PROMPT = (
    "You condense conversations between a user and an AI assistant that works with "
    "tools. Your summary replaces the older part of the conversation in the "
    "assistant's memory: the assistant will continue the work from your summary and "
    "the most recent messages alone, so anything you leave out is lost to it. Do not "
    "continue the conversation, answer questions in it or call tools; only write the "
    "summary."
)

_SECTIONS = """\
Write the summary in Markdown with exactly these sections, in this order:

## Goal
What the user is trying to achieve, with the constraints and preferences they stated.

## Decisions
What was decided and why, including approaches that were tried and rejected.

## Progress
What has been done so far, what worked and what failed.

## Open items
What remains to be done, questions still unanswered, and the next step.

## Key facts and files
File paths, names, identifiers, commands, values, URLs and error messages the work \
depends on, copied exactly.

Be brief, but keep every detail the assistant will need; prefer exact names to \
descriptions. Write "None." under a section with nothing to report."""


def _truncate(text: str, limit: int = TRUNCATE_CHARS) -> str:
    if len(text) <= limit:
        return text
    head = limit * 3 // 4
    tail = limit - head
    omitted = len(text) - head - tail
    return f"{text[:head]}\n[... {omitted} characters omitted ...]\n{text[-tail:]}"


def _content_text(parts: Sequence[Any]) -> str:
    out = []
    for p in parts:
        if isinstance(p, TextPart):
            out.append(p.text)
        elif isinstance(p, ImagePart):
            out.append(f"[image: {p.mime_type}]")
        elif isinstance(p, BlobPart):
            out.append(f"[attachment: {p.media_type}, {p.size:,} bytes"
                       + (f", {p.name}]" if p.name else "]"))
    return "\n".join(out)


def _transcript(messages: Sequence[Message]) -> str:
    """The conversation as plain text, one labelled block per message part."""
    blocks: list[str] = []
    for m in messages:
        if isinstance(m, UserMessage):
            blocks.append(f"[user]\n{_content_text(m.content)}")
        elif isinstance(m, ToolResultMessage):
            label = f"[tool result: {m.tool_name}{', error' if m.is_error else ''}]"
            blocks.append(f"{label}\n{_truncate(_content_text(m.content))}")
        else:
            for p in m.content:
                if isinstance(p, TextPart) and p.text:
                    blocks.append(f"[assistant]\n{p.text}")
                elif isinstance(p, ThinkingPart) and p.thinking and not p.redacted:
                    blocks.append(f"[assistant reasoning]\n{_truncate(p.thinking)}")
                elif isinstance(p, ToolCall):
                    args = msgspec.json.encode(p.arguments).decode()
                    blocks.append(f"[assistant tool call: {p.name}]\n{_truncate(args)}")
    return "\n\n".join(blocks)


def _summary_request(
    messages: Sequence[Message], previous_summary: str | None, instructions: str | None
) -> Request:
    parts = []
    if previous_summary:
        parts.append(
            "Summary of the conversation before the part below:\n"
            f"<previous-summary>\n{previous_summary}\n</previous-summary>"
        )
    parts.append(f"<conversation>\n{_transcript(messages)}\n</conversation>")
    task = "Summarize the conversation above"
    if previous_summary:
        task += (
            ", folding in the previous summary: keep what still holds, update what "
            "changed, and drop nothing that is still relevant"
        )
    parts.append(f"{task}.\n\n{_SECTIONS}")
    if instructions:
        parts.append(f"Additional instructions:\n{instructions}")
    return Request(messages=(UserMessage.of("\n\n".join(parts)),), system=SUMMARY_SYSTEM_PROMPT)


async def summarize(
    model: LanguageModel,
    messages: Sequence[Message],
    *,
    previous_summary: str | None = None,
    instructions: str | None = None,
    abort: asyncio.Event | None = None,
) -> str:
    """Ask ``model`` for a structured summary of ``messages``.

    The conversation is sent as one plain-text transcript inside a single user
    message, so the request is valid for every provider whatever the messages
    hold (tool calls without tool definitions, another provider's reasoning
    signatures) and the model is not tempted to continue the conversation.
    Tool results, tool-call arguments and reasoning are cut to
    ``TRUNCATE_CHARS`` characters each (head and tail kept); images become a
    ``[image: <type>]`` marker. ``previous_summary`` is folded in.

    Raises the model's typed ``ModelError`` when the stream fails, is aborted,
    or yields an empty summary.
    """
    return (await _summarize(model, messages, previous_summary=previous_summary,
                             instructions=instructions, abort=abort)).text.strip()


async def _summarize(
    model: LanguageModel,
    messages: Sequence[Message],
    *,
    previous_summary: str | None,
    instructions: str | None,
    abort: asyncio.Event | None,
) -> AssistantMessage:
    """``summarize``, giving the model's whole reply (its usage is stored with the entry)."""
    request = _summary_request(messages, previous_summary, instructions)
    info = model.info
    final: AssistantMessage | None = None
    error: BaseException | None = None
    span = trace.model_span(info.provider, info.id, request.messages, request.system)
    stream = model.stream(request, StreamOptions(abort=abort))
    try:
        async for event in stream:
            if isinstance(event, ErrorEvent):
                raise event.error or ModelError(
                    f"summary request failed: {event.message.error_message or 'no reason'}"
                    f" (stop reason {event.message.stop_reason})",
                    provider=info.provider, model=info.id,
                )
            if isinstance(event, DoneEvent):
                final = event.message
                break
    except ModelError as exc:
        error = exc
        raise
    except Exception as exc:
        error = exc
        raise ModelError(f"summary request failed: {type(exc).__name__}: {exc}",
                         provider=info.provider, model=info.id) from exc
    finally:
        trace.end_model_span(span, final or AssistantMessage(stop_reason="error"), error)
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()
    if final is None:
        raise ModelError("summary stream ended without a final message",
                         provider=info.provider, model=info.id)
    summary = final.text.strip()
    if not summary:
        raise ModelError("the model returned an empty summary",
                         provider=info.provider, model=info.id)
    return final


# -- driving a durable agent ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class CompactionPolicy:
    """Automatic compaction, checked before each run of a durable agent.

    When the estimated context (the path plus the run's input) exceeds
    ``threshold * context_window``, the agent compacts first, keeping about
    ``keep_recent_tokens`` of recent context. ``model`` writes the summary;
    ``None`` means the run's own model, which a factory exposes as its ``lm``
    attribute (``durable.model(...)`` does). ``context_window`` overrides the
    window of the run's model (or of ``model`` when the factory exposes none).
    """

    model: LanguageModel | None = None
    threshold: float = 0.8
    keep_recent_tokens: int = 20_000
    instructions: str | None = None
    context_window: int | None = None

    def __post_init__(self) -> None:
        if not 0 < self.threshold <= 1:
            raise ConfigError(f"compaction threshold must be in (0, 1], got {self.threshold}")
        if self.keep_recent_tokens < 0:
            raise ConfigError(
                f"keep_recent_tokens must be >= 0, got {self.keep_recent_tokens}")
        if self.context_window is not None and self.context_window <= 0:
            raise ConfigError(f"context_window must be > 0, got {self.context_window}")

    def models(self, factory: object) -> tuple[LanguageModel, int]:
        """The summarising model and the context window to measure against."""
        lm = getattr(factory, "lm", None)
        run_model = lm if isinstance(lm, LanguageModel) else None
        summarizer = self.model or run_model
        if summarizer is None:
            raise ConfigError(
                f"automatic compaction needs a model to write summaries, and the factory "
                f"{factory!r} exposes none (no 'lm' attribute): pass "
                "CompactionPolicy(model=...)"
            )
        window = self.context_window or (run_model or summarizer).info.context_window
        return summarizer, window


async def compact_agent(
    agent: _Compactable,
    model: LanguageModel,
    *,
    keep_recent_tokens: int,
    instructions: str | None = None,
    abort: asyncio.Event | None = None,
    details: dict[str, Any] | None = None,
) -> CompactionEntry | None:
    """Plan, summarise and append one compaction (see ``DurableAgent.compact_with``)."""
    plan = plan_compaction(agent.path(), keep_recent_tokens)
    if plan is None:
        return None
    try:
        with trace.conversation(agent.session_id):
            reply = await _summarize(model, plan.messages,
                                     previous_summary=plan.previous_summary,
                                     instructions=instructions, abort=abort)
    except ModelError as exc:
        exc.add_note(f"while summarising session {agent.session_id!r} for compaction; "
                     "nothing was appended")
        raise
    info = model.info
    record = {
        "trigger": "manual",
        "estimate": plan.tokens_before.method,
        "usage_tokens": plan.tokens_before.usage_tokens,
        "estimated_tokens": plan.tokens_before.estimated_tokens,
        "kept_tokens": plan.kept_tokens,
        "keep_recent_tokens": keep_recent_tokens,
        "summarized_messages": len(plan.messages),
        "model": f"{info.provider}:{info.id}",
        **compaction_details(reply.provider or info.provider, reply.model or info.id,
                             reply.usage),
        **(details or {}),
    }
    return await agent.compact(reply.text.strip(), plan.first_kept_entry_id,
                               tokens_before=plan.tokens_before.tokens, details=record)


async def maybe_compact(
    agent: _Compactable, policy: CompactionPolicy, factory: object, input: Sequence[Message]
) -> CompactionEntry | None:
    """Compact ``agent`` if its context plus ``input`` is over the policy's threshold."""
    summarizer, window = policy.models(factory)
    tokens = estimate_path(agent.path()).tokens + sum(estimate_tokens(m) for m in input)
    limit = policy.threshold * window
    if tokens <= limit:
        return None
    return await compact_agent(
        agent, summarizer, keep_recent_tokens=policy.keep_recent_tokens,
        instructions=policy.instructions,
        details={"trigger": "auto", "context_tokens": tokens, "context_window": window,
                 "threshold": policy.threshold},
    )
