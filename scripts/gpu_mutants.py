#!/usr/bin/env python3
"""Checks that the GPU tests can fail: the CUDA counterpart of scripts/cpu-mutants.sh.

Each mutant is one small deliberate bug in the CUDA backend (a dropped term, a sign, an
off-by-one in causality, a tie order, a missing scale), applied with sed, together with the
GoogleTest filter of the GPU tests that should catch it; a mutant is "detected" when at least
one of them fails (or the test process dies or hangs). A survivor names a property no GPU
test checks.

Why not rebuild per mutant as cpu-mutants.sh does: one CUDA translation unit takes minutes
and device time is scarce. Instead every mutant gets its own copy of src/ and include/ (a few
MB), the objects that include the mutated file (from ninja's dependency records) are compiled
from that copy with the build's own commands - all mutants' objects at once, JOBS in
parallel - and a mutant test binary is linked with them placed before libcsattn.a, so the
archive's original members are not pulled in. The whole run costs about one slow
translation unit's compile, one link a mutant and the mutants' test filters (run
TEST_JOBS at a time on the one GPU), and never touches the working tree.

Usage (on the lent GPU machine, from the repository root; `.device` carried after
scripts/prepare-device-deps.sh):
    python3 scripts/gpu_mutants.py                  # build-gpu (built first if absent), all
    MUTANTS='sink|top-k' python3 scripts/gpu_mutants.py   # mutants whose name matches
    python3 scripts/gpu_mutants.py --build-only     # compile + link every mutant, no tests
    python3 scripts/gpu_mutants.py --check BINARY   # every sed applies, every filter selects
                                                    # tests of BINARY (a ctest entry: no build)
Environment: BUILD_DIR (default build-gpu), OUT (logs; default out/gpu-mutants), JOBS
(parallel compiles, default the CPU count), TEST_JOBS (mutant test processes at once,
default 4), MUTANT_TIMEOUT (seconds a mutant's tests may take, default 300).
Verdicts: "detected" (a test failed, the process died, or it timed out where its baseline
took under a third of MUTANT_TIMEOUT), "SURVIVED", "not judged" (the filter fails without the
mutant), "inconclusive" (a timeout beside a slow baseline), or a build problem; each is also
appended to $OUT/gpu-mutants.jsonl as it comes, the whole table written to gpu-mutants.json.
Exit status: 0 every selected mutant detected (--build-only: built), 1 any other verdict, 2
the run could not start (the build fails as it is, every test skipped - no GPU -, bad
MUTANTS or arguments).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str  # relative to the repository root, under src/ or include/
    sed: str  # one GNU sed script, applied with sed -i -e
    tests: str  # a --gtest_filter
    control: bool = False  # a harmless edit: must SURVIVE (the pipeline's own check)


# Forward kernels -------------------------------------------------------------------------
# (What the tests dispatch to: the wgmma attention forward serves every head count at head
# dim 512, the mma kernel only where wgmma's shared memory does not fit - the kernel tests
# call it directly; the small preset (head dim 64) runs the CUDA-core kernels; the default
# indexer on a 132-SM card is the overlapped wgmma one, whose rows select by one warp.)
FWD_WGMMA = "Kernels/CudaAttentionForward.WgmmaMatchesReferenceMmaAndBaseline/"
INDEXER = "Shapes/CudaIndexer.TiledMatchesOneRowKernelsExact/H8_D64_K32"
SMALL_LAYER = "Layers/CudaForward.MatchesCpuBackendAndOracle/small_"
MUTANTS: list[Mutant] = [
    # The control: the same object code from the copy (a comment added). Detected would mean
    # the pipeline or the tests' stability is at fault, not the code.
    Mutant("control: a comment added to the wgmma forward (must survive)",
           "src/cuda/sparse_attention_wgmma.cu",
           r"s#^\(    float l_part\[2\] = .*\)$#\1  // gpu_mutants control#",
           f"{FWD_WGMMA}SWA_H8:{FWD_WGMMA}CSA_H64", control=True),
    Mutant("attention forward (wgmma): the sink left out of the softmax denominator",
           "src/cuda/sparse_attention_wgmma.cu",
           r"s/float l_part\[2\] = {c == 0 && qd == 0 ? 1\.0f : 0\.0f, c == 0 && qd == 0 ? 1\.0f : 0\.0f};/float l_part[2] = {0.0f, 0.0f};/",
           f"{FWD_WGMMA}SWA_H8:{FWD_WGMMA}CSA_H64"),
    Mutant("attention forward (wgmma): an HCA query sees the entry it is still inside",
           "src/cuda/sparse_attention_wgmma.cu",
           r"s#n_comp = d\.ratio > 1 ? min((pos + 1) / d\.ratio, meta\.comp_start\[b + 1\] - comp0) : 0;#n_comp = d.ratio > 1 ? min((pos + 2) / d.ratio, meta.comp_start[b + 1] - comp0) : 0;#",
           f"{FWD_WGMMA}HCA_H24:{FWD_WGMMA}HCA_H72"),
    Mutant("attention forward (mma): key slots past the list not masked", "src/cuda/sparse_attention_mma.cu",
           r"s/s\[j\]\[i\] = key < n ? s\[j\]\[i\] \* scale2 : -INFINITY;/s[j][i] = s[j][i] * scale2;/",
           f"{FWD_WGMMA}SWA_H8:{FWD_WGMMA}CSA_H8"),
    Mutant("device dims: the sliding window one row short", "src/cuda/workspace.cpp",
           r"s/d\.window = c\.window;/d.window = c.window - 1;/",
           f"{SMALL_LAYER}SWA_H0:{SMALL_LAYER}HCA_H0"),
    Mutant("top-k (block select): ties go to the larger index", "src/cuda/indexer_select.cuh",
           r"s/int slot = before\.x + min(before\.y, need_equal);/const int after_eq = block_suffix_above<G>(greater, equal, sh).y; int slot = before.x + max(0, need_equal - equal - after_eq);/;s/int equal_rank = before\.y;/int equal_rank = equal + after_eq;/;s/take = equal_rank++ < need_equal;/take = equal_rank-- <= need_equal;/",
           f"Shapes/CudaIndexer.AllTiesTakeTheSmallestIds/H8_D64_K32:{INDEXER}"),
    Mutant("indexer: the ReLU dropped from the head terms", "src/cuda/indexer_score.cuh",
           r"s/return __fmaf_rn(w0, fmaxf(s0, 0\.0f), __fmul_rn(w1, fmaxf(s1, 0\.0f)));/return __fmaf_rn(w0, s0, __fmul_rn(w1, s1));/",
           f"{INDEXER}:{SMALL_LAYER}CSA_H0"),
    Mutant("indexer (multi-row kernels): a row sees one compressed key too many", "src/cuda/indexer_block.cuh",
           r"s#min((meta\.row_position\[t\] + 1) / d\.ratio, seg_entries)#min((meta.row_position[t] + 2) / d.ratio, seg_entries)#",
           f"{INDEXER}:{SMALL_LAYER}CSA_H0"),
    Mutant("metadata: the first padding row counted as real", "src/cuda/metadata.cu",
           r"s/row_is_padding\[t\] = pos >= cu_real/row_is_padding[t] = pos > cu_real/",
           f"{INDEXER}:{SMALL_LAYER}CSA_H0"),
    Mutant("compressor (ratio 4): the previous block's A half left out", "src/cuda/compressor.cu",
           r"s/const bool has_prev = kOverlap && ent\.pos > 0;/const bool has_prev = false;/",
           "Shapes/CudaCompressorPool.MatchesFp64AndTheReferenceKernel/csa_main_512:"
           "Shapes/CudaCompressorPool.MatchesFp64AndTheReferenceKernel/csa_indexer_128"),
    Mutant("compressor (ratio 128): token splits merged without rescaling to the row max", "src/cuda/compressor.cu",
           r"s/const float f = mx\[c\] == -INFINITY ? 0\.0f : exp2f(mx\[c\] - row_mx\[c\]);/const float f = mx[c] == -INFINITY ? 0.0f : 1.0f;/",
           "Shapes/CudaCompressorPool.MatchesFp64AndTheReferenceKernel/hca_main_512:"
           "Shapes/CudaCompressorPool.MatchesFp64AndTheReferenceKernel/hca_width_64"),
    Mutant("RoPE (in-place tail kernel): the inverse rotation turns forwards", "src/cuda/norm_rope.cu",
           r"s/const float sign = static_cast<float>(a\.rope_sign);/const float sign = 1.0f;/",
           f"CudaNormRope.InPlaceRopeTouchesOnlyTheRotatedTail:{SMALL_LAYER}SWA_H0"),
    Mutant("RMSNorm (warp kernel): 1/rms from the sum of squares, not their mean", "src/cuda/norm_rope.cu",
           r"/void transform_row(/,/^}/s#sqrtf(ss / n + a\.eps)#sqrtf(ss + a.eps)#",
           "Shapes/CudaNormRope.WarpKernelMatchesTheBlockKernel/q_norm_rope:CudaNormRopeRstd.StoresEachRowsScaleAndRunsInPlace"),
    Mutant("MXFP8: the E8M0 scale rounds down", "src/cuda/mxfp8.cu",
           r"s/) ++exponent;/) exponent += 0;/",
           "CudaMxfp8.RoundTripMatchesTheCpuQuantizerBitwise"),
]

# Backward kernels and the indexer loss ---------------------------------------------------
# (The small preset's layer runs the CUDA-core attention backward and loss; head dim 512 the
# wgmma backward and the tensor-core loss; the deterministic HCA backward the keyed pass.)
BWD_KERNELS = "Kernels/CudaAttentionBackward.TensorCoreMatchesBaseline/"
MUTANTS += [
    Mutant("attention backward: d_sink with the wrong sign (the tensor-core kernels' row terms)",
           "src/cuda/attention_row_terms.cuh",
           r"s/dsink_part\[static_cast<long>(t) \* H + h\] = -expf(s\[i\] - l\[i\]) \* acc;/dsink_part[static_cast<long>(t) * H + h] = expf(s[i] - l[i]) * acc;/",
           f"{BWD_KERNELS}H64_ratio4_topk100"),
    Mutant("attention backward (wgmma): dK's value term P^T dO read with dS for P",
           "src/cuda/attention_backward_wgmma.cu",
           r"s/wgmma_m64n128k16_ss<1, 1>(dk, wgmma_desc_sw128(p_base + a_off,/wgmma_m64n128k16_ss<1, 1>(dk, wgmma_desc_sw128(ds_base + a_off,/",
           f"{BWD_KERNELS}H64_ratio4_topk100"),
    Mutant("attention backward (wgmma): dS without its softmax scale", "src/cuda/attention_backward_wgmma.cu",
           r"s/const float scale = d\.scale, scale2 = d\.scale \* kAttentionLog2e;/const float scale = 1.0f, scale2 = d.scale * kAttentionLog2e;/",
           f"{BWD_KERNELS}H64_ratio4_topk100"),
    Mutant("attention backward (wgmma): the dK flush skips each query's last key slot", "src/cuda/attention_backward_wgmma.cu",
           r"s/if (slot < limit)$/if (slot < limit - 1)/",
           f"{BWD_KERNELS}H64_ratio4_topk100"),
    Mutant("attention backward (CUDA cores): dS without the D_row term", "src/cuda/attention_backward.cu",
           r"s/dz\[k\] = pk \* (dp - drow\[h\]);/dz[k] = pk * dp;/",
           f"Layers/CudaBackward.MatchesCpuBackend/SWA_sparse:{BWD_KERNELS}H64_ratio0_topk0"),
    Mutant("attention backward (keyed HCA pass): the last row chunk's partial sums dropped",
           "src/cuda/attention_backward_keyed.cu",
           r"s/for (int c = 1; c < chunks; ++c) {/for (int c = 1; c < chunks - 1; ++c) {/",
           f"{BWD_KERNELS}H64_ratio128_topk0"),
    Mutant("ordered scatter (deterministic): a window row misses its last query", "src/cuda/ordered_scatter.cu",
           r"s/hi = min(u + d\.window, r_end)/hi = min(u + d.window - 1, r_end)/",
           "Layouts/OrderedScatter.MatchesTheFixedOrderHostSumBitwise/attention_swa"),
    Mutant("RMSNorm backward: rstd^2 where rstd^3 belongs", "src/cuda/norm_backward.cu",
           r"s#r \* r \* r \* dot / n#r * r * dot / n#",
           "CudaNormBackward.RowKernelsMatchTheFormula"),
    Mutant("RMSNorm weight gradient: the last warp's rows left out", "src/cuda/norm_backward.cu",
           r"s/for (int w = 1; w < 8; ++w) {/for (int w = 1; w < 7; ++w) {/",
           "CudaNormBackward.RowKernelsMatchTheFormula"),
    Mutant("compressor backward: the gate's softmax gradient with the wrong sign", "src/cuda/compressor_backward.cu",
           r"s/p \* (__bfloat162float(a\[at\]) - pooled) \* grad/p * (pooled - __bfloat162float(a[at])) * grad/",
           "Layers/CudaBackward.MatchesCpuBackend/CSA_sparse"),
    Mutant("compressor backward: the previous block's A half gets no gradient", "src/cuda/compressor_backward.cu",
           r"/pooled \/= z;/,/dg\[at\]/s/for (int k = first; k < 2 \* m; ++k) {/for (int k = m; k < 2 * m; ++k) {/",
           "Layers/CudaBackward.MatchesCpuBackend/CSA_sparse"),
    Mutant("indexer loss (mma): the window left out of the teacher's denominator", "src/cuda/indexer_loss_mma.cu",
           r"s#merge_stats(m, l, src_stats\[tid \* 2\], src_stats\[tid \* 2 + 1\]);#(void)src_stats;#",
           "CudaIndexerLoss.DenseRaggedMatchesBaseline:CudaIndexerLoss.SparseWithoutForwardLseMatchesBaseline"),
    Mutant("indexer loss (mma): padding rows scored", "src/cuda/indexer_loss_mma.cu",
           r"s/const int vis = meta\.row_is_padding\[t\]$/const int vis = false/",
           "CudaIndexerLoss.DenseRaggedMatchesBaseline"),
    Mutant("indexer loss backward (mma): the ReLU mask dropped", "src/cuda/indexer_loss_mma.cu",
           r"s/const float gg = si\[j\]\[i\] > 0\.0f ? gv \* (i < 2 ? wa : wb) : 0\.0f;/const float gg = gv * (i < 2 ? wa : wb);/",
           "CudaIndexerLoss.SparseRaggedMatchesBaseline"),
    Mutant("indexer loss: a device upstream gradient without lambda / N", "src/cuda/indexer_loss.cu",
           r"s/out\[0\] = a\[0\] \* b\[0\];/out[0] = a[0];/",
           "Layers/CudaDeviceLayer.MatchesTheHostTensorLayer/CSA:CudaCp.DeviceMemoryEntryPointsMatchTheHostOnes"),
    Mutant("indexer loss: the mean over every row, padding included", "src/cuda/metadata.cu",
           r"s/loss_scale_kernel<<<1, 32, 0, stream>>>(meta\.cu_real,/loss_scale_kernel<<<1, 32, 0, stream>>>(meta.cu_padded,/",
           "Layers/CudaCp.RanksSharingOneGpuMatchSingleGpu/small_P2_contiguous_CSA:Layers/CudaBackward.MatchesCpuBackend/CSA_sparse"),
    Mutant("grouped O projection backward: every group's wo_a gradient reads group 0's heads", "src/cuda/gemm.cpp",
           r"s/groups \* group_dim, group_dim, dU, CUDA_R_16BF/groups * group_dim, 0, dU, CUDA_R_16BF/",
           "Layers/CudaBackward.MatchesCpuBackend/SWA_sparse"),
]

# Context parallelism on the GPU (once scripts/gpu-cp-mutants.sh; ranks sharing one GPU).
CP_TESTS = "*CudaCp*:-*Nccl*"
MUTANTS += [
    Mutant("CP: the ape gradient summed per block, not per entry", "src/cuda/compressor_backward.cu",
           r"s/const long row = prev_half ? ent.row0 - m + slot : ent.row0 + slot;/const long row = ent.row0 + slot;/",
           CP_TESTS),
    Mutant("CP: compressed rows gathered without the map", "src/cp/gpu_rank_plan.cpp",
           r"s/h.dup_src.push_back(src);/h.dup_src.push_back(base + j);/", CP_TESTS),
    Mutant("CP: a run's copies one row short", "src/cp/gpu_rank_plan.cpp",
           r"s|copies = std::min((h.seg_pos0\[ur\] + len) / m, entries);|copies = std::min((h.seg_pos0[ur] + len - 1) / m, entries);|",
           CP_TESTS),
    Mutant("CP: only a row's first copy gets its gradient", "src/cuda/cp_rows.cu",
           r"s/for (int k = offsets\[q\]; k < offsets\[q + 1\]; ++k)/for (int k = offsets[q]; k < min(offsets[q] + 1, offsets[q + 1]); ++k)/",
           CP_TESTS),
    Mutant("CP: owned entries at the wrong RoPE position", "src/cp/gpu_rank_plan.cpp",
           r"s/h.entry_pos\[slot\] = e.position;/h.entry_pos[slot] = e.position + m;/", CP_TESTS),
]


def log(msg: str) -> None:
    print(msg, flush=True)


def run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, text=True, capture_output=True, **kw)


def apply_sed(m: Mutant, path: Path) -> bool:
    """Applies m's sed to path; True when the file changed."""
    before = path.read_bytes()
    r = run(["sed", "-i", "-e", m.sed, str(path)])
    if r.returncode != 0:
        raise RuntimeError(f"mutant '{m.name}': sed failed: {r.stderr.strip()}")
    return path.read_bytes() != before


def listed_tests(binary: str) -> list[str]:
    r = run([binary, "--gtest_list_tests"])
    if r.returncode != 0:
        raise RuntimeError(f"{binary} --gtest_list_tests failed: {r.stderr.strip()[:500]}")
    names, suite = [], ""
    for line in r.stdout.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            suite = line.split()[0]
        else:
            names.append(suite + line.split()[0])
    return names


def filter_matches(filt: str, name: str) -> bool:
    """GoogleTest's --gtest_filter: positive patterns, then '-' and negative ones."""
    pos, _, neg = filt.partition("-")

    def any_of(patterns: str) -> bool:
        return any(re.fullmatch(re.escape(p).replace(r"\*", ".*").replace(r"\?", "."), name)
                   for p in patterns.split(":") if p)

    return (any_of(pos) if pos else True) and not any_of(neg)


def check(binary: str, selected: list[Mutant]) -> int:
    """No build: every sed changes its file and every filter selects at least one test."""
    names = listed_tests(binary)
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for m in selected:
            src = ROOT / m.file
            if not src.is_file():
                log(f"BAD '{m.name}': {m.file} does not exist"); bad += 1; continue
            copy = Path(tmp) / src.name
            shutil.copyfile(src, copy)
            if not apply_sed(m, copy):
                log(f"BAD '{m.name}': the sed matches nothing in {m.file}"); bad += 1; continue
            n = sum(filter_matches(m.tests, t) for t in names)
            if n == 0:
                log(f"BAD '{m.name}': the filter '{m.tests}' selects no test"); bad += 1; continue
            log(f"ok  '{m.name}': {m.file}, {n} tests")
    log(f"gpu_mutants --check: {len(selected) - bad} of {len(selected)} mutants apply and select tests")
    if bad == 0:
        log("all checks passed")
    return 1 if bad else 0


# ---- the build's own commands ------------------------------------------------------------

def ninja(build: Path, *args: str) -> str:
    r = run(["ninja", "-C", str(build), *args])
    if r.returncode != 0:
        raise RuntimeError(f"ninja {' '.join(args)}: {r.stderr.strip()[:500]}")
    return r.stdout


def last_command(build: Path, target: str) -> str:
    lines = [l for l in ninja(build, "-t", "commands", target).splitlines() if l.strip()]
    return lines[-1]


def dependency_records(build: Path) -> dict[str, set[str]]:
    """Object (build-relative) -> the absolute paths of the files it was compiled from."""
    deps: dict[str, set[str]] = {}
    current = None
    for line in ninja(build, "-t", "deps").splitlines():
        if line and not line.startswith(" "):
            current = line.split(":")[0]
            deps[current] = set()
        elif line.strip() and current is not None:
            deps[current].add(os.path.realpath(line.strip()))
    return deps


def link_parts(build: Path) -> tuple[str, str, set[str], set[str]]:
    """The test binary's link command, its output, its own objects and libcsattn.a's."""
    # ": && <link> && cd tests && cmake ... (gtest discovery) && :": the link alone
    parts = [p.strip() for p in last_command(build, "tests/csattn_tests").split(" && ")]
    links = [p for p in parts if re.search(r"\s-o\s+\S*csattn_tests(\s|$)", p)]
    if len(links) != 1:
        raise RuntimeError("cannot find the link step of tests/csattn_tests in ninja's command")
    cmd = links[0]
    tokens = shlex.split(cmd)
    own = {t for t in tokens if t.endswith(".o")}
    lib_inputs = set()
    for line in ninja(build, "-t", "query", "libcsattn.a").splitlines():
        t = line.strip()
        if t.endswith(".o"):
            lib_inputs.add(t)
    if "-o" not in tokens:
        raise RuntimeError("the link command of tests/csattn_tests has no -o")
    return cmd, tokens[tokens.index("-o") + 1], own, lib_inputs


def shadow_command(cmd: str, shadow: Path, obj_out: Path) -> str:
    """A compile command reading src/ and include/ from the shadow copy, writing obj_out and
    its dependency file obj_out.d (checked afterwards: the mutated file must be in it)."""
    cmd, n_mf = re.subn(r"\s-MF\s+\S+", f" -MF {shlex.quote(str(obj_out))}.d", cmd)
    if n_mf != 1:
        raise RuntimeError(f"compile command without exactly one -MF: {cmd[:200]}")
    # Every spelling: "-I/root/src", "-isystem /root/include", "-c /root/src/x.cu", ...
    root = re.escape(str(ROOT))
    cmd = re.sub(rf"{root}/(src|include)(?=[/\s]|$)", lambda mt: f"{shadow}/{mt.group(1)}", cmd)
    if re.search(rf"{root}/(src|include)(?=[/\s]|$)", cmd):
        raise RuntimeError(f"compile command still reads the real sources: {cmd[:300]}")
    cmd, n = re.subn(r"\s-o\s+\S+", f" -o {shlex.quote(str(obj_out))}", cmd)
    if n != 1:
        raise RuntimeError(f"compile command without exactly one -o: {cmd[:200]}")
    return cmd


def depfile_lists(obj_out: Path, path: Path) -> bool:
    """Whether the compiler's dependency file for obj_out names `path` (the mutated copy)."""
    try:
        text = Path(f"{obj_out}.d").read_text()
    except OSError:
        return False
    return str(path) in text.replace("\\\n", " ").split() or str(path) in text


# ---- the run -----------------------------------------------------------------------------

def gtest_failed(log_text: str) -> int | None:
    mt = re.search(r"^\[  FAILED  \] (\d+) tests?, listed below", log_text, re.M)
    if mt:
        return int(mt.group(1))
    return 0 if re.search(r"^\[  PASSED  \] \d+ test", log_text, re.M) else None


def all_skipped(log_text: str) -> bool:
    """GoogleTest counts skipped tests apart from passed ones: all skipped = none passed,
    none failed, some skipped."""
    p = re.search(r"^\[  PASSED  \] (\d+) test", log_text, re.M)
    s = re.search(r"^\[  SKIPPED \] (\d+) test", log_text, re.M)
    return bool(p and s and int(p.group(1)) == 0 and int(s.group(1)) > 0 and gtest_failed(log_text) == 0)


# TEST_JOBS processes share the CPUs (their CPU references run OpenMP and BLAS) as ctest's
# entries do, each with its share of the cores.
TEST_ENV = dict(os.environ)


def run_tests(binary: Path, filt: str, log_path: Path, timeout: int) -> tuple[str, int | None]:
    """('ran' | 'timeout' | 'died', failed count or None)."""
    try:
        r = subprocess.run([str(binary), f"--gtest_filter={filt}"], text=True, timeout=timeout,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=binary.parent,
                           env=TEST_ENV)
    except subprocess.TimeoutExpired as e:
        log_path.write_text((e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""))
        return "timeout", None
    log_path.write_text(r.stdout)
    failed = gtest_failed(r.stdout)
    if failed is None or (r.returncode != 0 and failed == 0):
        return "died", failed
    return "ran", failed


def main() -> int:
    args = sys.argv[1:]
    pattern = os.environ.get("MUTANTS", "")
    # Numbered as --list numbers them, whatever MUTANTS selects.
    selected = {k: m for k, m in enumerate(MUTANTS, 1) if not pattern or re.search(pattern, m.name)}
    if not selected:
        log(f"gpu_mutants: no mutant matches MUTANTS='{pattern}'")
        return 2
    if args[:1] == ["--list"]:
        for k, m in enumerate(MUTANTS, 1):
            log(f"{k:2d} {m.name}  [{m.file}; {m.tests}]")
        return 0
    if args[:1] == ["--check"]:
        if len(args) != 2:
            log("usage: gpu_mutants.py --check <csattn_tests binary>")
            return 2
        return check(args[1], list(selected.values()))
    build_only = args[:1] == ["--build-only"]
    if args and not build_only:
        log(f"gpu_mutants: unknown arguments {args} (see the docstring)")
        return 2

    build = Path(os.environ.get("BUILD_DIR", "build-gpu"))
    if not build.is_absolute():
        build = ROOT / build
    out = Path(os.environ.get("OUT", ROOT / "out" / "gpu-mutants"))
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("*.tests.log"), *out.glob("*.compile.log"), out / "gpu-mutants.jsonl"]:
        old.unlink(missing_ok=True)
    jobs = int(os.environ.get("JOBS", os.cpu_count() or 2))
    test_jobs = int(os.environ.get("TEST_JOBS", "4"))
    timeout = int(os.environ.get("MUTANT_TIMEOUT", "300"))
    threads = str(max(1, (os.cpu_count() or 2) // test_jobs))
    TEST_ENV.update(OMP_NUM_THREADS=threads, OPENBLAS_NUM_THREADS=threads)
    start = time.time()

    # 1. the build as it is
    if not (build / "build.ninja").is_file():
        if build.name != "build-gpu":
            log(f"gpu_mutants: {build} is not configured"); return 2
        log("== configure + build (scripts/device-build.sh)")
        r = subprocess.run(["bash", "-c", "source scripts/device-build.sh"], cwd=ROOT,
                           env={**os.environ, "OUT": str(out)})
        if r.returncode != 0:
            return 2
    else:
        log(f"== building {build.name}/tests/csattn_tests")
        r = run(["cmake", "--build", str(build), "-j", str(jobs), "--target", "csattn_tests"])
        (out / "build.log").write_text(r.stdout + r.stderr)
        if r.returncode != 0:
            log(f"gpu_mutants: the build fails as it is ({out}/build.log)"); return 2
    binary = build / "tests" / "csattn_tests"

    # 2. shadow trees and the objects each mutant changes
    deps = dependency_records(build)
    link_cmd, link_out, own_objs, lib_objs = link_parts(build)
    work = build / "mutants"
    shutil.rmtree(work, ignore_errors=True)
    compiles: list[tuple[int, str, str, Path]] = []  # (mutant, object, command, its output)
    plans: dict[int, list[tuple[str, Path]]] = {}
    problems: dict[int, str] = {}
    for k, m in selected.items():
        shadow = work / f"m{k}"
        for sub in ("src", "include"):
            shutil.copytree(ROOT / sub, shadow / sub)
        if not apply_sed(m, shadow / m.file):
            problems[k] = "the sed matched nothing (update this script)"
            continue
        target = os.path.realpath(ROOT / m.file)
        objs = sorted(o for o, d in deps.items() if target in d and (o in own_objs or o in lib_objs))
        if not objs:
            problems[k] = f"no object of csattn_tests is built from {m.file}"
            continue
        plans[k] = []
        for i, o in enumerate(objs):
            obj_out = shadow / "obj" / f"{i}_{Path(o).name}"
            obj_out.parent.mkdir(parents=True, exist_ok=True)
            plans[k].append((o, obj_out))
            compiles.append((k, o, shadow_command(last_command(build, o), shadow, obj_out), obj_out))
    log(f"== compiling {len(compiles)} objects for {len(plans)} mutants, {jobs} at a time")

    def compile_one(job: tuple[int, str, str, Path]) -> tuple[int, str, str]:
        k, o, cmd, obj_out = job
        r = run(cmd, shell=True, cwd=build)
        with open(out / f"m{k}.compile.log", "a") as f:
            f.write(f"$ {cmd}\n{r.stdout}{r.stderr}\n")
        if r.returncode != 0:
            return k, o, f"compile of {Path(o).name} failed ({out}/m{k}.compile.log)"
        # The proof that the object holds the bug: its dependency file names the mutated copy.
        if not depfile_lists(obj_out, work / f"m{k}" / selected[k].file):
            return k, o, f"{Path(o).name} was compiled without the mutated {selected[k].file}"
        return k, o, ""

    with ThreadPoolExecutor(jobs) as pool:
        for k, o, problem in pool.map(compile_one, compiles):
            if problem and k not in problems:
                problems[k] = problem
    log(f"compiled: {time.time() - start:.0f} s")

    # 3. one test binary a mutant: its objects first, the archive's originals left out
    def link_one(k: int) -> tuple[int, bool]:
        tokens = shlex.split(link_cmd)
        mutated = {o: str(p) for o, p in plans[k]}
        tokens = [mutated.get(t, t) for t in tokens]  # the test binary's own objects
        extra = [str(p) for o, p in plans[k] if o in lib_objs and o not in own_objs]
        lib_at = next(i for i, t in enumerate(tokens) if t.endswith("libcsattn.a"))
        tokens[lib_at:lib_at] = extra
        tokens[tokens.index("-o") + 1] = f"{link_out}.mutant{k}"
        r = run(tokens, cwd=build)
        with open(out / f"m{k}.compile.log", "a") as f:
            f.write(f"$ (link) {shlex.join(tokens)[:300]}...\n{r.stdout}{r.stderr}\n")
        return k, r.returncode == 0

    with ThreadPoolExecutor(jobs) as pool:
        for k, ok in pool.map(link_one, [k for k in plans if k not in problems]):
            if not ok:
                problems[k] = f"link failed ({out}/m{k}.compile.log)"
    log(f"linked: {time.time() - start:.0f} s")

    # 4. the tests: each distinct filter on the real binary (the baseline: it must pass) and
    # each mutant's on its binary, TEST_JOBS processes at a time on the one GPU. Verdicts are
    # appended to gpu-mutants.jsonl as they come (a call cut short keeps what finished).
    results: dict[int, tuple[str, str, float]] = {}  # mutant -> (how, verdict text, seconds)
    ready = [k for k in plans if k not in problems]
    filters = sorted({selected[k].tests for k in ready})
    baseline: dict[str, tuple[str, float]] = {}  # filter -> ("" passed / "skipped" / what failed, s)
    lock = threading.Lock()

    def record(entry: dict) -> None:
        with lock, open(out / "gpu-mutants.jsonl", "a") as f:
            f.write(json.dumps(entry) + "\n")

    def base_one(i: int) -> None:
        f, t0 = filters[i], time.time()
        how, failed = run_tests(binary, f, out / f"base{i + 1}.tests.log", timeout)
        text = (out / f"base{i + 1}.tests.log").read_text()
        what = ("skipped" if all_skipped(text) else "") if how == "ran" and not failed else \
            f"{how}, {failed} failed (base{i + 1}.tests.log)"
        baseline[f] = (what, time.time() - t0)
        record({"baseline": f, "result": what or "passed", "seconds": round(baseline[f][1], 1)})

    def test_one(k: int) -> None:
        t0 = time.time()
        log_path = out / f"m{k}.tests.log"
        how, failed = run_tests(build / f"{link_out}.mutant{k}", selected[k].tests, log_path, timeout)
        took = time.time() - t0
        if how == "timeout":
            text = f"timed out after {timeout} s"
        elif how == "died":
            text = f"detected (the test process died; m{k}.tests.log) [{took:.0f} s]"
        elif failed:
            first = re.search(r"^\[  FAILED  \] (\S+)", log_path.read_text(), re.M)
            text = f"detected ({failed} failed, e.g. {first.group(1) if first else '?'}) [{took:.0f} s]"
        elif all_skipped(log_path.read_text()):
            text = "NOT RUN (its tests skipped)"
        else:
            text = f"SURVIVED (m{k}.tests.log) [{took:.0f} s]"
        results[k] = (how, text, took)
        record({"mutant": k, "name": selected[k].name, "result": text})

    if not build_only and ready:
        log(f"== testing: {len(filters)} baseline filters, {len(ready)} mutants, {test_jobs} at a time")
        # Longest first (by how many tests a filter selects): the CP filters' 20 cases each
        # then overlap the many short kernel-level runs instead of ending the call alone.
        names = listed_tests(str(binary))
        size = {f: sum(filter_matches(f, t) for t in names) for f in filters}
        order = sorted([(size[f], "base", i) for i, f in enumerate(filters)] +
                       [(size[selected[k].tests], "mutant", k) for k in ready], key=lambda j: -j[0])
        with ThreadPoolExecutor(test_jobs) as pool:
            futures = [pool.submit(base_one if kind == "base" else test_one, i) for _, kind, i in order]
            for fut in futures:
                fut.result()
        if all(what == "skipped" for what, _ in baseline.values()):
            log("gpu_mutants: every test skipped (no GPU here?); --build-only compiles and links only")
            return 2
        for k in ready:
            what, base_s = baseline[selected[k].tests]
            how, text, _ = results[k]
            if what:
                problems[k] = f"not judged: its tests fail as they are ({what})"
            elif how == "timeout" and base_s > timeout / 3:
                # A slow baseline: the mutant may only have been slow under contention.
                problems[k] = f"inconclusive: {text}, its baseline took {base_s:.0f} s"
            elif how == "timeout":
                results[k] = (how, f"detected ({text}; its baseline took {base_s:.0f} s)", 0.0)

    # 5. report
    bad_count = 0
    report = []
    for k, m in selected.items():
        verdict = problems.get(k) or ("built" if build_only else results[k][1])
        expected = "SURVIVED" if m.control else "detected"
        bad = k in problems or not (build_only or verdict.startswith(expected))
        bad_count += bad
        log(f"mutant {k} '{m.name}': {verdict}")
        report.append({"mutant": k, "name": m.name, "file": m.file, "tests": m.tests, "verdict": verdict})
        if not bad:
            (build / f"{link_out}.mutant{k}").unlink(missing_ok=True)
    (out / "gpu-mutants.json").write_text(json.dumps(report, indent=1))
    if bad_count == 0:
        shutil.rmtree(work, ignore_errors=True)
    took = f"({time.time() - start:.0f} s)"
    if build_only:
        log(f"gpu_mutants: {len(selected) - bad_count} of {len(selected)} mutants built {took}")
    else:
        # The controls are counted apart: "36 of 36 detected" read wrong when the control
        # (rightly) survived.
        bugs = [k for k, m in selected.items() if not m.control]
        caught = sum(k not in problems and results[k][1].startswith("detected") for k in bugs)
        controls = [k for k, m in selected.items() if m.control]
        kept = sum(k not in problems and results[k][1].startswith("SURVIVED") for k in controls)
        log(f"gpu_mutants: {caught} of {len(bugs)} mutants detected, {kept} of {len(controls)} "
            f"controls survived {took}")
    return 1 if bad_count else 0


if __name__ == "__main__":
    sys.exit(main())
