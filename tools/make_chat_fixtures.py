#!/usr/bin/env python3
"""make_chat_fixtures: the expected prompts for tests/unit/test_chat_template.c, rendered by
Hugging Face transformers' apply_chat_template(tokenize=False) (its sandboxed Jinja2 environment:
trim_blocks, lstrip_blocks, loopcontrols, the tojson override, raise_exception, strftime_now).

Writes tests/data/chat/<name>.jsonl, one case per line:
  {"id": S, "messages": [...], "tools": [...] | null, "add_generation_prompt": B, "kwargs": {...},
   "bos_token": S | null, "eos_token": S | null, "expected": S}
or, where transformers raises (raise_exception, a type error in the template),
  {..., "error": "the exception text"}  instead of "expected": the C renderer must fail too.

and tests/data/chat/snippets.jsonl: small templates on the edges of the Jinja subset (whitespace control,
literals, operators, Undefined, loops, macros, filters, tests, methods, errors), each with "template".

Templates (the test reads them from the same places):
  glm45     tests/data/chat/glm46.jinja (GLM-4.6's template, a copy of the assets' glm4/chat_template.jinja)
  glm47     tests/data/chat/glm47.jinja (GLM-4.7-Flash's, a copy of glm4/chat_template_glm47_flash.jinja)
  qwen3     <assets>/tokenizers/qwen3/tokenizer_config.json "chat_template" (not committed)
  builtin, llama3_style, deepseek_style, features
            tests/data/chat/<name>.jinja (committed: written for moeserve, so CI always has cases)
Run from the repository root:  /work/venv/bin/python tools/make_chat_fixtures.py [--assets DIR]
"""
import argparse
import copy
import json
import os
import sys

from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

OUT = "tests/data/chat"

# ---- the conversations ----

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city. Températures en °C — 天气",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.\nReturns a list of {title, url}.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "filters": {"type": "object", "properties": {"lang": {"type": "string"}, "safe": {"type": "boolean"}}},
                "top_k": {"type": "number", "default": 2.5},
            },
            "required": ["query"],
        },
    },
}
TOOLS = [WEATHER_TOOL, SEARCH_TOOL]

ARGS_RICH = {
    "query": "naïve \"quoted\" \\ back\tslash 😀 中文",
    "filters": {"lang": "fr", "safe": True, "tags": ["a", "b"], "none": None},
    "top_k": 3,
    "ratio": 0.1,
    "tiny": 1.5e-07,
    "big": 12345678901234567,
    "neg": -2.0,
    "ctrl": "\u0001\u001f\u007f",
}


def tc(name, args, as_string=False, call_id="call_1"):
    a = json.dumps(args, ensure_ascii=False) if as_string else args
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": a}}


def convs():
    """(id, messages, tools, add_generation_prompt, kwargs); each template renders all of them."""
    U = lambda s: {"role": "user", "content": s}
    A = lambda s, **kw: dict({"role": "assistant", "content": s}, **kw)
    S = lambda s: {"role": "system", "content": s}
    T = lambda s, **kw: dict({"role": "tool", "content": s}, **kw)
    out = []

    def add(cid, msgs, tools=None, kwargs=None, gens=(True, False)):
        for g in gens:
            out.append((f"{cid}{'+gen' if g else ''}", msgs, tools, g, kwargs or {}))

    add("user", [U("Hello!")])
    add("system_user", [S("You are a helpful assistant."), U("What is 2+2?")])
    add("multi_turn", [S("Be brief."), U("Hi"), A("Hello! How can I help?"), U("Tell me a joke."),
                       A("Why did the chicken cross the road?"), U("Why?")])
    add("reasoning_last", [U("Solve x+1=3"), A("x = 2", reasoning_content="Subtract 1 from both sides.\n")])
    add("reasoning_history", [U("Q1"), A("A1", reasoning_content="thinking 1"), U("Q2"),
                              A("A2", reasoning_content="  thinking 2  "), U("Q3")])
    add("inline_think", [U("Q"), A("<think>\nI reason here.\n</think>\n\nThe answer."), U("Q2"),
                         A("<think>second</think>final")])
    add("reasoning_empty", [U("Q"), A("plain answer", reasoning_content="")])
    add("tools_only", [U("What's the weather in Paris?")], tools=TOOLS)
    add("tool_call_dict", [S("Use tools when useful."), U("Weather in Paris and Tokyo?"),
                           A("", tool_calls=[tc("get_weather", {"city": "Paris", "unit": "celsius"}),
                                             tc("get_weather", {"city": "Tokyo", "days": 3}, call_id="call_2")]),
                           T('{"temp": 21, "sky": "clear"}', tool_call_id="call_1"),
                           T('{"temp": 18, "sky": "rain"}', tool_call_id="call_2"),
                           A("Paris: 21°C clear; Tokyo: 18°C rain.")], tools=TOOLS)
    add("tool_call_rich_args", [U("search"), A("Let me search.", tool_calls=[tc("search", ARGS_RICH)]),
                                T("[]"), U("thanks")], tools=TOOLS)
    add("tool_call_string_args", [U("Weather?"),
                                  A(None, tool_calls=[tc("get_weather", {"city": "Oslo"}, as_string=True)]),
                                  T("sunny")], tools=TOOLS)
    add("tool_call_null_content", [U("Weather?"), A(None, tool_calls=[tc("get_weather", {"city": "Oslo"})]),
                                   T("sunny")], tools=TOOLS)
    add("tool_call_with_reasoning", [U("Weather in Rome?"),
                                     A("", reasoning_content="Need the weather tool.",
                                       tool_calls=[tc("get_weather", {"city": "Rome"})]),
                                     T("hot"), A("It is hot.", reasoning_content="The tool said hot.")], tools=TOOLS)
    add("tool_flat_call", [U("q"), A("", tool_calls=[{"name": "search", "arguments": {"query": "x"}}]), T("r")],
        tools=TOOLS)
    add("tool_list_content", [U("q"), A("", tool_calls=[tc("search", {"query": "x"})]),
                              T([{"output": "first"}, {"output": "second"}])], tools=TOOLS)
    add("content_parts", [S([{"type": "text", "text": "sys part"}]),
                          U([{"type": "text", "text": "part one "}, {"type": "image", "url": "x"},
                             {"type": "text", "text": "part two"}]),
                          A([{"type": "text", "text": "reply"}])])
    add("empty_content", [U(""), A(""), U("")])
    add("unicode", [S("Système: répondez en français. 系统提示。"),
                    U("Ünïcödé 👍🏽 👨‍👩‍👧 עברית العربية हिन्दी \u00e9 e\u0301 \U0001F600"),
                    A("Ответ: 你好！ \u2028 ok"), U("tabs\tand\r\nCRLF and \u00a0nbsp\u3000")])
    add("whitespace", [U("  \n padded \n  "), A("\n\n  answer with spaces  \n\n"), U("\u3000ideo\u3000"),
                       A("\u00a0nbsp\u00a0")])
    add("nothink_suffix", [U("hello /nothink")], kwargs={"enable_thinking": False})
    add("thinking_off", [S("sys"), U("Hi")], kwargs={"enable_thinking": False})
    add("thinking_on", [U("Hi")], kwargs={"enable_thinking": True})
    add("clear_thinking_false", [U("Q1"), A("A1", reasoning_content="r1"), U("Q2")],
        kwargs={"clear_thinking": False})
    add("qwen_tool_response_user", [U("Q"), A("", tool_calls=[tc("search", {"query": "x"})]),
                                    U("<tool_response>\nok\n</tool_response>")], tools=TOOLS)
    add("last_assistant", [U("Start a story."), A("Once upon a time")], gens=(False,))
    add("system_twice", [S("first"), U("u"), S("second"), U("v")])
    add("unknown_role", [U("x"), {"role": "narrator", "content": "odd"}])
    long = [S("You are a helpful assistant.")]
    for i in range(10):
        long.append(U(f"Question {i}: what is {i} squared?"))
        long.append(A(f"{i} squared is {i * i}.", reasoning_content=f"{i} times {i}."))
    add("twenty_turns", long[:21])
    return out


# ---- snippets: small templates on the edges of the Jinja subset (tests/data/chat/snippets.jsonl) ----

SNIPPET_MESSAGES = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
SNIPPET_KWARGS = {"var": {"k": [1, 2], "s": "str", "n": None, "f": 2.5}, "text": "  Héllo wörld \u3000\n"}
SNIPPETS = [
    # whitespace control: trim_blocks, lstrip_blocks, -, +, comments, raw, newlines
    "a\n  {% if true %}\n  b\n  {% endif %}\nc",
    "  {%- if true %} x {% endif -%}  \n y",
    "{% if true +%}\nkeep{%+ if true %}x{% endif %}\n  {%+ if true %}y{% endif %}{% endif %}",
    "  {# comment #}\nz\n  {#- c -#}  w\n{#+ c +#}\nv",
    "{{ 'a' }}\n{{- 'b' -}}\n  c  {{+ 'd' }}",
    "x  {% raw %}{{ y }}{% endraw %}  z\n  {%- raw -%}  r  {%- endraw %}\nq",
    "x\n  {% raw %}\n  raw {{ }} {% %}\n  {% endraw %}\nend",
    "line1\r\nline2\rline3\n",
    "trailing\n\n",
    "\t {% for i in [1,2] %}\n\t{{ i }}\n\t {% endfor %}\n",
    "{% set x = 1 %}\n\n{{ x }}\n",
    "a {%- set x = 1 %}\u3000\n{{ x }}",
    "\u3000 {% if true %}u{% endif %}\n\u00a0{%- if true %}v{% endif %}",
    "{% if true %}a{% endif %}   {% if true %}b{% endif %}\n   {% if true %}c{% endif %}",
    "{%- for m in messages -%}\n  {{ m.role }}\n{%- endfor %}\n",
    "{{ 'x' -}}    \n\n  {{- 'y' }}",
    "{# multi\nline #}\n{{ 1 }}",
    # literals and operators
    "{{ '\\n\\t\\\\ \\x41 \\u00e9 \\U0001F600 \\101 \\q \\'' }}|{{ \"\\\"q\\\"\" }}",
    "{{ 1_000 }} {{ 0x1F }} {{ 0b101 }} {{ 0o17 }} {{ 1.5e3 }} {{ 1e-3 }} {{ 2.0 }} {{ 1_0.5_0 }} {{ 00 }}",
    "{{ 'a' 'b' \"c\" }}",
    "{{ {'a': {'b': 1}} }}{{ {'a': {'b': 1}}['a'] }}{{ [[1],[2,[3]]] }}",
    "{{ 2 + 3 * 4 ** 2 }} {{ -2 ** 2 }} {{ (2 + 3) * 4 }} {{ ('a' ~ 1) ~ 2 * 3 }} {{ not 1 == 2 }} {{ 1 if 0 else 2 if 0 else 3 }} {{ -3|abs }} {{ 1 - -1 }} {{ 2 ** 3 ** 2 }}",
    "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 1 / 4 }} {{ 2 ** -1 }} {{ 10 / 5 }} {{ true + 1 }} {{ 3 * 'ab' }} {{ [0] * 3 }}",
    "{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 1 == 1.0 }} {{ 'a' != 'a' }} {{ [1, 2] < [1, 3] }} {{ (1, 2) == [1, 2] }} {{ 'b' > 'a' }} {{ 1 in [1.0] }} {{ 'x' not in 'abc' }} {{ 'a' in {'a': 1} }}",
    "{{ none }} {{ true }} {{ 1.0 }} {{ 1e100 }} {{ 0.1 }} {{ -0.0 }} {{ 123456789.123 }} {{ 1/3 }} {{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }}",
    "{{ [none, 'a\"b', \"c'd\", 'e\\'f\"', 'g\\nh\\x01', '\u00e9\u00a0\u200b\u4e2d'] }} {{ {'k': (1,)} }} {{ () }} {{ [] }} {{ {} }} {{ (1, 'a') }}",
    "{{ true and 'x' }} {{ 0 or 'y' }} {{ none or 0 }} {{ '' and 1 }} {{ not none }} {{ 'a' if none }}|",
    # undefined
    "[{{ nope }}][{{ nope is defined }}][{{ nope|default('d') }}][{{ nope|length }}][{{ nope|list }}][{{ nope ~ 'x' }}][{% for x in nope %}a{% endfor %}][{{ 'y' if nope else 'n' }}][{{ nope == nope }}][{{ nope is none }}][{{ nope is iterable }}][{{ nope|string }}][{{ nope|first }}][{{ nope|join(',') }}][{{ nope|trim }}]",
    "{{ var.missing }}|{{ var.missing is defined }}|{{ var['k'][5] is defined }}|{{ var.k[-1] }}|{{ var.n.x }}|{{ var.s[10] }}|{{ var.k.x }}",
    "{{ nope.attr }}",
    "{{ nope + 1 }}",
    "{{ nope[0] }}",
    "{{ nope() }}",
    "{{ nope|int }}",
    # errors
    "{{ 'a' + 1 }}",
    "{{ 1 / 0 }}",
    "{{ 1 // 0 }}",
    "{{ raise_exception('boom ' ~ messages[0].role) }}",
    "{{ [1]|selectattr('x')|length }}",
    "{{ var.n.startswith('a') }}",
    "{{ 'abc'.split('') }}",
    "{{ 'a' < 1 }}",
    "{{ none|length }}",
    "{{ [[1]]|unique|list }}",
    "{% for x in 3 %}{% endfor %}",
    "{% set a, b = [1] %}",
    "{{ {}|items|list }}{{ {'a': 1}|items|list }}",
    "{{ 'x'|items|list }}",
    "{{ [1, 2]|map('string')|join }}{{ [1]|map('string')|list }}",
    "{{ 'abc'[::0] }}",
    "{{ 'x'.index('y') }}",
    "{{ ['a', 1]|join('-') }}{{ '-'.join(['a', 1]) }}",
    # loops
    "{% for a, b in [[1, 2], (3, 4), 'xy'] %}{{ a }}{{ b }}{% endfor %}",
    "{% for k in {'b': 1, 'a': 2} %}{{ k }}{{ loop.index }}{% endfor %}{% for k, v in {'b': 1, 'a': 2}.items() %}{{ k }}={{ v }}{% endfor %}",
    "{% for c in 'h\u00e9llo' %}{{ c }}|{% endfor %}",
    "{% for i in range(5) if i != 1 %}{{ i }}/{{ loop.index }}/{{ loop.length }}/{{ loop.revindex }} {% else %}none{% endfor %}",
    "{% for i in [] %}x{% else %}empty{% endfor %}",
    "{% set x = 5 %}{% for i in range(3) %}{{ x }}{% set x = i %}{{ x }}{% endfor %}{{ x }}",
    "{% for i in range(3) %}{{ y|default('u') }}{% set y = i %}{% endfor %}",
    "{% set ns = namespace(a=0, l=[]) %}{% for i in range(4) %}{% set ns.a = ns.a + i %}{% set ns.l = ns.l + [i] %}{% endfor %}{{ ns.a }}{{ ns.l }}{{ ns }}",
    "{% for i in range(3) %}{% for j in range(3) %}{% if j > i %}{% break %}{% endif %}{{ i }}{{ j }} {% endfor %}{% endfor %}",
    "{% for i in range(6) %}{% if i is odd %}{% continue %}{% endif %}{{ i }}{% endfor %}",
    "{% for m in messages %}{{ loop.previtem is defined }}{{ loop.nextitem is defined }}{{ loop.first }}{{ loop.last }}{{ loop.revindex0 }}{{ loop.cycle('x', 'y') }}{{ loop.depth }}{% endfor %}",
    "{% for m in messages %}{% for c in m.content %}{{ loop.index }}{% endfor %}{{ loop.index }}{% endfor %}",
    "{% set g = [1, 2]|map('string') %}{% for x in g %}{{ x }}{% endfor %}|{% for x in g %}{{ x }}{% endfor %}|{{ g|list }}",
    "{% if [1]|select %}truthy{% endif %}{% if []|select %} also{% endif %}",
    # macros, set, with, generation
    "{% macro f(a, b='B', c=none) %}[{{ a }}|{{ b }}|{{ c }}]{% endmacro %}{{ f(1) }}{{ f(1, 2) }}{{ f(1, c=3) }}{{ f() }}{{ f }}",
    "{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}",
    "{% macro f(a, b=a * 2) %}{{ b }}{% endmacro %}{{ f(3) }}{{ f(3, 1) }}",
    "{% set y = 1 %}{% macro f() %}{{ y }}{% endmacro %}{% set y = 2 %}{{ f() }}",
    "{% macro f(a) %}{{ a }}{% endmacro %}{{ f(1, 2) }}",
    "{% macro f(a) %}{{ a }}{% endmacro %}{{ f(b=1) }}",
    "{% macro f() -%}\n  x\n{%- endmacro %}[{{ f() }}]{{ f()|length }}{{ f() ~ f() }}",
    "{% set x %}  a {{ 1 }} {% endset %}[{{ x }}]{% set y | upper | trim %} b {% endset %}[{{ y }}]",
    "{% set a, b = 'xy' %}{{ b }}{{ a }}{% set c, d = 1, 2 %}{{ c + d }}{% set t = 1, 2 %}{{ t }}",
    "{% with x = 1, z = 3 %}{% set y = 2 %}{{ x + y + z }}{% endwith %}{{ x is defined }}{{ y is defined }}",
    "{% generation %}{% set g = 1 %}{{ g }}{% endgeneration %}{{ g is defined }}",
    "{% if messages %}{% set top = 1 %}{% endif %}{{ top }}{% if false %}{% set nope2 = 1 %}{% endif %}{{ nope2 is defined }}",
    "{% print 1, 'a' %}{% print messages|length %}",
    # Jinja's scoping (idtracking): names assigned at top level after a loop/macro/with uses them,
    # conditional assignments, aliasing of outer variables, for-else after break/continue
    "{{ word }}{% set word = 'b' %}{{ word }}|{% for i in [1] %}{{ word }}{% endfor %}",
    "{% for i in [1] %}[{{ word }}]{% endfor %}{% set word = 'b' %}{% for i in [1] %}[{{ word }}]{% endfor %}",
    "{% if true %}{{ word }}{% endif %}{% set word = 'b' %}",
    "{% macro m() %}[{{ word }}]{% endmacro %}{{ m() }}{% set word = 'b' %}{{ m() }}",
    "{% for i in [1] %}{% macro m() %}[{{ word }}]{% endmacro %}{{ m() }}{% endfor %}{% set word = 'b' %}",
    "{% for i in [1] %}[{{ word }}]{% set word = 'c' %}[{{ word }}]{% endfor %}{% set word = 'b' %}",
    "{% for i in [1] %}{% for j in [1] %}[{{ word }}]{% endfor %}{% endfor %}{% set word = 'b' %}",
    "{% for i in [1] %}[{{ word }}]{% endfor %}{% if false %}{% set word = 'b' %}{% endif %}",
    "{% for i in [1] %}[{{ word }}]{% endfor %}{% if true %}{% set word = 'b' %}{% else %}{% set word = 'c' %}{% endif %}",
    "{% with %}[{{ word }}]{% endwith %}{% set word = 'b' %}{% generation %}[{{ word }}]{% endgeneration %}",
    "{% for i in [1] %}[{{ word }}]{% endfor %}{% for word in [1] %}{% endfor %}{% for i in word %}{{ i }}{% endfor %}",
    "{% for i in [1] if word %}{{ i }}{% endfor %}{% set word = 'b' %}",
    "{% for i in [1] %}[{{ word }}]{% endfor %}{% macro word() %}{% endmacro %}",
    "{% for i in [1, 2] %}{% if i == 2 %}{% set x = i %}{% endif %}[{{ x }}]{% endfor %}{% set x = 5 %}",
    "{% set x = 5 %}{% for i in [1, 2] %}{% if i == 2 %}{% set x = i %}{% endif %}[{{ x }}]{% endfor %}[{{ x }}]",
    "{% for i in [1, 2] %}{% if i == 2 %}{% set num = i %}{% endif %}[{{ num }}]{% endfor %}",
    "{% set x = 1 %}{% macro m(a=x) %}{{ a }}{% set x = 3 %}{{ x }}{% endmacro %}{{ m() }}{{ x }}",
    "{% for i in [1, 2] %}{{ loop.index }}{% for j in [3] %}{{ loop.index }}{% endfor %}{% endfor %}{% for i in [] %}{% else %}{{ loop is defined }}{% endfor %}",
    "{% for m in [1, 2] %}{% break %}{% else %}[else {{ m }}]{% endfor %}{% for m in [1, 2] %}{% if m == 1 %}{% continue %}{% endif %}{% else %}[else2]{% endfor %}{% for m in [1] %}x{% else %}[else3]{% endfor %}",
    "{% for i in [1, 2] %}{% for j in [] %}{% else %}{% break %}{% endfor %}{{ i }}{% endfor %}",
    # filters
    "{{ messages|map(attribute='role')|join(',') }} {{ messages|selectattr('role', 'eq', 'user')|list|length }} {{ messages|rejectattr('role', 'equalto', 'user')|map(attribute='content')|first }}",
    "{{ [3, 1, 2]|sort|first }} {{ ['b', 'A', 'a']|sort }} {{ ['b', 'A', 'a']|sort(case_sensitive=true) }} {{ [{'n': 'b'}, {'n': 'a'}]|sort(attribute='n')|map(attribute='n')|list }} {{ [2, 1]|sort(reverse=true) }}",
    "{{ ['a', 'A', 'b', 'a']|unique|list }} {{ ['a', 'A']|unique(case_sensitive=true)|list }} {{ {'b': 1, 'A': 2, 'a': 0}|dictsort }} {{ {'b': 1, 'a': 2}|dictsort(by='value', reverse=true) }}",
    "{{ [1, 2, 3]|select('odd')|list }} {{ [1, 2, 3]|reject('odd')|list }} {{ [0, 1, '', 'a']|select|list }} {{ [1, 2, 3]|select('gt', 1)|list }} {{ [1, 2, 3]|select('in', [1, 3])|list }}",
    "{{ [{'a': {'b': 1}}, {'a': {'b': 2}}]|map(attribute='a.b')|list }} {{ [[1, 2], [3, 4]]|map(attribute='1')|list }} {{ [{'a': 1}, {}]|map(attribute='a', default='x')|list }} {{ [1, 2]|map('string')|list }}",
    "{{ [1, 2, 3]|sum }} {{ [0.1, 0.2]|sum }} {{ [{'a': 1}, {'a': 2}]|sum(attribute='a') }} {{ [[1], [2]]|sum(start=[]) }} {{ [3, 1]|max }} {{ ['B', 'a']|min }} {{ []|max }}|",
    "{{ [1, 2, 3]|first }} {{ [1, 2, 3]|last }} {{ 'abc'|first }} {{ 'abc'|last }} {{ []|first }}| {{ [1, 2]|reverse|list }} {{ 'abc'|reverse }} {{ {'a': 1, 'b': 2}|reverse|list }} {{ [1, 2]|map('string')|reverse }}",
    "{{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 3.14159|round(3) }} {{ 3.7|round(method='floor') }} {{ 3.2|round(method='ceil') }} {{ 3|round }} {{ -0.5|round }}",
    "{{ '12'|int }} {{ ' 3 '|int }} {{ '1.9'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ 2.9|int }} {{ true|int }} {{ none|int }} {{ '1_000'|int }} {{ '2.5'|float }} {{ 'x'|float }} {{ 3|float }} {{ '1e3'|float }} {{ '-inf'|float }}",
    "{{ ''|default('empty') }}|{{ ''|default('empty', true) }}|{{ none|default('n') }}|{{ none|d('n', boolean=true) }}|{{ 0|default(5, true) }}",
    "{{ 'aaa'|replace('a', 'b') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ 'abc'|replace('', '-') }} {{ 5|replace('5', 'five') }} {{ 'xxhixx'|trim('x') }} {{ '  a  '|trim }}|{{ text|trim }}|",
    "{{ 'hello world'|title }} {{ 'hELLO wORLD'|capitalize }} {{ 'a-b c(d[e<f{g'|title }} {{ \"they're bill's 1st\"|title }} {{ 'ABC'|lower }} {{ 'abc'|upper }} {{ 3|string }}{{ none|string }}",
    "{{ [1, 2]|length }} {{ 'h\u00e9llo'|length }} {{ {'a': 1}|count }} {{ var|length }} {{ range(5)|list }} {{ range(2, 10, 3)|list }} {{ range(3) }} {{ range(1, 4, 2) }} {{ range(3, 0, -1)|list }}",
    "{{ {'b': [1, 2.5, none, true], 'a': '\u00e9\"\\n'}|tojson }}|{{ {'b': 1, 'a': {'c': [], 'd': {}}}|tojson(indent=2, sort_keys=true) }}|{{ [1, [2]]|tojson(indent='\\t') }}|{{ '\u00e9\U0001F600\x7f'|tojson(ensure_ascii=true) }}|{{ {1: 2, none: 3, true: 4, 1.5: 5}|tojson }}|{{ {'a': 1}|tojson(separators=(',', ':')) }}|{{ [1]|tojson(indent=0) }}|{{ 'x'|tojson(false, 2) }}",
    "{{ var|tojson }} {{ messages|tojson }} {{ (1, 2)|tojson }} {{ 1e-07|tojson }} {{ 100.0|tojson }}",
    "{{ nope|tojson }}",
    "{{ range(3)|tojson }}",
    # string methods
    "{{ 'Hello World'.lower() }} {{ 'ab-cd'.replace('-', '_') }} {{ 'a,b,,c'.split(',') }} {{ 'a b  c'.split() }} {{ 'a b  c'.split(None, 1) }} {{ 'a.b.c'.rsplit('.', 1) }} {{ '  a b  '.rsplit(None, 1) }} {{ ''.split() }} {{ ''.split(',') }} {{ 'a\u3000b'.split() }}",
    "{{ 'xxhixx'.strip('x') }} {{ '  hi  '.lstrip() }}| {{ '  hi  '.rstrip() }}| {{ '\\n\\nhi\\n'.strip('\\n') }} {{ 'h\u00e9\u00e9'.rstrip('\u00e9') }} {{ text.strip() }}|{{ text.split() }}",
    "{{ 'abc'.startswith('a') }} {{ 'abc'.startswith(('x', 'ab')) }} {{ 'abc'.endswith('bc') }} {{ 'abc'.find('c') }} {{ 'h\u00e9llo'.find('l') }} {{ 'h\u00e9llo'.rfind('l') }} {{ 'abc'.find('z') }} {{ 'banana'.count('an') }} {{ 'abc'.count('') }} {{ 'abc'.index('b') }}",
    "{{ 'title case  words'.title() }} {{ \"they're\".title() }} {{ 'mIXed'.capitalize() }} {{ 'abc'.upper() }} {{ '-'.join(['a', 'b']) }} {{ ', '.join('xyz') }} {{ 'pre_x'.removeprefix('pre_') }} {{ 'x.txt'.removesuffix('.txt') }} {{ '123'.isdigit() }} {{ 'a1'.isalpha() }} {{ ' \\t'.isspace() }} {{ 'ABC'.isupper() }} {{ 'abc'.islower() }} {{ 'a1'.isalnum() }}",
    "{{ 'h\u00e9llo'.upper() }} {{ 'stra\u00dfe'.upper() }} {{ 'stra\u00dfe'|title }} {{ '\u03a3\u0391\u03a3'.lower() }} {{ '\u1f48\u0394\u03a5\u03a3\u03a3\u0395\u038e\u03a3'.lower() }} {{ '\u03a3'.lower() }} {{ 'A\u03a3 b'.lower() }} {{ '\u01c6emal'.title() }} {{ '\ufb01re'.capitalize() }} {{ '\u0130'.lower() }} {{ '\u0130'.lower()|length }}",
    "{{ '\u00e9cole \u00c9T\u00c9 \u0434\u043e\u043c'|title }} {{ '\u00e9\u00c9'|lower }}{{ '\u00e9\u00c9'|upper }} {{ ['\u00c9b', '\u00e9a', 'Ea']|sort }} {{ ['\u00e9', '\u00c9']|unique|list }} {{ '\u00c9'.isupper() }}{{ '\u00e9'.islower() }}{{ '\u00aa'.islower() }}{{ '\u01c5'.isupper() }}{{ '\u2160'.isupper() }} {{ '\u00e9\u4e2d'.isalpha() }}{{ '\u00b2'.isdigit() }}{{ '\u0663'.isdigit() }}{{ '\u2155'.isalnum() }}{{ '\u00bd'.isdigit() }}{{ '\u00e9' is lower }}{{ '\u00c9' is upper }}",
    "{{ [' ', '\u00a0', '\x85', '\u200b', '\u2028', '\ue000', '\U0001F600', '\u0378', '\u0300', '\x7f'] }}",
    "{{ 'abcdef'[1:4] }} {{ 'abcdef'[::-1] }} {{ 'abcdef'[-2:] }} {{ 'abcdef'[::2] }} {{ [1, 2, 3, 4][1::2] }} {{ 'h\u00e9llo w\u00f6rld'[2:-2] }} {{ 'abc'[10:] }}| {{ (1, 2, 3)[1:] }} {{ [1, 2, 3][::-2] }} {{ 'h\u00e9llo'[::-1] }} {{ 'abc'[-10:10] }} {{ [1, 2, 3][5:1:-1] }} {{ 'abc'[1] }}{{ 'h\u00e9llo'[1] }}{{ 'abc'[-1] }}",
    # attribute / item access
    "{% set d = {'items': 1, 'x': 2, 'get': 3} %}{{ d.x }} {{ d['items'] }} {{ d.get('x') }} {{ d.get('y', 'z') }} {{ d.get('y') }} {{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|list }} {{ d['get'] }} {{ d.keys() }} {{ d.items() }}",
    "{% set d = {'a': 1} %}{{ d.update is defined }}{{ d.pop is defined }}{{ [1].append is defined }}{{ d.nokey is defined }}",
    "{{ messages[0].role }} {{ messages[0]['content'] }} {{ messages[-1].role }} {{ messages.0.role }} {{ messages[5] is defined }} {{ (messages|last).missing is defined }}",
    # tests
    "{{ 1 is number }}{{ 1.0 is integer }}{{ true is integer }}{{ true is boolean }}{{ [] is sequence }}{{ {} is iterable }}{{ 'a' is in 'abc' }}{{ 3 is gt 2 }}{{ 3 is ge(3) }}{{ none is sameas none }}{{ 'upper' is filter }}{{ 'indent' is filter }}{{ 'nope' is test }}{{ 'odd' is test }}{{ 'a' is lower }}{{ 'A' is upper }}{{ 4 is divisibleby 2 }}{{ 3 is even }}{{ none is none }}{{ 1 is not none }}{{ [] is mapping }}{{ {} is mapping }}{{ 'a' is string }}{{ 1 is float }}{{ 1.5 is float }}{{ false is false }}{{ 0 is false }}{{ var.f is number }}",
    "{{ messages[0] is mapping }}{{ messages is sequence }}{{ messages[0].content is string }}{{ var.n is none }}{{ var.k is iterable }}{{ range(2) is sequence }}{{ ([1]|map('string')) is sequence }}{{ ([1]|map('string')) is iterable }}{{ namespace() is mapping }}",
    # globals
    "{{ namespace(a=1).a }}{{ namespace({'a': 2}).a }}{{ dict(a=1) }}{{ dict({'b': 1}, a=2) }}{{ strftime_now('%Y')|length }}",
    "{{ range(200000)|length }}",
]


def render_snippet(t):
    from transformers.utils.chat_template_utils import render_jinja_template
    out, _ = render_jinja_template(conversations=[copy.deepcopy(SNIPPET_MESSAGES)], chat_template=t,
                                   add_generation_prompt=False, **copy.deepcopy(SNIPPET_KWARGS))
    return out[0]


def write_snippets():
    n_ok = n_err = 0
    with open(os.path.join(OUT, "snippets.jsonl"), "w", encoding="utf-8") as f:
        for i, t in enumerate(SNIPPETS):
            rec = {"id": f"snippet{i}", "template": t, "messages": SNIPPET_MESSAGES, "kwargs": SNIPPET_KWARGS}
            try:
                rec["expected"] = render_snippet(t)
                n_ok += 1
            except Exception as e:
                rec["error"] = f"{type(e).__name__}: {e}"
                n_err += 1
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    print(f"snippets: {n_ok} rendered, {n_err} errors -> {OUT}/snippets.jsonl")


# ---- rendering through transformers ----

def make_tokenizer(template, bos, eos):
    tok = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    t = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos)
    t.chat_template = template
    return t


def render(tok, messages, tools, gen, kwargs):
    return tok.apply_chat_template(copy.deepcopy(messages), tools=copy.deepcopy(tools), add_generation_prompt=gen,
                                   tokenize=False, **kwargs)


def templates(assets):
    """name -> (template text or None when the asset is absent, bos, eos)"""
    def read(p):
        return open(p, encoding="utf-8").read() if os.path.exists(p) else None
    qcfg = os.path.join(assets, "tokenizers/qwen3/tokenizer_config.json")
    qwen = json.load(open(qcfg, encoding="utf-8"))["chat_template"] if os.path.exists(qcfg) else None
    local = lambda n: read(os.path.join(OUT, n + ".jinja"))
    return {
        "glm45": (local("glm46"), None, "<|endoftext|>"),
        "glm47": (local("glm47"), None, "<|endoftext|>"),
        "qwen3": (qwen, None, "<|im_end|>"),
        "builtin": (local("builtin"), None, "<|endoftext|>"),
        "llama3_style": (local("llama3_style"), "<|begin_of_text|>", "<|eot_id|>"),
        "deepseek_style": (local("deepseek_style"), "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
        "features": (local("features"), "<s>", "</s>"),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--assets", default=os.environ.get("MOESERVE_ASSETS", "../shared/assets"))
    a = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    cases = convs()
    for name, (text, bos, eos) in templates(a.assets).items():
        if text is None:
            print(f"{name}: template not found under {a.assets}, skipped", file=sys.stderr)
            continue
        tok = make_tokenizer(text, bos, eos)
        n_ok = n_err = 0
        with open(os.path.join(OUT, name + ".jsonl"), "w", encoding="utf-8") as f:
            for cid, msgs, tools, gen, kwargs in cases:
                rec = {"id": cid, "messages": msgs, "tools": tools, "add_generation_prompt": gen, "kwargs": kwargs,
                       "bos_token": bos, "eos_token": eos}
                try:
                    rec["expected"] = render(tok, msgs, tools, gen, kwargs)
                    n_ok += 1
                except Exception as e:  # the template raised: the C renderer must fail as well
                    rec["error"] = f"{type(e).__name__}: {e}"
                    n_err += 1
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        print(f"{name}: {n_ok} rendered, {n_err} errors -> {OUT}/{name}.jsonl")
    write_snippets()


if __name__ == "__main__":
    main()
