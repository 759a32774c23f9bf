"""Tool calling through `tessera serve` with the official `openai` client, on stories260K and one
template per family's call format (tests/integration/data/): Hermes / Qwen `<tool_call>`
(stories_tools_template.jinja), Llama 3 JSON (stories_llama3_tools_template.jinja) and Mistral
`[TOOL_CALLS]` (stories_mistral_tools_template.jinja); the server picks the format from the
template. Every tool_choice, streamed and not; a required call's arguments validate against the
function's schema; the streamed deltas reassemble to exactly the non-streamed calls; tool results
render.
"""
import json
import os

import jsonschema
import pytest

from tessera_server import HERE, STORIES, Server, require_stories

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                            "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MESSAGES = [{"role": "user", "content": "Once upon a time"}]


TEMPLATES = {"hermes": "stories_tools_template.jinja", "llama3_json": "stories_llama3_tools_template.jinja",
             "mistral": "stories_mistral_tools_template.jinja"}


@pytest.fixture(scope="module", params=list(TEMPLATES))
def server(request):
    require_stories(os.path.join(STORIES, "hf"))
    s = Server(os.path.join(STORIES, "hf"),
               extra=["--chat-template", os.path.join(HERE, "data", TEMPLATES[request.param])])
    status, info = s.get("/tokenizer_info")
    assert status == 200 and json.loads(info)["tool_call_format"] == request.param, info
    yield s
    s.stop()


def check_calls(calls, names=None):
    assert calls
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_")
        assert c.function.name in (names or SCHEMAS)
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])


def streamed(server, **kwargs):
    """The streamed answer reassembled as a client does: content, and calls by index."""
    content, calls, finish = "", {}, None
    for chunk in server.client.chat.completions.create(stream=True, **kwargs):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            c = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
            c["id"] += tc.id or ""
            c["name"] += (tc.function.name or "") if tc.function else ""
            c["arguments"] += (tc.function.arguments or "") if tc.function else ""
        finish = chunk.choices[0].finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_required_call_validates_and_streams_the_same(server, temperature, parallel):
    kwargs = dict(model="test-model", messages=MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=150,
                  temperature=temperature, seed=4, parallel_tool_calls=parallel)
    r = server.client.chat.completions.create(**kwargs)
    m = r.choices[0].message
    check_calls(m.tool_calls)
    if not parallel:
        assert len(m.tool_calls) == 1 and not m.content
        assert r.choices[0].finish_reason == "tool_calls", m
    else:  # a tiny model may go on calling until max_tokens: the unfinished call stays text
        assert r.choices[0].finish_reason in ("tool_calls", "length"), m
    content, calls, finish = streamed(server, **kwargs)
    assert finish == r.choices[0].finish_reason
    assert content == (m.content or "")
    assert [(c["name"], c["arguments"]) for c in calls] == [(c.function.name, c.function.arguments) for c in m.tool_calls]
    assert all(c["id"].startswith("call_") for c in calls)


def test_named_function(server):
    r = server.client.chat.completions.create(
        model="test-model", messages=MESSAGES, tools=TOOLS, max_tokens=100, temperature=1.0, seed=9,
        tool_choice={"type": "function", "function": {"name": "get_time"}})
    check_calls(r.choices[0].message.tool_calls, names=["get_time"])
    assert len(r.choices[0].message.tool_calls) == 1


def test_auto_and_none(server):
    # auto: free text or calls; whatever calls there are validate.
    r = server.client.chat.completions.create(model="test-model", messages=MESSAGES, tools=TOOLS, tool_choice="auto",
                                              max_tokens=40, temperature=0)
    m = r.choices[0].message
    if m.tool_calls:
        check_calls(m.tool_calls)
        assert r.choices[0].finish_reason == "tool_calls"
    else:
        assert m.content and r.choices[0].finish_reason in ("stop", "length")
    # none: the tools are shown to the model, its reply is text only.
    r = server.client.chat.completions.create(model="test-model", messages=MESSAGES, tools=TOOLS, tool_choice="none",
                                              max_tokens=20, temperature=0)
    assert not r.choices[0].message.tool_calls and r.choices[0].message.content


def test_tool_results_render_and_errors_name_the_field(server):
    history = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": "{\"zone\": \"utc\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}]
    r = server.client.chat.completions.create(model="test-model", messages=history, tools=TOOLS, max_tokens=10,
                                              temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    status, text = server.post_raw("/tokenize", json.dumps({"messages": history}).encode())
    assert status == 200, text
    for body, needle in [({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "nope"),
                         ({"tool_choice": "sometimes"}, "sometimes"),
                         ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools[0].function.name"),
                         ({"guided_regex": "a+"}, "tool_choice"),
                         ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
                             "type": "array", "uniqueItems": True}}}]}, "tools[0].function.parameters.uniqueItems")]:
        status, text = server.post_raw("/v1/chat/completions", json.dumps(
            {"model": "test-model", "messages": MESSAGES, "tools": TOOLS, **body}).encode())
        assert status == 400 and needle in text, text


def test_tools_with_a_json_response_format(server):
    """tools (auto) and a JSON response_format together: the reply is calls, or JSON that matches
    the response format (never free text), and streamed equals whole."""
    schema = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 8}}, "required": ["answer"],
              "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}
    kinds = set()
    for temperature, seed in [(0.0, 1), (1.0, 2), (1.0, 3), (1.0, 4)]:
        kwargs = dict(model="test-model", messages=MESSAGES, tools=TOOLS, response_format=fmt, max_tokens=150,
                      temperature=temperature, seed=seed, parallel_tool_calls=False)
        r = server.client.chat.completions.create(**kwargs)
        m = r.choices[0].message
        if m.tool_calls:
            check_calls(m.tool_calls)
            assert not m.content and r.choices[0].finish_reason == "tool_calls", m
            kinds.add("calls")
        else:
            jsonschema.validate(json.loads(m.content), schema)
            assert r.choices[0].finish_reason == "stop", m
            kinds.add("json")
        content, calls, finish = streamed(server, **kwargs)
        assert finish == r.choices[0].finish_reason and content == (m.content or "")
        assert [(c["name"], c["arguments"]) for c in calls] == \
            [(c.function.name, c.function.arguments) for c in m.tool_calls or []]
    assert kinds, "no reply"
