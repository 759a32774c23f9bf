"""Reasoning models (`--reasoning-parser`, auto-on for a template that writes <think>): the
<think> ... </think> part of a chat reply comes back as `reasoning_content`, streamed or not and
the same both ways; a JSON answer is constrained after the reasoning, not instead of it.

Served model: stories260K with a Qwen3-style template (tests/integration/data/
stories_reasoning_template.jinja). Its own text never closes a reasoning part, so the reasoning
is spelled by a guided_regex (a client's regex is the whole output, reasoning included).
"""
import json
import os
import re

import jsonschema
import pytest

from tessera_server import HERE, STORIES, Server, require_stories

TEMPLATE = os.path.join(HERE, "data", "stories_reasoning_template.jinja")
REGEX = r"<think>[a-z ]{3,20}</think>\n\{\"ok\": (true|false)\}"


@pytest.fixture(scope="module")
def server():
    require_stories(os.path.join(STORIES, "hf"))
    s = Server(os.path.join(STORIES, "hf"), extra=["--chat-template", TEMPLATE])
    yield s
    s.stop()


def chat(server, stream, **body):
    body = {"model": "test-model", "messages": [{"role": "user", "content": "Lily"}], "max_tokens": 80,
            "temperature": 1.0, "seed": 7, **body}
    if not stream:
        status, text = server.post_raw("/v1/chat/completions", json.dumps(body).encode())
        assert status == 200, text
        m = json.loads(text)["choices"][0]["message"]
        return m.get("reasoning_content", ""), m["content"] or ""
    status, text = server.post_raw("/v1/chat/completions", json.dumps({**body, "stream": True}).encode())
    assert status == 200, text
    reasoning, content = "", ""
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    for ev in events:
        assert "error" not in ev, ev
        for c in ev.get("choices", []):
            reasoning += c["delta"].get("reasoning_content") or ""
            content += c["delta"].get("content") or ""
    return reasoning, content


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_comes_apart_from_the_answer(server, stream):
    reasoning, content = chat(server, stream, guided_regex=REGEX)
    assert re.fullmatch(r"[a-z ]{3,20}", reasoning), reasoning
    assert json.loads(content)["ok"] in (True, False)
    assert "<think>" not in content and "</think>" not in content


def test_streamed_reasoning_equals_the_whole_reply(server):
    for seed in (1, 2, 3):
        assert chat(server, False, guided_regex=REGEX, seed=seed) == chat(server, True, guided_regex=REGEX, seed=seed)


def test_a_schema_is_enforced_after_the_reasoning(server):
    """response_format with a reasoning model: the reply may reason first (free text up to
    </think>), then the JSON; whenever it completes, the content validates. (The tiny model never
    closes a reasoning part it opened, so here a reply either answers at once, the JSON from its
    first token, or reasons until max_tokens; grammar_test's ReasoningPrefix test walks the
    reasoning-then-answer path token by token; thinking off below, the answer-at-once path.)"""
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}
    for seed in range(4):
        for stream in (False, True):
            reasoning, content = chat(server, stream, seed=seed, max_tokens=60, response_format=fmt)
            if content:
                jsonschema.validate(json.loads(content), schema)
            else:  # still reasoning at max_tokens: all of it is reasoning
                assert reasoning


def test_thinking_off_in_the_prompt_is_plain_content(server):
    """A prompt that closed the reasoning itself (enable_thinking false): the reply is all content
    and a schema constrains it from the first token."""
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    for stream in (False, True):
        reasoning, content = chat(server, stream, chat_template_kwargs={"enable_thinking": False},
                                  response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema}})
        assert reasoning == ""
        jsonschema.validate(json.loads(content), schema)


def test_reasoning_parser_none_keeps_the_tags_in_content():
    require_stories(os.path.join(STORIES, "hf"))
    s = Server(os.path.join(STORIES, "hf"), extra=["--chat-template", TEMPLATE, "--reasoning-parser", "none"])
    try:
        reasoning, content = chat(s, False, guided_regex=REGEX)
        assert reasoning == ""
        assert content.startswith("<think>") and "</think>" in content
    finally:
        s.stop()
