#!/usr/bin/env python3
"""Generates cl100k_golden.json: reference encodings of the built-in tokenizer.

The ids come from OpenAI's `tiktoken` package (pip install tiktoken), fed with
the same rank file the gateway embeds, so no download is needed:

    python3 gateway/testdata/gen_cl100k_golden.py

Each case holds the text, its ids with special tokens recognized
(`encode(..., allowed_special="all")`) and its ids with special tokens as
plain text (`encode_ordinary`).
"""

import json
import pathlib
import random

import tiktoken
import tiktoken.load

HERE = pathlib.Path(__file__).resolve().parent
RANKS = HERE.parent / "assets" / "cl100k_base.tiktoken"

PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
    r"""\s*[\r\n]+|\s+(?!\S)|\s+"""
)
SPECIALS = {
    "<|endoftext|>": 100257,
    "<|fim_prefix|>": 100258,
    "<|fim_middle|>": 100259,
    "<|fim_suffix|>": 100260,
    "<|im_start|>": 100264,
    "<|im_end|>": 100265,
    "<|endofprompt|>": 100276,
}

FIXED = [
    "",
    "hello world",
    "The capital of France is Paris.",
    "I'LL be there, they'd said; it's 'sure'. We'RE ready, you've seen.",
    "  leading spaces, trailing spaces   ",
    "tabs\tand\t\ttabs\n\nnewlines\r\n\r\nand   \n  mixed \t\n",
    "numbers: 0 7 42 123 1234 12345 3.14159 -273.15 1e10 0xFF 1,000,000",
    "emoji: 😀🎉👍🏽 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵",
    "Unicode: naïve café résumé Ångström Straße ﬁ ſtop 'ſ",
    "日本語のテキストと中文文本，还有한국어 텍스트。",
    "Русский текст и ελληνικά γράμματα, עברית, العربية ١٢٣٤٥",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{v:?}\");\n}\n",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n",
    "text<|endoftext|>more<|fim_prefix|>a<|fim_middle|>b<|fim_suffix|>c<|endofprompt|>",
    "<|im_start <|im_end| <|endoftext|",
    "a" * 300,
    " " * 100 + "x",
    "!@#$%^&*()_+-=[]{}|;':\",./<>?`~" * 3,
    "https://example.com/path?query=value&other=1#fragment",
    "\u00a0non-breaking\u00a0spaces\u3000ideographic\u2003em",
    "combining: e\u0301 a\u0308 o\u0302\u0323",
    "zero\u200bwidth\u200djoiner\ufeffbom",
    "Mixed CASE Words And ALLCAPS and camelCaseIdentifiers snake_case_names",
    "base64: " + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0NTY3ODkrLw==" * 4,
    "\n" * 10 + "end",
    "mathematical: ∀x∈ℝ, ∃y: x² + y² ≤ 1 ⇒ |x| ≤ 1; ∑ᵢ aᵢ = ∫ f(x) dx",
]

ATOMS = [
    " ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "'s", "'T", "'ll", "'ſ", "word", "Word", "WORD",
    "é", "ß", "日本", "한", "123", "4567", "٣", "½", "Ⅻ", "!?", "...", "->", "😀", "👍🏽", "\u0301",
    "<|im_end|>", "<|endoftext|>", "<|", "|>", "{", "}", "\"", "\\", "0x", "ـ", "ﷺ",
]


def random_cases(count: int) -> list:
    rng = random.Random(20240601)
    cases = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(1, 30)):
            if rng.random() < 0.15:
                parts.append(chr(rng.choice([rng.randint(0x20, 0x7E), rng.randint(0xA0, 0x2FFF), rng.randint(0x1F300, 0x1FAFF)])))
            else:
                parts.append(rng.choice(ATOMS))
        cases.append("".join(parts))
    return cases


def main() -> None:
    encoding = tiktoken.Encoding(
        name="cl100k_base",
        pat_str=PATTERN,
        mergeable_ranks=tiktoken.load.load_tiktoken_bpe(str(RANKS)),
        special_tokens=SPECIALS,
    )
    cases = []
    for text in FIXED + random_cases(300):
        cases.append(
            {
                "text": text,
                "ids": encoding.encode(text, allowed_special="all"),
                "ordinary_ids": encoding.encode_ordinary(text),
            }
        )
    out = {
        "generator": "gateway/testdata/gen_cl100k_golden.py",
        "tiktoken_version": tiktoken.__version__,
        "cases": cases,
    }
    (HERE / "cl100k_golden.json").write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
