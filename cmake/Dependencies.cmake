# Third-party dependencies. On Debian (our machines and CI) they come from packages
# (scripts/bootstrap.sh). Elsewhere (the lent GPU machine has no package registry) the
# header-only ones and GoogleTest's sources can be supplied in CSATTN_THIRD_PARTY_DIR
# (scripts/gpu-check.sh fills it), and BLAS falls back to csattn's own blocked GEMM.

set(CSATTN_THIRD_PARTY_DIR "" CACHE PATH
    "Folder with include/{nlohmann,CLI,fmt} and googletest/ for machines without packages")

find_package(OpenMP REQUIRED)

find_package(nlohmann_json 3.10 QUIET)
if(NOT nlohmann_json_FOUND)
  if(NOT EXISTS "${CSATTN_THIRD_PARTY_DIR}/include/nlohmann/json.hpp")
    message(FATAL_ERROR "nlohmann-json not found: install nlohmann-json3-dev (scripts/bootstrap.sh) "
                        "or set CSATTN_THIRD_PARTY_DIR")
  endif()
  add_library(nlohmann_json::nlohmann_json INTERFACE IMPORTED)
  target_include_directories(nlohmann_json::nlohmann_json INTERFACE "${CSATTN_THIRD_PARTY_DIR}/include")
endif()

find_package(fmt QUIET)
if(NOT fmt_FOUND)
  if(NOT EXISTS "${CSATTN_THIRD_PARTY_DIR}/include/fmt/format.h")
    message(FATAL_ERROR "fmt not found: install libfmt-dev (scripts/bootstrap.sh) or set CSATTN_THIRD_PARTY_DIR")
  endif()
  add_library(fmt::fmt INTERFACE IMPORTED)
  target_include_directories(fmt::fmt INTERFACE "${CSATTN_THIRD_PARTY_DIR}/include")
  target_compile_definitions(fmt::fmt INTERFACE FMT_HEADER_ONLY=1)
endif()

find_package(CLI11 QUIET)
if(NOT CLI11_FOUND)
  if(NOT EXISTS "${CSATTN_THIRD_PARTY_DIR}/include/CLI/CLI.hpp")
    message(FATAL_ERROR "CLI11 not found: install libcli11-dev (scripts/bootstrap.sh) or set CSATTN_THIRD_PARTY_DIR")
  endif()
  add_library(CLI11::CLI11 INTERFACE IMPORTED)
  target_include_directories(CLI11::CLI11 INTERFACE "${CSATTN_THIRD_PARTY_DIR}/include")
endif()

# OpenBLAS's CBLAS for the CPU projections; without it, csattn's own blocked GEMM (slower,
# used only where no BLAS package can be installed).
option(CSATTN_USE_BLAS "Use OpenBLAS for the CPU projections when found" ON)
if(CSATTN_USE_BLAS)
  find_path(CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas)
  find_library(CBLAS_LIBRARY NAMES openblas)
endif()
if(CSATTN_USE_BLAS AND CBLAS_INCLUDE_DIR AND CBLAS_LIBRARY)
  set(CSATTN_HAVE_CBLAS ON)
else()
  set(CSATTN_HAVE_CBLAS OFF)
  message(WARNING "OpenBLAS not found: the CPU backend uses its own (slower) GEMM")
endif()

if(CSATTN_BUILD_TESTS)
  find_package(GTest QUIET)
  if(NOT GTest_FOUND)
    if(NOT EXISTS "${CSATTN_THIRD_PARTY_DIR}/googletest/CMakeLists.txt")
      message(FATAL_ERROR "GoogleTest not found: install libgtest-dev (scripts/bootstrap.sh) "
                          "or set CSATTN_THIRD_PARTY_DIR")
    endif()
    set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
    set(BUILD_GMOCK OFF CACHE BOOL "" FORCE)
    add_subdirectory("${CSATTN_THIRD_PARTY_DIR}/googletest" googletest EXCLUDE_FROM_ALL)
    add_library(GTest::gtest ALIAS gtest)
    add_library(GTest::gtest_main ALIAS gtest_main)
  endif()
endif()
