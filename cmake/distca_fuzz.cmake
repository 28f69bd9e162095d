# The libFuzzer targets of fuzz/, built by the full build (scripts/test.sh; not by
# scripts/run.sh, which builds only its targets) and run by CTest.
#
# libFuzzer is clang's, and the project builds with GCC, so fuzz/ is its own CMake project
# that ExternalProject configures with clang++ into <build>/fuzz. It compiles only the parsers'
# sources. Every target gets a CTest entry (label `fuzz`) that runs it for
# DISTCA_FUZZ_SECONDS from its seed corpus (fuzz/corpus/<target>); scripts/fuzz.sh runs them
# longer.
include_guard(GLOBAL)

option(DISTCA_FUZZ "Build the libFuzzer targets with clang++ and run each briefly in CTest (where clang++ links -fsanitize=fuzzer)" ON)
set(DISTCA_FUZZ_SECONDS 20 CACHE STRING "Seconds each fuzz target runs in CTest")
if(NOT DISTCA_FUZZ)
  return()
endif()

find_program(DISTCA_CLANGXX NAMES clang++ clang++-14 DOC "clang++ used for the libFuzzer build")
if(DISTCA_CLANGXX AND NOT DISTCA_LIBFUZZER_WORKS)
  # Link a trivial target: clang without libFuzzer's runtime (libclang-rt-14-dev on Debian)
  # compiles but fails here. Only success is cached, so installing the runtime is seen.
  set(_probe ${CMAKE_BINARY_DIR}/CMakeFiles/distca_fuzz_probe)
  file(WRITE ${_probe}/probe.cpp
       "#include <cstddef>\n#include <cstdint>\n"
       "extern \"C\" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n")
  execute_process(COMMAND ${DISTCA_CLANGXX} -fsanitize=fuzzer,address,undefined probe.cpp -o probe
                  WORKING_DIRECTORY ${_probe} RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_QUIET)
  if(_rc EQUAL 0)
    set(DISTCA_LIBFUZZER_WORKS ON CACHE INTERNAL "clang++ links -fsanitize=fuzzer")
  endif()
endif()
set(_fuzz_tools_found OFF)
if(DISTCA_CLANGXX AND DISTCA_LIBFUZZER_WORKS)
  set(_fuzz_tools_found ON)
endif()
distca_optional_part(DISTCA_FUZZ _fuzz_tools_found "fuzz targets"
                     "clang++ that links -fsanitize=fuzzer (clang, libclang-rt-14-dev)")
if(NOT DISTCA_FUZZ)
  return()
endif()

include(ExternalProject)
include(${PROJECT_SOURCE_DIR}/fuzz/targets.cmake)
set(DISTCA_FUZZ_BINARY_DIR ${CMAKE_BINARY_DIR}/fuzz)
set(_fuzz_args -DCMAKE_CXX_COMPILER=${DISTCA_CLANGXX} -DCMAKE_BUILD_TYPE=RelWithDebInfo)
if(CMAKE_CXX_COMPILER_LAUNCHER)
  list(APPEND _fuzz_args -DCMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER})
endif()
set(_fuzz_byproducts)
foreach(t IN LISTS DISTCA_FUZZ_TARGETS)
  list(APPEND _fuzz_byproducts ${DISTCA_FUZZ_BINARY_DIR}/${t})
endforeach()
ExternalProject_Add(distca_fuzz
  SOURCE_DIR ${PROJECT_SOURCE_DIR}/fuzz
  BINARY_DIR ${DISTCA_FUZZ_BINARY_DIR}
  CMAKE_ARGS ${_fuzz_args}
  # The inner build decides what is stale; always asking it is how edits in src/ reach it.
  BUILD_ALWAYS ON
  BUILD_BYPRODUCTS ${_fuzz_byproducts}
  INSTALL_COMMAND "")

if(DISTCA_BUILD_TESTS)
  foreach(t IN LISTS DISTCA_FUZZ_TARGETS)
    add_test(NAME fuzz.${t}
             COMMAND ${CMAKE_COMMAND} -DFUZZER=${DISTCA_FUZZ_BINARY_DIR}/${t}
                     -DSEEDS=${PROJECT_SOURCE_DIR}/fuzz/corpus/${t}
                     -DDICT=${PROJECT_SOURCE_DIR}/fuzz/${t}.dict
                     -DWORK=${DISTCA_FUZZ_BINARY_DIR}/run/${t} -DSECONDS=${DISTCA_FUZZ_SECONDS}
                     -P ${PROJECT_SOURCE_DIR}/cmake/run_fuzzer.cmake)
    math(EXPR _timeout "${DISTCA_FUZZ_SECONDS} + 120")
    set_tests_properties(fuzz.${t} PROPERTIES LABELS "fuzz" TIMEOUT ${_timeout})
  endforeach()
endif()
