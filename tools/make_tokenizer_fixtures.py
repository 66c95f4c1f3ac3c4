#!/usr/bin/env python3
"""make_tokenizer_fixtures: the expected token ids for tests/unit/test_tokenizer.c, from Hugging
Face `tokenizers` (the Rust library through its Python binding, which is what "HF encode" means in
tests: `Tokenizer.from_file(p).encode(text, add_special_tokens=...)`).

Writes tests/data/tokenizer/<vocab>.jsonl, one case per line:
  {"text": S, "ids": [...]}                      encode(S, add_special_tokens=False)
  {"text": S, "special": 1, "ids": [...]}        encode(S, add_special_tokens=True)
  {"hex": H, "ids": [...]}                       raw bytes H (maybe invalid UTF-8); HF sees
                                                 bytes.decode("utf-8", "replace")
  {"src": "arena"|"mtbench"|"sharegpt", "i": N, "turn": T, "ids": [...]}
                                                 a prompt from <assets>/datasets (the text
                                                 is not committed; the test reads it there)
  {"long": N, "n": count, "fnv": hex}            the "long text" (the static texts joined by "\n",
                                                 repeated to >= N bytes): count ids, FNV-1a 64 of
                                                 the ids printed as "%d " each
  {"decode": [...], "dec": S, "dec_skip": S}     decode(ids, skip_special_tokens=False / True)
Static cases also carry "dec" (decode of their ids) when it differs from the text, and "st": 1
(the long text is built from those).

tests/data/tokenizer/variants.jsonl: the synthetic Llama-3 tokenizer.json with components
replaced ({"patch": {"key" or "a.b": value}, "cases": [{"text", "ids", "special"?}]}) to cover
every Split behavior, the other pre-tokenizers, normalizers, added-token options and
post-processors that the real vocabularies do not use.

It also trains two small synthetic vocabularies with the exact pre-tokenizer configuration of the
Llama-3 and DeepSeek-V3 families (so CI covers those code paths without the real files) and writes
them to tests/data/tokenizer/synth-llama3/ and synth-deepseek-v3/ (committed).

Real vocabularies: glm4 and qwen3 from <assets>/tokenizers; with --extra DIR also the real
DeepSeek-V3 / Llama-3 / GLM-4.7 files found as DIR/<name>/tokenizer.json (see README.md there).
Run from the repository root:  /work/venv/bin/python tools/make_tokenizer_fixtures.py [--extra DIR]
"""
import argparse
import json
import os
import random
import sys

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

OUT = "tests/data/tokenizer"
LONG_BYTES = 100_000
N_DATASET = {"arena": 120, "mtbench": 40, "sharegpt": 100}
SEED = 1234

# ---- the strings ----

SPECIALS = [
    "<|user|>", " <|user|> hi <|assistant|> ", "[gMASK]<sop><|system|>\nYou are a helpful assistant.",
    "<|user|><|user|>", "<|use", "<|endoftext|>text after", "text<|endoftext|>", "x <|observation|>\n",
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n", " <|im_start|> ", "<|im_start|",
    "<think>\n\n</think>\n\nAnswer.", "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
    "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
    "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜>", "<｜end▁of▁sentence｜> x",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<|reserved_special_token_5|>", "  <|eot_id|>  ", "</s><s>[INST]", "<<|user|>>",
]

STATIC = [
    "", "a", "Hello world", " Hello world", "Hello World!", "Hello, world!", "hello世界123abc",
    # Latin with accents, decomposed vs precomposed
    "Café naïve façade jalapeño Ångström Øresund straße Œuvre Dvořák Łódź",
    "\u00e9 e\u0301 \u00c5 A\u030a \u212b \u1e69 s\u0323\u0307 s\u0307\u0323",
    "Zalgo: Z\u0324\u0354\u0367\u0311\u0313a\u0308\u0356\u032d\u0308\u0307l\u036e\u0312\u036bg\u030c\u0317\u035a\u031ao\u0319\u0314\u036e\u0307\u0350\u0307",
    "e\u0301\u0301\u0301 o\u0308\u0304 \u0301leading combining",
    # scripts
    "Καλημέρα κόσμε, τι κάνεις; ΆΈΉ", "Привет, мир! Съешь же ещё этих мягких французских булок.",
    "مرحبا بالعالم، كيف حالك؟ ١٢٣", "שלום עולם, מה שלומך?", "नमस्ते दुनिया, आप कैसे हैं? क्षत्रिय",
    "สวัสดีชาวโลก ภาษาไทย", "你好，世界！今天天气很好。我们去公园散步吧。", "こんにちは世界、カタカナとひらがな。漢字ｶﾀｶﾅ",
    "안녕하세요 세계 한국어", "\u1100\u1161\u11a8 \u1112\u1161\u11ab", "ქართული ენა", "Հայերեն", "አማርኛ",
    "தமிழ் மொழி", "বাংলা ভাষা", "ꦧꦱꦗꦮ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕄𝕒𝕥𝕙 𝟙𝟚𝟛",
    # emoji
    "👍 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵🇺🇸 🏳️‍🌈 ❤️ 🦙 🧑🏿‍💻", "😀😃😄😁😆😅🤣😂🙂🙃", "I ❤ NY ☺ ✓ ✔ ✗", "🦙.cpp this is 🦙.cpp",
    # numbers
    "1", "12", "123", "1234", "12345", "123456", "1234567", "12345678901234567890", "3.14159 2.71828",
    "1,000,000 and 1 000 000", "0x1F 0b1010 1e-9 -42 +7", "٣٤٥ ०१२ ๓๔ ²³ ½ ⅓ Ⅻ ⑦",
    "In 2024, 15% of 7,832 people paid $1,234.56 on 12/31.",
    # contractions
    "I'm sure you're right, they've said it's John's and we'll see, I'd go.", "DON'T SHOUT I'M HERE YOU'LL SEE",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE", "rock'n'roll o'clock can't won't", "l'été d'accord",
    "’s curly ‘quotes’ “double”",
    # whitespace
    "a  b   c    d     e", "\t\tindented\ttabs\t", "line1\nline2\n\nline4\n\n\n", "crlf\r\nline\r\n\r\nend\r",
    "trailing   ", "   leading", "\n\n\nstart", " ", "  ", "   ", "\t", "\n", "\r\n", "\r", " \n ", "\n \n",
    "a \n b \t c \r\n d", " \t \n \r ", "\u00a0nbsp\u00a0 x", "\u3000ideographic\u3000space", "x\u2028y\u2029z",
    "\u0085nel x", "a\u180eb \u180e", "\u200b zero\u200bwidth \u200d", "\ufeffbom", "\x00\x01\x1f\x7f nul and controls",
    "\x1c\x1d\x1e\x1f separators", "    def f(x):\n        return x\n\n\n    ", "\n\n\n\n\n\n\n\n\n\n",
    # code, markup, URLs
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n-1) + fib(n-2)\n",
    "int main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
    "{\"key\": [1, 2.5, null, true], \"s\": \"a\\\"b\"}", "<div class=\"x\">&nbsp;&amp;</div>",
    "SELECT * FROM t WHERE a >= 10 AND b != 'x';", "$ ls -la | grep '\\.c$' && echo ok",
    "https://example.com/path/to?q=1&x=%20y#frag", "mailto:someone@example.org", "C:\\Users\\me\\file.txt",
    "a==b!=c<=d>=e->f=>g::h...i---j___k", "((((()))))[[[]]]{{{}}}", "∑∫∂√∞≠≤≥ → ← ⇒ ∀x∃y", "┌─┬─┐│ │└─┴─┘",
    "ＡＢＣ１２３ fullwidth", "ﬁ ﬂ ligatures", "ſ 'ſ 'ſt K 'K",
    # long runs (one long pre-token: BPE must not be quadratic)
    "a" * 1000, "ab" * 700, "😀" * 200, " " * 500, "\n" * 300, "1" * 1000, "x " * 400, "é" * 300,
    "-" * 200, "\t" * 100 + "x",
] + SPECIALS

INVALID_HEX = [
    "ff", "c0af", "e28228", "f09f98", "f09f9880", "eda080", "808182", "e08080", "f4908080", "c3",
    "61c362", "e282", "48656c6c6f20fffe20776f726c64", "f09f9820782078", "c0", "f8888080", "fe", "efbfbd",
    "3c7c757365727cff3e", "e4bda0e5a5bde4b8",
]


def random_strings(rng, n):
    """Seeded strings of code points from many blocks (no surrogates)."""
    blocks = [(0x20, 0x7e), (0xa0, 0x24f), (0x300, 0x36f), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x6ff),
              (0x900, 0x97f), (0xe00, 0xe7f), (0x1100, 0x11ff), (0x2000, 0x206f), (0x2190, 0x23ff),
              (0x3000, 0x30ff), (0x4e00, 0x9fff), (0xac00, 0xd7a3), (0xfe00, 0xfe0f), (0xff00, 0xffef),
              (0x1f300, 0x1faff), (0x10000, 0x1007f), (0x1d400, 0x1d7ff), (0x9, 0xd)]
    out = []
    for _ in range(n):
        s = []
        for _ in range(rng.randint(1, 40)):
            lo, hi = rng.choice(blocks)
            s.append(chr(rng.randint(lo, hi)))
        out.append("".join(s))
    return out


def long_text(texts):
    """The static texts joined by newlines, repeated to at least LONG_BYTES bytes (test_tokenizer.c
    builds the same)."""
    unit = "\n".join(texts).encode("utf-8")
    reps = -(-LONG_BYTES // len(unit))
    return (unit * reps).decode("utf-8")


def fnv_ids(ids):
    h = 0xcbf29ce484222325
    for b in "".join("%d " % i for i in ids).encode():
        h ^= b
        h = (h * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def dataset_texts(assets):
    """(src, i, turn, text) prompts sampled (seeded) from the assets datasets."""
    d = os.path.join(assets, "datasets")
    rng = random.Random(SEED)
    out = []
    arena = [json.loads(l)["prompt"] for l in open(os.path.join(d, "arena-hard-v0.1-question.jsonl"))]
    for i in sorted(rng.sample(range(len(arena)), N_DATASET["arena"])):
        out.append(("arena", i, 0, arena[i]))
    mt = [json.loads(l)["turns"] for l in open(os.path.join(d, "mt_bench_question.jsonl"))]
    for i in sorted(rng.sample(range(len(mt)), N_DATASET["mtbench"])):
        t = rng.randrange(len(mt[i]))
        out.append(("mtbench", i, t, mt[i][t]))
    sg = json.load(open(os.path.join(d, "ShareGPT_V3_filtered_1000.json")))
    for i in sorted(rng.sample(range(len(sg)), N_DATASET["sharegpt"])):
        conv = sg[i]["conversations"]
        t = rng.randrange(len(conv))
        if len(conv[t]["value"]) <= 6000:
            out.append(("sharegpt", i, t, conv[t]["value"]))
    return out


# ---- synthetic vocabularies ----

LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
DSV3_RES = [r"\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
            "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
            "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"]
# Whole words added to the synthetic Llama-3 vocabulary without a merge path, so that
# ignore_merges (a vocabulary hit skips the merges) changes the result.
LLAMA3_WORDS = ["Ġantidisestablishment", "Ġsupercalifragilistic", "Ġzyzzyva", "qwertyuiop"]


def train(pre, corpus, vocab_size, specials, ignore_merges=False):
    model = models.BPE(ignore_merges=ignore_merges)
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    return tok


def synth_llama3(corpus, path):
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_RE), "isolated"),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok = train(pre, corpus, 3000, specials, ignore_merges=True)
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
        special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])
    j = json.loads(tok.to_str())
    # Model ids first, specials after (as in the real file): renumber the vocabulary.
    vocab = j["model"]["vocab"]
    plain = sorted((v, k) for k, v in vocab.items() if k not in specials)
    new = {k: i for i, (_, k) in enumerate(plain)}
    for w in LLAMA3_WORDS:
        new[w] = len(new)
    base = len(new)
    for i, s in enumerate(specials):
        new[s] = base + i
    j["model"]["vocab"] = {k: v for k, v in new.items() if k not in specials}
    for t in j["added_tokens"]:
        t["id"] = new[t["content"]]
    j["added_tokens"].sort(key=lambda t: t["id"])
    j["post_processor"]["special_tokens"]["<|begin_of_text|>"]["ids"] = [new["<|begin_of_text|>"]]
    j["pre_tokenizer"]["pretokenizers"][1]["trim_offsets"] = True
    j["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    write_json(j, path)


def synth_deepseek_v3(corpus, path):
    specials = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"]
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r), "isolated") for r in DSV3_RES] +
                                  [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok = train(pre, corpus, 3000, specials)
    j = json.loads(tok.to_str())
    # As in the real file: normalizer an empty Sequence, non-special added tokens normalized.
    j["normalizer"] = {"type": "Sequence", "normalizers": []}
    nxt = max(j["model"]["vocab"].values()) + 1
    for name in ["<｜User｜>", "<｜Assistant｜>", "<｜tool▁sep｜>"]:
        j["added_tokens"].append({"id": nxt, "content": name, "single_word": False, "lstrip": False,
                                  "rstrip": False, "normalized": True, "special": False})
        nxt += 1
    j["post_processor"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
    j["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    # Merges as "a b" strings (the real file's form; the Llama-3 one keeps [a, b] pairs).
    j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    write_json(j, path)


def write_json(j, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    Tokenizer.from_file(path)  # must load


# ---- fixtures ----

def cases_for(tok, name, datasets):
    rng = random.Random(SEED)
    texts = STATIC + random_strings(rng, 60)
    out = []
    for k, s in enumerate(texts):
        ids = tok.encode(s, add_special_tokens=False).ids
        c = {"text": s, "ids": ids}
        if k < len(STATIC):
            c["st"] = 1
        dec = tok.decode(ids, skip_special_tokens=False)
        if dec != s:
            c["dec"] = dec
        out.append(c)
    for s in ["", "Hello world", " <|user|> hi", "<|im_start|>user\nHi<|im_end|>", "<|begin_of_text|>x",
              "<｜begin▁of▁sentence｜>x", "12345 ok"]:
        out.append({"text": s, "special": 1, "ids": tok.encode(s, add_special_tokens=True).ids})
    for h in INVALID_HEX:
        s = bytes.fromhex(h).decode("utf-8", "replace")
        out.append({"hex": h, "ids": tok.encode(s, add_special_tokens=False).ids})
    for src, i, t, s in datasets:
        out.append({"src": src, "i": i, "turn": t, "ids": tok.encode(s, add_special_tokens=False).ids})
    lt = long_text(STATIC)
    ids = tok.encode(lt, add_special_tokens=False).ids
    out.append({"long": LONG_BYTES, "n": len(ids), "fnv": fnv_ids(ids)})
    # decode of arbitrary ids (byte tokens that leave UTF-8 incomplete or invalid, specials)
    vs = tok.get_vocab_size(with_added_tokens=True)
    added = sorted(tok.get_added_tokens_decoder().keys())
    for k in range(40):
        ids = [rng.randrange(vs) for _ in range(rng.randint(1, 12))]
        if k % 3 == 0 and added:
            ids.insert(rng.randrange(len(ids) + 1), rng.choice(added))
        if k % 4 == 1:
            ids += [rng.randrange(256) for _ in range(3)]   # low ids are single bytes in these vocabs
        out.append({"decode": ids, "dec": tok.decode(ids, skip_special_tokens=False),
                    "dec_skip": tok.decode(ids, skip_special_tokens=True)})
    return out


VARIANT_TEXTS = [
    "", "the-final--countdown-", "-a-b-", "Hello World  foo\tbar\n\nbaz ", "ÀÉÎ café ﬁ Ⅻ ²³ İstanbul ΣΑΣ ǅ",
    "a1b22c333d4444 5.5 ٣٤", "x,y;z!? (hi) [yo] {o} 'q' \"w\" $+<=>^`|~", "  lead and trail  ",
    "<mask> x <mask>y [SW] a[SW]b [SW]. <R>   z Hello hello HELLO", " antidisestablishment antidisestablishmentarianism",
    "e\u0301 \u212b \u00c5 \u1e9b\u0323", "\u3000x\u00a0y\u2003z\u180e", "I'm you're",
]


def variants(base_path):
    base = json.load(open(base_path, encoding="utf-8"))
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
    vocab = base["model"]["vocab"]
    bos = next(t["id"] for t in base["added_tokens"] if t["content"] == "<|begin_of_text|>")
    eot = next(t["id"] for t in base["added_tokens"] if t["content"] == "<|eot_id|>")

    def seq(*p):
        return {"pre_tokenizer": {"type": "Sequence", "pretokenizers": list(p) + [bl]}}
    patches = []
    for beh in ["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"]:
        for inv in [False, True]:
            patches.append(seq({"type": "Split", "pattern": {"String": "-"}, "behavior": beh, "invert": inv}))
            patches.append(seq({"type": "Split", "pattern": {"Regex": "[aeiou]|\\s+"}, "behavior": beh, "invert": inv}))
    patches.append(seq({"type": "Split", "pattern": {"String": ""}, "behavior": "Isolated", "invert": False}))
    patches.append(seq({"type": "Split", "pattern": {"Regex": "\\u0061|x*"}, "behavior": "Isolated", "invert": False}))
    patches.append({"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}})
    patches.append({"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}})
    patches.append({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"String": "-"}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": False}]}})
    patches.append(seq({"type": "Digits", "individual_digits": True}))
    patches.append(seq({"type": "Digits", "individual_digits": False}))
    for beh in ["Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"]:
        patches.append(seq({"type": "Punctuation", "behavior": beh}))
    patches.append(seq({"type": "Whitespace"}))
    patches.append(seq({"type": "WhitespaceSplit"}))
    for n in [{"type": "NFD"}, {"type": "NFKC"}, {"type": "NFKD"}, {"type": "NFC"}, {"type": "Lowercase"},
              {"type": "Replace", "pattern": {"String": " "}, "content": "_"},
              {"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "},
              {"type": "Prepend", "prepend": "_"}, {"type": "Strip", "strip_left": True, "strip_right": True},
              {"type": "Strip", "strip_left": False, "strip_right": True},
              {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]},
              {"type": "ByteLevel"}]:
        p = {"normalizer": n}
        if n["type"] == "ByteLevel":
            p["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": "\u0120"}, "behavior": "MergedWithNext", "invert": False}
        patches.append(p)

    def added(content, **kw):
        t = {"id": 0, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": False}
        t.update(kw)
        return t
    extra = [added("<mask>", lstrip=True, special=True), added("[SW]", single_word=True),
             added("<R>", rstrip=True), added("Hello", normalized=True), added("hello", normalized=True),
             added("ant", special=True)]
    patches.append({"added_tokens": base["added_tokens"] + extra})
    # (not "hello" too: two normalized tokens with one normalized form make HF pick either at random)
    patches.append({"added_tokens": base["added_tokens"] + [t for t in extra if t["content"] != "hello"],
                    "normalizer": {"type": "Lowercase"}})
    patches.append({"added_tokens": base["added_tokens"] + [added("<mask>", lstrip=True, rstrip=True, single_word=True)]})
    patches.append({"post_processor": {"type": "RobertaProcessing", "sep": ["<|eot_id|>", eot],
                                       "cls": ["<|begin_of_text|>", bos], "trim_offsets": True, "add_prefix_space": False}})
    patches.append({"post_processor": {"type": "BertProcessing", "sep": ["<|eot_id|>", eot], "cls": ["<|begin_of_text|>", bos]}})
    patches.append({"post_processor": {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                                                  {"Sequence": {"id": "A", "type_id": 0}},
                                                  {"SpecialToken": {"id": "<|eot_id|>", "type_id": 0}}],
         "pair": [], "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [bos], "tokens": ["<|begin_of_text|>"]},
                                        "<|eot_id|>": {"id": "<|eot_id|>", "ids": [eot, bos], "tokens": ["<|eot_id|>", "<|begin_of_text|>"]}}}]}})
    patches.append({"model.ignore_merges": False})
    patches.append({"decoder": None})
    assert "Ġantidisestablishment" in vocab

    out = []
    tmp = os.path.join(OUT, ".variant.json")
    for p in patches:
        j = json.loads(json.dumps(base))
        for k, v in p.items():
            o = j
            ks = k.split(".")
            for kk in ks[:-1]:
                o = o[kk]
            o[ks[-1]] = v
        write_json(j, tmp)
        tok = Tokenizer.from_file(tmp)
        cases = []
        for s in VARIANT_TEXTS:
            c = {"text": s, "ids": tok.encode(s, add_special_tokens=False).ids}
            dec = tok.decode(c["ids"], skip_special_tokens=False)
            if dec != s:
                c["dec"] = dec
            cases.append(c)
        for s in VARIANT_TEXTS[:3]:
            cases.append({"text": s, "special": 1, "ids": tok.encode(s, add_special_tokens=True).ids})
        ids = tok.encode(VARIANT_TEXTS[8], add_special_tokens=False).ids
        cases.append({"decode": ids, "dec": tok.decode(ids, skip_special_tokens=False),
                      "dec_skip": tok.decode(ids, skip_special_tokens=True)})
        out.append({"patch": p, "cases": cases})
    os.remove(tmp)
    return out


def write_cases(name, cases):
    path = os.path.join(OUT, name + ".jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for c in cases:
            f.write(json.dumps(c, ensure_ascii=False, separators=(",", ":")) + "\n")
    print("%-20s %4d cases %8d bytes" % (name, len(cases), os.path.getsize(path)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--assets", default=os.environ.get("MOESERVE_ASSETS", "../shared/assets"))
    ap.add_argument("--extra", help="dir with <name>/tokenizer.json of the real deepseek-v3, llama3, glm47")
    a = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    datasets = dataset_texts(a.assets)

    corpus = [s for _, _, _, s in datasets] + STATIC
    synth_llama3(corpus, os.path.join(OUT, "synth-llama3", "tokenizer.json"))
    synth_deepseek_v3(corpus, os.path.join(OUT, "synth-deepseek-v3", "tokenizer.json"))

    vocabs = [("glm4", os.path.join(a.assets, "tokenizers/glm4/tokenizer.json")),
              ("qwen3", os.path.join(a.assets, "tokenizers/qwen3/tokenizer.json")),
              ("synth-llama3", os.path.join(OUT, "synth-llama3/tokenizer.json")),
              ("synth-deepseek-v3", os.path.join(OUT, "synth-deepseek-v3/tokenizer.json"))]
    if a.extra:
        for name in ["deepseek-v3", "llama3", "glm47"]:
            p = os.path.join(a.extra, name, "tokenizer.json")
            if os.path.exists(p):
                vocabs.append((name, p))
            else:
                print("no %s: skipped" % p, file=sys.stderr)
    for name, path in vocabs:
        write_cases(name, cases_for(Tokenizer.from_file(path), name, datasets))
    write_cases("variants", variants(os.path.join(OUT, "synth-llama3/tokenizer.json")))


if __name__ == "__main__":
    main()
