#!/usr/bin/env python3
"""Reference token ids from Hugging Face `tokenizers`, for tokenizer_hf_parity_test.

Reads the tokenizer of a GGUF model with the `gguf` package and writes two files to --out:

  vocab.json     tokens, token types, merges, pre rule, special ids and chat template: what
                 the C++ test turns into a TokenizerSpec (it needs no GGUF loader of its own)
  expected.json  cases (texts) and, per pre-tokenizer rule, the ids `tokenizers` gives each case
                 with special tokens parsed and with special tokens encoded as plain text

Each rule is built from `tokenizers` parts, independently of the C++ code:

  smollm     Digits(individual_digits) then ByteLevel(use_regex) -- SmolLM2's own tokenizer.json
  gpt2       ByteLevel(use_regex)
  llama-bpe  Split(Llama 3 regex, isolated) then ByteLevel(no regex); BPE(ignore_merges)
  qwen2      Split(Qwen2 regex, isolated) then ByteLevel(no regex)

Cases: the corpus as a whole, each of its lines, and seeded random strings mixing scripts,
digits, white space runs, contractions, emoji and special tokens.
"""

import argparse
import json
import os
import random

import gguf
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

# The regular expressions as Llama 3 and Qwen2 ship them in their tokenizer.json files.
LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_REGEX = LLAMA3_REGEX.replace(r"\p{N}{1,3}", r"\p{N}")

CONTROL = 3


def field(reader, name):
    f = reader.fields.get(name)
    return None if f is None else f.contents()


def read_vocab(path):
    reader = gguf.GGUFReader(path)
    vocab = {
        "model": field(reader, "tokenizer.ggml.model"),
        "pre": field(reader, "tokenizer.ggml.pre"),
        "tokens": field(reader, "tokenizer.ggml.tokens"),
        "token_types": [int(t) for t in field(reader, "tokenizer.ggml.token_type")],
        "merges": field(reader, "tokenizer.ggml.merges"),
        "add_bos": bool(field(reader, "tokenizer.ggml.add_bos_token")),
        "chat_template": field(reader, "tokenizer.chat_template") or "",
    }
    for key in ("bos", "eos", "unknown", "padding"):
        value = field(reader, f"tokenizer.ggml.{key}_token_id")
        vocab[f"{key}_id"] = -1 if value is None else int(value)
    return vocab


def build(vocab, rule):
    token_ids = {}
    for i, token in enumerate(vocab["tokens"]):
        token_ids.setdefault(token, i)
    merges = [tuple(m.split(" ")) for m in vocab["merges"]]
    tok = Tokenizer(models.BPE(vocab=token_ids, merges=merges, ignore_merges=rule == "llama-bpe"))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=rule in ("smollm", "gpt2"))
    if rule == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif rule == "gpt2":
        tok.pre_tokenizer = byte_level
    else:
        regex = LLAMA3_REGEX if rule == "llama-bpe" else QWEN2_REGEX
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(regex), behavior="isolated"), byte_level])
    tok.decoder = decoders.ByteLevel()
    specials = [t for t, ty in zip(vocab["tokens"], vocab["token_types"]) if ty == CONTROL]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    for t in specials:
        assert tok.token_to_id(t) == vocab["tokens"].index(t), t
    return tok


FRAGMENTS = [
    "the", "The", " quick", "brown", " fox", "DOG", "Hello", "world", "naïve", "café", "Straße",
    "e\u0301", "a\u0308\u0301", "日本語", "中文", "한국어", "Привет", "Καλημέρα", "שלום", "مرحبا",
    "नमस्ते", "สวัสดี", "😀", "🚀", "👍🏽", "👨\u200d👩\u200d👧", "🇫🇷", "❤️", "'s", "'t", "'re",
    "'ve", "'m", "'ll", "'d", "'S", "'LL", "'Re", "ſ", "'ſ", "'", "''", "\"", ".", ",", "!?",
    "...", "()", "{}", "[]", "<", ">", "<|", "|>", "<|im_start|>", "<|im_end|>", "<|endoftext|>",
    "<|im_", "_", "-", "+", "=", "#", "@", "$", "%", "&", "*", "/", "\\", "`", "~", "^", ":",
    ";", "²", "½", "٣", "४", "Ⅻ", "\u00a0", "\u3000", "\u2009", "\u2028", "\u0085", "\x0b",
    "\x0c", "\x1c", "\u200b", "\ufeff",
    # Bytes SmolLM2's vocabulary has no symbol for: dropped before merging, as in `tokenizers`.
    "\x04", ".\x04.", "(\x06)", "\x13\x14", "\U00040000",
]


def random_case(rng):
    parts = []
    for _ in range(rng.randint(1, 24)):
        kind = rng.random()
        if kind < 0.45:
            parts.append(rng.choice(FRAGMENTS))
        elif kind < 0.6:
            parts.append(rng.choice([" ", "\t", "\n", "\r\n", "\r"]) * rng.randint(1, 5))
        elif kind < 0.75:
            parts.append("".join(rng.choice("0123456789") for _ in range(rng.randint(1, 9))))
        elif kind < 0.9:
            parts.append(" ")
        else:
            parts.append(chr(rng.choice([rng.randint(0x20, 0x7E), rng.randint(0xA0, 0x2FFF),
                                         rng.randint(0x4E00, 0x9FFF),
                                         rng.randint(0x1F300, 0x1FAFF)])))
    return "".join(parts)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--random-cases", type=int, default=1500)
    args = parser.parse_args()

    vocab = read_vocab(args.model)
    with open(args.corpus, encoding="utf-8", newline="") as f:
        corpus = f.read()
    cases = [{"name": "corpus (whole)", "text": corpus}]
    for i, line in enumerate(corpus.split("\n")):
        cases.append({"name": f"corpus line {i + 1}", "text": line})
    rng = random.Random(20240509)
    for i in range(args.random_cases):
        cases.append({"name": f"random case {i}", "text": random_case(rng)})

    rules = {}
    for rule in ("smollm", "gpt2", "llama-bpe", "qwen2"):
        tok = build(vocab, rule)
        tok.encode_special_tokens = False
        special = [tok.encode(c["text"], add_special_tokens=False).ids for c in cases]
        tok.encode_special_tokens = True
        plain = [tok.encode(c["text"], add_special_tokens=False).ids for c in cases]
        rules[rule] = {"special": special, "plain": plain}

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(args.out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump({"cases": cases, "rules": rules}, f, ensure_ascii=False)
    print(f"hf_reference: {len(vocab['tokens'])} tokens, {len(vocab['merges'])} merges, "
          f"{len(cases)} cases -> {args.out}")


if __name__ == "__main__":
    main()
