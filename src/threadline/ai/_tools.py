"""Tools: what the model may call, and how its arguments reach a Python function.

Build a tool from a typed function; the schema comes from the type hints and
the parameter docs, and msgspec converts the model's arguments into the typed
parameters (Structs, Literals, optionals, lists, dicts...)::

    @tool
    async def read_file(path: str, limit: int = 100) -> str:
        \"\"\"Read a text file.

        Args:
            path: File to read, relative to the workspace.
            limit: Maximum number of lines.
        \"\"\"

Or give a hand-written JSON schema; the function then receives the arguments
as keyword arguments, checked against the schema's common subset (``type``,
``required``, ``enum``, ``const``, ``properties``, ``items``,
``additionalProperties``, ``anyOf``/``oneOf``, local ``$ref``)::

    @tool(parameters={"type": "object", "properties": {"q": {"type": "string"}},
                      "required": ["q"]})
    def search(q: str) -> str: ...

A function may take a ``progress`` parameter (it is not part of the schema):
calling ``progress(update)`` streams ``update`` to the application while the
tool runs. A function returns a ``ToolResult`` (content parts, ``details``
kept out of the model's view, ``is_error``), or a plain value: a string, a
part or a list of parts, ``None`` (no content), or anything msgspec can
encode (dict, list, Struct, dataclass), sent as JSON text.

Sync functions run inline on the event loop: keep them quick, or make them
async (``asyncio.to_thread`` for blocking work).
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeAlias, overload

import msgspec

from threadline.ai._messages import BlobPart, ImagePart, TextPart, UserContent
from threadline.ai._model import ToolSpec
from threadline.errors import ToolError

__all__ = ["ApprovalRule", "Progress", "Replay", "Tool", "ToolContext", "ToolResult", "tool"]

Progress: TypeAlias = Callable[[Any], None]
"""Callback a tool calls to report progress; the value reaches the application."""

Replay: TypeAlias = Literal["safe", "never"]
"""Whether a call that may have run is run again after a crash."""

ApprovalRule: TypeAlias = Callable[[dict[str, Any]], Any]
"""Given a call's validated arguments: true or a reason string to require approval."""


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a tool may know about the call it serves.

    A tool receives it by declaring a parameter annotated ``ToolContext``.
    ``idempotency_key`` is the same for this call in every attempt, in every
    process: pass it to an API that deduplicates, or check it in your own
    database. ``attempt`` counts executions of this call (1 the first time).
    """

    call_id: str
    tool_name: str
    idempotency_key: str
    session_id: str | None = None
    attempt: int = 1


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a tool returns: content for the model, ``details`` for the application."""

    content: tuple[UserContent, ...] = ()
    details: Any = None
    is_error: bool = False

    @classmethod
    def text(cls, text: str, *, details: Any = None, is_error: bool = False) -> ToolResult:
        return cls((TextPart(text=text),), details, is_error)

    @classmethod
    def error(cls, text: str, *, details: Any = None) -> ToolResult:
        return cls((TextPart(text=text),), details, True)

    @classmethod
    def of(cls, value: Any) -> ToolResult:
        """Convert a tool function's return value."""
        if isinstance(value, ToolResult):
            return value
        if value is None:
            return cls()
        if isinstance(value, str):
            return cls.text(value)
        if isinstance(value, TextPart | ImagePart | BlobPart):
            return cls((value,))
        if (
            isinstance(value, list | tuple)
            and value
            and all(isinstance(v, TextPart | ImagePart | BlobPart) for v in value)
        ):
            return cls(tuple(value))
        try:
            return cls.text(msgspec.json.encode(value).decode())
        except TypeError:
            return cls.text(str(value))


class Tool:
    """A tool: ``name``, ``description``, JSON-schema ``parameters`` and ``fn``.

    Construct it directly with a hand-written schema, or with ``@tool`` /
    ``Tool.from_function`` to derive the schema from the function.
    """

    __slots__ = (
        "_args_type", "_context_param", "_wants_progress", "approval", "description", "fn",
        "name", "parameters", "reconcile", "replay", "side_effects",
    )

    def __init__(
        self,
        name: str,
        description: str,
        parameters: Mapping[str, Any],
        fn: Callable[..., Any],
        *,
        side_effects: bool = False,
        replay: Replay | None = None,
        reconcile: Callable[[str], Any] | None = None,
        approval: bool | ApprovalRule = False,
    ) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
            raise ToolError(
                f"tool name {name!r}: use 1-64 letters, digits, '_' or '-' (what providers accept)"
            )
        if parameters.get("type", "object") != "object":
            raise ToolError(f"tool {name!r}: parameters schema must describe an object")
        self.name = name
        self.description = description
        self.parameters: dict[str, Any] = dict(parameters)
        self.fn = fn
        if replay not in (None, "safe", "never"):
            raise ToolError(f"tool {name!r}: replay must be 'safe' or 'never', got {replay!r}")
        self.side_effects = side_effects or replay == "never" or reconcile is not None
        """Calls are tracked by the durable agent's effect ledger."""
        self.replay: Replay = replay or ("never" if self.side_effects else "safe")
        self.reconcile = reconcile
        """``reconcile(key)``: the result if the effect keyed ``key`` happened, else None."""
        self.approval = approval
        self._args_type: type[msgspec.Struct] | None = None
        self._wants_progress = "progress" in _param_names(fn)
        self._context_param = _context_param(fn)

    @classmethod
    def from_function(
        cls, fn: Callable[..., Any], *, name: str | None = None, description: str | None = None,
        **policy: Any,
    ) -> Tool:
        """Derive name, description and schema from ``fn``'s signature and docstring."""
        tool_name = name or fn.__name__
        summary, param_docs = _parse_docstring(inspect.getdoc(fn) or "")
        try:
            hints = typing.get_type_hints(fn, include_extras=True)
        except Exception as exc:
            raise ToolError(f"tool {tool_name!r}: cannot resolve type hints: {exc}") from exc
        fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
        for p in inspect.signature(fn).parameters.values():
            if p.name == "progress" or hints.get(p.name) is ToolContext:
                continue
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
                raise ToolError(
                    f"tool {tool_name!r}: parameter {p.name!r} must be passable by keyword"
                )
            hint = hints.get(p.name, Any)
            if p.name in param_docs:
                hint = Annotated[hint, msgspec.Meta(description=param_docs[p.name])]
            fields.append((p.name, hint) if p.default is p.empty else (p.name, hint, p.default))
        try:
            args_type = msgspec.defstruct(
                f"{tool_name}_arguments", fields, kw_only=True, forbid_unknown_fields=True
            )
            schema = msgspec.json.schema(args_type)
        except (TypeError, ValueError) as exc:
            raise ToolError(f"tool {tool_name!r}: cannot build a schema: {exc}") from exc
        defs = schema.pop("$defs")
        params = defs.pop(args_type.__name__)
        params.pop("title", None)
        if defs:
            params["$defs"] = defs
        made = cls(tool_name, description if description is not None else summary, params, fn,
                   **policy)
        made._args_type = args_type
        return made

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters)

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Check the model's arguments; return the keyword arguments for ``fn``.

        Raises ``msgspec.ValidationError`` with a readable message on failure.
        """
        if not isinstance(arguments, Mapping):
            raise msgspec.ValidationError(f"Expected `object`, got `{_json_type(arguments)}`")
        if self._args_type is None:
            _check(arguments, self.parameters, self.parameters, "$")
            return dict(arguments)
        args = msgspec.convert(arguments, self._args_type)
        return {f: getattr(args, f) for f in args.__struct_fields__}

    async def execute(
        self, arguments: Mapping[str, Any], progress: Progress | None = None,
        context: ToolContext | None = None,
    ) -> ToolResult:
        """Call ``fn`` with already validated keyword arguments; its exceptions propagate."""
        kwargs = dict(arguments)
        if self._wants_progress:
            kwargs["progress"] = progress or _ignore
        if self._context_param is not None:
            kwargs[self._context_param] = context or ToolContext(
                call_id="", tool_name=self.name, idempotency_key=""
            )
        out = self.fn(**kwargs)
        if inspect.isawaitable(out):
            out = await out
        return ToolResult.of(out)

    async def invoke(
        self, arguments: Mapping[str, Any], progress: Progress | None = None
    ) -> ToolResult:
        """Validate, then execute. Invalid arguments give an error result."""
        try:
            kwargs = self.validate(arguments)
        except msgspec.ValidationError as exc:
            return ToolResult.error(self.invalid_arguments_message(arguments, exc))
        return await self.execute(kwargs, progress)

    def invalid_arguments_message(self, arguments: Any, exc: Exception) -> str:
        try:
            received = msgspec.json.encode(arguments).decode()
        except TypeError:
            received = repr(arguments)
        return f"Invalid arguments for tool {self.name!r}: {exc}. Received: {received}"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the wrapped function directly."""
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Tool({self.name!r})"


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: Mapping[str, Any] | None = None,
    side_effects: bool = False,
    replay: Replay | None = None,
    reconcile: Callable[[str], Any] | None = None,
    approval: bool | ApprovalRule = False,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: Mapping[str, Any] | None = None,
    side_effects: bool = False,
    replay: Replay | None = None,
    reconcile: Callable[[str], Any] | None = None,
    approval: bool | ApprovalRule = False,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a ``Tool`` from a function: ``@tool`` or ``@tool(name=..., parameters=...)``.

    Without ``parameters`` the schema is derived from the signature; with it,
    the given schema is used as is and the function gets the arguments as
    keyword arguments. ``side_effects``, ``replay``, ``reconcile`` and
    ``approval`` are the durable-execution policy (``docs/tools-with-side-effects.md``).
    """
    policy: dict[str, Any] = {"side_effects": side_effects, "replay": replay,
                              "reconcile": reconcile, "approval": approval}

    def wrap(f: Callable[..., Any]) -> Tool:
        if parameters is None:
            return Tool.from_function(f, name=name, description=description, **policy)
        summary, _ = _parse_docstring(inspect.getdoc(f) or "")
        return Tool(name or f.__name__, summary if description is None else description,
                    parameters, f, **policy)

    return wrap if fn is None else wrap(fn)


def _ignore(_: Any) -> None:
    pass


def _context_param(fn: Callable[..., Any]) -> str | None:
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        return None
    return next((n for n, h in hints.items() if h is ToolContext and n != "return"), None)


def _param_names(fn: Callable[..., Any]) -> Sequence[str]:
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return ()


_SECTION = re.compile(
    r"^(Args|Arguments|Parameters|Params|Returns?|Yields?|Raises|Examples?|Notes?|"
    r"Attributes|See Also|Warnings?)\s*:\s*$"
)
_GOOGLE_PARAM = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_SPHINX_PARAM = re.compile(r"^:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$")


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Summary and per-parameter text from a Google- or Sphinx-style docstring."""
    summary: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    base_indent = -1
    for line in doc.splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        header = _SECTION.match(stripped) if indent == 0 else None
        if header:
            section, current, base_indent = header.group(1), None, -1
            continue
        sphinx = _SPHINX_PARAM.match(stripped)
        if sphinx:
            section, current = ":param", sphinx.group(1)
            params[current] = sphinx.group(2).strip()
            continue
        if section is None:
            if not stripped.startswith(":"):
                summary.append(line)
            else:
                section = ":field"
            continue
        if section in ("Args", "Arguments", "Parameters", "Params") and stripped:
            if base_indent < 0:
                base_indent = indent
            match = _GOOGLE_PARAM.match(stripped) if indent <= base_indent else None
            if match:
                current = match.group(1)
                params[current] = match.group(2).strip()
                continue
        if current is not None and stripped and indent > 0 and section != ":field":
            params[current] = f"{params[current]} {stripped}".strip()
        elif stripped.startswith(":"):
            section, current = ":field", None
    return "\n".join(summary).strip(), params


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list, tuple),
    "object": (dict, Mapping),
    "null": (type(None),),
}


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    for name in ("string", "array", "object", "null"):
        if isinstance(value, _JSON_TYPES[name]):
            return name
    return type(value).__name__


def _is(value: Any, type_name: str) -> bool:
    if type_name in ("integer", "number") and isinstance(value, bool):
        return False
    if type_name == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _JSON_TYPES.get(type_name, (object,)))


def _check(value: Any, schema: Any, root: Mapping[str, Any], path: str) -> None:
    """Validate ``value`` against the JSON-schema subset tools use; raise on the first error."""
    if not isinstance(schema, Mapping):
        return  # ``true``/``{}``: anything goes
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        _check(value, _resolve(ref, root), root, path)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            _check_any(value, schema[key], root, path)
    _check_scalar(value, schema, path)
    if isinstance(value, Mapping):
        _check_object(value, schema, root, path)
    elif isinstance(value, list | tuple) and "items" in schema:
        for i, item in enumerate(value):
            _check(item, schema["items"], root, f"{path}[{i}]")


def _invalid(message: str, path: str) -> msgspec.ValidationError:
    return msgspec.ValidationError(f"{message} - at `{path}`")


def _resolve(ref: str, root: Mapping[str, Any]) -> Any:
    """The schema a local ``#/...`` reference points at; ``{}`` when nothing is there."""
    target: Any = root
    for key in ref[2:].split("/"):
        target = target.get(key, {}) if isinstance(target, Mapping) else {}
    return target


def _check_any(value: Any, options: Any, root: Mapping[str, Any], path: str) -> None:
    # ``oneOf`` is checked like ``anyOf``: tool arguments rarely match two forms,
    # and telling the model "more than one matched" would not help it.
    for option in options:
        try:
            _check(value, option, root, path)
            return
        except msgspec.ValidationError:
            continue
    raise _invalid(f"`{_json_type(value)}` value matches none of the allowed forms", path)


def _check_scalar(value: Any, schema: Mapping[str, Any], path: str) -> None:
    """``type``, ``enum`` and ``const``."""
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else list(types)
        if not any(_is(value, t) for t in names):
            raise _invalid(f"Expected `{' | '.join(names)}`, got `{_json_type(value)}`", path)
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(msgspec.json.encode(v).decode() for v in schema["enum"])
        raise _invalid(f"Invalid value, expected one of {allowed}", path)
    if "const" in schema and value != schema["const"]:
        raise _invalid(
            f"Invalid value, expected {msgspec.json.encode(schema['const']).decode()}", path)


def _check_object(
    value: Mapping[str, Any], schema: Mapping[str, Any], root: Mapping[str, Any], path: str
) -> None:
    for name in schema.get("required", ()):
        if name not in value:
            raise _invalid(f"Object missing required field `{name}`", path)
    props: Mapping[str, Any] = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    for name, item in value.items():
        if name in props:
            _check(item, props[name], root, f"{path}.{name}")
        elif extra is False:
            raise _invalid(f"Object contains unknown field `{name}`", path)
        else:
            _check(item, extra, root, f"{path}.{name}")
