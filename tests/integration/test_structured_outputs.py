"""Structured outputs through `tessera serve` with the official `openai` client: every output of
a constrained request, greedy and sampled, streamed and not, parses and validates with PyPI's
`jsonschema` (or matches its regex, choice or grammar); what the grammar engine cannot enforce
is refused with a 400 that names it.

Served model: stories260K (the reference test data). Its outputs are near-random text, which
makes it a hard client for a grammar: every token it would pick on its own is likely wrong.
"""
import json
import os
import re

import jsonschema
import pydantic
import pytest

from tessera_server import HERE, STORIES, Server, require_stories, sse_events


@pytest.fixture(scope="module")
def server():
    require_stories(os.path.join(STORIES, "hf"))
    s = Server(os.path.join(STORIES, "hf"),
               extra=["--chat-template", os.path.join(HERE, "data", "stories_chat_template.jinja")])
    yield s
    s.stop()


# Schemas whose every instance is short (bounded strings, numbers, arrays), so that an output
# always fits in max_tokens: what is tested is the grammar, not the model's taste.
SCHEMAS = [
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False},
    {"type": "object",
     "properties": {"color": {"enum": ["red", "green", "blue"]}, "n": {"type": "integer", "minimum": -5, "maximum": 40},
                    "tag": {"const": "v1"}},
     "required": ["color", "n", "tag"], "additionalProperties": False},
    {"type": "object",
     "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 6},
                    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 3}},
     "required": ["name", "tags"], "additionalProperties": False},
    {"type": "object",
     "properties": {"id": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"},
                    "kind": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "null"}]}},
     "required": ["id", "kind"], "additionalProperties": False},
    {"$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9},
                                                          "y": {"type": "integer", "minimum": 0, "maximum": 9}},
                         "required": ["x", "y"], "additionalProperties": False}},
     "type": "object", "properties": {"a": {"$ref": "#/$defs/point"}, "b": {"$ref": "#/$defs/point"}},
     "required": ["a", "b"], "additionalProperties": False},
    {"type": "object",
     "properties": {"when": {"type": "string", "format": "date"}, "score": {"type": "number", "minimum": 0,
                                                                             "maximum": 1}},
     "required": ["when"], "additionalProperties": False},
]


def response_format(schema):
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}}


@pytest.mark.parametrize("index", range(len(SCHEMAS)))
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_json_schema_outputs_validate(server, index, temperature):
    schema = SCHEMAS[index]
    r = server.client.chat.completions.create(
        model="test-model", messages=[{"role": "user", "content": "Once upon a time"}], max_tokens=120,
        temperature=temperature, seed=index, response_format=response_format(schema))
    text = r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop", text
    jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize("index", [1, 2, 4])
def test_streamed_json_schema_equals_the_whole_answer(server, index):
    schema = SCHEMAS[index]
    body = {"model": "test-model", "prompt": "Lily", "max_tokens": 120, "temperature": 0.7, "seed": 3,
            "guided_json": schema}
    whole = server.client.completions.create(**{k: v for k, v in body.items() if k != "guided_json"},
                                             extra_body={"guided_json": schema})
    events = sse_events(server.base, body)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    streamed = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert streamed == whole.choices[0].text
    jsonschema.validate(json.loads(streamed), schema)


def test_json_object_and_n_choices(server):
    r = server.client.chat.completions.create(
        model="test-model", messages=[{"role": "user", "content": "Tom had a"}], max_tokens=60, n=3,
        temperature=1.0, seed=11, response_format={"type": "json_object"})
    for c in r.choices:
        if c.finish_reason == "stop":
            assert isinstance(json.loads(c.message.content), dict), c.message.content
        else:  # an open-ended object may run to max_tokens; what there is still starts one
            assert c.finish_reason == "length" and c.message.content.startswith("{"), c.message.content


def test_regex_choice_and_grammar(server):
    r = server.client.completions.create(model="test-model", prompt="The dog", max_tokens=20, temperature=1.0,
                                         seed=5, extra_body={"guided_regex": "[a-z]{2,5}-[0-9]{3}"})
    assert re.fullmatch("[a-z]{2,5}-[0-9]{3}", r.choices[0].text), r.choices[0].text
    choices = ["happy", "sad", "a long (odd) answer."]
    for seed in range(3):
        r = server.client.completions.create(model="test-model", prompt="She was", max_tokens=20, temperature=1.0,
                                             seed=seed, extra_body={"guided_choice": choices})
        assert r.choices[0].text in choices
        assert r.choices[0].finish_reason == "stop"
    grammar = 'root ::= "yes" | "no" | ("maybe " [0-9])'
    r = server.client.completions.create(model="test-model", prompt="Is it", max_tokens=10, temperature=0,
                                         extra_body={"structured_outputs": {"grammar": grammar}})
    assert re.fullmatch("yes|no|maybe [0-9]", r.choices[0].text), r.choices[0].text


class Pet(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=5)
    age: int = pydantic.Field(ge=0, le=20)
    kind: str = pydantic.Field(pattern="^(cat|dog)$")


def test_openai_parse_returns_the_model(server):
    r = server.client.chat.completions.parse(model="test-model", messages=[{"role": "user", "content": "A pet"}],
                                             max_tokens=80, temperature=0.5, seed=2, response_format=Pet)
    pet = r.choices[0].message.parsed
    assert isinstance(pet, Pet), r.choices[0].message.content
    assert pet.kind in ("cat", "dog") and 0 <= pet.age <= 20


def error_of(server, body):
    status, text = server.post_raw("/v1/completions", json.dumps({"model": "test-model", "prompt": "x",
                                                                   "max_tokens": 5, **body}).encode())
    return status, json.loads(text)["error"]


def test_refusals_name_the_keyword_and_path(server):
    status, err = error_of(server, {"guided_json": {"type": "object", "properties": {
        "tags": {"type": "array", "uniqueItems": True}}}})
    assert status == 400
    assert "$.properties.tags.uniqueItems" in err["message"] and "'uniqueItems' is not supported" in err["message"]
    assert err["param"] == "guided_json"
    status, err = error_of(server, {"guided_json": {"if": {"type": "string"}}})
    assert status == 400 and "$.if: 'if' is not supported" in err["message"]
    status, err = error_of(server, {"guided_regex": "(unclosed"})
    assert status == 400 and "regex cannot be compiled" in err["message"]
    status, err = error_of(server, {"guided_regex": "a+", "guided_choice": ["a"]})
    assert status == 400 and "one output constraint" in err["message"]
    status, err = error_of(server, {"response_format": {"type": "xml"}})
    assert status == 400 and "'xml' is not supported" in err["message"]
    # The server is fine afterwards, and counts what it refused and compiled.
    r = server.client.completions.create(model="test-model", prompt="x", max_tokens=5,
                                         extra_body={"guided_choice": ["ok"]})
    assert r.choices[0].text == "ok"
    assert server.metric("tessera_grammar_refused_total") >= 2
    assert server.metric("tessera_grammar_compile_seconds_count") >= 1
    assert server.metric("tessera_grammar_mask_seconds_count") >= 1


def test_jump_forward_takes_forced_text_in_fewer_steps(server):
    """Fixed keys and punctuation are forced by the grammar: they are taken as forced drafts (no
    logits for their rows), so the request needs fewer steps than it has tokens."""
    schema = {"type": "object", "properties": {
        "a_rather_long_property_name": {"enum": ["first_value", "second_value"]},
        "another_long_property_name": {"type": "boolean"}},
        "required": ["a_rather_long_property_name", "another_long_property_name"], "additionalProperties": False}
    forced_before = server.metric("tessera_grammar_jump_forward_tokens_total")
    steps_before = server.metric("tessera_steps_total")
    r = server.client.completions.create(model="test-model", prompt="Lily", max_tokens=100, temperature=0,
                                         extra_body={"guided_json": schema})
    steps = server.metric("tessera_steps_total") - steps_before
    jsonschema.validate(json.loads(r.choices[0].text), schema)
    assert server.metric("tessera_grammar_jump_forward_tokens_total") - forced_before >= 20
    # One step for the prompt, then fewer decode steps than the output's tokens.
    assert steps < r.usage.completion_tokens / 2, (steps, r.usage.completion_tokens)


def test_jump_forward_off_still_constrains():
    """`--jump-forward-tokens 0` turns jump-forward off: every token is sampled under its mask
    (one step per token, with speculation off too), none is taken as a forced draft, and every output validates. (The
    outputs may differ from jump-forward's: forced text is spelled with the longest tokens, which
    is not always how the model would have cut it.)"""
    plain = Server(os.path.join(STORIES, "hf"), extra=["--jump-forward-tokens", "0", "--speculation", "off"])
    try:
        for schema in SCHEMAS[:3]:
            for temperature in (0.0, 1.0):
                steps_before = plain.metric("tessera_steps_total")
                r = plain.client.completions.create(model="test-model", prompt="Lily", max_tokens=120, seed=3,
                                                    temperature=temperature, extra_body={"guided_json": schema})
                jsonschema.validate(json.loads(r.choices[0].text), schema)
                assert plain.metric("tessera_steps_total") - steps_before >= r.usage.completion_tokens
        assert plain.metric("tessera_grammar_jump_forward_tokens_total") == 0
    finally:
        plain.stop()


def test_ngram_drafts_are_checked_and_verified_under_masks():
    """With the n-gram lookup always on (and jump-forward off, so that it is the only source of
    drafts), constrained sequences take drafts: cut to what the grammar accepts, verified row by
    row under each row's mask. The outputs are exactly those of decoding without drafts, greedy
    and seeded-sampled, and they validate."""
    extra = ["--jump-forward-tokens", "0"]
    plain = Server(os.path.join(STORIES, "hf"), extra=extra + ["--speculation", "off"])
    spec = Server(os.path.join(STORIES, "hf"), extra=extra + ["--speculation", "ngram", "--spec-depth", "4"])
    try:
        # A prompt the output repeats, so that the n-gram lookup finds continuations.
        prompt = '{"name": "Lily", "tags": ["a", "b"]}\n{"name": "Lily", "tags": ["a", "b"]}\n'
        for schema in SCHEMAS[:3]:
            for temperature in (0.0, 1.0):
                outs = []
                for s in (plain, spec):
                    r = s.client.completions.create(model="test-model", prompt=prompt, max_tokens=120, seed=5,
                                                    temperature=temperature, extra_body={"guided_json": schema})
                    jsonschema.validate(json.loads(r.choices[0].text), schema)
                    outs.append(r.choices[0].text)
                assert outs[0] == outs[1], (schema, temperature, outs)
        def ngram_drafts(server):
            _, text = server.get("/metrics")
            return sum(float(line.split()[-1]) for line in text.splitlines()
                       if line.startswith("tessera_spec_proposed_tokens_total{") and 'proposer="ngram"' in line)
        assert ngram_drafts(spec) > 0, "no n-gram drafts were verified for the constrained sequences"
        assert ngram_drafts(plain) == 0
    finally:
        plain.stop()
        spec.stop()


def test_cuda_shards_apply_the_masks():
    """Shards on the CUDA backend (TP 1 and 2; without a GPU, the fake backend CTest names in
    TESSERA_FAKE_CUDA_LIBRARY): masked rows are sampled on the host from the device's logits,
    jump-forward drafts included, and every output validates."""
    lib = os.environ.get("TESSERA_FAKE_CUDA_LIBRARY")
    if not lib or not os.path.exists(lib):
        pytest.skip("TESSERA_FAKE_CUDA_LIBRARY does not name the fake CUDA backend")
    require_stories(os.path.join(STORIES, "hf"))
    for tp in (1, 2):
        s = Server(os.path.join(STORIES, "hf"), tp=tp, extra=["--device", "cuda"],
                   env=dict(os.environ, TESSERA_CUDA_LIBRARY=lib))
        try:
            for temperature in (0.0, 1.0):
                r = s.client.completions.create(model="test-model", prompt="Lily", max_tokens=120, seed=1,
                                                temperature=temperature, extra_body={"guided_json": SCHEMAS[1]})
                jsonschema.validate(json.loads(r.choices[0].text), SCHEMAS[1])
        finally:
            s.stop()
