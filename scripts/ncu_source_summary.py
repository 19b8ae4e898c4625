#!/usr/bin/env python3
"""Summarises ncu's per-SASS-instruction source page (`ncu --import R --page source --csv
--print-source sass`): where a kernel's warps were sampled, by instruction and by opcode.

Usage: ncu_source_summary.py <source.csv[.gz]> [--top N] [--split TEXT ...]

Prints the totals, the samples by stall reason (the page's `stall_*` columns), by opcode
(HGMMA, SYNCS, BAR, ...) and by code region, and the N most-sampled instructions with their
index, top reasons and SASS, so a phase of the kernel can be priced from the device's own
counters (gpu-profile.sh with PROFILE_SET=full writes the CSV). Regions: the code is cut
before each instruction holding one of the --split texts (default `USETMAXREG`: in a
warp-specialised kernel the roles' register reconfigurations start their code), so the
consumers' and the producer's samples come apart. A `BRA` right after a
`SYNCS.PHASECHK...TRYWAIT` is an mbarrier wait (its samples show as long_sb): the summary
names the barrier's shared-memory offset. Shares are of all samples (all warps).
"""
import argparse
import csv
import gzip
import io
import re
import sys
from collections import defaultdict


def open_text(path):
    if path.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", errors="replace")
    return open(path, encoding="utf-8", errors="replace")


def number(text):
    text = (text or "").replace(",", "").strip()
    try:
        return float(text)
    except ValueError:
        return 0.0


def opcode(sass):
    # "@!P0 HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24 ;" -> "HGMMA"
    words = [w for w in sass.split() if not w.startswith("@")]
    return words[0].split(".")[0] if words else "?"


def read_rows(path):
    with open_text(path) as f:
        lines = f.read().splitlines()
    # ncu prints a few lines (kernel name, notes) before the table: start at the header row.
    start = next((i for i, l in enumerate(lines) if '"Address"' in l or l.startswith("Address")), None)
    if start is None:
        sys.exit("no header row with an Address column in " + path)
    reader = csv.DictReader(lines[start:])
    return reader.fieldnames, list(reader)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--split", nargs="*", default=["USETMAXREG"])
    args = ap.parse_args()
    fields, rows = read_rows(args.csv)
    sample_cols = [c for c in fields if "Samples" in c]
    all_col = next((c for c in sample_cols if "All" in c), sample_cols[0] if sample_cols else None)
    idle_col = next((c for c in sample_cols if "Not" in c and "ssued" in c), None)
    src_col = next((c for c in fields if c.strip().lower() in ("source", "sass")), fields[1])
    print(f"{len(rows)} instructions; sample columns: {', '.join(sample_cols) or 'none'}")
    if all_col is None:
        print("columns:", ", ".join(fields))
        return
    total = sum(number(r[all_col]) for r in rows)
    idle = sum(number(r[idle_col]) for r in rows) if idle_col else 0.0
    print(f"samples: {total:.0f} all" + (f", {idle:.0f} not issued ({idle / max(total, 1):.0%})" if idle_col else ""))
    # Per-reason columns (`stall_long_sb`, ...; their "(Not Issued)" twins left out).
    reasons = [c for c in fields if c.startswith("stall_") and "Not Issued" not in c]
    if reasons:
        sums = sorted(((sum(number(r[c]) for r in rows), c) for c in reasons), reverse=True)
        print("by reason: " + "; ".join(f"{c[6:]} {v / max(total, 1):.1%}" for v, c in sums[:12] if v > 0))

    by_op = defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows:
        op = opcode(r[src_col])
        by_op[op][0] += number(r[all_col])
        by_op[op][1] += number(r[idle_col]) if idle_col else 0.0
        by_op[op][2] += 1
    print("\nby opcode (share of all samples, not-issued share, instructions):")
    for op, (a, n, k) in sorted(by_op.items(), key=lambda kv: -kv[1][0])[:16]:
        print(f"  {op:<10} {a / max(total, 1):6.1%}  {n / max(total, 1):6.1%}  {k:5d}")

    # Regions: cut before each instruction holding a --split text.
    cuts = [i for i, r in enumerate(rows) if any(t in r[src_col] for t in args.split)]
    bounds = [0] + cuts + [len(rows)]
    print("\nby region (instruction range: share of all samples; top reasons):")
    for lo, hi in zip(bounds, bounds[1:]):
        part = rows[lo:hi]
        share = sum(number(r[all_col]) for r in part) / max(total, 1)
        if not part or share < 0.001:
            continue
        top = sorted(((sum(number(r[c]) for r in part), c) for c in reasons), reverse=True)[:4]
        first = re.sub(r"\s+", " ", part[0][src_col]).strip()[:40]
        print(f"  [{lo}, {hi}) {share:6.1%}  " + ", ".join(f"{c[6:]} {v / max(total, 1):.1%}" for v, c in top if v > 0)
              + f"   (starts: {first})")

    print(f"\ntop {args.top} instructions (share of all samples, index, top reasons, SASS):")
    order = sorted(range(len(rows)), key=lambda i: -number(rows[i][all_col]))[: args.top]
    for i in order:
        r = rows[i]
        share = number(r[all_col]) / max(total, 1)
        sass = re.sub(r"\s+", " ", r[src_col]).strip()
        why = sorted(((number(r[c]), c[6:]) for c in reasons), reverse=True)[:2]
        why_text = " ".join(f"{c}:{v / max(total, 1):.1%}" for v, c in why if v > 0)
        prev = re.sub(r"\s+", " ", rows[i - 1][src_col]).strip() if i > 0 else ""
        waits = re.search(r"SYNCS\.PHASECHK\S*TRYWAIT \S+ \[([^\]]+)\]", prev)
        if waits and "BRA" in sass:
            sass += f"   <- mbarrier wait [{waits.group(1)}]"
        print(f"  {share:6.1%}  {i:6d}  {why_text:<28} {sass[:120]}")


if __name__ == "__main__":
    main()
