#!/usr/bin/env python3
"""Write the fuzzers' seed corpus, tests/fuzz/corpus/<target>/, from the test fixtures (run from
the repository root; rewrites the directories). Seeds stay small: libFuzzer mutates small inputs
far faster, and every accepted construct it needs is in one of them."""
import json, os, shutil, struct

OUT = "tests/fuzz/corpus"


def put(target, name, data):
    os.makedirs(f"{OUT}/{target}", exist_ok=True)
    with open(f"{OUT}/{target}/{name}", "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def safetensors(header, data=b""):
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def seeds_safetensors():
    put("safetensors", "empty", safetensors({}))
    put("safetensors", "meta_f32", safetensors(
        {"__metadata__": {"format": "pt"}, "w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}},
        struct.pack("<6f", 1, 2, 3, 4, 5, 6)))
    put("safetensors", "mixed", safetensors({
        "a.weight": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]},
        "a.weight_scale": {"dtype": "F8_E4M3", "shape": [2, 2], "data_offsets": [8, 12]},
        "a.weight_scale_2": {"dtype": "F32", "shape": [], "data_offsets": [12, 16]},
        "b.packed": {"dtype": "U8", "shape": [2, 4], "data_offsets": [16, 24]},
        "c.empty": {"dtype": "I64", "shape": [0, 5], "data_offsets": [24, 24]},
        "d.f4": {"dtype": "F4", "shape": [3], "data_offsets": [24, 26]},
        "e.i64": {"dtype": "I64", "shape": [1], "data_offsets": [26, 34]},
    }, bytes(range(34))))
    put("safetensors", "hole", safetensors(
        {"x": {"dtype": "F16", "shape": [1, 1, 1, 2], "data_offsets": [4, 8]}}, bytes(8)))
    with open("tests/data/golden/glm4moe-bf16/model.safetensors", "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
    # the fixture's header with its data cut to a few bytes per tensor (shapes shrunk to fit)
    small, off = {}, 0
    for k, v in sorted(hdr.items()):
        if k == "__metadata__":
            small[k] = v
            continue
        if len(small) > 12:
            break
        width = {"BF16": 2, "F16": 2, "F32": 4}.get(v["dtype"], 1)
        small[k] = {"dtype": v["dtype"], "shape": [2], "data_offsets": [off, off + 2 * width]}
        off += 2 * width
    put("safetensors", "golden_header", safetensors(small, bytes(off)))


def seeds_config():
    for root in ("tests/data/configs", "tests/data/golden"):
        for d in sorted(os.listdir(root)):
            p = f"{root}/{d}/config.json"
            if os.path.exists(p):
                put("config", f"{os.path.basename(root)}_{d}.json", open(p, "rb").read())
    for p in ("models/builtin-nvfp4/config.json", "models/builtin-nvfp4/hf_quant_config.json"):
        put("config", "builtin_" + os.path.basename(p), open(p, "rb").read())


def tiny_tokenizer(src, keep=300):
    """src with its vocabulary cut to the first `keep` ids and the merges between them"""
    t = json.load(open(src))
    m = t["model"]
    vocab = {k: v for k, v in m["vocab"].items() if v < keep}
    merges = []
    for mg in m["merges"]:
        a, b = mg if isinstance(mg, list) else mg.split(" ", 1)
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(mg)
    m["vocab"], m["merges"] = vocab, merges
    t["added_tokens"] = t["added_tokens"][:3]
    return remap_special(t)


def remap_special(t):
    """added tokens past the cut vocabulary renumbered after it, and the post-processor's special
    tokens pointed at their ids"""
    keep = len(t["model"]["vocab"])
    added, next_id = [], keep
    for a in t["added_tokens"]:
        if a["id"] >= keep:
            a = dict(a, id=next_id)
            next_id += 1
        added.append(a)
    t["added_tokens"] = added
    ids = dict(t["model"]["vocab"])
    ids.update({a["content"]: a["id"] for a in t["added_tokens"]})

    def walk(v):
        if isinstance(v, dict):
            if isinstance(v.get("tokens"), list) and isinstance(v.get("ids"), list):
                v["ids"] = [ids.get(tok, 0) for tok in v["tokens"]]
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            if len(v) == 2 and isinstance(v[0], str) and isinstance(v[1], int):
                v[1] = ids.get(v[0], 0)  # RobertaProcessing / BertProcessing: [token, id]
            for x in v:
                walk(x)

    walk(t.get("post_processor"))
    return t


def patch(t, p):
    """as tests/unit/test_tokenizer.c applies a variant: "a.b" sets key b of object a"""
    t = json.loads(json.dumps(t))
    for k, v in p.items():
        o, key = (t[k.split(".", 1)[0]], k.split(".", 1)[1]) if "." in k else (t, k)
        o[key] = v
    return t


def seeds_tokenizer():
    base = tiny_tokenizer("tests/data/tokenizer/synth-llama3/tokenizer.json")
    put("tokenizer", "llama3_tiny.json", json.dumps(base))
    ds = tiny_tokenizer("tests/data/tokenizer/synth-deepseek-v3/tokenizer.json")
    put("tokenizer", "deepseek_tiny.json", json.dumps(ds))
    for i, line in enumerate(open("tests/data/tokenizer/variants.jsonl")):
        p = json.loads(line).get("patch")
        if p:
            put("tokenizer", f"variant{i:02d}.json", json.dumps(remap_special(patch(base, p))))


def seeds_chat_template():
    for f in sorted(os.listdir("tests/data/chat")):
        if f.endswith(".jinja"):
            put("chat_template", f, open(f"tests/data/chat/{f}", "rb").read())
    seen = set()
    for line in open("tests/data/chat/snippets.jsonl"):
        c = json.loads(line)
        if c["template"] not in seen:
            seen.add(c["template"])
            put("chat_template", c["id"] + ".jinja", c["template"])


REQUESTS = [
    {"prompt": "Hello", "max_tokens": 2},
    {"model": "builtin", "prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0.7, "top_p": 0.9, "top_k": 20,
     "seed": 7, "stop": ["\n", "end"], "logprobs": 2, "echo": True, "n": 1},
    {"prompt": ["batched", "no"], "max_tokens": 1},
    {"prompt": "x", "stream": True, "stream_options": {"include_usage": True}, "stop": "a", "stop_token_ids": [5, 6],
     "ignore_eos": True, "min_tokens": 1, "repetition_penalty": 1.1, "presence_penalty": 0.5,
     "frequency_penalty": -0.5, "skip_special_tokens": False, "logit_bias": {"10": -100}},
    {"prompt": "a\u0000b", "max_tokens": 2, "seed": -9223372036854775807},
    {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                  {"role": "assistant", "content": "Hello", "reasoning_content": "greet"},
                  {"role": "user", "content": "weather?"}],
     "stream": True, "max_completion_tokens": 8, "chat_template_kwargs": {"enable_thinking": False}},
    {"messages": [{"role": "user", "content": "weather in Paris?"}],
     "tools": [{"type": "function", "function": {"name": "get_weather", "description": "weather",
                                                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                                "required": ["city"]}}}],
     "tool_choice": "auto", "parallel_tool_calls": True},
    {"messages": [{"role": "user", "content": "go"},
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "42"}],
     "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
     "tool_choice": {"type": "function", "function": {"name": "f"}}, "logprobs": True, "top_logprobs": 3},
    {"messages": [{"role": "user", "content": "x"}], "tool_choice": "required",
     "tools": [{"type": "function", "function": {"name": "g"}}], "response_format": {"type": "text"}, "user": "u"},
]


def seeds_openai_request():
    for i, r in enumerate(REQUESTS):
        put("openai_request", f"req{i:02d}.json", json.dumps(r))
    put("openai_request", "bad_utf8.json", b'{"prompt": "ab\xff\xfe"}')
    put("openai_request", "empty_object.json", "{}")


if __name__ == "__main__":
    for t in ("safetensors", "config", "tokenizer", "chat_template", "openai_request"):
        shutil.rmtree(f"{OUT}/{t}", ignore_errors=True)
    seeds_safetensors()
    seeds_config()
    seeds_tokenizer()
    seeds_chat_template()
    seeds_openai_request()
