#!/usr/bin/env bash
# Installs cuobjdump and nvdisasm (NVIDIA's PyPI wheels, pinned) into .sass-tools/bin, for
# reading the SASS of kernels compiled on this GPU-less machine: the toolkit here ships nvcc
# and ptxas but no disassembler. Then, for example:
#   .sass-tools/bin/cuobjdump -sass build/CMakeFiles/csattn_cuda.dir/src/cuda/X.cu.o
# (cuobjdump finds nvdisasm on PATH: PATH=$PWD/.sass-tools/bin:$PATH). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
dst=.sass-tools
version=13.5.37
if [ -x "$dst/bin/cuobjdump" ] && [ -x "$dst/bin/nvdisasm" ]; then exit 0; fi
mkdir -p "$dst/wheels" "$dst/bin"
python3 -m pip download -q --no-deps --disable-pip-version-check -d "$dst/wheels" \
  "nvidia-cuda-cuobjdump==$version" "nvidia-cuda-nvdisasm==$version"
for tool in cuobjdump nvdisasm; do
  python3 - "$dst/wheels" "$tool" "$dst/bin" <<'PY'
import pathlib, sys, zipfile
wheels, tool, out = pathlib.Path(sys.argv[1]), sys.argv[2], pathlib.Path(sys.argv[3])
for w in wheels.glob("*.whl"):
    with zipfile.ZipFile(w) as z:
        for name in z.namelist():
            if name.endswith("/bin/" + tool):
                target = out / tool
                target.write_bytes(z.read(name))
                target.chmod(0o755)
                sys.exit(0)
sys.exit(f"sass-tools: {tool} not found in {wheels}")
PY
done
echo "sass-tools: $dst/bin/cuobjdump, $dst/bin/nvdisasm"
