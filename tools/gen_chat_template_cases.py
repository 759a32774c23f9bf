#!/usr/bin/env python3
"""Generates the expected outputs of the chat-template tests with the reference renderer.

The reference is Python jinja2 configured exactly as Hugging Face transformers renders chat
templates (transformers/utils/chat_template_utils.py): an ImmutableSandboxedEnvironment with
trim_blocks=True, lstrip_blocks=True and the loopcontrols extension, a `generation` block tag,
a tojson filter that does not escape HTML (json.dumps, ensure_ascii=False by default), and the
globals raise_exception and strftime_now; render() receives messages, tools=None,
documents=None, add_generation_prompt and the special tokens.

Not needed at test time: the tests read the JSON this script writes.

    python3 -m venv /tmp/venv-chat && /tmp/venv-chat/bin/pip install jinja2
    /tmp/venv-chat/bin/python tools/gen_chat_template_cases.py \
        --testdata build/testdata --out tests/template/data/chat_templates

--testdata is the reference test data (tests/data/README.md) as the build unpacks it
(`cmake --build build --target tessera_testdata`); by default $TESSERA_TESTDATA, else build/testdata.

Outputs:
  chat_cases.json   conversations rendered through ChatTemplate (messages + flags)
  jinja_cases.json  templates rendered with an arbitrary JSON context (interpreter features)
Each case holds the template (inline `template`, a file under the output folder
`template_file`, or a tokenizer_config.json under the reference test data `template_testdata`),
its inputs, and either `expected` (the exact string) or `error`: {"kind": "raise", "message"}
for raise_exception, {"kind": "syntax", "line"} for template syntax errors, {"kind": "runtime"}
for other render errors.
"""

import argparse
import datetime
import json
import os
import sys

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

# 2025-01-01 12:00:00 UTC: the local date is the same in every time zone within +-11 h.
NOW_UNIX_SECONDS = 1735732800


class GenerationTag(jinja2.ext.Extension):
    """transformers' {% generation %} tag: renders its body in place."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


class RaisedByTemplate(Exception):
    pass


def make_env():
    def raise_exception(message):
        raise RaisedByTemplate(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.fromtimestamp(NOW_UNIX_SECONDS).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


ENV = make_env()


def render_case(source, context):
    try:
        template = ENV.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        return {"error": {"kind": "syntax", "line": e.lineno}}
    except jinja2.TemplateError as e:  # unknown filters/tests are assertion errors at compile time
        return {"error": {"kind": "syntax", "line": getattr(e, "lineno", None)}}
    except SyntaxError:  # jinja2 lets Python's compiler reject e.g. `break` outside a loop
        return {"error": {"kind": "syntax", "line": None}}
    try:
        return {"expected": template.render(**context)}
    except RaisedByTemplate as e:
        return {"error": {"kind": "raise", "message": str(e)}}
    except Exception as e:  # noqa: BLE001 - any render failure is an expected error case
        return {"error": {"kind": "runtime", "python": f"{type(e).__name__}: {e}"}}


# ---------------------------------------------------------------------------------------------
# Conversations for the four families

FAMILIES = {
    # name: (template reference, bos, eos)
    "llama3": ({"template_testdata": "tokenizers/llama3/tokenizer_config.json"}, "<|begin_of_text|>", "<|eot_id|>"),
    "qwen3": ({"template_testdata": "tokenizers/qwen3/tokenizer_config.json"}, "", "<|im_end|>"),
    "gemma3": ({"template_testdata": "tokenizers/gemma3/tokenizer_config.json"}, "<bos>", "<eos>"),
    "mistral": ({"template_file": "mistral_instruct.jinja"}, "<s>", "</s>"),
}

CONVERSATIONS = {
    "single_user": [{"role": "user", "content": "Hello!"}],
    "system_user": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2 + 2?"},
    ],
    "multi_turn": [
        {"role": "user", "content": "Hi, who are you?"},
        {"role": "assistant", "content": "I am an assistant."},
        {"role": "user", "content": "Tell me a joke."},
    ],
    "system_multi_turn": [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Italy?"},
    ],
    "ends_with_assistant": [
        {"role": "user", "content": "Say yes."},
        {"role": "assistant", "content": "Yes."},
    ],
    "special_characters": [
        {"role": "user", "content": "  Quotes ' \" and braces {{ x }} {% if %} {# c #} \\ backslash\ttab  "},
        {"role": "assistant", "content": "\n\nLine one\nLine two\r\nLine three\n\n"},
        {"role": "user", "content": "<|im_start|> </s> [INST] <start_of_turn> not special here"},
    ],
    "unicode": [
        {"role": "user", "content": "Grüße, 世界! Привет 👋🏽 — مرحبا नमस्ते \u00a0nbsp\u3000ideographic"},
        {"role": "assistant", "content": "\u2028emoji 👨‍👩‍👧 and é (e\u0301)\u2029"},
        {"role": "user", "content": "ß → SS? İ ı"},
    ],
    "think_in_history": [
        {"role": "user", "content": "What is 1+1?"},
        {"role": "assistant", "content": "<think>\nSimple arithmetic.\n</think>\n\n2"},
        {"role": "user", "content": "And 2+2?"},
    ],
    "think_last": [
        {"role": "user", "content": "What is 1+1?"},
        {"role": "assistant", "content": "<think>\nSimple.\n</think>\n\n2"},
    ],
    "empty_content": [
        {"role": "user", "content": ""},
    ],
    "alternation_error": [
        {"role": "user", "content": "one"},
        {"role": "user", "content": "two"},
    ],
    "assistant_first": [
        {"role": "assistant", "content": "I start."},
        {"role": "user", "content": "ok"},
    ],
    "long_conversation": [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}: " + "word " * (i % 7)}
        for i in range(41)
    ],
}


def chat_cases():
    cases = []
    for family, (ref, bos, eos) in FAMILIES.items():
        source = load_template(ref)
        for conv_name, messages in CONVERSATIONS.items():
            for agp in (True, False):
                context = {"messages": messages, "tools": None, "documents": None,
                           "add_generation_prompt": agp, "bos_token": bos, "eos_token": eos}
                case = {"name": f"{family}/{conv_name}/{'gen' if agp else 'nogen'}", **ref,
                        "messages": messages, "add_generation_prompt": agp, "bos_token": bos, "eos_token": eos}
                case.update(render_case(source, context))
                cases.append(case)
    # Qwen 3 with thinking disabled through an extra template variable.
    ref, bos, eos = FAMILIES["qwen3"]
    for conv_name in ("single_user", "think_in_history"):
        messages = CONVERSATIONS[conv_name]
        extra = {"enable_thinking": False}
        context = {"messages": messages, "tools": None, "documents": None, "add_generation_prompt": True,
                   "bos_token": bos, "eos_token": eos, **extra}
        case = {"name": f"qwen3/{conv_name}/no_thinking", **ref, "messages": messages,
                "add_generation_prompt": True, "bos_token": bos, "eos_token": eos, "extra_context": extra}
        case.update(render_case(load_template(ref), context))
        cases.append(case)
    return cases


# ---------------------------------------------------------------------------------------------
# Interpreter features: small templates with JSON contexts

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "Name"}},
                       "required": ["city"]},
    },
}

FEATURES = [
    # Output and literals
    ("print_literals", "{{ 1 }}|{{ -2 }}|{{ 1.5 }}|{{ 1e3 }}|{{ 'a' }}|{{ \"b\" }}|{{ true }}|{{ none }}|{{ [1, 'x', none, false] }}|{{ {'k': 'v', 'n': 1} }}", {}),
    ("print_floats", "{{ 0.1 + 0.2 }} {{ 1/3 }} {{ 1e16 }} {{ 1e-5 }} {{ 123456789.0 }} {{ 2.5e-7 }} {{ -0.0 }} {{ 10/4 }} {{ 1e300*1e300 }}", {}),
    ("print_tuple", "{{ (1, 'a') }}{{ (1,) }}{{ () }}{{ 1, 2 }}", {}),
    ("string_escapes", "{{ 'a\\nb\\tc\\\\d\\'e\\\"f\\x41\\u00e9\\U0001F600\\q' }}", {}),
    ("adjacent_strings", "{{ 'a' 'b' \"c\" }}", {}),
    ("repr_quotes", "{{ [\"it's\", 'say \"hi\"', 'both \\' \"', 'tab\\t', '\\u200d\\xa0é'] }}", {}),
    ("undefined_prints_empty", "[{{ nothing }}][{{ d.missing }}][{{ d['missing'] }}][{{ l[5] }}]", {"d": {}, "l": [1]}),
    # Whitespace control
    ("ws_trim_lstrip", "  {% if true %}\n  x\n  {% endif %}\n  y {% if true %} z {% endif %}\n", {}),
    ("ws_minus", "a  \n {%- if true -%}  \n b \n {%- endif -%} \n c", {}),
    ("ws_plus", "a\n  {%+ if true %}x{% endif +%}\nb", {}),
    ("ws_var_minus", "a {{- 1 -}} b {{ 2 }} \n c", {}),
    ("ws_comments", "x  {# c #}  \n  {# d #}\ny\n{#- e -#}\n  z", {}),
    ("ws_lstrip_not_after_text", "text {% if true %}A{% endif %}\n\t{% if true %}B{% endif %}", {}),
    ("ws_trailing_newline", "line\n", {}),
    ("ws_crlf", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc", {}),
    ("ws_raw", "{% raw %}  {{ x }} {% if %}{% endraw %}\nz", {}),
    ("ws_nested_blocks", "{% for i in [1, 2] %}\n  {% if i == 1 %}\n    one\n  {% else %}\n    other\n  {% endif %}\n{% endfor %}\n", {}),
    # Expressions
    ("arith", "{{ 7 + 3 }} {{ 7 - 10 }} {{ 7 * 3 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 2 ** -1 }}", {}),
    ("arith_float", "{{ 7.5 // 2 }} {{ -7.5 // 2 }} {{ 7.5 % 2 }} {{ -7.5 % 2 }} {{ 1 + 1.0 }} {{ true + true }} {{ 3 * 1.5 }}", {}),
    ("string_ops", "{{ 'ab' + 'cd' }} {{ 'ab' * 3 }} {{ 3 * 'x' }} {{ 'a' ~ 1 ~ none ~ true ~ [1] }} {{ [1] + [2, 3] }} {{ [0] * 3 }}", {}),
    ("precedence", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 'n=' ~ 2 * 3 }} {{ 'n=' ~ (1 + 2) }} {{ not true or true }} {{ not (true and false) }} {{ 1 if false else 2 if false else 3 }} {{ -1|abs }}", {}),
    ("compare", "{{ 1 < 2 }} {{ 2 <= 2 }} {{ 3 > 2 > 1 }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 'a' != 'a' }} {{ {'a': 1} == {'a': 1} }} {{ none == none }}", {}),
    ("in_operator", "{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }} {{ 1 not in [1] }} {{ 'x' in missing }}", {}),
    ("and_or_values", "{{ true and 'x' }}|{{ false or 'y' }}|{{ none or [] }}|{{ 0 and 1 }}|{{ '' or 'default' }}", {}),
    ("inline_if_no_else", "[{{ 'yes' if false }}][{{ 'yes' if true }}]", {}),
    ("literals_collections", "{% set d = {'a': [1, {'b': 2}], 'c': (3, 4)} %}{{ d.a[1].b }}{{ d['c'][0] }}{{ d.c|length }}{{ {'a': 1, 'a': 2} }}", {}),
    ("subscripts", "{{ l[0] }}{{ l[-1] }}{{ s[1] }}{{ s[-1] }}{{ d.x.y }}{{ d['x']['y'] }}{{ l.0 }}", {"l": [1, 2, 3], "s": "héllo", "d": {"x": {"y": "Y"}}}),
    ("slices", "{{ l[1:] }}{{ l[:2] }}{{ l[::2] }}{{ l[::-1] }}{{ l[-2:] }}{{ s[::-1] }}{{ s[1:3] }}{{ 'abcdef'[4:1:-1] }}{{ l[5:] }}", {"l": [1, 2, 3, 4], "s": "añb€c"}),
    # Statements
    ("if_elif_else", "{% for x in [1, 2, 3, 4] %}{% if x == 1 %}one{% elif x == 2 %}two{% elif x == 3 %}three{% else %}many{% endif %} {% endfor %}", {}),
    ("for_loop_vars", "{% for x in ['a', 'b', 'c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}", {}),
    ("for_prev_next_cycle", "{% for x in [1, 2, 3] %}{{ loop.previtem }}-{{ loop.nextitem }}-{{ loop.cycle('odd', 'even') }};{% endfor %}", {}),
    ("for_else", "{% for x in [] %}x{% else %}empty{% endfor %}{% for x in [1] %}{{ x }}{% else %}empty{% endfor %}{% for x in missing %}x{% else %}undef{% endfor %}", {}),
    ("for_filter", "{% for x in [1, 2, 3, 4] if x is even %}{{ loop.index }}:{{ x }}/{{ loop.length }} {% endfor %}", {}),
    ("for_unpack", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}", {"d": {"z": 1, "a": 2}}),
    ("for_dict_and_string", "{% for k in d %}{{ k }}{% endfor %}|{% for c in 'añ' %}[{{ c }}]{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("break_continue", "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}", {}),
    ("nested_loops", "{% for a in [1, 2] %}{% for b in ['x', 'y'] %}{{ a }}{{ b }}{{ loop.index }}{% endfor %}({{ loop.index }}){% endfor %}", {}),
    ("loop_scoping", "{% set a = 1 %}{% for x in [1, 2] %}{{ a }}{% set a = a + 1 %}{{ a }}{% endfor %}{{ a }}|{% for x in [1, 2] %}{% if loop.first %}{% set b = 5 %}{% endif %}[{{ b }}]{% endfor %}", {}),
    ("if_scoping", "{% if true %}{% set b = 3 %}{% endif %}{{ b }}", {}),
    # Jinja decides scopes at compile time: a template-level name first assigned after a loop is
    # undefined inside the loop even though the context has it; blocks are frames of their own.
    ("scoping_compile_time", "{% for i in [1] %}[{{ s }}]{% endfor %}{% set s = 'new' %}{{ s }}|{% for i in [1] %}[{{ t }}]{% endfor %}{% if false %}{% set t = 'x' %}{% endif %}|{% set u2 = u %}{% for i in [1] %}[{{ u }}]{% endfor %}{% set u = 'new' %}|{% macro m() %}[{{ v }}]{% endmacro %}{{ m() }}{% set v = 'new' %}{{ m() }}", {"s": "ctx", "t": "ctx", "u": "ctx", "v": "ctx"}),
    ("block_frames_do_not_leak", "{% set blk %}{% set inner = 1 %}x{% endset %}[{{ inner }}]{% filter upper %}{% set inner2 = 2 %}y{% endfilter %}[{{ inner2 }}]{% with %}{% set inner3 = 3 %}{% endwith %}[{{ inner3 }}]", {}),
    ("for_else_after_break_continue", "{% for x in [1, 2] %}{% break %}{% else %}E1{% endfor %}|{% for x in [1, 2] %}{{ x }}{% continue %}{% else %}E2{% endfor %}|{% for x in [1, 2] %}{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% else %}E3{% endfor %}|{% for x in [1, 2] if x > 5 %}{% else %}E4{% endfor %}", {}),
    ("generators_are_truthy_and_single_pass", "{% if empty|selectattr('role', 'equalto', 'system') %}truthy{% endif %}|{% set g = [1, 2, 3]|select('odd') %}{{ g|list }}{{ g|list }}|{% set h = [1, 2, 3]|map('string') %}{{ h|first }}{{ h|join }}|{{ [3, 1]|reverse|list }}{{ (none|map(attribute='x')) is defined }}", {"empty": []}),
    ("percent_format_mappings", "{{ 'a' % {'x': 1} }}|{{ 'a' % [1] }}|{{ 'a%s' % [1] }}|{{ '%(x)s-%(y)d' % {'x': 'X', 'y': 2} }}|{{ '%s' % missing }}|{{ '%s and %s' % ('a', 'b') }}|{{ '%5.1f|%-4d|%x' % (3.14159, 7, 255) }}", {}),
    ("tests_on_floats", "{{ 2.5 is divisibleby 2 }}{{ 4.0 is divisibleby 2 }}{{ 3.0 is odd }}{{ 2.0 is even }}{{ loop is callable }}", {}),
    ("tuple_subscript_and_name_not", "[{{ d[1, 2] }}][{{ {'a': 1}['a'] }}]", {"d": {}}),
    ("namespace", "{% set ns = namespace(count=0, found=false) %}{% for m in msgs %}{% if m.role == 'user' %}{% set ns.count = ns.count + 1 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.found }} {{ ns.missing }}", {"msgs": [{"role": "user"}, {"role": "assistant"}, {"role": "user"}]}),
    ("set_multiple_and_block", "{% set a, b = 1, 2 %}{{ b }}{{ a }}{% set blk %}  hi {{ a }}\n{% endset %}[{{ blk }}]{% set up | upper %}shout{% endset %}{{ up }}", {}),
    ("macro", "{% macro greet(name, punct='!') %}Hello {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }} {{ greet(punct='.', name='C') }} {{ greet() }}", {}),
    ("macro_sees_globals", "{% set g = 1 %}{% macro m() %}{{ g }}{{ bos_token }}{% endmacro %}{% set g = 2 %}{{ m() }}", {"bos_token": "<s>"}),
    ("macro_recursion", "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(6) }}", {}),
    ("with_block", "{% with a = 1, b = 'x' %}{{ a }}{{ b }}{% endwith %}[{{ a }}]", {}),
    ("filter_block", "{% filter upper %}abc{{ 'd' }}{% endfilter %}{% filter replace('a', 'o') | trim %}  banana  {% endfilter %}", {}),
    ("generation_tag", "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}", {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}),
    # Filters
    ("filter_trim_length", "[{{ '  x y  '|trim }}][{{ 'xxaxx'|trim('x') }}][{{ '\u00a0a\u3000'|trim }}]{{ 'héllo'|length }}{{ [1, 2]|length }}{{ {'a': 1}|count }}{{ missing|length }}", {}),
    ("filter_case", "{{ 'Hello World'|upper }} {{ 'Hello World'|lower }} {{ 'hello WORLD'|capitalize }} {{ 'hello wide-world (x)'|title }} {{ 'ÀÉÎ straße'|lower }} {{ 'àéî'|upper }}", {}),
    ("filter_replace_join", "{{ 'a-b-c'|replace('-', '+') }} {{ 'hello'|replace('l', 'L', 1) }} {{ 'ab'|replace('', '.') }} {{ [1, 2, 3]|join(', ') }} {{ ['a', 'b']|join }} {{ items|join(' ', attribute='n') }}", {"items": [{"n": "x"}, {"n": "y"}]}),
    ("filter_first_last", "{{ [1, 2, 3]|first }}{{ [1, 2, 3]|last }}{{ 'abc'|first }}{{ 'abc'|last }}[{{ []|first }}]", {}),
    ("filter_list_items", "{{ {'a': 1, 'b': 2}|items|list }} {{ {'a': 1}|list }} {{ 'ab'|list }} {{ missing|list }}", {}),
    ("filter_int_float_string", "{{ '12'|int + 1 }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ 3.7|int }} {{ '3.9'|int }} {{ ' 7 '|int }} {{ '0x1f'|int(base=16) }} {{ true|int }} {{ '1.5'|float }} {{ 'x'|float }} {{ 2|float }} {{ 5|string }} {{ [1]|string }} {{ none|string }}", {}),
    ("filter_default", "{{ missing|default('d') }} {{ none|default('d') }} {{ ''|default('d', true) }} {{ 0|d('zero', boolean=true) }} {{ 'set'|default('d') }} {{ missing|default }}|", {}),
    ("filter_tojson", "{{ obj|tojson }}\n{{ obj|tojson(indent=2) }}\n{{ obj|tojson(separators=(',', ':')) }}\n{{ obj|tojson(sort_keys=true) }}\n{{ 'é<>&\"\\n\\u0001'|tojson }}\n{{ 'é'|tojson(ensure_ascii=true) }}\n{{ [] | tojson }}{{ {} | tojson(indent=2) }}{{ none|tojson }}{{ 1.0|tojson }}", {"obj": {"b": [1, 2.5, None, True, "x"], "a": {"nested": {}}, "u": "ü😀"}}),
    ("filter_sort_unique", "{{ [3, 1, 2]|sort }} {{ ['b', 'A', 'a', 'C']|sort }} {{ ['b', 'A', 'a']|sort(case_sensitive=true) }} {{ [3, 1]|sort(reverse=true) }} {{ users|sort(attribute='age')|map(attribute='name')|join(',') }} {{ ['a', 'A', 'b', 'a']|unique|list }}", {"users": [{"name": "x", "age": 30}, {"name": "y", "age": 20}]}),
    ("filter_map_select", "{{ msgs|map(attribute='role')|list }} {{ msgs|selectattr('role', 'equalto', 'user')|map(attribute='content')|join('|') }} {{ msgs|rejectattr('role', 'eq', 'user')|list|length }} {{ [1, 2, 3, 4]|select('odd')|list }} {{ [0, 1, '', 'a']|select|list }} {{ [1, 2, 3]|reject('gt', 1)|list }} {{ ['a', 'b']|map('upper')|join }} {{ msgs|selectattr('missing')|list }}", {"msgs": [{"role": "system", "content": "s"}, {"role": "user", "content": "u1"}, {"role": "user", "content": "u2"}]}),
    ("filter_misc", "{{ [1, 2, 3]|sum }} {{ items|sum(attribute='n') }} {{ [3, 1, 2]|max }} {{ [3, 1, 2]|min }} {{ ['b', 'A']|max }} {{ 'ab'|reverse }} {{ [1, 2]|reverse|list }} {{ -3|abs }} {{ 3.14159|round(2) }} {{ 2.5|round }} {{ 3.5|round }} {{ 2.1|round(0, 'ceil') }} {{ 'a b  c'|wordcount }} [{{ 'x'|center(5) }}]", {"items": [{"n": 1}, {"n": 2}]}),
    ("filter_indent_format", "{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(blank=true) }}|{{ '%s-%d-%.2f-%5s|%-3s|%03d'|format('x', 3, 2.5, 'ab', 'c', 7) }}|{{ 'hi %s' % 'you' }}|{{ '%s+%s' % (1, 2) }}", {}),
    ("filter_escape_safe_dictsort", "{{ '<a href=\"x\">&</a>'|e }} {{ '<b>'|safe }} {{ {'b': 1, 'A': 2, 'a': 3}|dictsort }} {{ {'b': 1, 'a': 3}|dictsort(by='value', reverse=true) }} {{ 'a long sentence here that goes on'|truncate(12) }} {{ 'abcdefghijklmnopqrstuvwxyz'|truncate(10, true) }}", {}),
    ("filter_attr", "{{ d|attr('k') }}{{ (d|attr('missing')) is defined }}", {"d": {"k": "v"}}),
    # Tests
    ("tests_types", "{{ x is defined }}{{ x is undefined }}{{ none is none }}{{ 1 is number }}{{ true is number }}{{ true is boolean }}{{ 1 is integer }}{{ 1.0 is float }}{{ 1 is float }}{{ 'a' is string }}{{ {} is mapping }}{{ [] is mapping }}{{ 'a' is iterable }}{{ 1 is iterable }}{{ [] is sequence }}{{ {} is sequence }}{{ range is callable }}{{ 'a' is callable }}", {}),
    ("tests_values", "{{ 2 is even }}{{ 3 is odd }}{{ 6 is divisibleby 3 }}{{ 7 is divisibleby(3) }}{{ 'a' is equalto 'a' }}{{ 1 is eq 1.0 }}{{ 1 is ne 2 }}{{ 2 is gt 1 }}{{ 2 is lt 1 }}{{ 2 is ge 2 }}{{ 2 is le 1 }}{{ 'abc' is lower }}{{ 'ABC' is upper }}{{ 'Abc' is lower }}{{ 1 is in [1, 2] }}{{ true is true }}{{ false is false }}{{ 1 is true }}{{ none is sameas none }}{{ true is sameas true }}", {}),
    ("tests_negated", "{{ x is not defined }}{{ 1 is not none }}{{ 'a' is not string }}{{ d.k is not none }}{{ d.missing is not defined }}", {"d": {"k": None}}),
    ("tests_filter_test_names", "{{ 'upper' is filter }}{{ 'nope' is filter }}{{ 'even' is test }}", {}),
    # Methods
    ("str_methods", "{{ 'abc'.startswith('a') }}{{ 'abc'.startswith(('x', 'a')) }}{{ 'abc'.endswith('bc') }}|{{ '  x  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  a  '.lstrip() }}|{{ '  a  '.rstrip() }}|{{ '\\n\\nb\\n'.lstrip('\\n') }}|{{ 'AbC'.upper() }}{{ 'AbC'.lower() }}{{ 'hello world'.title() }}{{ 'hELLO'.capitalize() }}{{ 'aB'.swapcase() }}", {}),
    ("str_split", "{{ 'a b  c '.split() }}{{ 'a,b,,c'.split(',') }}{{ 'a-b-c'.split('-', 1) }}{{ 'a-b-c'.rsplit('-', 1) }}{{ '  a b '.split(none, 1) }}{{ 'x</think>y</think>z'.split('</think>')[-1] }}{{ 'a\\nb\\r\\nc'.splitlines() }}", {}),
    ("str_methods_more", "{{ 'hello'.replace('l', 'L') }}{{ 'hello'.find('l') }}{{ 'héllo'.find('l') }}{{ 'hello'.rfind('l') }}{{ 'hello'.find('z') }}{{ 'hello'.count('l') }}{{ '-'.join(['a', 'b']) }}{{ '{} and {}'.format(1, 'x') }}{{ '{0}{name}'.format('p', name='n') }}{{ '42'.isdigit() }}{{ 'ab'.isalpha() }}{{ ' '.isspace() }}{{ '7'.zfill(3) }}{{ 'ab'.center(6, '*') }}{{ 'ab'.ljust(4, '.') }}{{ 'ab'.rjust(4) }}{{ 'a=b=c'.partition('=') }}{{ 'prefix-x'.removeprefix('prefix-') }}", {}),
    ("dict_methods", "{{ d.get('a') }}{{ d.get('z') }}{{ d.get('z', 5) }}{{ d.keys()|list }}{{ d.values()|list }}{{ d.items()|list }}{{ d['items'] }}", {"d": {"a": 1, "items": "I"}}),
    ("list_methods", "{{ l.index(2) }}{{ l.count(1) }}", {"l": [1, 2, 1]}),
    ("globals", "{{ range(3)|list }}{{ range(1, 10, 3)|list }}{{ range(5, 0, -2)|list }}{{ dict(a=1, b='x') }}{{ namespace(a=1).a }}{{ strftime_now('%Y-%m-%d') }} {{ strftime_now('%d %b %Y') }}", {}),
    ("message_content_checks", "{% for m in messages %}{% if m.content is string %}S:{{ m.content|trim }}{% elif m.content is iterable %}{% for p in m.content %}{% if p.type == 'text' %}T:{{ p.text }}{% elif p.type == 'image' %}<img>{% endif %}{% endfor %}{% endif %};{% endfor %}", {"messages": [{"role": "user", "content": " plain "}, {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "caption"}]}]}),
    ("tool_calls_like", "{%- for m in messages %}{%- if m.tool_calls is defined and m.tool_calls %}{%- for tc in m.tool_calls %}{%- set f = tc.function if tc.function is defined else tc %}<call>{{ f.name }}({{ f.arguments|tojson if f.arguments is not string else f.arguments }})</call>{%- endfor %}{%- else %}{{ m.role }}: {{ m.content }}\n{%- endif %}{%- endfor %}", {"messages": [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}, {"name": "raw", "arguments": "{\"x\": 1}"}]}]}),
    ("tools_json_indent", "{%- if tools %}{%- for t in tools %}{{ t | tojson(indent=4) }}\n\n{% endfor %}{%- endif %}Today is {{ strftime_now('%d %B %Y') }}.", {"tools": [WEATHER_TOOL]}),
    # Errors
    ("error_raise", "{% if messages|length == 0 %}{{ raise_exception('No messages given!') }}{% endif %}ok", {"messages": []}),
    ("error_raise_in_macro", "{% macro check(x) %}{% if x > 1 %}{{ raise_exception('too big: ' ~ x) }}{% endif %}{% endmacro %}{{ check(1) }}{{ check(2) }}", {}),
    ("error_attr_of_undefined", "line1\n{{ x.y }}", {}),
    ("error_add_undefined", "{{ x + 'a' }}", {}),
    ("error_type", "{{ 'a' + 1 }}", {}),
    ("error_div_zero", "{{ 1 // 0 }}", {}),
    ("error_compare_types", "{{ 1 < 'a' }}", {}),
    ("error_unsafe_append", "{% set l = [1] %}{{ l.append(2) }}", {}),
    ("error_not_namespace", "{% set d = {'a': 1} %}{% set d.a = 2 %}", {}),
    ("error_macro_args", "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}", {}),
    ("error_index_empty", "{{ messages[0]['role'] }}", {"messages": []}),
    ("error_tojson_undefined", "{{ x|tojson }}", {}),
    ("syntax_unclosed_if", "a\n{% if x %}\nb", {}),
    ("syntax_bad_expr", "line1\nline2 {{ a + }}", {}),
    ("syntax_unknown_tag", "{% frobnicate %}", {}),
    ("syntax_stray_endfor", "\n\n{% endfor %}", {}),
    ("syntax_unterminated_string", "{{ 'abc }}", {}),
    ("syntax_unknown_filter", "\n{{ x|nosuchfilter }}", {}),
    ("syntax_unknown_test", "{{ x is nosuchtest }}", {}),
    ("syntax_unclosed_comment", "a {# never closed", {}),
    ("syntax_break_outside_loop", "{% break %}", {}),
    ("syntax_double_else", "{% if true %}a{% else %}b{% else %}c{% endif %}", {}),
    ("syntax_unclosed_var", "{{ x ", {}),
]


def family_feature_cases():
    """The family templates with contexts ChatTemplate cannot express (tools, reasoning, lists)."""
    qwen = {"template_testdata": "tokenizers/qwen3/tokenizer_config.json"}
    gemma = {"template_testdata": "tokenizers/gemma3/tokenizer_config.json"}
    base = {"bos_token": "", "eos_token": "<|im_end|>", "documents": None, "add_generation_prompt": True}
    tool_conversation = [
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": "<think>\nI need two calls.\n</think>\n\nLet me check.",
         "tool_calls": [
             {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
             {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}},
         ]},
        {"role": "tool", "content": "{\"temp\": 20}"},
        {"role": "tool", "content": "{\"temp\": 25}"},
        {"role": "assistant", "content": "Paris 20, Rome 25."},
        {"role": "user", "content": "<tool_response>\nnot really a tool\n</tool_response>"},
    ]
    cases = [
        ("qwen3_tools", qwen, {**base, "messages": tool_conversation, "tools": [WEATHER_TOOL]}),
        ("qwen3_tools_no_system", qwen, {**base, "messages": tool_conversation[1:], "tools": [WEATHER_TOOL]}),
        ("qwen3_tool_history_without_tools", qwen, {**base, "messages": tool_conversation, "tools": None}),
        ("qwen3_reasoning_content_field", qwen, {**base, "tools": None, "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "answer", "reasoning_content": "\nthoughts\n"},
            {"role": "user", "content": "q2"},
            {"role": "assistant", "content": "a2", "reasoning_content": "more"},
        ]}),
        ("qwen3_system_not_first", qwen, {**base, "tools": None, "messages": [
            {"role": "user", "content": "q"},
            {"role": "system", "content": "late system"},
        ]}),
        ("gemma3_list_content", gemma, {"bos_token": "<bos>", "eos_token": "<eos>", "tools": None, "documents": None,
                                        "add_generation_prompt": True, "messages": [
            {"role": "system", "content": [{"type": "text", "text": "Be terse."}]},
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "  What is this?  "}]},
        ]}),
        ("gemma3_invalid_content", gemma, {"bos_token": "<bos>", "eos_token": "<eos>", "tools": None,
                                           "documents": None, "add_generation_prompt": True,
                                           "messages": [{"role": "user", "content": 42}]}),
    ]
    return cases


def load_template(ref):
    if "template" in ref:
        return ref["template"]
    if "template_file" in ref:
        with open(os.path.join(ARGS.out, ref["template_file"]), encoding="utf-8") as f:
            return f.read()
    with open(os.path.join(ARGS.testdata, ref["template_testdata"]), encoding="utf-8") as f:
        return json.load(f)["chat_template"]


def jinja_cases():
    cases = []
    for name, source, context in FEATURES:
        case = {"name": name, "template": source, "context": context}
        case.update(render_case(source, context))
        cases.append(case)
    for name, ref, context in family_feature_cases():
        case = {"name": name, **ref, "context": context}
        case.update(render_case(load_template(ref), context))
        cases.append(case)
    return cases


def write(path, cases):
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"generator": "tools/gen_chat_template_cases.py", "jinja2": jinja2.__version__,
                   "now_unix_seconds": NOW_UNIX_SECONDS, "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    errors = sum(1 for c in cases if "error" in c)
    print(f"{path}: {len(cases)} cases ({errors} expecting errors)")


def main():
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--testdata", default=os.environ.get("TESSERA_TESTDATA") or
                        os.path.join(os.path.dirname(__file__), "../build/testdata"))
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "../tests/template/data/chat_templates"))
    ARGS = parser.parse_args()
    write(os.path.join(ARGS.out, "chat_cases.json"), chat_cases())
    write(os.path.join(ARGS.out, "jinja_cases.json"), jinja_cases())
    return 0


ARGS = None

if __name__ == "__main__":
    sys.exit(main())
