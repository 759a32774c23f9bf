#!/usr/bin/env python3
"""Checks the module dependency rules of ARCHITECTURE.md against the code.

The rules are the table under "## Module map" in ARCHITECTURE.md: one row per module (a
top-level folder), its job, and the modules it may use. This script reads that table and fails
when
  * a source file of a module (.h .cpp .cu .cuh) includes a header of a module it may not use
    (`#include "kernels/gemm.h"` in engine/ when the engine may not use kernels), or
  * a CMake target defined in a module's CMakeLists.txt links a tessera_* library of a module it
    may not use, or
  * a module marked "no sockets" includes a socket, ZeroMQ or control-channel header, or a module
    marked "no CUDA" includes a CUDA header,
  * a folder with sources is missing from the table.
Test, benchmark and fuzz folders (tests/, bench/, fuzz/) may use everything and are not checked.

Usage: check_layering.py [--root DIR]   (exit 0: clean; 1: violations, each printed with file:line)
"""
import argparse
import os
import re
import sys

SOURCE_EXT = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")
UNCHECKED = {"tests", "bench", "fuzz", "build", "docs", "scripts", "cmake", "models"}
SOCKET_HEADERS = re.compile(r'#include\s*[<"](sys/socket\.h|netinet/[^>"]+|arpa/inet\.h|zmq\.h|zmq\.hpp|'
                            r'comm/control_channel\.h|httplib\.h)[>"]')
CUDA_HEADERS = re.compile(r'#include\s*[<"](cuda[^/>"]*\.h|cublas[^>"]*\.h|nccl\.h|cuda_runtime[^>"]*)[>"]')
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"/]+)/[^"]+"')


def read_rules(root):
    """{module: (allowed set, flags set)} from ARCHITECTURE.md's module map."""
    path = os.path.join(root, "ARCHITECTURE.md")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    start = text.find("## Module map")
    if start < 0:
        sys.exit(f"{path}: no '## Module map' section")
    rules = {}
    for line in text[start:].splitlines()[1:]:
        if line.startswith("## "):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        module = cells[0].strip("`/ ")
        uses = cells[2]
        allowed = set(re.findall(r"`([a-z_]+)/?`", uses))
        flags = set()
        if "no sockets" in uses:
            flags.add("no-sockets")
        if "no CUDA" in uses:
            flags.add("no-cuda")
        if "everything" in uses:
            flags.add("everything")
        rules[module] = (allowed, flags)
    if not rules:
        sys.exit(f"{path}: the module map has no rows")
    return rules


def library_modules(root):
    """{cmake library target: module folder} for every add_library in the tree."""
    targets = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        top = rel.split(os.sep)[0]
        if top.startswith(".") or top in ("build",) or top.startswith("build"):
            dirnames[:] = []
            continue
        if "CMakeLists.txt" in filenames:
            with open(os.path.join(dirpath, "CMakeLists.txt"), encoding="utf-8") as f:
                for name in re.findall(r"add_library\(\s*(tessera_\w+)", f.read()):
                    targets[name] = top if rel != "." else "."
    return targets


def strip_comments(cmake_text):
    return "\n".join(line.split("#", 1)[0] for line in cmake_text.splitlines())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    root = os.path.abspath(ap.parse_args().root)
    rules = read_rules(root)
    libs = library_modules(root)
    errors = []

    def allowed(module, other):
        own, flags = rules[module]
        return other == module or other in own or "everything" in flags

    modules = sorted(d for d in os.listdir(root)
                     if os.path.isdir(os.path.join(root, d)) and not d.startswith(".") and not d.startswith("build")
                     and d not in UNCHECKED)
    for module in modules:
        files = []
        for dirpath, _, filenames in os.walk(os.path.join(root, module)):
            files += [os.path.join(dirpath, n) for n in filenames if n.endswith(SOURCE_EXT)]
        if not files:
            continue
        if module not in rules:
            errors.append(f"{module}/: has sources but no row in ARCHITECTURE.md's module map")
            continue
        _, flags = rules[module]
        for path in sorted(files):
            rel = os.path.relpath(path, root)
            with open(path, encoding="utf-8", errors="replace") as f:
                for n, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if m and m.group(1) in rules and not allowed(module, m.group(1)):
                        errors.append(f"{rel}:{n}: {module}/ may not use {m.group(1)}/ ({line.strip()})")
                    if "no-sockets" in flags and SOCKET_HEADERS.search(line):
                        errors.append(f"{rel}:{n}: {module}/ does no socket I/O ({line.strip()})")
                    if "no-cuda" in flags and CUDA_HEADERS.search(line):
                        errors.append(f"{rel}:{n}: {module}/ does not use CUDA ({line.strip()})")
        cmake = os.path.join(root, module, "CMakeLists.txt")
        if os.path.exists(cmake):
            with open(cmake, encoding="utf-8") as f:
                text = strip_comments(f.read())
            for call in re.finditer(r"target_link_libraries\(([^)]*)\)", text):
                words = call.group(1).split()
                for lib in words[1:]:
                    other = libs.get(lib)
                    if other and other != "." and other in rules and not allowed(module, other):
                        line = text[:call.start()].count("\n") + 1
                        errors.append(f"{module}/CMakeLists.txt:{line}: {words[0]} links {lib}, "
                                      f"but {module}/ may not use {other}/")
    for e in errors:
        print(e)
    if errors:
        print(f"layering: {len(errors)} violation(s) of ARCHITECTURE.md's module map")
        return 1
    print(f"layering: {len(modules)} folders checked against ARCHITECTURE.md's module map: clean")
    return 0


if __name__ == "__main__":
    sys.exit(main())
