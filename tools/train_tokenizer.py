#!/usr/bin/env python3
"""train_tokenizer.py -- the built-in model's byte-level BPE tokenizer (GLM-4 style, 8192 ids).

Dev-time tool (not run by CI). Needs: tokenizers (0.23 used), transformers 5.x for the check.

    /work/venv/bin/python tools/train_tokenizer.py [--data /work/corpus/train.txt]
                                                   [--out models/builtin] [--vocab 8192]

What it writes (into --out):
  tokenizer.json         HF `tokenizers` file: no normalizer; pre-tokenizer = Sequence[Split(GLM-4's
                         regex, Isolated), ByteLevel(add_prefix_space=false, use_regex=false)];
                         BPE (no unk, no byte fallback, ignore_merges=false); ByteLevel decoder;
                         no post-processor -- the same components as GLM-4/4.5's tokenizer.json
                         (as zai-org/GLM-4.5 ships it on the Hugging Face Hub).
  tokenizer_config.json  eos = pad = <|endoftext|>, no BOS (as GLM-4.5: the chat template starts
                         with [gMASK]<sop>), added_tokens_decoder, chat_template.
Vocabulary: ids 0..255 are the 256 ByteLevel characters, then the learned merges, then the
SPECIALS (GLM-4.5's text added tokens, in GLM-4.5's order; GLM's image/video/audio/box tokens are
left out) at the top: ids vocab-len(SPECIALS) .. vocab-1.

Training text: --data split into documents on lines holding exactly "<|endoftext|>" (the corpus
format of tools/corpus_convert.py); the separator is never seen by the trainer.

Chat template: tests/data/chat/builtin.jinja (moeserve's built-in GLM-4.5-style template). The
script stops if it is missing.

Checks at the end: AutoTokenizer.from_pretrained(--out) loads; encode/decode round-trips the
held-out text exactly; special tokens are single ids; apply_chat_template renders
tests/data/chat/builtin.jsonl's conversations as expected. Prints bytes/token on held-out text.
"""
import argparse
import json
import os
import sys
import time

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC_SEP = "<|endoftext|>"

# GLM-4 / GLM-4.5 pre-tokenizer regex (tokenizer.json "pre_tokenizer" Split pattern)
GLM4_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
              r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# GLM-4.5's added tokens that concern text, in GLM-4.5's id order (151329.. there)
SPECIALS = [
    "<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>",
    "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
    "<|code_prefix|>", "<|code_middle|>", "<|code_suffix|>",
    "<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
    "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "/nothink",
]
# generation stops at these (GLM-4.5 generation_config: <|endoftext|>, <|user|>, <|observation|>)
EOS_TOKENS = ["<|endoftext|>", "<|user|>", "<|observation|>"]


def docs_of(path):
    with open(path, encoding="utf-8") as f:
        cur = []
        for line in f:
            if line.rstrip("\n") == DOC_SEP:
                yield "".join(cur).rstrip("\n")
                cur = []
            else:
                cur.append(line)
        if cur:
            yield "".join(cur).rstrip("\n")


def build(vocab_size, data):
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False, fuse_unk=False,
                               ignore_merges=False))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GLM4_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = None
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIALS), min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(docs_of(data), trainer=trainer)
    assert tok.get_vocab_size() == vocab_size - len(SPECIALS), tok.get_vocab_size()
    tok.add_special_tokens(SPECIALS)
    assert tok.get_vocab_size() == vocab_size
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == vocab_size - len(SPECIALS) + i
    return tok


def tokenizer_config(tok, template):
    added = {}
    for s in SPECIALS:
        added[str(tok.token_to_id(s))] = {"content": s, "lstrip": False, "normalized": False,
                                          "rstrip": False, "single_word": False, "special": True}
    return {
        "added_tokens_decoder": added,
        "additional_special_tokens": [s for s in SPECIALS if s not in ("<|endoftext|>",)],
        "bos_token": None,
        "chat_template": template,
        "clean_up_tokenization_spaces": False,
        "do_lower_case": False,
        "eos_token": "<|endoftext|>",
        "extra_special_tokens": {},
        "model_max_length": 4096,
        "pad_token": "<|endoftext|>",
        "padding_side": "left",
        "remove_space": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


def check(out, heldout, template_cases):
    from transformers import AutoTokenizer
    t = AutoTokenizer.from_pretrained(out)
    raw = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
    text = open(heldout, encoding="utf-8").read()
    ids = t.encode(text, add_special_tokens=False)
    assert ids == raw.encode(text, add_special_tokens=False).ids, "AutoTokenizer != tokenizers"
    back = t.decode(ids, clean_up_tokenization_spaces=False)
    assert back == text, "round trip failed"
    for s in SPECIALS:
        assert t.encode(s, add_special_tokens=False) == [t.convert_tokens_to_ids(s)], s
    assert t.encode("Hello", add_special_tokens=True) == t.encode("Hello", add_special_tokens=False)
    for s in ["  spaces\tand tabs\r\n", "caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \U0001F600",
              "<|user|>\nHi<|assistant|>\n<think></think>"]:
        assert t.decode(t.encode(s, add_special_tokens=False)) == s, s
    n_ok = 0
    if template_cases and os.path.exists(template_cases):
        for line in open(template_cases, encoding="utf-8"):
            c = json.loads(line)
            got = t.apply_chat_template(c["messages"], tools=c.get("tools"), tokenize=False,
                                        add_generation_prompt=c["add_generation_prompt"],
                                        **(c.get("kwargs") or {}))
            assert got == c["expected"], (c["id"], got, c["expected"])
            n_ok += 1
    nbytes = len(text.encode("utf-8"))
    print("check: AutoTokenizer loads %s; held-out %d bytes -> %d tokens = %.3f bytes/token; "
          "round trip exact; %d chat-template cases match" % (out, nbytes, len(ids),
                                                              nbytes / len(ids), n_ok))
    print("example:", t.convert_ids_to_tokens(t.encode("The Debian package management system "
                                                       "handles dependencies.")))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="/work/corpus/train.txt")
    ap.add_argument("--heldout", default=os.path.join(REPO, "tests/data/heldout.txt"))
    ap.add_argument("--out", default=os.path.join(REPO, "models/builtin"))
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--template", default=os.path.join(REPO, "tests/data/chat/builtin.jinja"))
    ap.add_argument("--template-cases", default=os.path.join(REPO, "tests/data/chat/builtin.jsonl"))
    args = ap.parse_args()

    if not os.path.exists(args.template):
        sys.exit("chat template %s missing" % args.template)
    template = open(args.template, encoding="utf-8").read()
    t0 = time.time()
    tok = build(args.vocab, args.data)
    print("trained %d-id vocabulary in %.0f s" % (tok.get_vocab_size(), time.time() - t0))
    os.makedirs(args.out, exist_ok=True)
    # the Python binding's decoders.ByteLevel() serialises its defaults (add_prefix_space etc.
    # true); write GLM-4's decoder entry exactly (decoding is the same either way)
    spec = json.loads(tok.to_str())
    spec["decoder"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                       "use_regex": False}
    with open(os.path.join(args.out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(spec, f, ensure_ascii=False, separators=(",", ":"))
    with open(os.path.join(args.out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(tok, template), f, indent=2, ensure_ascii=False)
        f.write("\n")
    check(args.out, args.heldout, args.template_cases)


if __name__ == "__main__":
    main()
