"""Fetch a pinned source distribution from the package index (PEP 503 simple API, as pip reads
it: $PIP_INDEX_URL, else PyPI), check its sha256 and extract the given members.

usage: fetch.py NAME VERSION SHA256 DEST MEMBER...

pip itself cannot fetch vLLM's sdist without building it: `pip download` prepares the sdist's
metadata, which runs vLLM's setup.py (it imports torch and CMake machinery).
"""

import hashlib
import html.parser
import os
import ssl
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request


class Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.hrefs += [v for k, v in attrs if k == "href" and v]


def main() -> int:
    name, version, sha256, dest, *members = sys.argv[1:]
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    cafile = os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE")
    ctx = ssl.create_default_context(cafile=cafile if cafile and os.path.exists(cafile) else None)
    page_url = f"{index}/{name}/"
    with urllib.request.urlopen(page_url, timeout=120, context=ctx) as r:
        parser = Links()
        parser.feed(r.read().decode())
    filename = f"{name}-{version}.tar.gz"
    urls = [urllib.parse.urljoin(page_url, h) for h in parser.hrefs
            if urllib.parse.urlsplit(h).path.endswith("/" + filename)]
    if not urls:
        print(f"fetch: {page_url} lists no {filename}", file=sys.stderr)
        return 1
    url = urls[0].split("#")[0]
    digest = hashlib.sha256()
    with tempfile.TemporaryFile() as f:
        with urllib.request.urlopen(url, timeout=600, context=ctx) as r:
            while chunk := r.read(1 << 20):
                digest.update(chunk)
                f.write(chunk)
        if digest.hexdigest() != sha256:
            print(f"fetch: {url} has sha256 {digest.hexdigest()}, not the pinned {sha256}",
                  file=sys.stderr)
            return 1
        f.seek(0)
        prefix = f"{name}-{version}/"
        with tarfile.open(fileobj=f, mode="r:gz") as tar:
            picked = [m for m in tar.getmembers()
                      if any(m.name == prefix + p or m.name.startswith(prefix + p.rstrip("/") + "/")
                             for p in members)]
            for m in picked:
                m.name = m.name[len(prefix):]
            if hasattr(tarfile, "data_filter"):
                tar.extractall(dest, members=picked, filter="data")
            else:  # an interpreter before the extraction filters (checked above: no escapes)
                for m in picked:
                    if m.name.startswith("/") or ".." in m.name.split("/") or m.islnk() \
                            or m.issym():
                        print(f"fetch: refusing {m.name} of {filename}", file=sys.stderr)
                        return 1
                tar.extractall(dest, members=picked)
    print(f"fetch: {filename} ({len(picked)} files of it) from {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
