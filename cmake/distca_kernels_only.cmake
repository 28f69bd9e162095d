# DISTCA_KERNELS_ONLY=ON (preset cuda-kernels): the CUDA kernels (distca_kernels_cuda), their
# test programs and nothing else, so that a machine with the CUDA toolkit alone builds them
# (scripts/gpu-check.sh on a device image without OpenBLAS, MPI, OpenMP, CLI11, toml++,
# nlohmann-json or NCCL). Included by the top-level CMakeLists.txt, which stops after it.
#
# What the kernels and their tests use of the layers below: core's Status, checks and Rng
# (status.cpp, rng.cpp), and kernels' params, fp64/fp32 references and test problems
# (params.cpp, reference.cpp, problem.cpp); none of these needs a third-party library. Left
# out: the CPU fast path (attention.cpp: OpenBLAS, OpenMP), hence test_criterion.cpp; the CLI,
# hence kernels_cuda_cli_test and the benchmarks; the NCCL communicator and the device pack.
#
# GoogleTest: find_package(GTest), else built from DISTCA_GTEST_SOURCE_DIR (a googletest source
# tree: `scripts/gpu-check.sh --bundle` packs Debian's /usr/src/googletest as build/gtest-src).
set(DISTCA_CUDA ON)
include(cmake/distca_target.cmake)
include(cmake/distca_cuda.cmake)

add_library(distca_core STATIC src/core/status.cpp src/core/rng.cpp)
add_library(distca::core ALIAS distca_core)
target_include_directories(distca_core PUBLIC ${PROJECT_SOURCE_DIR}/include)
distca_target_flags(distca_core)

add_library(distca_kernels STATIC src/kernels/params.cpp src/kernels/reference.cpp src/kernels/problem.cpp)
add_library(distca::kernels ALIAS distca_kernels)
target_link_libraries(distca_kernels PUBLIC distca::core)
distca_target_flags(distca_kernels)

add_subdirectory(src/kernels_cuda)

if(DISTCA_BUILD_TESTS)
  set(DISTCA_GTEST_SOURCE_DIR "" CACHE PATH "googletest source tree, used when find_package(GTest) finds none")
  find_package(GTest QUIET)
  if(NOT GTest_FOUND)
    if(NOT EXISTS "${DISTCA_GTEST_SOURCE_DIR}/CMakeLists.txt")
      message(FATAL_ERROR "DISTCA_KERNELS_ONLY: no GTest installed; set DISTCA_GTEST_SOURCE_DIR to a googletest source tree")
    endif()
    set(BUILD_GMOCK OFF CACHE BOOL "" FORCE)
    set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
    add_subdirectory(${DISTCA_GTEST_SOURCE_DIR} ${CMAKE_BINARY_DIR}/googletest EXCLUDE_FROM_ALL)
    if(NOT TARGET GTest::gtest)  # googletest 1.11+ defines these aliases itself
      add_library(GTest::gtest ALIAS gtest)
      add_library(GTest::gtest_main ALIAS gtest_main)
    endif()
  endif()
  enable_testing()
  include(cmake/distca_test.cmake)
  add_subdirectory(tests/kernels_cuda)
endif()
