# The CUDA side of the build, included by the top-level CMakeLists.txt only when DISTCA_CUDA=ON.
#
# Architectures: sm_90 SASS only ("90-real": the H200/H100; no PTX, so the driver never JITs and
# nvcc compiles each kernel once, which matters on 2-core build machines). The kernels use
# mma.sync (m16n8k16, sm_80+) and cp.async (sm_80+), nothing sm_90a-only (no wgmma/TMA), so
# "80-real;90-real" would also build them for A100s at twice the compile time.
set(DISTCA_CUDA_ARCHITECTURES "90-real" CACHE STRING "CMAKE_CUDA_ARCHITECTURES for the distca CUDA targets")
if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
endif()
set(CMAKE_CUDA_ARCHITECTURES ${DISTCA_CUDA_ARCHITECTURES})
enable_language(CUDA)
# C++17 for .cu files: CMake 3.25 has no CUDA20 dialect for nvcc. Headers a .cu file includes
# (core/status.h, core/cuda_check.h, kernels/attention.h, kernels_cuda/*) must stay C++17.
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(CMAKE_CUDA_EXTENSIONS OFF)
find_package(CUDAToolkit REQUIRED)

# distca::cuda: what every CUDA target links (the runtime, core/cuda_check.h's Status type).
# The runtime is linked statically: a program then needs only the driver's libcuda from the
# machine it runs on (scripts/gpu-check.sh carries programs to a device machine; libcublas and
# libnccl, hundreds of MB each, come from that machine's own CUDA 13).
add_library(distca_cuda_common INTERFACE)
add_library(distca::cuda ALIAS distca_cuda_common)
target_link_libraries(distca_cuda_common INTERFACE distca::core CUDA::cudart_static)
target_compile_definitions(distca_cuda_common INTERFACE DISTCA_HAS_CUDA=1)

# Per-target flags for a target with .cu and .cpp sources: the C++ flags of distca_target_flags
# for the host compiler (also behind nvcc, via -Xcompiler), warnings as errors on the device
# side too. Sanitizers are not applied to CUDA targets.
function(distca_cuda_target_flags target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Werror --Werror=all-warnings
                               --expt-relaxed-constexpr -lineinfo>)
  if(DISTCA_NATIVE)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-march=native>)
  endif()
endfunction()
