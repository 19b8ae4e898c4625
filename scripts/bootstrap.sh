#!/usr/bin/env bash
# Installs what csattn needs to build and test on a Debian machine (idempotent): Debian
# packages for the C++ build, and from PyPI (pinned) what the Python module needs to build
# and test (nanobind, NumPy, pytest) into the python3 on PATH. Nothing else is downloaded.
set -euo pipefail

# Python packages, checked by importing them (no network when present).
py_pkgs=(nanobind==2.10.2 numpy==2.2.6 pytest==8.3.5)
if command -v python3 > /dev/null 2>&1 &&
   ! python3 -c "import nanobind, numpy, pytest" > /dev/null 2>&1; then
  echo "bootstrap: pip installing ${py_pkgs[*]}"
  python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore "${py_pkgs[@]}"
fi

# Where nvcc is (the CUDA backend gets built), cuobjdump and nvdisasm for the kernel SASS
# checks (ctest kernel_checks): the toolkit ships no disassembler. Pinned PyPI wheels into
# .sass-tools/ (no network when present).
# A failed download only skips those checks (CMake says so), it does not stop the build.
if command -v nvcc > /dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  "$(dirname "$0")/sass-tools.sh" ||
    echo "bootstrap: WARNING: cuobjdump / nvdisasm not installed; ctest kernel_checks will be skipped" >&2
fi

# Debian package -> a file whose presence proves it is installed (checked before apt runs,
# so a second call costs nothing and needs no network). Each path is one the package itself
# ships (dpkg -S), not an update-alternatives link such as /usr/bin/mpirun.
declare -A probe=(
  [cmake]=/usr/bin/cmake
  [ninja-build]=/usr/bin/ninja
  [g++]=/usr/bin/g++
  [libgtest-dev]=/usr/include/gtest/gtest.h
  [libgmock-dev]=/usr/include/gmock/gmock.h
  [libbenchmark-dev]=/usr/include/benchmark/benchmark.h
  [libcli11-dev]=/usr/include/CLI/CLI.hpp
  [nlohmann-json3-dev]=/usr/include/nlohmann/json.hpp
  [libfmt-dev]=/usr/include/fmt/format.h
  [libopenblas-openmp-dev]=/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so
  [openmpi-bin]=/usr/bin/mpirun.openmpi
  [libopenmpi-dev]=/usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h
)

missing=()
for pkg in "${!probe[@]}"; do
  [ -e "${probe[$pkg]}" ] || missing+=("$pkg")
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "bootstrap: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
