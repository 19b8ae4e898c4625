"""Context parallelism from Python over MPI (run by ctest as `mpirun -np 2 python3 ...`): every
rank runs the CP layer on its rows for both partition modes and all three layer types, and
compares them with the single-rank layer it also runs on the whole batch: fp32 outputs
bitwise, input gradients and the rank-summed parameter gradients and loss within 1e-5 of
their largest element (the ranks' shares add in another order).
`--device cuda` does the same on one GPU per rank over NCCL (main_cuda).
Exits non-zero on the first mismatch (every rank reports)."""
import sys

import numpy as np

import csattn


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def check_close(a, b, what, tol=1e-5):
    """max |a - b| within tol of max |b| (fp32 sums in another order: the rank shares)."""
    err, scale = float(np.abs(a - b).max(initial=0.0)), float(np.abs(b).max(initial=0.0))
    check(err <= tol * max(scale, 1e-30), f"{what}: max |diff| {err:.3e} against max |ref| {scale:.3e}")


def main_cuda(comm):
    """`--device cuda`: one GPU per rank over NCCL (bootstrapped through MPI) against the
    single-GPU layer: outputs within 1e-3 (the same kernels on the same rows: bitwise on an
    H200), gradients within 1e-2 of their largest element (atomic sums in another order)."""
    P, r = comm.size, comm.rank
    local = csattn.launcher_local_rank()
    nccl = csattn.nccl_communicator(comm, local if local >= 0 else r)
    lengths, padded = [37, 5, 300, 150], [40, 8, 304, 150]
    cu = [0] + list(np.cumsum(lengths))
    for cfg in csattn.preset_layers("small"):
        cfg.per_token_loss = False
        w = csattn.LayerWeights.random(cfg, 60)
        for mode in ("contiguous", "two_chunk"):
            cu_p = csattn.pad_for_context_parallel(cu, [0] + list(np.cumsum(padded)), mode, P, cfg.window)
            part = csattn.CpPartition.build(cu, cu_p, mode, P)
            T = part.total_rows
            rng = np.random.default_rng(61)
            x = rng.standard_normal((T, cfg.d_model)).astype(np.float32)
            gy = rng.standard_normal((T, cfg.d_model)).astype(np.float32)
            one = csattn.Layer(cfg, w, device="cuda")
            ref = one.forward(x, cu, cu_p)
            ref_g = one.backward(ref, gy)
            rows = np.array(part.rows(r))
            cp = csattn.ContextParallelLayer(cfg, w, device="cuda")
            fwd = cp.forward(nccl, part, x[rows])
            what = f"rank {r} {cfg.kind} {mode} (cuda)"
            check_close(fwd.output, ref.output[rows], f"{what}: output", tol=1e-3)
            g = cp.backward(nccl, fwd, gy[rows])
            check_close(g["input"], ref_g["input"][rows], f"{what}: grad input", tol=1e-2)
            shares = {k: v for k, v in g.items() if k != "input"}
            shares["loss"] = np.array([fwd.indexer_loss], dtype=np.float32)
            total = comm.all_reduce_sum(shares)
            check_close(total["loss"], np.array([ref.indexer_loss]), f"{what}: loss", tol=1e-2)
            for name in w.names():
                check_close(total[name], ref_g[name], f"{what}: {name}", tol=1e-2)
    comm.barrier()
    if r == 0:
        print(f"cp_mpi_check: {P} ranks on {P} GPUs (NCCL), SWA/CSA/HCA x contiguous/two_chunk: CP == single GPU")


def main():
    comm = csattn.mpi_world()
    P, r = comm.size, comm.rank
    check(P >= 2, f"run under mpirun with at least 2 ranks (got {P})")
    if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1] == "cuda":
        return main_cuda(comm)
    lengths, padded = [37, 5, 70, 150], [40, 8, 72, 150]
    cu = [0] + list(np.cumsum(lengths))
    for cfg in csattn.preset_layers("tiny"):
        cfg.per_token_loss = False
        w = csattn.LayerWeights.random(cfg, 50)
        for mode in ("contiguous", "two_chunk"):
            cu_p = csattn.pad_for_context_parallel(cu, [0] + list(np.cumsum(padded)), mode, P, cfg.window)
            part = csattn.CpPartition.build(cu, cu_p, mode, P)
            T = part.total_rows
            rng = np.random.default_rng(51)
            x = rng.standard_normal((T, cfg.d_model)).astype(np.float32)
            gy = rng.standard_normal((T, cfg.d_model)).astype(np.float32)
            one = csattn.Layer(cfg, w, precision="fp32")
            ref = one.forward(x, cu, cu_p)
            ref_g = one.backward(ref, gy)

            rows = np.array(part.rows(r))
            cp = csattn.ContextParallelLayer(cfg, w, precision="fp32")
            fwd = cp.forward(comm, part, x[rows])
            what = f"rank {r} {cfg.kind} {mode}"
            check(np.array_equal(fwd.output, ref.output[rows]), f"{what}: output differs")
            if cfg.kind == "CSA":
                check(np.array_equal(fwd.topk, ref.topk[rows]), f"{what}: top-k differs")
            g = cp.backward(comm, fwd, gy[rows])
            check_close(g["input"], ref_g["input"][rows], f"{what}: grad input")
            shares = {k: v for k, v in g.items() if k != "input"}
            shares["loss"] = np.array([fwd.indexer_loss], dtype=np.float32)
            total = comm.all_reduce_sum(shares)
            check_close(total["loss"], np.array([ref.indexer_loss]), f"{what}: loss")
            for name in w.names():
                check_close(total[name], ref_g[name], f"{what}: {name}")
            check(fwd.work["local_rows"] == len(rows), f"{what}: work report")
    comm.barrier()
    if r == 0:
        print(f"cp_mpi_check: {P} ranks, SWA/CSA/HCA x contiguous/two_chunk: CP == single rank")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # every rank says why, then the job fails
        import traceback
        traceback.print_exc()
        print(f"cp_mpi_check FAILED: {e!r}", file=sys.stderr)
        sys.exit(1)
