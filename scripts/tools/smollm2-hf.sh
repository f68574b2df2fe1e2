#!/usr/bin/env bash
# smollm2-hf.sh: prints the path of a directory under the cache outside the repository
# (${KVROUTE_CACHE:-~/.cache/kvroute}/models/SmolLM2-135M-Instruct-hf) holding the project's demo model,
# SmolLM2-135M-Instruct, in Hugging Face's format for vLLM: config.json, model.safetensors (float32, 538 MB),
# tokenizer.json, tokenizer_config.json (with the chat template), chat_template.jinja and
# generation_config.json. No registry package ships SmolLM2 in that format, so it is converted on first use
# from the Q4_1 GGUF file that scripts/fetch-model.sh fetches: Hugging Face's transformers (in the vLLM
# environment of scripts/tools/vllm.sh, with gguf and accelerate added to it) dequantizes the weights.
# The conversion checks that the tokenizer matches the GGUF one and that greedy decoding of
# "The capital of France is" gives " Paris". Exit status 1 when it cannot be made.
set -euo pipefail
cd "$(dirname "$0")/../.."

dir="${KVROUTE_CACHE:-$HOME/.cache/kvroute}/models/SmolLM2-135M-Instruct-hf"
stamp="SmolLM2-135M-Instruct.Q4_1.gguf float32 v1"
if [ "$(cat "$dir/.converted" 2>/dev/null)" = "$stamp" ]; then
  echo "$dir"
  exit 0
fi
gguf=$(scripts/fetch-model.sh) || { echo "smollm2-hf: could not fetch the GGUF model" >&2; exit 1; }
venv=$(scripts/tools/vllm.sh) || { echo "smollm2-hf: could not set up the vLLM environment" >&2; exit 1; }
if ! "$venv/bin/python" -c 'import gguf, accelerate' 2>/dev/null; then
  echo "smollm2-hf: adding gguf and accelerate to $venv" >&2
  if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check gguf==0.19.0 accelerate==1.15.0 >&2; then
    echo "smollm2-hf: could not install gguf==0.19.0 and accelerate==1.15.0 into $venv" >&2
    exit 1
  fi
fi
echo "smollm2-hf: converting $gguf into $dir ..." >&2
rm -rf "$dir" "$dir.part"
mkdir -p "$dir.part"
if ! "$venv/bin/python" - "$gguf" "$dir.part" >&2 <<'PY'; then
import json, os, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

gguf_path, out = sys.argv[1], sys.argv[2]
folder, name = os.path.split(gguf_path)
tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
# Saved as a plain float32 model: no quantization left to describe.
model.hf_quantizer = None
if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
model.config.architectures = ["LlamaForCausalLM"]
model.save_pretrained(out)
tokenizer.save_pretrained(out)

# transformers 5 keeps the chat template in chat_template.jinja; older readers look in tokenizer_config.json.
config_path = os.path.join(out, "tokenizer_config.json")
with open(config_path) as f:
    config = json.load(f)
config["chat_template"] = tokenizer.chat_template
with open(config_path, "w") as f:
    json.dump(config, f, indent=2, ensure_ascii=False)
    f.write("\n")

# The converted model, reloaded from disk: the GGUF tokenizer's ids and the expected greedy answer.
tokenizer = AutoTokenizer.from_pretrained(out)
ids = tokenizer("The capital of France is Paris.")["input_ids"]
if ids != [504, 3575, 282, 4649, 314, 7042, 30]:
    sys.exit(f"unexpected token ids {ids}")
if not tokenizer.chat_template:
    sys.exit("no chat template")
model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
prompt = tokenizer("The capital of France is", return_tensors="pt")
generated = model.generate(**prompt, max_new_tokens=1, do_sample=False)
answer = tokenizer.decode(generated[0, prompt["input_ids"].shape[1]:])
if answer != " Paris":
    sys.exit(f"greedy answer {answer!r}, expected ' Paris'")
PY
  echo "smollm2-hf: converting $gguf failed" >&2
  rm -rf "$dir.part"
  exit 1
fi
echo "$stamp" >"$dir.part/.converted"
mv "$dir.part" "$dir"
echo "$dir"
