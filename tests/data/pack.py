#!/usr/bin/env python3
"""Packs the reference test data into tests/data/*.tar.xz (see tests/data/README.md).

The archives are deterministic (tools/pack_archive.py), so one changes in git only when its data
does.

Usage: python3 tests/data/pack.py SOURCE_DIR
  SOURCE_DIR holds stories260K/ and tokenizers/<name>/, as the build unpacks them
  (<build>/testdata). Each archive below is rewritten from its folder.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
from pack_archive import write_archive  # noqa: E402

# Archive name (without .tar.xz) -> the folder it holds, relative to the test-data root. The
# build's list (tests/data/CMakeLists.txt) names the same archives.
ARCHIVES = {
    "stories260K": "stories260K",
    "tokenizer-llama3": "tokenizers/llama3",
    "tokenizer-qwen3": "tokenizers/qwen3",
    "tokenizer-mistral-spm": "tokenizers/mistral-spm",
    "tokenizer-gemma3": "tokenizers/gemma3",
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", help="folder holding stories260K/ and tokenizers/")
    args = ap.parse_args()
    for archive, folder in ARCHIVES.items():
        if not os.path.isdir(os.path.join(args.source, folder)):
            sys.exit(f"pack: no {folder}/ under {args.source}")
        out = os.path.join(HERE, archive + ".tar.xz")
        print(f"{os.path.relpath(out)}: {write_archive(args.source, folder, out)} bytes")


if __name__ == "__main__":
    main()
