"""openai_client_tools: GLM reasoning and tool calls through the official OpenAI Python client,
against `moeserve serve --script-output SCRIPT` (a test hook: every request generates SCRIPT's
text). Run by tests/unit/test_server_tools.c (test server_tools_11_openai_python); by hand:
    python3 tests/openai_client_tools.py http://127.0.0.1:8000/v1 MODEL SCRIPT
on a server started with --script-output SCRIPT on a model with a GLM-4.5-style template (the
built-in one): this script writes SCRIPT. Checks message.reasoning_content, content and
tool_calls (name, arguments) non-streamed, the same reassembled from a stream (delta.tool_calls
by index, delta.reasoning_content), and that the client's own message goes back as the next
turn. Prints "ok ..." and exits 0, or raises (exit 1)."""
import json
import sys

from openai import OpenAI

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "zip": {"type": "string"}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "search", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}, "filters": {"type": "object"}}}}},
]

SCRIPT = ("\n<think>Two things to do: weather, then a search.</think>\nChecking both.\n"
          "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
          "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>zip</arg_key>\n<arg_value>75001</arg_value>\n</tool_call>\n"
          "<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>cafés in \"Paris\"</arg_value>\n"
          "<arg_key>filters</arg_key>\n<arg_value>{\"open\": true, \"price\": [1, 2.5]}</arg_value>\n</tool_call>")
REASONING = "Two things to do: weather, then a search."
CONTENT = "Checking both."
CALLS = [("get_weather", {"city": "Paris", "days": 3, "zip": "75001"}),
         ("search", {"query": "cafés in \"Paris\"", "filters": {"open": True, "price": [1, 2.5]}})]
MARKUP = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")


def check_calls(calls, where):
    assert len(calls) == len(CALLS), (where, calls)
    ids = set()
    for (name, args), c in zip(CALLS, calls):
        assert c["type"] == "function", (where, c)
        assert c["id"].startswith("call_") and c["id"] not in ids, (where, c)
        ids.add(c["id"])
        assert c["name"] == name, (where, c)
        got = json.loads(c["arguments"])  # compared as JSON text: 3 is not "3" nor 3.0
        assert json.dumps(got, sort_keys=True) == json.dumps(args, sort_keys=True), (where, got, args)


def main():
    base, model, script = sys.argv[1], sys.argv[2], sys.argv[3]
    with open(script, "w", encoding="utf-8") as f:
        f.write(SCRIPT)
    client = OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=60)
    messages = [{"role": "user", "content": "Weather in Paris, and cafes there?"}]

    r = client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
    choice = r.choices[0]
    m = choice.message
    assert choice.finish_reason == "tool_calls", choice.finish_reason
    reasoning = getattr(m, "reasoning_content", None) or (m.model_extra or {}).get("reasoning_content")
    assert reasoning == REASONING, reasoning
    assert m.content == CONTENT, m.content
    check_calls([{"id": c.id, "type": c.type, "name": c.function.name, "arguments": c.function.arguments} for c in m.tool_calls],
                "non-streamed")

    stream = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, stream=True,
                                            stream_options={"include_usage": True})
    s_reasoning, s_content, s_calls, finish, usage = "", "", [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            d = c.delta
            piece = getattr(d, "reasoning_content", None) or (d.model_extra or {}).get("reasoning_content")
            for text in (piece, d.content):
                assert not text or not any(t in text for t in MARKUP), ("markup in a delta", text)
            s_reasoning += piece or ""
            s_content += d.content or ""
            for tc in d.tool_calls or []:
                if tc.index == len(s_calls):
                    s_calls.append({"id": tc.id, "type": tc.type, "name": tc.function.name, "arguments": ""})
                assert tc.index < len(s_calls), ("tool call index out of order", tc)
                s_calls[tc.index]["arguments"] += tc.function.arguments or ""
            if c.finish_reason:
                finish = c.finish_reason
    assert finish == "tool_calls", finish
    assert s_reasoning == REASONING, s_reasoning
    assert s_content == CONTENT, s_content
    check_calls(s_calls, "streamed")
    assert usage is not None and usage.prompt_tokens == r.usage.prompt_tokens, (usage, r.usage)
    assert usage.completion_tokens == r.usage.completion_tokens, (usage, r.usage)

    # the next turn: the client's own message back, one result per call
    with open(script, "w", encoding="utf-8") as f:
        f.write("\n<think>Both answered.</think>\nParis: 21 C, and two cafes.")
    follow = messages + [m.model_dump(exclude_none=True)] + [
        {"role": "tool", "tool_call_id": c.id, "content": json.dumps({"ok": True, "n": i})} for i, c in enumerate(m.tool_calls)]
    r2 = client.chat.completions.create(model=model, messages=follow, tools=TOOLS)
    assert r2.choices[0].finish_reason == "stop", r2.choices[0]
    assert r2.choices[0].message.content == "Paris: 21 C, and two cafes.", r2.choices[0].message
    assert not r2.choices[0].message.tool_calls, r2.choices[0].message
    assert r2.usage.prompt_tokens > r.usage.prompt_tokens, (r2.usage, r.usage)
    print("ok", len(m.tool_calls), "calls", r.usage.prompt_tokens, "+", r.usage.completion_tokens, "tokens; next turn",
          r2.usage.prompt_tokens, "prompt tokens")


if __name__ == "__main__":
    main()
