#!/usr/bin/env python3
"""Writes deterministic .tar.xz archives of data committed to the repository (the reference test
data, tests/data/pack.py; the fuzz seed corpora, fuzz/make_seeds.py). An archive changes in git
only when its data does: names sorted, every mtime 0, owner root with no user or group names,
modes 0644 (files) and 0755 (folders), ustar headers, xz preset 9e with a CRC64 check. The same
input gives the same bytes with the same liblzma. The build unpacks them with
tessera_unpack_archive (CMakeLists.txt).

Usage as a module: write_archive(ROOT, FOLDER, OUT) packs ROOT/FOLDER (and everything under it,
as FOLDER/...) into OUT and returns its size in bytes.
"""
import io
import lzma
import os
import sys
import tarfile


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
                sys.exit(f"pack_archive: {path} is neither a plain file nor a folder")
    return buf.getvalue()


def write_archive(root, folder, out):
    data = lzma.compress(tar_bytes(root, folder), format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64,
                         preset=9 | lzma.PRESET_EXTREME)
    with open(out, "wb") as f:
        f.write(data)
    return len(data)
