#!/usr/bin/env python3
"""Packs the reference test data into tests/data/*.tar.xz (see tests/data/README.md).

The archives are deterministic, so one changes in git only when its data does: names sorted,
every mtime 0, owner root with no user or group names, modes 0644 (files) and 0755 (folders),
ustar headers, xz preset 9e with a CRC64 check. The same input gives the same bytes with the same
liblzma.

Usage: python3 tests/data/pack.py SOURCE_DIR
  SOURCE_DIR holds stories260K/ and tokenizers/<name>/, as the build unpacks them
  (<build>/testdata). Each archive below is rewritten from its folder.
"""
import argparse
import io
import lzma
import os
import sys
import tarfile

HERE = os.path.dirname(os.path.abspath(__file__))

# Archive name (without .tar.xz) -> the folder it holds, relative to the test-data root. The
# build's list (tests/data/CMakeLists.txt) names the same archives.
ARCHIVES = {
    "stories260K": "stories260K",
    "tokenizer-llama3": "tokenizers/llama3",
    "tokenizer-qwen3": "tokenizers/qwen3",
    "tokenizer-mistral-spm": "tokenizers/mistral-spm",
    "tokenizer-gemma3": "tokenizers/gemma3",
}


def entries(root, folder):
    """(archive name, path on disk) for `folder` and everything under it, sorted by name."""
    out = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, folder)):
        dirnames.sort()
        for name in [dirpath] + [os.path.join(dirpath, f) for f in filenames]:
            out.append((os.path.relpath(name, root).replace(os.sep, "/"), name))
    return sorted(out)


def tar_bytes(root, folder):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, path in entries(root, folder):
            info = tarfile.TarInfo(name)
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if os.path.isdir(path):
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
            elif os.path.isfile(path) and not os.path.islink(path):
                info.mode = 0o644
                info.size = os.path.getsize(path)
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                sys.exit(f"pack: {path} is neither a plain file nor a folder")
    return buf.getvalue()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", help="folder holding stories260K/ and tokenizers/")
    args = ap.parse_args()
    for archive, folder in ARCHIVES.items():
        if not os.path.isdir(os.path.join(args.source, folder)):
            sys.exit(f"pack: no {folder}/ under {args.source}")
        data = lzma.compress(tar_bytes(args.source, folder), format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64,
                             preset=9 | lzma.PRESET_EXTREME)
        out = os.path.join(HERE, archive + ".tar.xz")
        with open(out, "wb") as f:
            f.write(data)
        print(f"{os.path.relpath(out)}: {len(data)} bytes")


if __name__ == "__main__":
    main()
