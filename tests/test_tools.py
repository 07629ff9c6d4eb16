"""Tools (``threadline.ai._tools``): schemas from functions, argument checks, results."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import threadline.ai
from threadline.ai import ImagePart, Progress, TextPart, Tool, ToolResult, ToolSpec, tool
from threadline.errors import ToolError


class Point(msgspec.Struct):
    """A point on the grid."""

    x: int
    y: int = 0


@tool
async def plot(
    points: list[Point],
    color: Literal["red", "blue"] = "red",
    label: str | None = None,
    weights: dict[str, float] | None = None,
    progress: Progress | None = None,
) -> str:
    """Draw points on the canvas.

    Longer explanation that is still part of the description.

    Args:
        points: Where to draw; at least
            one point.
        color (str): Ink colour.
        label: Caption under the plot.

    Returns:
        A summary.
    """
    if progress is not None:
        progress(len(points))
    return f"{len(points)} {color} {label}"


def test_schema_is_derived_from_hints_and_google_docstring() -> None:
    params = plot.parameters
    assert plot.name == "plot"
    assert plot.description == (
        "Draw points on the canvas.\n\nLonger explanation that is still part of the description."
    )
    assert params["type"] == "object" and params["additionalProperties"] is False
    assert params["required"] == ["points"]
    props = params["properties"]
    assert set(props) == {"points", "color", "label", "weights"}  # progress is not shown
    assert props["points"]["description"] == "Where to draw; at least one point."
    assert props["points"]["items"] == {"$ref": "#/$defs/Point"}
    assert params["$defs"]["Point"]["description"] == "A point on the grid."
    assert sorted(props["color"]["enum"]) == ["blue", "red"] and props["color"]["default"] == "red"
    assert props["color"]["description"] == "Ink colour."
    assert {"type": "null"} in props["label"]["anyOf"]
    assert props["weights"]["anyOf"][0]["additionalProperties"] == {"type": "number"}
    assert plot.spec == ToolSpec("plot", plot.description, params)
    msgspec.json.encode(params)  # the schema is plain JSON


def test_sphinx_docstrings_and_overrides() -> None:
    @tool(name="find-files", description="Search the tree.")
    def find(pattern: str, depth: int = 2) -> list[str]:
        """Find files.

        :param pattern: Glob to match.
        :param int depth: How deep to go,
            counting from the root.
        :returns: paths
        """
        return [pattern] * depth

    assert find.name == "find-files" and find.description == "Search the tree."
    props = find.parameters["properties"]
    assert props["pattern"]["description"] == "Glob to match."
    assert props["depth"]["description"] == "How deep to go, counting from the root."
    assert find("a", depth=1) == ["a"]  # still callable as the function


def test_bad_definitions_raise_tool_error() -> None:
    def star(*args: int) -> None: ...

    with pytest.raises(ToolError, match="star"):
        Tool.from_function(star)
    with pytest.raises(ToolError, match="tool name"):
        Tool("has space", "", {"type": "object"}, print)
    with pytest.raises(ToolError, match="object"):
        Tool("t", "", {"type": "array"}, print)

    class Opaque:
        pass

    def takes(o: Opaque) -> None: ...

    with pytest.raises(ToolError, match="takes"):
        Tool.from_function(takes)


async def test_arguments_are_converted_into_typed_parameters() -> None:
    kwargs = plot.validate({"points": [{"x": 1}, {"x": 2, "y": 3}], "color": "blue"})
    assert kwargs == {
        "points": [Point(1, 0), Point(2, 3)], "color": "blue", "label": None, "weights": None,
    }
    updates: list[Any] = []
    result = await plot.execute(kwargs, updates.append)
    assert result == ToolResult.text("2 blue None") and updates == [2]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"points": [{"x": "1"}]}, "Expected `int`, got `str` - at `$.points[0].x`"),
        ({"points": [], "color": "green"}, "Invalid enum value 'green' - at `$.color`"),
        ({}, "Object missing required field `points`"),
        ({"points": [], "size": 3}, "Object contains unknown field `size`"),
        (["not", "an", "object"], "Expected `object`, got `array`"),
    ],
)
async def test_invalid_arguments_give_a_readable_error_result(
    arguments: Any, message: str
) -> None:
    with pytest.raises(msgspec.ValidationError) as info:
        plot.validate(arguments)
    assert message in str(info.value)
    result = await plot.invoke(arguments)
    assert result.is_error
    text = result.content[0]
    assert isinstance(text, TextPart)
    assert text.text.startswith("Invalid arguments for tool 'plot': ")
    assert message in text.text and msgspec.json.encode(arguments).decode() in text.text


HAND_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {"type": "string"},
        "limit": {"type": "integer"},
        "mode": {"enum": ["fast", "exact"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "filter": {"$ref": "#/$defs/Filter"},
        "cutoff": {"anyOf": [{"type": "number"}, {"type": "null"}]},
    },
    "required": ["query"],
    "additionalProperties": False,
    "$defs": {
        "Filter": {
            "type": "object",
            "properties": {"field": {"type": "string"}, "op": {"const": "eq"}},
            "required": ["field"],
            "additionalProperties": {"type": "boolean"},
        }
    },
}


@tool(parameters=HAND_SCHEMA)
def search(**arguments: Any) -> dict[str, Any]:
    """Search the index."""
    return arguments


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({}, "Object missing required field `query` - at `$`"),
        ({"query": 3}, "Expected `string`, got `integer` - at `$.query`"),
        ({"query": "q", "limit": True}, "Expected `integer`, got `boolean` - at `$.limit`"),
        ({"query": "q", "limit": 1.5}, "Expected `integer`, got `number` - at `$.limit`"),
        ({"query": "q", "mode": "slow"}, 'expected one of "fast", "exact" - at `$.mode`'),
        ({"query": "q", "tags": ["a", 1]}, "Expected `string`, got `integer` - at `$.tags[1]`"),
        ({"query": "q", "page": 2}, "Object contains unknown field `page` - at `$`"),
        ({"query": "q", "filter": {}}, "missing required field `field` - at `$.filter`"),
        ({"query": "q", "filter": {"field": "a", "op": "ne"}}, 'expected "eq" - at `$.filter.op`'),
        ({"query": "q", "filter": {"field": "a", "x": 1}}, "got `integer` - at `$.filter.x`"),
        ({"query": "q", "cutoff": "high"}, "matches none of the allowed forms - at `$.cutoff`"),
    ],
)
def test_hand_written_schema_is_enforced(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(msgspec.ValidationError) as info:
        search.validate(arguments)
    assert message in str(info.value)


async def test_hand_written_schema_accepts_valid_arguments_as_keywords() -> None:
    arguments = {"query": "q", "limit": 2.0, "mode": "fast", "tags": ["a"], "cutoff": None,
                 "filter": {"field": "f", "op": "eq", "deep": True}}
    assert search.parameters is not HAND_SCHEMA and search.parameters == HAND_SCHEMA
    assert search.description == "Search the index."
    result = await search.invoke(arguments)
    assert not result.is_error
    assert msgspec.json.decode(result.content[0].text) == arguments  # type: ignore[union-attr]


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.sampled_from(["red", "blue", "x"]),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from(["x", "y", "z"]), inner, max_size=3),
    max_leaves=8,
)


def _mostly(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Usually a valid value, sometimes any JSON value."""
    return st.one_of(good, good, good, _json)


_points = st.lists(
    st.fixed_dictionaries(
        {"x": _mostly(st.integers(-1000, 1000))},
        optional={"y": _mostly(st.integers(-1000, 1000)), "z": _json},
    ),
    max_size=2,
)
_plot_arguments = st.fixed_dictionaries(
    {"points": _mostly(_points)},
    optional={
        "color": _mostly(st.sampled_from(["red", "blue"])),
        "label": _mostly(st.none() | st.text(max_size=3)),
        "weights": _mostly(st.none() | st.dictionaries(
            st.text(max_size=2), st.integers(-9, 9) | st.floats(-1e3, 1e3), max_size=2)),
    },
) | st.dictionaries(st.sampled_from(["points", "color", "other"]), _json, max_size=3)


@settings(max_examples=300, deadline=None)
@given(_plot_arguments)
def test_hand_validator_agrees_with_msgspec_on_derived_schemas(arguments: dict[str, Any]) -> None:
    """The small JSON-schema checker and msgspec accept exactly the same arguments."""
    by_schema = Tool("plot", "", plot.parameters, plot.fn)
    try:
        plot.validate(arguments)
        typed_ok = True
    except msgspec.ValidationError:
        typed_ok = False
    try:
        by_schema.validate(arguments)
        schema_ok = True
    except msgspec.ValidationError:
        schema_ok = False
    assert typed_ok == schema_ok


@dataclasses.dataclass
class Row:
    id: int
    name: str


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("plain", ToolResult((TextPart(text="plain"),))),
        (None, ToolResult()),
        ({"a": [1, 2]}, ToolResult.text('{"a":[1,2]}')),
        (Point(1, 2), ToolResult.text('{"x":1,"y":2}')),
        (Row(1, "r"), ToolResult.text('{"id":1,"name":"r"}')),
        (42, ToolResult.text("42")),
        (ImagePart(data="aGk=", mime_type="image/png"),
         ToolResult((ImagePart(data="aGk=", mime_type="image/png"),))),
        ([TextPart(text="a"), TextPart(text="b")],
         ToolResult((TextPart(text="a"), TextPart(text="b")))),
        (ToolResult.error("bad", details={"code": 2}),
         ToolResult((TextPart(text="bad"),), {"code": 2}, True)),
        ({3}, ToolResult.text("[3]")),
    ],
)
async def test_return_values_become_content(value: Any, expected: ToolResult) -> None:
    @tool
    def give() -> Any:
        return value

    @tool
    async def give_async() -> Any:
        return value

    assert await give.invoke({}) == expected
    assert await give_async.invoke({}) == expected


def test_unencodable_values_fall_back_to_str() -> None:
    class Thing:
        def __str__(self) -> str:
            return "a thing"

    assert ToolResult.of(Thing()) == ToolResult.text("a thing")


async def test_tool_exceptions_propagate_from_invoke() -> None:
    @tool
    def fail() -> None:
        raise KeyError("gone")

    with pytest.raises(KeyError):
        await fail.invoke({})


def test_public_names() -> None:
    for name in ("Tool", "ToolResult", "Progress", "tool"):
        assert name in threadline.ai.__all__
        assert hasattr(threadline.ai, name)
