"""Resolving models from ``"provider:model"`` strings."""

from __future__ import annotations

import subprocess
import sys

import pytest

from support.wire_server import WireServer, sse_data, sse_reply
from threadline.ai import DoneEvent, Request, UserMessage, get_model
from threadline.ai.providers import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel
from threadline.errors import ConfigError

KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENROUTER_API_KEY", "OLLAMA_API_KEY",
        "OPENAI_BASE_URL", "ANTHROPIC_BASE_URL", "OLLAMA_BASE_URL")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in KEYS:
        monkeypatch.delenv(key, raising=False)


@pytest.mark.parametrize(("spec", "var"), [
    ("openai:gpt-4.1-mini", "OPENAI_API_KEY"),
    ("openai-responses:o4-mini", "OPENAI_API_KEY"),
    ("anthropic:claude-sonnet-4-5", "ANTHROPIC_API_KEY"),
    ("openrouter:anthropic/claude-sonnet-4", "OPENROUTER_API_KEY"),
])
def test_missing_key_names_the_variable(spec: str, var: str) -> None:
    with pytest.raises(ConfigError, match=var):
        get_model(spec)


async def test_keys_from_environment_and_known_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-env")
    chat = get_model("openai:gpt-4.1-mini")
    assert isinstance(chat, OpenAIChatModel)
    assert (chat.info.provider, chat.info.id) == ("openai", "gpt-4.1-mini")
    assert chat.info.context_window == 1_047_576
    assert chat.info.images
    resp = get_model("openai-responses:o4-mini")
    assert isinstance(resp, OpenAIResponsesModel)
    assert resp.info.reasoning
    claude = get_model("anthropic:claude-sonnet-4-5-20250929")
    assert isinstance(claude, AnthropicModel)
    assert claude.info.context_window == 200_000
    unknown = get_model("anthropic:claude-next", context_window=1_000_000)
    assert unknown.info.context_window == 1_000_000
    routed = get_model("openrouter:anthropic/claude-sonnet-4", api_key="sk-or")
    assert routed.info.images and routed.info.provider == "openrouter"
    for m in (chat, resp, claude, unknown, routed):
        await m.aclose()  # type: ignore[attr-defined]


@pytest.mark.parametrize("spec", ["gpt-4.1", "openai:", ":x", "nosuch:model"])
def test_bad_specs(spec: str) -> None:
    with pytest.raises(ConfigError, match="model"):
        get_model(spec)


def test_unknown_info_field_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="no_such_field"):
        get_model("ollama:llama3.2", no_such_field=1)


async def test_ollama_preset_needs_no_key_and_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    async with WireServer() as srv:
        monkeypatch.setenv("OLLAMA_BASE_URL", srv.url + "/v1")
        model = get_model("ollama:llama3.2", max_retries=0)
        assert model.info.context_window == 32_768
        assert not model.info.images
        srv.reply(sse_reply(sse_data([
            {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "llama3.2",
             "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}])))
        events = [e async for e in model.stream(Request(messages=(UserMessage.of("x"),)))]
        await model.aclose()  # type: ignore[attr-defined]
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].message.provider == "ollama"
    assert srv.received[0].path == "/v1/chat/completions"
    # A local server needs no key; the SDK still sends a placeholder.
    assert srv.received[0].headers["authorization"] == "Bearer unused"


def test_missing_sdk_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    monkeypatch.setitem(sys.modules, "anthropic", None)  # makes `import anthropic` fail
    monkeypatch.delitem(sys.modules, "threadline.ai.providers._anthropic", raising=False)
    with pytest.raises(ConfigError, match=r"threadline\[anthropic\]"):
        get_model("anthropic:claude-sonnet-4")


def test_importing_threadline_ai_loads_no_sdk() -> None:
    code = ("import sys, threadline.ai; "
            "print(any(m in sys.modules for m in ('openai', 'anthropic')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
