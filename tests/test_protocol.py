"""The tool-call grammar: exact round trips, never-raising parse, order, every error kind."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from carl.harness.protocol import (
    parse_calls,
    render_call,
    render_result,
    render_results,
    tools_prompt,
    typed_value,
)
from carl.harness.tools import default_tools, specs_of
from carl.harness.tools.base import ParamSpec, ToolSpec
from carl.types import ToolCall, ToolError, ToolResult

SPECS = {
    "edit_file": ToolSpec(
        "edit_file",
        "edit",
        (ParamSpec("path", "str", "p"), ParamSpec("old", "str", "o"), ParamSpec("new", "str", "n")),
    ),
    "read_file": ToolSpec(
        "read_file",
        "read",
        (
            ParamSpec("path", "str", "p"),
            ParamSpec("start_line", "int", "s", required=False),
            ParamSpec("end_line", "int", "e", required=False),
        ),
    ),
    "finish": ToolSpec(
        "finish",
        "done",
        (ParamSpec("message", "str", "m", required=False), ParamSpec("force", "bool", "f", required=False)),
    ),
}

names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_\-]{0,12}", fullmatch=True)
# values stress the grammar: markup-like pieces, CDATA terminators, newlines, whitespace, unicode
pieces = st.sampled_from(
    [
        "<",
        ">",
        "&",
        "&lt;",
        "]]>",
        "<![CDATA[",
        "]]",
        "\n",
        "\r\n",
        " ",
        "\t",
        "</tool>",
        '<tool name="x">',
        "</path>",
        "</a>",
        "<a>",
        "x = 1",
        "é",
        "🙂",
        '"',
    ]
)
values = st.lists(st.one_of(pieces, st.text(max_size=8)), max_size=12).map("".join)


def _spec_for(name: str, params: dict[str, str]) -> dict[str, ToolSpec]:
    return {name: ToolSpec(name, "d", tuple(ParamSpec(p, "str", "d") for p in params))}


@settings(max_examples=300, deadline=None)
@given(name=names, params=st.dictionaries(names, values, max_size=4))
def test_render_parse_round_trip(name, params):
    call = ToolCall(name=name, params=params)
    parsed = parse_calls(render_call(call), _spec_for(name, params))
    assert parsed == [call]


@settings(max_examples=100, deadline=None)
@given(
    calls=st.lists(st.tuples(st.sampled_from(["p", "q"]), values), min_size=1, max_size=6),
    thoughts=st.lists(st.text(alphabet="abc \n.", max_size=20), min_size=7, max_size=7),
)
def test_several_calls_keep_order_and_thoughts_are_ignored(calls, thoughts):
    specs = {
        "p": ToolSpec("p", "d", (ParamSpec("v", "str", "d"),)),
        "q": ToolSpec("q", "d", (ParamSpec("v", "str", "d"),)),
    }
    text = thoughts[0] + "".join(
        render_call(ToolCall(n, {"v": v})) + thoughts[i + 1] for i, (n, v) in enumerate(calls)
    )
    parsed = parse_calls(text, specs)
    assert parsed == [ToolCall(n, {"v": v}, index=i) for i, (n, v) in enumerate(calls)]


@settings(max_examples=500, deadline=None)
@given(
    st.lists(
        st.one_of(
            pieces,
            st.sampled_from(
                [
                    "<tool",
                    "<path>",
                    "<old>",
                    "</old>",
                    "<new>",
                    "</new>",
                    '<tool name="edit_file">',
                    '<tool name="nope">',
                    "<tool>",
                    "</",
                    "<!",
                    "name=",
                ]
            ),
            st.text(max_size=5),
        ),
        max_size=30,
    ).map("".join)
)
def test_parse_never_raises_and_indexes_in_order(text):
    parsed = parse_calls(text, SPECS)
    assert [p.index for p in parsed] == list(range(len(parsed)))
    for p in parsed:
        assert isinstance(p, (ToolCall, ToolError))
        if isinstance(p, ToolError):
            assert p.raw and p.raw in text


@given(st.text(max_size=200))
def test_parse_arbitrary_text_never_raises(text):
    parse_calls(text, SPECS)


def test_newlines_around_a_value_are_markup():
    text = '<tool name="edit_file">\n<path>a.py</path>\n<old>\nx = 1\n</old>\n<new>\nx = 2\n\n</new>\n</tool>'
    [call] = parse_calls(text, SPECS)
    assert call.params == {"path": "a.py", "old": "x = 1", "new": "x = 2\n"}


def test_raw_values_are_literal_and_cdata_carries_anything():
    text = (
        '<tool name="edit_file"><path>a.py</path><old>if a < b && c: &lt;</old>'
        "<new><![CDATA[</new> ]]]]><![CDATA[> </tool>]]> tail</new></tool>"
    )
    [call] = parse_calls(text, SPECS)
    assert call.params["old"] == "if a < b && c: &lt;"
    assert call.params["new"] == "</new> ]]> </tool> tail"


def test_text_outside_calls_is_ignored():
    text = 'I will read it.\n<tool name="read_file"><path>a.py</path></tool>\nThen think.'
    assert parse_calls(text, SPECS) == [ToolCall("read_file", {"path": "a.py"})]
    assert parse_calls("no calls here, just <b>html</b> and a <toolbox>", SPECS) == []


@pytest.mark.parametrize(
    "text,kind,param",
    [
        ('<tool name="grep"><pattern>x</pattern></tool>', "unknown_tool", None),
        ('<tool name="edit_file"><path>a</path><old>x</old></tool>', "missing_param", "new"),
        ('<tool name="read_file"><path>a</path><mode>r</mode></tool>', "extra_param", "mode"),
        ('<tool name="read_file"><path>a</path><path>b</path></tool>', "duplicate_param", "path"),
        ('<tool name="read_file"><path>a</path>', "unclosed_tag", None),
        ('<tool name="read_file"><path>a.py</tool>', "unclosed_tag", "path"),
        ('<tool name="read_file"><path><![CDATA[a.py</path></tool>', "unclosed_tag", "path"),
        (
            '<tool name="read_file"><path>a</path><start_line>ten</start_line></tool>',
            "bad_value",
            "start_line",
        ),
        ('<tool name="finish"><force>maybe</force></tool>', "bad_value", "force"),
        ("<tool><path>a</path></tool>", "malformed", None),
        ("<tool name=read_file><path>a</path></tool>", "malformed", None),
        ('<tool name="read_file">path=a.py</tool>', "malformed", None),
        ('<tool name="read_file"><path x="1">a</path></tool>', "malformed", None),
    ],
)
def test_each_malformed_kind_is_detected(text, kind, param):
    [err] = parse_calls(text, SPECS)
    assert isinstance(err, ToolError)
    assert (err.kind, err.param) == (kind, param)
    assert err.raw == text
    if kind == "unknown_tool":
        assert err.tool == "grep" and err.valid_tools == tuple(SPECS)


def test_parsing_resynchronises_after_a_bad_call():
    text = (
        '<tool name="read_file"><path>a.py</tool> oops '
        '<tool name="read_file"><path>b.py</path></tool>'
        '<tool name="read_file"><path>c.py</path>'
        '<tool name="read_file"><path>d.py</path></tool>'
    )
    parsed = parse_calls(text, SPECS)
    assert [type(p).__name__ for p in parsed] == ["ToolError", "ToolCall", "ToolError", "ToolCall"]
    assert parsed[1].params == {"path": "b.py"} and parsed[3].params == {"path": "d.py"}
    assert [p.index for p in parsed] == [0, 1, 2, 3]


def test_typed_values_accept_whitespace():
    [call] = parse_calls(
        '<tool name="read_file"><path>a</path><start_line> 3 \n\n</start_line></tool>', SPECS
    )
    assert isinstance(call, ToolCall) and call.params["start_line"] == " 3 \n"
    assert typed_value(SPECS["read_file"].param("start_line"), call.params["start_line"]) == 3


def test_render_result_shows_kind_and_valid_tools():
    err = ToolError(
        kind="unknown_tool",
        message="unknown tool 'grep'",
        tool="grep",
        valid_tools=("read_file", "finish"),
        index=1,
    )
    from carl.harness.execute import error_result

    text = render_results([ToolResult("read_file", "1\tx", ok=True, index=0), error_result(err)])
    assert text == (
        '<result index="0" tool="read_file">\n1\tx\n</result>\n'
        '<result index="1" tool="grep" error="unknown_tool">\n'
        "unknown tool 'grep'\nValid tools: read_file, finish\n</result>"
    )
    assert 'truncated="true"' in render_result(ToolResult("t", "x", ok=True, truncated=True))


def test_tools_prompt_lists_every_tool_and_parameter():
    specs = specs_of(default_tools())
    prompt = tools_prompt(specs)
    assert len(specs) == 11
    for spec in specs.values():
        assert f"## {spec.name}\n{spec.description}" in prompt
        for p in spec.params:
            assert f"- <{p.name}> ({p.type}, {'required' if p.required else 'optional'}" in prompt
    # the example in the prompt parses as a valid call of the real tool set
    example = next(line for line in prompt.splitlines() if line.startswith("<tool"))
    assert isinstance(parse_calls(example, specs)[0], ToolCall)


@settings(max_examples=200, deadline=None)
@given(
    path=values,
    old=values,
    new=values,
    mutation=st.sampled_from(
        ["drop", "extra", "duplicate", "unclose_param", "unclose_tool", "rename_tool", "bad_int"]
    ),
)
def test_every_mutation_of_a_valid_call_is_detected(path, old, new, mutation):
    call = ToolCall("edit_file", {"path": path, "old": old, "new": new})
    text = render_call(call)
    expected = {
        "drop": ("missing_param", "old"),
        "extra": ("extra_param", "mode"),
        "duplicate": ("duplicate_param", "path"),
        "unclose_param": ("unclosed_tag", "new"),
        "unclose_tool": ("unclosed_tag", None),
        "rename_tool": ("unknown_tool", None),
        "bad_int": ("bad_value", "start_line"),
    }[mutation]
    if mutation == "drop":
        text = render_call(ToolCall("edit_file", {"path": path, "new": new}))
    elif mutation == "extra":
        text = text.replace("</tool>", "<mode>w</mode></tool>")
    elif mutation == "duplicate":
        text = text.replace("</tool>", "<path>b</path></tool>")
    elif mutation == "unclose_param":
        text = text[: text.rindex("</new>")] + "</tool>"
    elif mutation == "unclose_tool":
        text = text.removesuffix("</tool>")
    elif mutation == "rename_tool":
        text = text.replace('name="edit_file"', 'name="edit_files"', 1)
    elif mutation == "bad_int":
        text = render_call(ToolCall("read_file", {"path": path, "start_line": "x" + new}))
    [err] = parse_calls(text, SPECS)
    assert isinstance(err, ToolError) and (err.kind, err.param) == expected, (text, err)
    assert err.raw == text
