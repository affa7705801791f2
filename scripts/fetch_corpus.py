"""Put the Tiny Shakespeare corpus at data/tinyshakespeare/input.txt.

Copies it from a local folder when one holds it (the shared folder beside the
project, or $TINYSHAKESPEARE), otherwise downloads it from its public address.
Either way the file's SHA-256 must match, so a partial download or another
file is never used.
"""

import hashlib
import os
import shutil
import sys
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "data" / "tinyshakespeare" / "input.txt"
URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
LOCAL_COPIES = [os.environ.get("TINYSHAKESPEARE", ""),
                ROOT.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"]


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def main():
    if TARGET.is_file() and sha256(TARGET) == SHA256:
        print(f"corpus: {TARGET.relative_to(ROOT)} is in place")
        return 0
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    partial = TARGET.with_suffix(".partial")
    source = next((Path(p) for p in LOCAL_COPIES if p and Path(p).is_file()), None)
    try:
        if source is not None:
            shutil.copyfile(source, partial)
        else:
            print(f"corpus: downloading {URL}")
            with urllib.request.urlopen(URL, timeout=60) as response, open(partial, "wb") as f:
                shutil.copyfileobj(response, f)
    except OSError as e:
        print(f"error: could not fetch the corpus ({e}); put it at {TARGET} or set TINYSHAKESPEARE",
              file=sys.stderr)
        return 1
    if sha256(partial) != SHA256:
        partial.unlink()
        print(f"error: the corpus from {source or URL} has the wrong checksum", file=sys.stderr)
        return 1
    partial.replace(TARGET)
    print(f"corpus: {TARGET.relative_to(ROOT)} ({TARGET.stat().st_size:,} bytes) from {source or URL}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
