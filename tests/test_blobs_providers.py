"""S60: providers resolve blob references when they build a request.

Each provider's real SDK talks to ``WireServer`` over TCP; the test reads the
request the server received and finds the attachment's bytes in the form that
API takes. A blob that is not there is a typed ``BlobNotFound`` naming the
session, the entry and the hash, and no request goes out.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import pytest

from support.wire_server import WireServer, sse_data, sse_named, sse_reply
from threadline.ai import (
    BlobPart,
    BlobRef,
    ErrorEvent,
    ModelInfo,
    Request,
    TextPart,
    ToolResultMessage,
    UserMessage,
)
from threadline.ai.providers._anthropic import AnthropicModel
from threadline.ai.providers._openai_chat import OpenAIChatModel
from threadline.ai.providers._openai_responses import OpenAIResponsesModel
from threadline.errors import BlobNotFound

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
PDF = b"%PDF-1.4\n" + b"\x00\xff" * 300 + b"\n%%EOF\n"
NOTES = "caf\u00e9 notes\n".encode()
ZIP = b"PK\x03\x04 not for models"


def part(data: bytes, media_type: str, name: str | None = None) -> BlobPart:
    return BlobPart(sha256=hashlib.sha256(data).hexdigest(), media_type=media_type,
                    size=len(data), name=name)


IMG, DOC, TXT, ARC = (part(PNG, "image/png", "chart.png"), part(PDF, "application/pdf",
                      "report.pdf"), part(NOTES, "text/plain", "notes.txt"),
                      part(ZIP, "application/zip", "x.zip"))
BYTES = {IMG.sha256: PNG, DOC.sha256: PDF, TXT.sha256: NOTES, ARC.sha256: ZIP}


class Reader:
    def __init__(self, stored: dict[str, bytes]) -> None:
        self.stored = stored
        self.read: list[str] = []

    async def __call__(self, p: BlobPart) -> bytes:
        self.read.append(p.sha256)
        if p.sha256 not in self.stored:
            raise BlobNotFound(p.sha256, session_id="s", entry_id="e")
        return self.stored[p.sha256]


def request(reader: Reader | None, *content: Any) -> Request:
    return Request(messages=(UserMessage(content=(TextPart(text="look"), *content)),),
                   blobs=reader)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


OPENAI = ModelInfo(provider="openai", id="gpt-test", images=True)
CLAUDE = ModelInfo(provider="anthropic", id="claude-test", images=True, max_output_tokens=64)
_models: list[Any] = []


@pytest.fixture(autouse=True)
async def _close_models() -> Any:
    yield
    while _models:
        await _models.pop().aclose()


def chat(srv: WireServer, **kw: Any) -> OpenAIChatModel:
    m = OpenAIChatModel(OPENAI, api_key="k", base_url=srv.url + "/v1", max_retries=0, **kw)
    _models.append(m)
    return m


def responses(srv: WireServer, **kw: Any) -> OpenAIResponsesModel:
    m = OpenAIResponsesModel(OPENAI, api_key="k", base_url=srv.url + "/v1", max_retries=0, **kw)
    _models.append(m)
    return m


def claude(srv: WireServer, **kw: Any) -> AnthropicModel:
    m = AnthropicModel(CLAUDE, api_key="k", base_url=srv.url, max_retries=0, cache=False, **kw)
    _models.append(m)
    return m


def chat_reply() -> Any:
    return sse_reply(sse_data([
        {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-test",
         "choices": [{"index": 0, "delta": {"role": "assistant", "content": "ok"},
                      "finish_reason": "stop"}]}]))


def responses_reply() -> Any:
    obj = {"id": "resp_1", "object": "response", "created_at": 1, "model": "gpt-test",
           "status": "completed", "output": [], "parallel_tool_calls": True,
           "tool_choice": "auto", "tools": []}
    return sse_reply(sse_data([
        {"type": "response.output_item.added", "sequence_number": 0, "output_index": 0,
         "item": {"type": "message", "id": "m1", "role": "assistant", "status": "in_progress",
                  "content": []}},
        {"type": "response.output_text.delta", "sequence_number": 1, "item_id": "m1",
         "output_index": 0, "content_index": 0, "delta": "ok", "logprobs": []},
        {"type": "response.completed", "sequence_number": 2, "response": obj}], done=False))


def claude_reply() -> Any:
    return sse_reply(sse_named([
        {"type": "message_start", "message": {
            "id": "msg_1", "type": "message", "role": "assistant", "content": [],
            "model": "claude-test", "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "text_delta", "text": "ok"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
         "usage": {"output_tokens": 1}},
        {"type": "message_stop"}]))


async def run(model: Any, req: Request) -> list[Any]:
    return [e async for e in model.stream(req)]


# --------------------------------------------------------------------------- each API's form


async def test_s60_chat_receives_image_pdf_and_text_file() -> None:
    reader = Reader(BYTES)
    async with WireServer() as srv:
        srv.reply(chat_reply())
        events = await run(chat(srv), request(reader, IMG, DOC, TXT, ARC))
    assert not isinstance(events[-1], ErrorEvent)
    content = srv.received[0].body["messages"][0]["content"]
    assert content[0] == {"type": "text", "text": "look"}
    assert content[1] == {"type": "image_url",
                          "image_url": {"url": "data:image/png;base64," + b64(PNG)}}
    assert content[2] == {"type": "file", "file": {
        "filename": "report.pdf", "file_data": "data:application/pdf;base64," + b64(PDF)}}
    assert content[3] == {"type": "text", "text": "File notes.txt (text/plain):\ncaf\u00e9 notes\n"}
    # A type no API takes is said, not dropped.
    assert "x.zip omitted: application/zip" in content[4]["text"]
    assert sorted(reader.read) == sorted(BYTES)  # each blob read once


async def test_s60_responses_receives_image_and_pdf() -> None:
    async with WireServer() as srv:
        srv.reply(responses_reply())
        await run(responses(srv), request(Reader(BYTES), IMG, DOC))
    content = srv.received[0].body["input"][0]["content"]
    assert content[1] == {"type": "input_image", "detail": "auto",
                          "image_url": "data:image/png;base64," + b64(PNG)}
    assert content[2] == {"type": "input_file", "filename": "report.pdf",
                          "file_data": "data:application/pdf;base64," + b64(PDF)}


async def test_s60_anthropic_receives_image_and_document_blocks() -> None:
    async with WireServer() as srv:
        srv.reply(claude_reply())
        await run(claude(srv), request(Reader(BYTES), IMG, DOC, TXT))
    content = srv.received[0].body["messages"][0]["content"]
    assert content[1] == {"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": b64(PNG)}}
    assert content[2] == {"type": "document", "title": "report.pdf", "source": {
        "type": "base64", "media_type": "application/pdf", "data": b64(PDF)}}
    assert content[3] == {"type": "document", "title": "notes.txt", "source": {
        "type": "text", "media_type": "text/plain", "data": "caf\u00e9 notes\n"}}


async def test_s60_a_tool_result_image_reaches_every_api() -> None:
    result = ToolResultMessage(tool_call_id="call_1", tool_name="shot",
                               content=(TextPart(text="here"), IMG))
    from threadline.ai import AssistantMessage, ToolCall

    call = AssistantMessage(content=(ToolCall(id="call_1", name="shot"),), stop_reason="tool_use")
    req = Request(messages=(UserMessage.of("go"), call, result), blobs=Reader(BYTES))
    async with WireServer() as srv:
        srv.reply(chat_reply(), responses_reply(), claude_reply())
        await run(chat(srv), req)
        await run(responses(srv), req)
        await run(claude(srv), req)
    url = "data:image/png;base64," + b64(PNG)
    chat_body, resp_body, claude_body = (r.body for r in srv.received)
    assert chat_body["messages"][-1]["content"][1]["image_url"]["url"] == url
    assert resp_body["input"][-1]["output"][1]["image_url"] == url
    tool_result = claude_body["messages"][-1]["content"][0]
    assert tool_result["content"][1]["source"]["data"] == b64(PNG)


# --------------------------------------------------------------------------- missing, hook


@pytest.mark.parametrize("make", [chat, responses, claude])
async def test_s60_missing_blob_raises_before_any_request(make: Any) -> None:
    async with WireServer() as srv:
        with pytest.raises(BlobNotFound) as caught:
            await run(make(srv), request(Reader({}), IMG))
    assert caught.value.key == IMG.sha256
    assert caught.value.entry_id == "e"
    assert srv.received == []


async def test_s60_request_without_reader_is_a_typed_error() -> None:
    async with WireServer() as srv:
        with pytest.raises(BlobNotFound, match="no reader"):
            await run(chat(srv), request(None, IMG))
    assert srv.received == []


async def test_s60_upload_hook_sends_a_reference_instead_of_bytes() -> None:
    seen: list[str] = []

    async def upload(p: BlobPart, read: Any) -> BlobRef | None:
        seen.append(p.media_type)
        if p.media_type == "application/pdf":
            assert await read(p) == PDF  # the hook may read the bytes to upload them
            return BlobRef(file_id="file-abc")
        if p.media_type == "image/png":
            return BlobRef(url="https://files.example/chart.png")
        return None

    reader = Reader(BYTES)
    async with WireServer() as srv:
        srv.reply(chat_reply(), responses_reply(), claude_reply())
        await run(chat(srv, upload=upload), request(reader, IMG, DOC))
        await run(responses(srv, upload=upload), request(reader, IMG, DOC))
        await run(claude(srv, upload=upload), request(reader, IMG, DOC))
    chat_c, resp_c, claude_c = (
        srv.received[0].body["messages"][0]["content"], srv.received[1].body["input"][0]["content"],
        srv.received[2].body["messages"][0]["content"])
    assert chat_c[1:] == [
        {"type": "image_url", "image_url": {"url": "https://files.example/chart.png"}},
        {"type": "file", "file": {"file_id": "file-abc"}}]
    assert resp_c[1:] == [
        {"type": "input_image", "image_url": "https://files.example/chart.png", "detail": "auto"},
        {"type": "input_file", "file_id": "file-abc"}]
    assert claude_c[1]["source"] == {"type": "url", "url": "https://files.example/chart.png"}
    assert claude_c[2]["source"] == {"type": "file", "file_id": "file-abc"}
    assert b64(PDF) not in str(srv.received[0].body)
    assert b64(PNG) not in str(srv.received[0].body)


async def test_s60_text_only_model_gets_a_note_not_the_image() -> None:
    async with WireServer() as srv:
        srv.reply(chat_reply())
        m = OpenAIChatModel(ModelInfo(provider="ollama", id="llama"), api_key="k",
                            base_url=srv.url + "/v1", max_retries=0)
        _models.append(m)
        await run(m, request(Reader(BYTES), IMG))
    assert srv.received[0].body["messages"][0]["content"] == (
        "look\n(image omitted: this model does not accept images)")


# --------------------------------------------------------------------------- through the agent


async def test_s60_durable_run_sends_an_attached_image() -> None:
    from threadline import durable
    from threadline.agent import AgentEnd
    from threadline.stores import MemoryStore, attach

    store = MemoryStore()
    async with WireServer() as srv:
        srv.reply(chat_reply(), chat_reply())
        agent = await durable.open(durable.model(chat(srv)), store=store, session_id="pics")
        img = await attach(store, "pics", PNG, media_type="image/png", name="chart.png")
        events = await agent.run([UserMessage(content=(TextPart(text="look"), img))]).collect()
        assert isinstance(events[-1], AgentEnd) and events[-1].error is None
        # The next turn rebuilds the context from the log: the image goes again, from the store.
        await agent.run("and now?").collect()
    for received in srv.received:
        assert received.body["messages"][0]["content"][1]["image_url"]["url"] == (
            "data:image/png;base64," + b64(PNG))
    stored = await store.load_entries("pics")
    assert b64(PNG) not in str(stored)  # the log holds the reference only


async def test_s60_durable_run_with_a_missing_blob_names_session_entry_and_hash() -> None:
    from threadline import durable
    from threadline.agent import AgentEnd
    from threadline.stores import MemoryStore

    store = MemoryStore()
    async with WireServer() as srv:
        srv.reply(chat_reply())
        agent = await durable.open(durable.model(chat(srv)), store=store, session_id="gone")
        events = await agent.run([UserMessage(content=(TextPart(text="look"), IMG))]).collect()
    end = events[-1]
    assert isinstance(end, AgentEnd) and isinstance(end.error, BlobNotFound)
    user_entry = agent.path()[0]
    assert end.error.key == IMG.sha256
    assert end.error.session_id == "gone"
    assert end.error.entry_id == user_entry.id
    for text in ("gone", user_entry.id, IMG.sha256):
        assert text in str(end.error)
    assert srv.received == []  # nothing half-sent
    # The failure is on the record, as any failed model call is.
    assert "BlobNotFound" in (agent.path()[-1].message.error_message or "")  # type: ignore[attr-defined]


async def test_s60_encrypted_store_run_sends_the_plaintext_and_stores_none(
        tmp_path: Any) -> None:
    """Through EncryptedStore the reader opens the subject's sealed blob for the model."""
    from threadline import durable
    from threadline.privacy import EncryptedStore, Keyring, LocalKeyProvider
    from threadline.stores import FileStore, attach

    inner = FileStore(tmp_path / "store")
    store = EncryptedStore(inner, Keyring(tmp_path / "keyring", LocalKeyProvider(b"k" * 32)))
    async with WireServer() as srv:
        srv.reply(claude_reply())
        agent = await durable.open(durable.model(claude(srv)), store=store, session_id="enc")
        part = await attach(store, "enc", PDF, media_type="application/pdf", name="r.pdf")
        await agent.run([UserMessage(content=(TextPart(text="read"), part))]).collect()
    doc = srv.received[0].body["messages"][0]["content"][1]
    assert doc["source"]["data"] == b64(PDF)
    on_disk = b"".join(p.read_bytes() for p in (tmp_path / "store").rglob("*") if p.is_file())
    assert PDF[:40] not in on_disk and b64(PDF)[:40].encode() not in on_disk
    await store.close()
