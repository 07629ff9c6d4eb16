"""Public test helpers: the store conformance suite, a fault-injecting store,
power-loss recording and checking for local stores, and ``ScriptedModel``, a
deterministic offline LanguageModel.

The conformance names are loaded on first use because they need pytest and
pytest-asyncio, which the other helpers do not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from threadline.testing._faults import FaultyStore
from threadline.testing._grammar import assert_event_order, assert_stream_order
from threadline.testing._powerloss import (
    CrashState,
    PowerLoss,
    PowerLossReport,
    PowerLossTrace,
    inject_fault,
    mark_acknowledged,
)
from threadline.testing._scripted import (
    Call,
    Delay,
    Fail,
    Gate,
    ScriptedModel,
    Text,
    Thinking,
    Turn,
)
from threadline.testing._validity import assert_valid_for_providers

if TYPE_CHECKING:
    from threadline.testing._conformance import StoreConformance, StoreOpener, sample_entries

__all__ = [
    "Call",
    "CrashState",
    "Delay",
    "Fail",
    "FaultyStore",
    "Gate",
    "PowerLoss",
    "PowerLossReport",
    "PowerLossTrace",
    "ScriptedModel",
    "StoreConformance",
    "StoreOpener",
    "Text",
    "Thinking",
    "Turn",
    "assert_event_order",
    "assert_stream_order",
    "assert_valid_for_providers",
    "inject_fault",
    "mark_acknowledged",
    "sample_entries",
]

_CONFORMANCE = {"StoreConformance", "StoreOpener", "sample_entries"}


def __getattr__(name: str) -> Any:
    if name in _CONFORMANCE:
        from threadline.testing import _conformance as conformance

        return getattr(conformance, name)
    raise AttributeError(f"module 'threadline.testing' has no attribute {name!r}")
