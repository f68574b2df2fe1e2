"""Puts the Hugging Face model $HF_MODEL (at $HF_REVISION) into $KVROUTE_MODEL_DIR unless it is there.
$MODEL_FILES: `all` (what vLLM loads: weights, configs, tokenizer) or `tokenizer` (tokenizer.json,
tokenizer_config.json with the chat template, config.json and their companions: what a gateway reads).
$HF_ENDPOINT is the Hub (or a mirror); $HF_TOKEN, when set, is sent to it (gated and private models).
Standard library only. Each file is written beside its final name and renamed into place, so pods sharing a
volume never read half a file; an interrupted download resumes. A marker file records a completed fetch, so
a volume that holds the model starts without asking the Hub."""
import json, os, sys, time, urllib.error, urllib.parse, urllib.request

model = os.environ["HF_MODEL"]
revision = os.environ.get("HF_REVISION") or "main"
target = os.environ["KVROUTE_MODEL_DIR"]
scope = os.environ.get("MODEL_FILES", "all")
endpoint = (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
token = os.environ.get("HF_TOKEN", "")
if scope not in ("all", "tokenizer"):
    sys.exit(f"fetch-model: MODEL_FILES must be `all` or `tokenizer`, not {scope!r}")

TOKENIZER_FILES = {
    "tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json",
    "special_tokens_map.json", "chat_template.jinja", "chat_template.json",
}
# What vLLM reads of a checkpoint: configs, tokenizers, safetensors weights (.bin/.pt only without them) and
# custom code. Not original/ (a second copy of the weights in some repositories), GGUF, ONNX, ...
KEEP = (".json", ".safetensors", ".model", ".txt", ".jinja", ".py", ".tiktoken")
FALLBACK_WEIGHTS = (".bin", ".pt")

def fetched(scope):
    """Whether a completed fetch of this model and revision, of these files, is recorded in the directory."""
    marker = os.path.join(target, f".kvroute-fetched-{scope}")
    return os.path.isfile(marker) and open(marker).read() == f"{model}@{revision}\n"


# A fetch of everything holds the tokenizer too.
if fetched(scope) or fetched("all"):
    print(f"fetch-model: {model}@{revision} is in {target}")
    sys.exit(0)


class DropAuthOffHost(urllib.request.HTTPRedirectHandler):
    """Follows redirects, but sends the token only to the Hub itself, not to the storage it redirects to."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urllib.parse.urlsplit(newurl).netloc != urllib.parse.urlsplit(req.full_url).netloc:
            new.remove_header("Authorization")
        return new


opener = urllib.request.build_opener(DropAuthOffHost)


def request(url, headers=None):
    headers = dict(headers or {})
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return opener.open(urllib.request.Request(url, headers=headers), timeout=60)


def retried(what, action, attempts=5):
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except urllib.error.HTTPError as error:
            if error.code in (401, 403, 404):
                hint = " (gated or private: set model.download.hfTokenSecret)" if error.code in (401, 403) else ""
                sys.exit(f"fetch-model: {what}: HTTP {error.code}{hint}")
            problem = error
        except (OSError, ValueError) as error:
            problem = error
        if attempt == attempts:
            sys.exit(f"fetch-model: {what}: {problem}")
        print(f"fetch-model: {what}: {problem}; retrying", flush=True)
        time.sleep(2 * attempt)


quoted = urllib.parse.quote(model, safe="/")
# The pod's name: pods sharing a volume keep their partial files apart.
host = os.environ.get("HOSTNAME", "pod")


def listing():
    url = f"{endpoint}/api/models/{quoted}/revision/{urllib.parse.quote(revision, safe='')}?blobs=true"
    with request(url) as response:
        return json.load(response)


info = retried(f"listing {model}@{revision}", listing)
commit = info.get("sha") or revision
files = {s["rfilename"]: s.get("size") for s in info.get("siblings", [])}
if "tokenizer.json" not in files:
    sys.exit(f"fetch-model: {model} has no tokenizer.json, which kvroute's gateways and agents read")
if scope == "tokenizer":
    wanted = sorted(name for name in files if name in TOKENIZER_FILES)
else:
    top = [name for name in files if not name.startswith("original/")]
    has_safetensors = any(name.endswith(".safetensors") for name in top)
    keep = KEEP if has_safetensors else KEEP + FALLBACK_WEIGHTS
    wanted = sorted(name for name in top if name.endswith(keep))


def fetch(name, size):
    path = os.path.join(target, name)
    if size is not None and os.path.isfile(path) and os.path.getsize(path) == size:
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    part = f"{path}.part-{host}"
    have = os.path.getsize(part) if os.path.isfile(part) else 0
    if size is not None and have >= size:
        if have == size:
            os.replace(part, path)
            return
        os.remove(part)
        have = 0
    headers = {"Range": f"bytes={have}-"} if have else {}
    url = f"{endpoint}/{quoted}/resolve/{commit}/{urllib.parse.quote(name)}"
    with request(url, headers) as response:
        mode = "ab" if have and response.status == 206 else "wb"
        with open(part, mode) as out:
            while chunk := response.read(1 << 20):
                out.write(chunk)
    got = os.path.getsize(part)
    if size is not None and got != size:
        if got > size:
            os.remove(part)
        # Short: the next attempt resumes from what arrived.
        raise ValueError(f"{got} bytes of {size}")
    os.replace(part, path)


os.makedirs(target, exist_ok=True)
total = sum(files[name] or 0 for name in wanted)
print(f"fetch-model: {len(wanted)} files of {model}@{commit[:12]} ({total / 2**30:.2f} GiB) into {target}", flush=True)
for name in wanted:
    retried(name, lambda: fetch(name, files[name]))
    print(f"fetch-model: {name}", flush=True)
marker = os.path.join(target, f".kvroute-fetched-{scope}")
with open(f"{marker}.{host}", "w") as file:
    file.write(f"{model}@{revision}\n")
os.replace(f"{marker}.{host}", marker)
print(f"fetch-model: {model}@{revision} ready in {target}")
