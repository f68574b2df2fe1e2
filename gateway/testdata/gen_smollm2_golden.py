#!/usr/bin/env python3
"""Generates smollm2_golden.json: reference encodings of SmolLM2's GGUF tokenizer.

The reference is Hugging Face's `tokenizers` package (pip install tokenizers
gguf), built from the vocabulary and merges stored in the GGUF file with
SmolLM2's pre-tokenizer (individual digits, then byte-level):

    python3 gateway/testdata/gen_smollm2_golden.py [path/to/SmolLM2-135M-Instruct.Q4_1.gguf]

The default path is the one the tests use ($KVROUTE_CACHE or ~/.cache/kvroute,
then models/SmolLM2-135M-Instruct.Q4_1.gguf). The texts are those of
gen_cl100k_golden.py.
"""

import json
import os
import pathlib
import sys

import gguf
import tokenizers
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import gen_cl100k_golden  # noqa: E402


def default_model_path() -> pathlib.Path:
    cache = os.environ.get("KVROUTE_CACHE") or os.path.join(os.environ.get("HOME", "."), ".cache", "kvroute")
    return pathlib.Path(cache) / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def field_strings(reader, key):
    field = reader.fields[key]
    return [bytes(field.parts[i]).decode("utf-8") for i in field.data]


def field_ints(reader, key):
    field = reader.fields[key]
    return [int(field.parts[i][0]) for i in field.data]


def main() -> None:
    path = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else default_model_path()
    reader = gguf.GGUFReader(str(path))
    tokens = field_strings(reader, "tokenizer.ggml.tokens")
    types = field_ints(reader, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in field_strings(reader, "tokenizer.ggml.merges")]
    vocab = {text: i for i, text in enumerate(tokens)}

    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    specials = [AddedToken(text, special=True, normalized=False) for text, kind in zip(tokens, types) if kind == 3]
    tokenizer.add_special_tokens(specials)

    cases = []
    for text in gen_cl100k_golden.FIXED + gen_cl100k_golden.random_cases(300):
        tokenizer.encode_special_tokens = False
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        tokenizer.encode_special_tokens = True
        ordinary_ids = tokenizer.encode(text, add_special_tokens=False).ids
        cases.append({"text": text, "ids": ids, "ordinary_ids": ordinary_ids})
    out = {
        "generator": "gateway/testdata/gen_smollm2_golden.py",
        "model": path.name,
        "tokenizers_version": tokenizers.__version__,
        "cases": cases,
    }
    (HERE / "smollm2_golden.json").write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
