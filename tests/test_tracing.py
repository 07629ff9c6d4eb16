"""OpenTelemetry spans (S68), each scenario in a child process with the SDK's in-memory exporter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

CHILD = Path(__file__).with_name("otel_child.py")
SRC = Path(__file__).resolve().parent.parent / "src"
SECRET = "the-secret-word"


def run_child(tmp_path: Path, *args: str, content: bool = False) -> list[dict[str, Any]]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("OTEL_INSTRUMENTATION_GENAI")}
    env["PYTHONPATH"] = str(SRC)
    if content:
        env["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = "true"
    out = subprocess.run([sys.executable, str(CHILD), str(tmp_path / "s"), *args],
                         capture_output=True, text=True, timeout=120, check=False, env=env)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_s68_spans_for_the_run_model_calls_tools_and_store(tmp_path: Path) -> None:
    ids, spans = run_child(tmp_path)
    stored = ids["ids"]
    by_name: dict[str, list[dict[str, Any]]] = {}
    for s in spans["spans"]:
        by_name.setdefault(s["name"], []).append(s)
    (run,) = by_name["invoke_agent threadline"]
    chats = by_name["chat scripted-model"]
    (tool,) = by_name["execute_tool lookup"]
    (failed,) = by_name["execute_tool explode"]
    appends = by_name["threadline.store.append"]
    loads = by_name["threadline.store.load"]
    assert len(chats) == 3 and len(loads) == 2  # the first open (not found), the reopen
    *chats, summary = chats  # compaction's summary call, after the run
    assert summary["parent"] is None and summary["attributes"]["gen_ai.usage.input_tokens"] == 23
    for s in [run, *chats, summary, tool, *appends, *loads]:
        assert s["attributes"]["gen_ai.conversation.id"] == "traced"
    assert run["attributes"]["gen_ai.operation.name"] == "invoke_agent"
    assert run["attributes"]["threadline.run.stop_reason"] == "done"
    assert run["attributes"]["gen_ai.usage.input_tokens"] == 11 + 17 + 2
    assert run["attributes"]["gen_ai.usage.output_tokens"] == 8
    assert run["attributes"]["threadline.entry.ids"] == [stored[0]]  # the run's input
    # The model calls and the tool are the run's children.
    assert {c["parent"] for c in chats} == {run["id"]} and tool["parent"] == run["id"]
    first, second = chats
    assert first["kind"] == "CLIENT"
    assert first["attributes"]["gen_ai.operation.name"] == "chat"
    assert first["attributes"]["gen_ai.provider.name"] == "scripted"
    assert first["attributes"]["gen_ai.request.model"] == "scripted-model"
    assert first["attributes"]["gen_ai.usage.input_tokens"] == 11
    assert first["attributes"]["gen_ai.usage.output_tokens"] == 3
    assert first["attributes"]["gen_ai.response.finish_reasons"] == ["tool_use"]
    assert second["attributes"]["gen_ai.usage.input_tokens"] == 19
    assert second["attributes"]["gen_ai.usage.cache_read.input_tokens"] == 2
    assert tool["attributes"]["gen_ai.operation.name"] == "execute_tool"
    assert tool["attributes"]["gen_ai.tool.name"] == "lookup"
    assert tool["attributes"]["gen_ai.tool.call.id"] and tool["status"] == "UNSET"
    # A tool that raised: an error span naming no more than the kind of failure.
    assert failed["status"] == "ERROR" and failed["attributes"]["error.type"] == "tool_error"
    # Every stored entry was named by the append that stored it, with the store's kind.
    appended = [i for s in appends for i in s["attributes"]["threadline.entry.ids"]]
    assert sorted(appended) == sorted(stored)
    assert {s["attributes"]["threadline.store.kind"] for s in appends + loads} == {"file"}
    assert loads[-1]["attributes"]["threadline.entry.count"] == len(stored)
    assert loads[-1]["attributes"]["threadline.entry.last_id"] == stored[-1]
    assert loads[0]["status"] == "ERROR"  # the first open: SessionNotFound, then created
    # No message content in any span by default.
    assert SECRET not in json.dumps(spans)


def test_s68_content_only_when_the_application_opts_in(tmp_path: Path) -> None:
    _, spans = run_child(tmp_path, content=True)
    text = json.dumps(spans)
    assert SECRET in text
    chat = next(s for s in spans["spans"] if s["name"].startswith("chat"))
    assert SECRET in chat["attributes"]["gen_ai.input.messages"]
    tool = next(s for s in spans["spans"] if s["name"].startswith("execute_tool"))
    assert SECRET in tool["attributes"]["gen_ai.tool.call.arguments"]
    assert SECRET in tool["attributes"]["gen_ai.tool.call.result"]


def test_s68_a_no_op_without_opentelemetry(tmp_path: Path) -> None:
    ids, result = run_child(tmp_path, "block")
    assert len(ids["ids"]) == 6 and result == {"tracer": False}
