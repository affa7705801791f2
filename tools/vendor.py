"""The site's JavaScript (MathJax and mermaid) and GPT-2's tokenizer files, from npm packages pinned by hash.

`tools/vendor.lock.json` names each npm package by exact version and by the SHA-512 of its tarball (npm's
`integrity`), and lists the files needed from it. This fetches exactly those tarballs with `npm pack` (the
packages alone, none of their dependencies), refuses any whose hash is not the one recorded, and unpacks only
the listed files into the package's folder (`into`, by default docs/assets/vendor/; both are in .gitignore).
A file may also carry its own SHA-256 (`sha256`): GPT-2's `encoder.json` and `vocab.bpe` are checked against
the hashes tiktoken publishes for them, so the files are the ones every GPT-2 tokenizer reads, whoever packed
them. scripts/setup runs it when a file is missing.

    python -m tools.vendor             # fetch, check and unpack
    python -m tools.vendor --refresh   # after changing a version in the lock: record the registry's hash

Nothing is executed from the packages and no path is taken from inside a tarball: each file is written to the
place the lock names.
"""

import argparse
import base64
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "tools" / "vendor.lock.json"
VENDOR = "docs/assets/vendor"  # where a package's files go unless the lock says `into`


class VendorError(Exception):
    """A tarball that is not the one the lock records, or a listed file it lacks."""


def integrity(path):
    """npm's integrity string of a file: "sha512-" and the base64 of its SHA-512."""
    return "sha512-" + base64.b64encode(hashlib.sha512(Path(path).read_bytes()).digest()).decode()


def check(tarball, name, expected):
    got = integrity(tarball)
    if got != expected:
        raise VendorError(f"{name}: the tarball's SHA-512 is {got}, the lock records {expected or 'nothing'} "
                          f"(run `python -m tools.vendor --refresh` only if you changed its version on purpose)")


def unpack(tarball, files, dest):
    """Write each listed member (a file, or every file under a folder ending in "/") to dest / its target."""
    with tarfile.open(tarball, "r:gz") as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
        for source, target in files.items():
            chosen = [m for m in members if (m.name.startswith(source) if source.endswith("/") else m.name == source)]
            if not chosen:
                raise VendorError(f"{Path(tarball).name} has no {source}")
            for m in chosen:
                out = dest / (target + m.name[len(source):] if source.endswith("/") else target)
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(tar.extractfile(m).read())


def npm_pack(name, version, into):
    """Download one package's tarball with npm; its path."""
    done = subprocess.run(["npm", "pack", "--silent", "--json", "--pack-destination", str(into), f"{name}@{version}"],
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise VendorError(f"npm pack {name}@{version} failed: {done.stderr.strip()}")
    return Path(into) / json.loads(done.stdout)[0]["filename"]


def check_files(folder, sha256, name):
    """Each file's SHA-256 against the one the lock records for it."""
    for target, expected in sha256.items():
        got = hashlib.sha256((folder / target).read_bytes()).hexdigest()
        if got != expected:
            raise VendorError(f"{name}: {target} has SHA-256 {got}, the lock records {expected}")


def install(lock, root=ROOT):
    """Fetch, check and unpack every package of the lock into its folder under root; each folder is replaced
    whole, and only once every package has been fetched and checked."""
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / "staged"
        for name, entry in lock.items():
            tarball = npm_pack(name, entry["version"], tmp)
            check(tarball, name, entry["integrity"])
            folder = staged / entry.get("into", VENDOR)
            unpack(tarball, entry["files"], folder)
            check_files(folder, entry.get("sha256", {}), name)
        for into in {entry.get("into", VENDOR) for entry in lock.values()}:
            shutil.rmtree(root / into, ignore_errors=True)
            shutil.copytree(staged / into, root / into)


def refresh(lock):
    """The lock with each package's integrity as the registry reports it for the version named."""
    for name, entry in lock.items():
        done = subprocess.run(["npm", "view", f"{name}@{entry['version']}", "dist.integrity"],
                              capture_output=True, text=True, check=True)
        entry["integrity"] = done.stdout.strip()
    return lock


def named(lock):
    return ", ".join(f"{name}@{entry['version']}" for name, entry in lock.items())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--refresh", action="store_true", help="record the registry's hashes in the lock")
    args = parser.parse_args(argv)
    lock = json.loads(LOCK.read_text())
    try:
        if args.refresh:
            LOCK.write_text(json.dumps(refresh(lock), indent=2) + "\n")
            print(f"recorded the hashes of {named(lock)} in {LOCK}")
        else:
            install(lock)
            print(f"unpacked {named(lock)} into {', '.join(sorted({e.get('into', VENDOR) for e in lock.values()}))}")
    except VendorError as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
