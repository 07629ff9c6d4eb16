"""Resolving a model from a ``"provider:model"`` string.

``get_model("openai:gpt-4.1-mini")`` builds a Chat Completions model,
``"openai-responses:..."`` one on the Responses API, ``"anthropic:..."`` one
on the Messages API, and the presets ``ollama``, ``vllm``, ``llamacpp`` and
``openrouter`` point the Chat Completions client at those servers. Keys come
from the usual environment variables; SDKs are imported only when a model of
theirs is built, so each extra stays optional.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from threadline.ai._model import LanguageModel, ModelInfo
from threadline.errors import ConfigError

__all__ = ["PROVIDERS", "Provider", "get_model", "model_info"]


@dataclass(frozen=True, slots=True)
class Provider:
    """How to reach one provider: which API, where, and which key."""

    api: str
    """``openai-chat``, ``openai-responses`` or ``anthropic-messages``."""
    base_url: str | None = None
    base_url_env: str | None = None
    key_env: str | None = None
    key_required: bool = True
    defaults: ModelInfo | None = None
    """Limits assumed for a model not in the known-models table."""


_LOCAL = ModelInfo(provider="", id="", context_window=32_768, max_output_tokens=4_096)

PROVIDERS: dict[str, Provider] = {
    "openai": Provider("openai-chat", key_env="OPENAI_API_KEY", base_url_env="OPENAI_BASE_URL"),
    "openai-responses": Provider(
        "openai-responses", key_env="OPENAI_API_KEY", base_url_env="OPENAI_BASE_URL"),
    "anthropic": Provider(
        "anthropic-messages", key_env="ANTHROPIC_API_KEY", base_url_env="ANTHROPIC_BASE_URL",
        defaults=ModelInfo(provider="", id="", context_window=200_000, max_output_tokens=32_000,
                           images=True, reasoning=True)),
    "openrouter": Provider(
        "openai-chat", base_url="https://openrouter.ai/api/v1", key_env="OPENROUTER_API_KEY"),
    "ollama": Provider(
        "openai-chat", base_url="http://127.0.0.1:11434/v1", base_url_env="OLLAMA_BASE_URL",
        key_env="OLLAMA_API_KEY", key_required=False, defaults=_LOCAL),
    "vllm": Provider(
        "openai-chat", base_url="http://127.0.0.1:8000/v1", base_url_env="VLLM_BASE_URL",
        key_env="VLLM_API_KEY", key_required=False, defaults=_LOCAL),
    "llamacpp": Provider(
        "openai-chat", base_url="http://127.0.0.1:8080/v1", base_url_env="LLAMACPP_BASE_URL",
        key_env="LLAMACPP_API_KEY", key_required=False, defaults=_LOCAL),
}
PROVIDERS["llama.cpp"] = PROVIDERS["llamacpp"]

# (model id prefix, context window, max output tokens, images, reasoning)
_KNOWN: tuple[tuple[str, int, int, bool, bool], ...] = (
    ("gpt-4.1", 1_047_576, 32_768, True, False),
    ("gpt-4o", 128_000, 16_384, True, False),
    ("gpt-5", 400_000, 128_000, True, True),
    ("o3", 200_000, 100_000, True, True),
    ("o4-mini", 200_000, 100_000, True, True),
    ("claude-opus-4", 200_000, 32_000, True, True),
    ("claude-sonnet-4", 200_000, 64_000, True, True),
    ("claude-haiku-4", 200_000, 64_000, True, True),
    ("claude-3-7-sonnet", 200_000, 64_000, True, True),
    ("claude-3-5-haiku", 200_000, 8_192, True, False),
)


def model_info(provider: str, model_id: str) -> ModelInfo:
    """What is known about ``model_id``: the longest matching known prefix, else defaults.

    A vendor prefix (``anthropic/claude-...`` on OpenRouter) is ignored for the lookup.
    """
    spec = PROVIDERS.get(provider)
    base = (spec.defaults if spec and spec.defaults else ModelInfo(provider="", id=""))
    bare = model_id.rsplit("/", 1)[-1]
    best = max((k for k in _KNOWN if bare.startswith(k[0])), key=lambda k: len(k[0]),
               default=None)
    if best is not None:
        _, ctx, out, images, reasoning = best
        base = ModelInfo(provider="", id="", context_window=ctx, max_output_tokens=out,
                         images=images, reasoning=reasoning)
    return replace(base, provider=provider, id=model_id)


def get_model(
    spec: str,
    *,
    api_key: str | None = None,
    base_url: str | None = None,
    max_retries: int | None = None,
    timeout: float | None = None,
    info: ModelInfo | None = None,
    **overrides: Any,
) -> LanguageModel:
    """A model from ``"provider:model-id"``, e.g. ``"anthropic:claude-sonnet-4-5"``.

    ``api_key`` and ``base_url`` override the environment and the preset;
    ``overrides`` replace fields of the model's ModelInfo
    (``context_window=8192, images=True``). Raises ``ConfigError`` for an
    unknown provider, a missing key (naming the variable) or a missing SDK.
    """
    provider, sep, model_id = spec.partition(":")
    if not sep or not provider or not model_id:
        raise ConfigError(f"model {spec!r}: expected 'provider:model', e.g. 'openai:gpt-4.1-mini'")
    conf = PROVIDERS.get(provider)
    if conf is None:
        raise ConfigError(
            f"model {spec!r}: unknown provider {provider!r}; known: {', '.join(sorted(PROVIDERS))}")
    key = api_key or (os.environ.get(conf.key_env) if conf.key_env else None)
    if not key:
        if conf.key_required:
            raise ConfigError(
                f"model {spec!r}: no API key; set the {conf.key_env} environment variable")
        key = "unused"  # local servers ignore it, the SDKs insist on one
    url = base_url or (os.environ.get(conf.base_url_env) if conf.base_url_env else None) \
        or conf.base_url
    resolved = info or model_info(provider, model_id)
    if overrides:
        try:
            resolved = replace(resolved, **overrides)
        except TypeError as exc:
            raise ConfigError(f"model {spec!r}: {exc}") from exc
    kwargs: dict[str, Any] = {"api_key": key, "base_url": url, "timeout": timeout}
    if max_retries is not None:
        kwargs["max_retries"] = max_retries
    # Each provider module raises ConfigError naming its extra when its SDK is missing.
    if conf.api == "anthropic-messages":
        from threadline.ai.providers._anthropic import AnthropicModel

        return AnthropicModel(resolved, **kwargs)
    if conf.api == "openai-responses":
        from threadline.ai.providers._openai_responses import OpenAIResponsesModel

        return OpenAIResponsesModel(resolved, **kwargs)
    from threadline.ai.providers._openai_chat import OpenAIChatModel

    return OpenAIChatModel(resolved, **kwargs)
