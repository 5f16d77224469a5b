"""Builds PufferLib 3.0.0 from its source archive into this peer's virtual environment, as
`make bench-peers` needs it (run by the peer's own interpreter, after requirements.txt).

Why not `pip install pufferlib==3.0.0`: the registry has only the source archive, and its
setup.py downloads raylib and box2d from the web when it runs (no such access here), and with
`nvcc` on PATH it builds a CUDA extension (`CUDA_HOME environment variable is not set` on a
machine without the toolkit). Nothing in the archive is edited. Instead:

- the archive is fetched from the package index pip is configured with (read from `pip config`,
  its sha256 checked against the index's) and unpacked under .venv/src: `pip download` cannot
  fetch it either, since it runs the same setup.py to read its metadata;
- the folders its setup.py would download into are made empty (its Ocean C envs need them;
  the Atari race does not use Ocean);
- only its torch kernel (`pufferlib._C`, the advantage computation its trainer imports) is
  built, with every directory holding `nvcc` left off PATH so that it is the CPU build.

The trainer then runs from that tree (train_puffer.py puts it on sys.path).
"""
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path
from urllib.parse import urljoin

VERSION = "3.0.0"
SOURCE = Path(sys.prefix) / "src"
TREE = SOURCE / f"pufferlib-{VERSION}"
DOWNLOAD_FOLDERS = ("raylib-5.5_webassembly", "box2d-web", "box2d-linux-amd64")


def index_urls() -> list[str]:
    """The simple indexes pip would look in: its configured index (or its default) and the extra ones."""
    from pip._internal.models.index import PyPI  # pip's default index, so that no host is named here
    configured = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                                check=True).stdout
    found = dict(re.findall(r"^[^.\s]*\.(index-url|extra-index-url)='([^']*)'", configured, re.MULTILINE))
    main = os.environ.get("PIP_INDEX_URL") or found.get("index-url") or PyPI.simple_url
    extra = (os.environ.get("PIP_EXTRA_INDEX_URL") or found.get("extra-index-url") or "").split()
    return [main, *extra]


def fetch_archive(name: str) -> Path:
    for index in index_urls():
        page_url = f"{index.rstrip('/')}/pufferlib/"
        try:
            with urllib.request.urlopen(page_url, timeout=60) as page:
                html = page.read().decode()
        except OSError:
            continue
        for href in re.findall(r'href="([^"]+)"', html):
            url, _, fragment = urljoin(page_url, href).partition("#")
            if url.rsplit("/", 1)[-1] != name:
                continue
            target = SOURCE / name
            urllib.request.urlretrieve(url, target)
            expected = fragment.removeprefix("sha256=") if fragment.startswith("sha256=") else None
            if expected and hashlib.sha256(target.read_bytes()).hexdigest() != expected:
                target.unlink()
                raise SystemExit(f"{name} from {page_url}: its sha256 is not the index's")
            return target
    raise SystemExit(f"{name}: not found in the package indexes pip is configured with ({', '.join(index_urls())})")


def cpu_only_path() -> str:
    return os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                           if d and not (Path(d) / "nvcc").exists())


def main() -> None:
    if not TREE.exists():
        SOURCE.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fetch_archive(f"pufferlib-{VERSION}.tar.gz")) as archive:
            archive.extractall(SOURCE, filter="data")
    for folder in DOWNLOAD_FOLDERS:
        (TREE / folder).mkdir(exist_ok=True)
    environment = dict(os.environ, PATH=cpu_only_path())
    subprocess.run([sys.executable, "setup.py", "build_torch", "--inplace"], cwd=TREE, env=environment, check=True,
                   stdout=subprocess.DEVNULL)
    shutil.rmtree(TREE / "build", ignore_errors=True)
    # the kernel links against torch's libraries, which only importing torch loads
    subprocess.run([sys.executable, "-c", "import torch, pufferlib._C"], cwd=TREE, check=True)
    print(f"built PufferLib {VERSION}'s CPU kernel in {TREE}", flush=True)


if __name__ == "__main__":
    main()
