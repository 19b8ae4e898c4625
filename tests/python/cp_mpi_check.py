"""Context parallelism from Python over MPI (run by ctest as `mpirun -np 2 python3 ...`): every
rank runs the CP layer on its rows for both partition modes and all three layer types, and
compares them with the single-rank layer it also runs on the whole batch: fp32 outputs
bitwise, input gradients and the rank-summed parameter gradients and loss within 1e-5 of
their largest element (the ranks' shares add in another order).
`--device cuda` does the same in bf16 on one GPU per rank over NCCL (main).
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


def check_layers(comm, layer_comm, preset, lengths, padded, device, out_tol, grad_tol):
    """Every layer type of `preset` x both modes: the CP layer on `layer_comm` against the
    single-rank layer on the whole batch. out_tol None: outputs and top-k bitwise."""
    P, r = comm.size, comm.rank
    precision = "fp32" if device == "cpu" else "bf16"
    cu = [0] + list(np.cumsum(lengths))
    for cfg in csattn.preset_layers(preset):
        cfg.per_token_loss = False
        w = csattn.LayerWeights.random(cfg, 50)
        for mode in ("contiguous", "two_chunk"):
            cu_p = csattn.pad_for_context_parallel(cu, [0] + list(np.cumsum(padded)), mode, P, cfg.window)
            part = csattn.CpPartition.build(cu, cu_p, mode, P)
            T = part.total_rows
            rng = np.random.default_rng(51)
            x = rng.standard_normal((T, cfg.d_model)).astype(np.float32)
            gy = rng.standard_normal((T, cfg.d_model)).astype(np.float32)
            one = csattn.Layer(cfg, w, precision=precision, device=device)
            ref = one.forward(x, cu, cu_p)
            ref_g = one.backward(ref, gy)

            rows = np.array(part.rows(r))
            cp = csattn.ContextParallelLayer(cfg, w, precision=precision, device=device)
            fwd = cp.forward(layer_comm, part, x[rows])
            what = f"rank {r} {cfg.kind} {mode} ({device})"
            if out_tol is None:
                check(np.array_equal(fwd.output, ref.output[rows]), f"{what}: output differs")
                if cfg.kind == "CSA":
                    check(np.array_equal(fwd.topk, ref.topk[rows]), f"{what}: top-k differs")
            else:
                check_close(fwd.output, ref.output[rows], f"{what}: output", tol=out_tol)
            g = cp.backward(layer_comm, fwd, gy[rows])
            check_close(g["input"], ref_g["input"][rows], f"{what}: grad input", tol=grad_tol)
            shares = {k: v for k, v in g.items() if k != "input"}
            shares["loss"] = np.array([fwd.indexer_loss], dtype=np.float32)
            total = comm.all_reduce_sum(shares)
            check_close(total["loss"], np.array([ref.indexer_loss]), f"{what}: loss", tol=grad_tol)
            for name in w.names():
                check_close(total[name], ref_g[name], f"{what}: {name}", tol=grad_tol)
            check(fwd.work["local_rows"] == len(rows), f"{what}: work report")


def main():
    comm = csattn.mpi_world()
    P, r = comm.size, comm.rank
    check(P >= 2, f"run under mpirun with at least 2 ranks (got {P})")
    if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1] == "cuda":
        # One GPU per rank over NCCL against the single-GPU layer: outputs within 1e-3 (the
        # same kernels on the same rows: bitwise on an H200), gradients within 1e-2 (atomic
        # sums in another order).
        local = csattn.launcher_local_rank()
        nccl = csattn.nccl_communicator(comm, local if local >= 0 else r)
        check_layers(comm, nccl, "small", [37, 5, 300, 150], [40, 8, 304, 150], "cuda", 1e-3, 1e-2)
        comm.barrier()
        if r == 0:
            print(f"cp_mpi_check: {P} ranks on {P} GPUs (NCCL), SWA/CSA/HCA x contiguous/two_chunk: CP == single GPU")
        return
    check_layers(comm, comm, "tiny", [37, 5, 70, 150], [40, 8, 72, 150], "cpu", None, 1e-5)
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
