#!/usr/bin/env python3
"""Issue 51, item 2: the whole quality grid as one Markdown table, from every eval.csv in this
folder's runs (DATE-TEXT-CONTEXT[-WHAT]/eval.csv, TEXT one of legal, code, prose).

Runs with the same text and context agree on dense attention's perplexity only where they ran on
machines of the same arithmetic (BENCHMARKS.md, "2-bit keys and page summaries at 2k"): each
cell is set against the dense run and the fp8 run of its own machine (its runs whose dense
perplexity is the same to the last digit), never against another machine's. A cell measured on
two machines keeps the later run (the folders' names sort by date); the matrix takes each row
from the machine with the most cells at that top-k and marks a cell from another machine with *.

Usage: python3 grid.py [--matrix] [FOLDER]   (prints the table, or with --matrix a row per text,
context and top-k with each format's perplexity against dense; FOLDER defaults to this script's)
"""
import csv
import os
import sys

TEXTS = ("legal", "code", "prose")
FORMATS = ("fp8", "int4:32", "channels:16:64", "int2:32", "pages:16")


def runs(folder):
    """Yields (name, text, rows) for each eval.csv under folder, oldest first."""
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name, "eval.csv")
        parts = name.split("-")
        text = next((p for p in parts if p in TEXTS), None)
        if text is None or not os.path.isfile(path):
            continue
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        for r in rows:
            # The first runs' CSVs predate the column: their keys were fp8 copies, 196 bytes.
            if r["attention"] != "dense" and not r.get("index_format"):
                r["index_format"], r["index_bytes"] = "fp8", "196"
        yield name, text, rows


def grid(folder):
    """Maps (text, context) to {dense perplexity (a machine): {(format, top_k): (perplexity,
    agreement, index bytes, run, hisparse identical, select ms)}}."""
    cells = {}
    for name, text, rows in runs(folder):
        dense = [r for r in rows if r["attention"] == "dense"]
        for d in dense:
            ctx = int(d["context"])
            machine = cells.setdefault((text, ctx), {}).setdefault(d["perplexity"], {})
            for r in rows:
                if r["attention"] != "sparse-resident" or int(r["context"]) != ctx:
                    continue
                same = [h for h in rows if h["attention"] == "hisparse" and h["context"] == r["context"]
                        and h["top_k"] == r["top_k"] and h["index_format"] == r["index_format"]]
                identical = all(h["identical_to_resident"] == "true" for h in same) and bool(same)
                machine[(r["index_format"], int(r["top_k"]))] = (
                    float(r["perplexity"]), float(r["agreement"]), r["index_bytes"], name, identical,
                    r.get("select_ms") or "")
    return cells


def pct(a, b):
    """a against b, as a signed percentage."""
    return f"{(a / b - 1) * 100:+.1f}%"


def table(cells):
    """The grid as Markdown, one row per cell, each machine's runs under their own dense row.
    `select ms` is the sparse-resident run's selection time per step (blank where the run's CSV
    predates the column; the entries in BENCHMARKS.md say which runs shared their machine)."""
    out = ["| text | context | top-k | index (bytes) | perplexity | against dense | against fp8 "
           "| agreement with dense | hisparse = sparse resident | select ms | run |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for text in TEXTS:
        for ctx in sorted(c for t, c in cells if t == text):
            for dense, machine in cells[(text, ctx)].items():
                if not machine:
                    continue
                out.append(f"| {text} | {ctx} | — | dense | {float(dense):.4f} | — | — | 100% | — | | |")
                for k in sorted({k for _, k in machine}):
                    fp8 = machine.get(("fp8", k))
                    for fmt in FORMATS:
                        if (fmt, k) not in machine:
                            continue
                        ppl, agree, nbytes, run, same, select = machine[(fmt, k)]
                        vs_fp8 = "—" if fmt == "fp8" or fp8 is None else pct(ppl, fp8[0])
                        out.append(f"| {text} | {ctx} | {k} | {fmt} ({nbytes}) | {ppl:.4f} | "
                                   f"{pct(ppl, float(dense))} | {vs_fp8} | {agree * 100:.1f}% | "
                                   f"{'yes' if same else 'NO'} | {select} | {run} |")
    return "\n".join(out)


def matrix(cells):
    """The grid in one screen: a row per text, context and top-k, a column per format (headed by
    its index bytes, as the runs' CSVs give them), each cell its perplexity against the dense run
    of the machine it ran on. A row's cells come from the machine with the most cells at that
    top-k; a cell only another machine measured is marked *, comparable with dense alone."""
    nbytes = {f: b for m in cells.values() for c in m.values() for (f, _), v in c.items() for b in [v[2]]}
    out = ["| text | context | top-k | " + " | ".join(f"{f} ({nbytes.get(f, '?')} B)" for f in FORMATS) + " |",
           "| --- | --- | --- |" + " --- |" * len(FORMATS)]
    for text in TEXTS:
        for ctx in sorted(c for t, c in cells if t == text):
            machines = cells[(text, ctx)]
            for k in sorted({k for m in machines.values() for _, k in m}):
                home = max(machines, key=lambda d: sum((f, k) in machines[d] for f in FORMATS))
                row = []
                for fmt in FORMATS:
                    if (fmt, k) in machines[home]:
                        row.append(pct(machines[home][(fmt, k)][0], float(home)))
                        continue
                    other = [(m[(fmt, k)][3], d) for d, m in machines.items() if (fmt, k) in m]
                    d = max(other)[1] if other else None
                    row.append(pct(machines[d][(fmt, k)][0], float(d)) + "*" if d else "—")
                out.append(f"| {text} | {ctx} | {k} | " + " | ".join(row) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--matrix"]
    here = args[0] if args else os.path.dirname(os.path.abspath(__file__))
    cells = grid(here)
    print(matrix(cells) if "--matrix" in sys.argv else table(cells))
