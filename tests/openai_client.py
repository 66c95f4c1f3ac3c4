"""openai_client: the official OpenAI Python client against a running `moeserve serve`.
Run by tests/unit/test_server.c (test server_openai_python); by hand:
    python3 tests/openai_client.py http://127.0.0.1:8000/v1 MODEL
Streams a chat completion with usage, checks that the non-streaming answer has the same text,
makes a text completion, and checks that errors come back as the client's exception classes.
Prints "ok ..." and exits 0, or raises."""
import sys

import openai
from openai import OpenAI


def main():
    base, model = sys.argv[1], sys.argv[2]
    client = OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=60)
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello!"}]

    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    text, roles, finish, usage, n_chunks = "", [], None, None, 0
    for chunk in stream:
        n_chunks += 1
        assert chunk.object == "chat.completion.chunk", chunk
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.role:
                roles.append(c.delta.role)
            if c.delta.content:
                text += c.delta.content
            if c.finish_reason:
                finish = c.finish_reason
    assert roles == ["assistant"], roles
    assert finish in ("stop", "length"), finish
    assert usage is not None and 1 <= usage.completion_tokens <= 8, usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, usage

    full = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0)
    assert full.choices[0].message.role == "assistant"
    assert full.choices[0].message.content == text, (full.choices[0].message.content, text)
    assert full.usage.prompt_tokens == usage.prompt_tokens, (full.usage, usage)

    comp = client.completions.create(model=model, prompt="The Debian package", max_tokens=4, temperature=0)
    assert comp.object == "text_completion" and isinstance(comp.choices[0].text, str), comp
    assert comp.usage.completion_tokens <= 4, comp.usage

    models = client.models.list()
    assert [m.id for m in models.data] == [model], models

    try:
        client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
        raise AssertionError("an unknown model was accepted")
    except openai.NotFoundError as e:
        assert e.status_code == 404
    two = client.completions.create(model=model, prompt="x", max_tokens=3, n=2, seed=5, temperature=1.0)
    assert sorted(c.index for c in two.choices) == [0, 1], two.choices
    assert 2 <= two.usage.completion_tokens <= 6, two.usage  # both choices counted
    chat_two = client.chat.completions.create(model=model, messages=messages, max_tokens=3, n=2, seed=5, temperature=1.0)
    assert sorted(c.index for c in chat_two.choices) == [0, 1], chat_two.choices
    try:
        client.completions.create(model=model, prompt="x", max_tokens=1, n=2, best_of=3)
        raise AssertionError("best_of=3 with n=2 was accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400
    print("ok", repr(text), usage.prompt_tokens, usage.completion_tokens, n_chunks, "chunks")


if __name__ == "__main__":
    main()
