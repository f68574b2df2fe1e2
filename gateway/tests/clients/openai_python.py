"""Drives a kvroute gateway with the official OpenAI Python client, unchanged.

Usage: python openai_python.py BASE_URL   (e.g. http://127.0.0.1:8080/v1)
Prints one JSON object with what it observed; exits non-zero on any failure.
"""

import json
import sys

import openai

base_url = sys.argv[1]
client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)
seen = {}

models = client.models.list()
model = models.data[0].id
seen["model"] = model

system = "You are a meticulous assistant for a shipping company. " * 8
completion = client.completions.create(model=model, prompt=system + "Ledger:", max_tokens=6, temperature=0)
again = client.completions.create(model=model, prompt=system + "Ledger:", max_tokens=6, temperature=0)
seen["completion_text"] = completion.choices[0].text
seen["completion_again_text"] = again.choices[0].text
seen["completion_prompt_tokens"] = completion.usage.prompt_tokens
seen["completion_again_cached"] = again.usage.prompt_tokens_details.cached_tokens

chat = client.chat.completions.create(
    model=model,
    messages=[{"role": "system", "content": system}, {"role": "user", "content": "Say hello."}],
    max_tokens=6,
    temperature=0,
)
seen["chat_role"] = chat.choices[0].message.role
seen["chat_content_is_text"] = isinstance(chat.choices[0].message.content, str)
seen["chat_completion_tokens"] = chat.usage.completion_tokens

stream = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Count."}],
    max_tokens=5,
    stream=True,
    stream_options={"include_usage": True},
)
deltas, usage = [], None
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        deltas.append(chunk.choices[0].delta.content)
    if chunk.usage is not None:
        usage = chunk.usage
seen["stream_chunks"] = len(deltas)
seen["stream_completion_tokens"] = usage.completion_tokens if usage else None

try:
    client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
    seen["unknown_model"] = "accepted"
except openai.NotFoundError as error:
    seen["unknown_model"] = error.status_code
try:
    client.completions.create(model=model, prompt="x", max_tokens=-1)
    seen["negative_max_tokens"] = "accepted"
except openai.BadRequestError as error:
    seen["negative_max_tokens"] = error.status_code

print(json.dumps(seen))
