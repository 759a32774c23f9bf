"""JSON Schema conformance on the default model (Gemma 3 270M, Q4_K_M), both ways:

* not wider than the schema: every output of `tessera serve` for every schema of the suite
  (tests/integration/schema_suite.py), greedy and sampled, streamed and not, parses and validates
  with PyPI's `jsonschema` (formats checked too), and ends because the value is complete (the
  only outputs allowed to run to max_tokens are those inside a string nothing bounds,
  schema_suite.UNBOUNDED_STRINGS, where a looping model never closes it; they are counted);
* not narrower than the schema: instances PyPI's `hypothesis-jsonschema` generates from each
  schema are accepted whole by the compiled grammar (`tessera grammar --instances`), except where
  the grammar engine is knowingly narrower (NARROWINGS, each documented in
  docs/structured_outputs.md);
* what it cannot enforce is refused by name: every keyword `tessera grammar --list-unsupported`
  prints gets a 400 naming it and its path.
"""
import concurrent.futures
import copy
import json
import math
import os
import re
import subprocess
import warnings

import jsonschema
import pytest

from tessera_server import BIN, DEFAULT_MODEL, Server
from schema_suite import SUITE, UNBOUNDED_STRINGS

hypothesis = pytest.importorskip("hypothesis")
hypothesis_jsonschema = pytest.importorskip("hypothesis_jsonschema")

TESSERA = os.path.join(BIN, "tessera")
INSTANCES_PER_SCHEMA = 8
MAX_TOKENS = 400


def require_model():
    if not os.path.exists(DEFAULT_MODEL):
        pytest.skip(f"the default model is not at {DEFAULT_MODEL} (scripts/default_model.sh fetches it)")


def validator(schema):
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


# ---- not narrower: hypothesis-jsonschema's instances through the grammar ----

def resolve(node, root):
    while isinstance(node, dict) and "$ref" in node:
        path = node["$ref"]
        assert path.startswith("#"), path
        target = root
        for part in [p for p in path[1:].split("/") if p]:
            target = target[part]
        rest = {k: v for k, v in node.items() if k != "$ref"}
        node = {**target, **rest} if rest and "properties" not in rest else target
    return node


def sub_valid(value, branch, root):
    """Whether `value` matches `branch`, a part of `root` (whose $defs it may refer to)."""
    branch = resolve(branch, root)
    defs = {k: root[k] for k in ("$defs", "definitions") if k in root}
    return validator({**branch, **defs}).is_valid(value)


def spelled(value, node, root):
    """The text the grammar writes for `value` at schema `node`: properties in the schema's order
    (the grammar fixes the order, as OpenAI's strict mode does), ", " and ": " between items, and
    const / enum values in xgrammar's own spelling (compact, numbers with 17 significant digits)."""
    node = resolve(node, root) if isinstance(node, dict) else {}
    if "const" in node or "enum" in node:
        members = [node["const"]] if "const" in node else node["enum"]
        return const_spelling(next((m for m in members if m == value and type(m) is type(value)), value))
    for key in ("anyOf", "oneOf"):
        if key in node:
            for branch in node[key]:
                if sub_valid(value, branch, root):
                    return spelled(value, branch, root)
    if isinstance(value, dict):
        props = node.get("properties", {})
        extra = node.get("additionalProperties", {})
        keys = [k for k in props if k in value] + [k for k in value if k not in props]
        return "{" + ", ".join(json.dumps(k, ensure_ascii=False) + ": " +
                               spelled(value[k], props.get(k, extra if isinstance(extra, dict) else {}), root)
                               for k in keys) + "}"
    if isinstance(value, list):
        prefix = node.get("prefixItems", [])
        items = node.get("items", {})
        return "[" + ", ".join(spelled(v, prefix[i] if i < len(prefix) else (items if isinstance(items, dict) else {}),
                                       root) for i, v in enumerate(value)) + "]"
    return json.dumps(value, ensure_ascii=False)


def const_spelling(value):
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.17g}"
    if isinstance(value, dict):
        return "{" + ",".join(json.dumps(k) + ":" + const_spelling(v) for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(const_spelling(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def walk(value, node, root, path="$"):
    """(sub-value, its schema node, its path) for every value inside `value`."""
    node = resolve(node, root) if isinstance(node, dict) else {}
    yield value, node, path
    for key in ("anyOf", "oneOf"):
        for branch in node.get(key, []):
            if sub_valid(value, branch, root):
                yield from walk(value, branch, root, path)
                break
    if isinstance(value, dict):
        props = node.get("properties", {})
        extra = node.get("additionalProperties", {})
        for k, v in value.items():
            yield from walk(v, props.get(k, extra if isinstance(extra, dict) else {}), root, f"{path}.{k}")
    elif isinstance(value, list):
        prefix = node.get("prefixItems", [])
        items = node.get("items", {})
        for i, v in enumerate(value):
            yield from walk(v, prefix[i] if i < len(prefix) else (items if isinstance(items, dict) else {}), root,
                            f"{path}[{i}]")


def ranged_number_outside_grammar(value, node):
    """xgrammar writes a number with a minimum or maximum without an exponent and with at most 6
    digits after the point (integers are not limited)."""
    if not isinstance(value, float) or node.get("type") != "number":
        return False
    if not any(k in node for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")):
        return False
    text = json.dumps(value).lower()
    return "e" in text or ("." in text and len(text.split(".")[1]) > 6)


def email_outside_grammar(value, node):
    """xgrammar's email: every domain label after the first has at least 2 characters."""
    if node.get("format") != "email" or not isinstance(value, str) or "@" not in value:
        return False
    labels = value.rsplit("@", 1)[1].split(".")
    return any(len(label) < 2 for label in labels[1:])


def hostname_outside_grammar(value, node):
    """xgrammar's hostname: lowercase letters only."""
    return node.get("format") == "hostname" and isinstance(value, str) and value != value.lower()


def lowercase_hostnames(value, node, root):
    """`value` with every hostname lowercased (still a hostname): hypothesis-jsonschema writes
    them in capitals, which the grammar refuses, so without this none would be checked."""
    node = resolve(node, root) if isinstance(node, dict) else {}
    if node.get("format") == "hostname" and isinstance(value, str):
        return value.lower()
    if isinstance(value, dict):
        props = node.get("properties", {})
        return {k: lowercase_hostnames(v, props.get(k, {}), root) for k, v in value.items()}
    if isinstance(value, list):
        items = node.get("items", {})
        return [lowercase_hostnames(v, items if isinstance(items, dict) else {}, root) for v in value]
    return value


def escaped_in_bounded_string(value, node):
    """A string with minLength / maxLength holds no '"', '\\' or control character (grammar/
    bounded_strings.h: escapes there would make every mask slow)."""
    return (isinstance(value, str) and ("minLength" in node or "maxLength" in node)
            and any(c in '"\\' or ord(c) < 0x20 for c in value))


def long_digit_run(value, node):
    """Every run of digits has at most 19 (grammar/digit_runs.h), so that every number ends."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return any(len(run) > 19 for run in re.findall(r"[0-9]+", json.dumps(value)))


NARROWINGS = [ranged_number_outside_grammar, email_outside_grammar, hostname_outside_grammar, long_digit_run,
              escaped_in_bounded_string]

def custom_formats():
    """Formats hypothesis-jsonschema does not generate itself (it would give arbitrary strings)."""
    from hypothesis import strategies as st
    n = st.integers(0, 99)
    duration = st.one_of(st.builds("P{}W".format, n), st.builds("P{}Y{}M{}D".format, n, n, n),
                         st.builds("P{}DT{}H{}M{}S".format, n, n, n, n), st.builds("PT{}H".format, n),
                         st.builds("PT{}M{}S".format, n, n), st.builds("P{}D".format, n))
    return {"uuid": st.uuids().map(str), "duration": duration}


def unknown_format(instance, schema):
    """An instance with a format neither generates: not known to be valid, not checked."""
    from hypothesis_jsonschema._from_schema import STRING_FORMATS
    known = set(STRING_FORMATS) | set(custom_formats())
    return any(isinstance(node.get("format"), str) and node["format"] not in known
               for _, node, _ in walk(instance, schema, schema))


def narrowed(instance, schema):
    for value, node, path in walk(instance, schema, schema):
        for rule in NARROWINGS:
            if rule(value, node):
                return f"{rule.__name__} at {path}"
    return None


def hypothesis_instances(schema, n):
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis_jsonschema import from_schema
    found = []

    # hypothesis-jsonschema rewrites the schema it is given: hand it a copy.
    @settings(max_examples=n, database=None, derandomize=True, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(from_schema(copy.deepcopy(schema), custom_formats=custom_formats()))
    def collect(x):
        found.append(x)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        collect()
    return found


@pytest.mark.parametrize("name,schema", SUITE, ids=[n for n, _ in SUITE])
def test_grammar_accepts_generated_instances(name, schema, tmp_path):
    require_model()
    check = validator(schema)
    try:
        instances = hypothesis_instances(schema, INSTANCES_PER_SCHEMA)
    except Exception as e:  # formats or keywords hypothesis-jsonschema cannot generate
        pytest.skip(f"hypothesis-jsonschema generates no instances of {name}: {type(e).__name__}: {e}"[:300])
    # Every instance is valid (formats PyPI's jsonschema can check included).
    instances = [lowercase_hostnames(i, schema, schema) for i in instances]
    instances = [i for i in instances if check.is_valid(i) and not unknown_format(i, schema)]
    checked = [i for i in instances if narrowed(i, schema) is None]
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(schema))
    texts = [spelled(i, schema, schema) for i in checked]
    for text in texts:
        check.validate(json.loads(text))  # the spelling did not change the value
    # What is checked is what the grammar accepts, not how fast it compiles (under a loaded CI
    # machine a 31-character bound's 32 states took longer than the default 5 s budget).
    p = subprocess.run([TESSERA, "grammar", "--model", DEFAULT_MODEL, "--json-schema", str(schema_file),
                        "--grammar-compile-timeout", "120000", "--instances", "-"], input="".join(json.dumps(t) + "\n" for t in texts),
                       capture_output=True, text=True, timeout=300)
    lines = [json.loads(line) for line in p.stdout.splitlines()]
    assert lines and lines[0].get("compiled"), (p.stdout, p.stderr)
    refused = [(texts[r["line"] - 1], r) for r in lines[1:] if not r["accepted"]]
    assert not refused, f"{name}: valid instances the grammar refuses: {refused[:3]}"
    assert len(lines) - 1 == len(texts)


# ---- not wider: the model's constrained outputs validate ----

@pytest.fixture(scope="module")
def server():
    require_model()
    s = Server(DEFAULT_MODEL, extra=["--max-batch", "16", "--grammar-compile-timeout", "120000"])
    yield s
    s.stop()


def ask(server, name, schema, temperature, stream):
    messages = [{"role": "user", "content": "Reply with one JSON value for this JSON Schema, with realistic "
                                            f"values:\n{json.dumps(schema)}"}]
    body = dict(model="test-model", messages=messages, max_tokens=MAX_TOKENS, temperature=temperature, seed=7,
                response_format={"type": "json_schema",
                                 "json_schema": {"name": "out", "schema": schema, "strict": True}})
    if not stream:
        r = server.client.chat.completions.create(**body)
        return r.choices[0].message.content, r.choices[0].finish_reason
    text, finish = "", None
    for chunk in server.client.chat.completions.create(stream=True, **body):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    return text, finish


def test_every_output_validates(server):
    jobs = [(name, schema, temperature, stream) for name, schema in SUITE for temperature in (0.0, 1.0)
            for stream in (False, True)]
    failures = []
    cut = []

    def run(job):
        name, schema, temperature, stream = job
        mode = f"{name} temperature {temperature} {'streamed' if stream else 'whole'}"
        try:
            text, finish = ask(server, name, schema, temperature, stream)
        except Exception as e:
            return f"{mode}: request failed: {e}"
        if finish == "length" and name in UNBOUNDED_STRINGS:
            cut.append(mode)
            return None
        if finish != "stop":
            return f"{mode}: finish_reason {finish!r} after {text[:200]!r}"
        try:
            value = json.loads(text)
        except ValueError as e:
            return f"{mode}: not JSON ({e}): {text[:200]!r}"
        errors = [e.message for e in validator(schema).iter_errors(value)]
        return f"{mode}: does not validate ({errors[:2]}): {text[:200]!r}" if errors else None

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        for result in pool.map(run, jobs):
            if result:
                failures.append(result)
    assert len(jobs) >= 400
    print(f"{len(jobs)} outputs, {len(failures)} failed, {len(cut)} cut at max_tokens inside an unbounded string: "
          f"{cut}")
    assert not failures, f"{len(failures)} of {len(jobs)} outputs failed:\n" + "\n".join(failures[:40])


# ---- refused by name ----

def unsupported_keywords():
    p = subprocess.run([TESSERA, "grammar", "--list-unsupported"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return [json.loads(line) for line in p.stdout.splitlines()]


def test_unsupported_keywords_are_refused_by_name_and_documented(server):
    keywords = unsupported_keywords()
    assert len(keywords) >= 5
    with open(os.path.join(os.path.dirname(__file__), "../../docs/structured_outputs.md")) as f:
        docs = f.read()
    values = {"not": {"type": "null"}, "if": {"type": "object"}, "then": {"required": ["a"]},
              "else": {"required": ["b"]}, "dependentRequired": {"a": ["b"]}, "dependentSchemas": {"a": {}},
              "dependencies": {"a": ["b"]}, "uniqueItems": True, "contains": {"type": "integer"}, "minContains": 1,
              "maxContains": 2}
    for k in keywords:
        keyword = k["keyword"]
        assert f"`{keyword}`" in docs, f"docs/structured_outputs.md does not list '{keyword}'"
        inner = {"type": "array", "items": {"type": "integer"}} if "ontains" in keyword or keyword == "uniqueItems" \
            else {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
        inner[keyword] = values.get(keyword, {})
        schema = {"type": "object", "properties": {"field": inner}, "required": ["field"]}
        status, body = server.post_raw("/v1/chat/completions", json.dumps({
            "model": "test-model", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}).encode())
        assert status == 400, (keyword, body)
        assert f"'{keyword}'" in body and "$.properties.field" in body, (keyword, body)
