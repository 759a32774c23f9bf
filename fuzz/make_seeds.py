#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpus, one archive a target, fuzz/corpus/<target>.tar.xz
(committed; rerun after a format change): small valid inputs of every kind each parser takes,
so mutation starts deep inside the format instead of at its magic number. The seeds are written
into a scratch folder, <target>/<seed>, then packed; the build unpacks each archive into
<build>/fuzz-corpus/<target>/ for its fuzz_corpus_<target> test, scripts/fuzz.sh into its own
scratch folder.

  python3 fuzz/make_seeds.py --bin-dir build/bin
  (--testdata: the reference test data, by default $TESSERA_TESTDATA, else the copy the build
  unpacks from tests/data/ beside the binaries, <bin-dir>/../testdata)
  python3 fuzz/make_seeds.py --pack DIR
  (packs the seeds already in DIR/<target>/, as they are, and writes none: e.g. an archive
  unpacked, one seed edited by hand, packed again; or only the control codec's seeds new,
  `build/bin/tessera_fuzz_control_seeds DIR/control_codec` first)

The archives are deterministic (tools/pack_archive.py, which also writes the test data's), so
one changes in git only when its seeds do.
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tools"))
from pack_archive import write_archive  # noqa: E402
SEP = b"\n\x00\n"  # splits an input in two documents (fuzz/fuzz_input.h)
# The fuzz targets, as fuzz/CMakeLists.txt lists them: one archive each.
TARGETS = ("gguf", "safetensors", "tokenizer_json", "chat_template", "control_codec", "http_request",
           "structured_request")


def out_dir(root, name):
    d = os.path.join(root, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    return d


def gguf_seeds(root, bin_dir):
    """Tiny synthetic models (tessera-make-model): llama Q8_0 with a tied head, Gemma 3 Q4_0,
    Qwen 3 F16; each has its tokenizer and config metadata and real tensor data."""
    d = out_dir(root, "gguf")
    make = os.path.join(bin_dir, "tessera-make-model")
    small = ["--hidden", "32", "--heads", "2", "--kv-heads", "1", "--ffn", "32", "--vocab", "354", "--ctx", "64"]
    for name, extra in (("llama-q8_0.gguf", ["--layers", "1", "--tie", "--type", "q8_0"]),
                        ("gemma3-q4_0.gguf", ["--preset", "gemma3-tiny", "--layers", "2", "--type", "q4_0"]),
                        ("qwen3-f16.gguf", ["--arch", "qwen3", "--layers", "1", "--type", "f16"])):
        subprocess.run([make, *small, *extra, "--format", "gguf", "--out", os.path.join(d, name)], check=True,
                       stdout=subprocess.DEVNULL)


def safetensors_file(tensors, metadata=None):
    """tensors: [(name, dtype, shape, bytes)] -> the bytes of a .safetensors file."""
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def safetensors_seeds(root):
    d = out_dir(root, "safetensors")
    f32 = struct.pack("<6f", 0.5, -1.0, 2.0, 0.25, 3.5, -0.125)
    seeds = {
        "f32_bf16_f16.safetensors": [("a.weight", "F32", [2, 3], f32), ("b.weight", "BF16", [4], b"\x80\x3f" * 4),
                                     ("c.bias", "F16", [2, 2], b"\x00\x3c" * 4)],
        "ints_and_scalar.safetensors": [("ids", "I64", [2], struct.pack("<2q", 1, 2)), ("u", "U8", [3], b"\x01\x02\x03"),
                                        ("i32", "I32", [1], struct.pack("<i", -7)), ("scalar", "F32", [], f32[:4])],
        "empty_tensor.safetensors": [("e", "F32", [0, 4], b""), ("x", "F64", [1], struct.pack("<d", 1.0))],
        "int4_packed.safetensors": [("q.qweight", "I32", [4, 1], struct.pack("<4i", 1, 2, 3, 4)),
                                    ("q.scales", "F16", [1, 8], b"\x00\x3c" * 8),
                                    ("q.qzeros", "I32", [1, 1], struct.pack("<i", 0x88888888 - (1 << 32)))],
    }
    for name, tensors in seeds.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(safetensors_file(tensors, {"format": "pt"} if "f32" in name else None))


def shrink_tokenizer(path, keep=400):
    """A real tokenizer.json cut to its first `keep` ids: the merges among them, up to 40 of its
    added tokens renumbered after them (and the post-processor's ids with them)."""
    with open(path, encoding="utf-8") as f:
        tok = json.load(f)
    model = tok["model"]
    remap = {}
    next_id = keep
    added = []
    for t in tok.get("added_tokens", []):
        if t["id"] >= keep:
            if next_id >= keep + 40:  # Gemma has 6,000 (<unusedN>, image tokens): 40 show the kind
                continue
            remap[t["id"]] = next_id
            t["id"] = next_id
            next_id += 1
        added.append(t)
    tok["added_tokens"] = added
    if isinstance(model.get("vocab"), dict):
        model["vocab"] = {k: v for k, v in model["vocab"].items() if v < keep}
        kept = set(model["vocab"])
        merges = []
        for m in model.get("merges", []):
            a, b = m.split(" ", 1) if isinstance(m, str) else m
            if a in kept and b in kept and (a + b) in kept:
                merges.append(m)
        model["merges"] = merges
    elif isinstance(model.get("vocab"), list):  # Unigram: [piece, score] rows
        model["vocab"] = model["vocab"][:keep]
    post = tok.get("post_processor") or {}
    for proc in [post] + list(post.get("processors", [])):
        for spec in (proc.get("special_tokens") or {}).values():
            spec["ids"] = [remap.get(i, i) for i in spec.get("ids", [])]
    return json.dumps(tok, ensure_ascii=False).encode()


def tokenizer_seeds(root, testdata, synthetic_hf):
    d = out_dir(root, "tokenizer_json")
    sources = [("stories260K", os.path.join(testdata, "stories260K/hf"), None),
               ("synthetic", synthetic_hf, None)]
    for name in ("llama3", "mistral-spm", "qwen3", "gemma3"):
        sources.append((name, os.path.join(testdata, "tokenizers", name), 400))
    for name, directory, keep in sources:
        tj = os.path.join(directory, "tokenizer.json")
        if not os.path.exists(tj):
            print(f"skip {name}: no {tj}")
            continue
        body = shrink_tokenizer(tj, keep) if keep else open(tj, "rb").read()
        config = os.path.join(directory, "tokenizer_config.json")
        with open(os.path.join(d, name + ".json"), "wb") as f:
            f.write(body)
        if os.path.exists(config):
            with open(config, encoding="utf-8") as c:
                cfg = json.load(c)
            cfg.pop("chat_template", None)  # the chat template target has those
            cfg.pop("added_tokens_decoder", None)
            with open(os.path.join(d, name + "+config.json"), "wb") as f:
                f.write(body + SEP + json.dumps(cfg).encode())


def chat_template_seeds(root, testdata):
    d = out_dir(root, "chat_template")
    n = 0

    def put(text, extra=None):
        nonlocal n
        data = text.encode()
        if extra is not None:
            data += SEP + json.dumps(extra).encode()
        with open(os.path.join(d, f"t{n:03d}.jinja"), "wb") as f:
            f.write(data)
        n += 1

    put(open(os.path.join(ROOT, "template/gemma3_chat_template.jinja"), encoding="utf-8").read())
    put(open(os.path.join(ROOT, "tests/template/data/chat_templates/mistral_instruct.jinja"), encoding="utf-8").read())
    for name in ("llama3", "mistral-spm", "qwen3", "gemma3"):
        cfg = os.path.join(testdata, "tokenizers", name, "tokenizer_config.json")
        if os.path.exists(cfg):
            t = json.load(open(cfg, encoding="utf-8")).get("chat_template")
            if isinstance(t, str):
                put(t, {"enable_thinking": False} if name == "qwen3" else None)
    cases = json.load(open(os.path.join(ROOT, "tests/template/data/chat_templates/jinja_cases.json"), encoding="utf-8"))
    for case in cases["cases"]:
        if "template" in case:  # the others name a tokenizer's template, above
            put(case["template"], case.get("context") or None)


def http_seeds(root):
    d = out_dir(root, "http_request")
    body = b'{"model":"m","prompt":"Once upon a time","max_tokens":8,"stream":true}'
    seeds = {
        "post_completion": b"POST /v1/completions HTTP/1.1\r\nHost: localhost:8000\r\nContent-Type: application/json\r\n"
                           b"Content-Length: %d\r\n\r\n" % len(body) + body,
        "get_health_10": b"GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
        "get_query_lf_only": b"\r\nGET /v1/models?limit=1&x=%20 HTTP/1.1\nHost: a\nAccept: */*\n\n",
        "expect_continue": b"POST /v1/chat/completions HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\n"
                            b"Content-Length: 2\r\nConnection: close\r\n\r\n{}",
        "chunked": b"POST /v1/completions HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        "absolute_form": b"GET http://localhost:8000/metrics HTTP/1.1\r\nHost: localhost\r\nX-Empty:\r\n"
                         b"X-Spaces:   padded value \t\r\n\r\n",
        "pipelined": b"GET /health HTTP/1.1\r\nHost: h\r\n\r\nGET /metrics HTTP/1.1\r\nHost: h\r\n\r\n",
    }
    for name, data in seeds.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)


def structured_request_seeds(root):
    """Request bodies with every kind of output constraint and of tool_choice (fuzz/
    structured_request_fuzz.cpp): schemas with the keywords that compile and those refused."""
    d = out_dir(root, "structured_request")
    weather = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                                "unit": {"enum": ["c", "f"]}}, "required": ["city"]}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": weather}},
             {"type": "function", "function": {"name": "noop"}}]
    bodies = {
        "json_object": {"response_format": {"type": "json_object"}},
        "json_schema": {"response_format": {"type": "json_schema", "json_schema": {"name": "w", "strict": True,
                                                                                   "schema": weather}}},
        "schema_refs": {"guided_json": {"$defs": {"p": {"type": "integer", "minimum": 0, "maximum": 9}},
                                        "type": "array", "items": {"$ref": "#/$defs/p"}, "maxItems": 3}},
        "schema_anyof": {"guided_json": {"anyOf": [{"type": "null"}, {"type": "string", "pattern": "^[a-c]+$"},
                                                   {"const": 5}]}},
        "schema_formats": {"guided_json": {"type": "object", "properties": {
            "d": {"type": "string", "format": "date"}, "u": {"type": "string", "format": "uuid"}}}},
        "schema_refused": {"guided_json": {"type": "array", "uniqueItems": True}},
        "schema_string": {"structured_outputs": {"json": "{\"type\": \"boolean\"}"}},
        "regex": {"guided_regex": "[a-z]{2,4}-[0-9]+(\\.[0-9]+)?"},
        "choice": {"guided_choice": ["yes", "no (really)", "a\\b"]},
        "grammar": {"guided_grammar": 'root ::= "a" root | "b" [0-9]*'},
        "two_constraints": {"guided_regex": "a", "guided_choice": ["a"]},
        "tools_auto": {"tools": tools},
        "tools_required": {"tools": tools, "tool_choice": "required", "parallel_tool_calls": False},
        "tools_named_llama": {"tools": tools, "tool_choice": {"type": "function", "function": {"name": "noop"}},
                              "llama": True},
        "tools_none": {"tools": tools, "tool_choice": "none"},
        "tools_mistral": {"tools": tools, "tool_choice": "required", "mistral": True},
        "tools_and_json": {"tools": tools, "response_format": {"type": "json_schema", "json_schema": {
            "name": "w", "schema": weather}}},
        "tools_and_regex": {"tools": tools, "guided_regex": "a+"},
        "tools_refused_keyword": {"tools": [{"type": "function", "function": {
            "name": "f", "parameters": {"type": "array", "uniqueItems": True}}}]},
        "schema_pattern_digits": {"guided_json": {"type": "object", "properties": {
            "v": {"type": "string", "pattern": "^v[0-9]{1,2}(x[0-9]{1,2})?$"}, "n": {"type": "integer"},
            "ip": {"type": "string", "format": "ipv4"}, "s": {"type": "string", "minLength": 2}}}},
    }
    for name, body in bodies.items():
        with open(os.path.join(d, name + ".json"), "w") as f:
            json.dump(body, f, sort_keys=True)


def pack(root, target):
    """Writes fuzz/corpus/<target>.tar.xz from root/<target>/."""
    out = os.path.join(HERE, "corpus", target + ".tar.xz")
    size_packed = write_archive(root, target, out)
    folder = os.path.join(root, target)
    files = os.listdir(folder)
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in files)
    print(f"{target}: {len(files)} seeds, {size} bytes -> {os.path.relpath(out)} ({size_packed} bytes)")


def write_seeds(root, args):
    """Writes every target's seeds into root/<target>/."""
    gguf_seeds(root, args.bin_dir)
    safetensors_seeds(root)
    with tempfile.TemporaryDirectory() as tmp:
        hf = os.path.join(tmp, "hf")
        subprocess.run([os.path.join(args.bin_dir, "tessera-make-model"), "--hidden", "32", "--layers", "1",
                        "--heads", "2", "--kv-heads", "1", "--ffn", "32", "--vocab", "354", "--ctx", "64",
                        "--format", "hf", "--out", hf], check=True, stdout=subprocess.DEVNULL)
        tokenizer_seeds(root, args.testdata, hf)
    chat_template_seeds(root, args.testdata)
    http_seeds(root)
    structured_request_seeds(root)
    subprocess.run([os.path.join(args.bin_dir, "tessera_fuzz_control_seeds"), out_dir(root, "control_codec")],
                   check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "build/bin"))
    ap.add_argument("--testdata", help="the reference test data (default: $TESSERA_TESTDATA, else <bin-dir>/../testdata)")
    ap.add_argument("--pack", metavar="DIR", help="pack the seeds already in DIR/<target>/ instead of writing them")
    args = ap.parse_args()
    if args.pack:
        targets = [t for t in TARGETS if os.path.isdir(os.path.join(args.pack, t))]
        if not targets:
            sys.exit(f"make_seeds: no folder of seeds under {args.pack} (one of: {' '.join(TARGETS)})")
        for target in targets:
            pack(args.pack, target)
        return
    args.testdata = args.testdata or os.environ.get("TESSERA_TESTDATA") or \
        os.path.join(os.path.dirname(os.path.abspath(args.bin_dir)), "testdata")
    if not os.path.isdir(os.path.join(args.testdata, "tokenizers")):
        sys.exit(f"make_seeds: no reference test data at {args.testdata} (build target tessera_testdata unpacks it)")
    with tempfile.TemporaryDirectory() as root:
        write_seeds(root, args)
        for target in TARGETS:
            pack(root, target)


if __name__ == "__main__":
    main()
