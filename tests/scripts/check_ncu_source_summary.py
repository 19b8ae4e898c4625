#!/usr/bin/env python3
"""scripts/ncu_source_summary.py on a small synthetic source page with known answers: the
preamble lines before the header skipped, the totals and the not-issued share, the reasons'
shares (their "(Not Issued)" twins left out), opcodes with predicates stripped, the regions
cut at USETMAXREG, the most-sampled instruction first and an mbarrier wait named after the
TRYWAIT before its BRA. Also gzip input and a page without a sample column. Exits non-zero
with the first mismatch."""
import gzip
import os
import subprocess
import sys
import tempfile

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "ncu_source_summary.py")

HEADER = ['"Address"', '"Source"', '"Warp Stall Sampling (All Samples)"',
          '"Warp Stall Sampling (Not-issued Samples)"', '"stall_long_sb"', '"stall_long_sb (Not Issued)"',
          '"stall_wait"']
# (address, SASS, all, not issued, long_sb, long_sb not issued, wait)
ROWS = [
    ("0x00", "MOV R1, c[0x0][0x28] ;", 10, 5, 0, 0, 10),
    ("0x10", "USETMAXREG.DEALLOC.CTAPOOL 0x28 ;", 0, 0, 0, 0, 0),
    ("0x20", "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4+0x1b0], R3 ;", 20, 20, 0, 0, 20),
    ("0x30", "@!P0 BRA 0x20 ;", 600, 600, 600, 600, 0),
    ("0x40", "USETMAXREG.TRY_ALLOC.CTAPOOL 0xf0 ;", 0, 0, 0, 0, 0),
    ("0x50", "@P1 HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24 ;", 300, 100, 0, 0, 300),
    # A TRYWAIT whose next instruction is not its branch: that one is no wait.
    ("0x58", "SYNCS.PHASECHK.TRANS64.TRYWAIT P2, [UR4+0x1c0], R3 ;", 0, 0, 0, 0, 0),
    ("0x60", "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24 ;", 70, 70, 0, 0, 70),
]


def write_page(path, rows, header=HEADER, opener=open):
    with opener(path, "wt") as f:
        f.write('==PROF== Connected to process 1\n"Kernel Name","k"\n')  # ncu's preamble
        f.write(",".join(header) + "\n")
        for r in rows:
            f.write(",".join(f'"{v:,}"' if isinstance(v, int) else f'"{v}"' for v in r[: len(header)]) + "\n")


def run(path, *extra):
    res = subprocess.run([sys.executable, SCRIPT, path, *extra], capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        sys.exit(f"ncu_source_summary.py exited {res.returncode}: {res.stderr}")
    return res.stdout


def expect(text, needle):
    if needle not in text:
        sys.exit(f"missing {needle!r} in the summary:\n{text}")


def main():
    with tempfile.TemporaryDirectory() as d:
        plain, packed, bare = (os.path.join(d, n) for n in ("page.csv", "page.csv.gz", "bare.csv"))
        write_page(plain, ROWS)
        out = run(plain, "--top", "3")
        expect(out, "8 instructions")
        expect(out, "samples: 1000 all, 795 not issued (80%)")
        # Reasons: long_sb 600 / 1000, wait 400 / 1000; the "(Not Issued)" twin is not a reason.
        expect(out, "by reason: long_sb 60.0%; wait 40.0%")
        if "long_sb (Not Issued)" in out.split("by opcode")[0]:
            sys.exit("a (Not Issued) column was summed as a reason:\n" + out)
        expect(out, "  BRA         60.0%   60.0%      1")  # the predicate @!P0 stripped
        expect(out, "  HGMMA       37.0%   17.0%      2")
        # Regions: [0, 1) the prologue, [1, 4) the producer after DEALLOC, [4, 8) the consumer.
        expect(out, "  [0, 1)   1.0%")
        expect(out, "  [1, 4)  62.0%")
        expect(out, "  [4, 8)  37.0%")
        top = out.split("top 3 instructions")[1].splitlines()[1:]
        if len(top) != 3 or " 3 " not in top[0] or "<- mbarrier wait [UR4+0x1b0]" not in top[0]:
            sys.exit("the top instruction is not the mbarrier wait at index 3:\n" + out)
        if "mbarrier" in top[1] or "mbarrier" in top[2]:
            sys.exit("an instruction that is not a wait was named as one:\n" + out)

        write_page(packed, ROWS, opener=lambda p, m: gzip.open(p, m, encoding="utf-8"))
        if run(packed, "--top", "3") != out:
            sys.exit("the gzip page gave another summary")

        write_page(bare, [r[:2] for r in ROWS], header=HEADER[:2])
        expect(run(bare), "sample columns: none")
    print("ncu_source_summary.py: all checks passed")


if __name__ == "__main__":
    main()
