# Runs comm_mpi_wait_test under DISTCA_WAIT=sleep with DISTCA_WAIT_STATS=DIR and checks the
# record (docs/runtime.md, "Waits"): one file per rank, the sleep policy named, every rank's
# waits counted (each rank makes 8 blocking waits: 5 barriers, an exchange's wait() and 2 p2p), and
# rank 0, which waited 3 x 200 ms for late peers, with at least 0.3 s of waiting in the record,
# under a tenth of it in CPU, and sleeps.
# Usage: cmake -DMPIEXEC=... -DPROGRAM=... -DDIR=... -P expect_wait_stats.cmake
file(REMOVE_RECURSE "${DIR}")
file(MAKE_DIRECTORY "${DIR}")
set(ENV{DISTCA_WAIT} sleep)
set(ENV{DISTCA_WAIT_STATS} "${DIR}")
execute_process(
  COMMAND ${MPIEXEC} --oversubscribe --allow-run-as-root -np 2 ${PROGRAM}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 90)
if(NOT "${rc}" STREQUAL "0")
  message(FATAL_ERROR "mpirun failed (${rc}):\n${out}\n${err}")
endif()
foreach(rank 0 1)
  set(f "${DIR}/wait-stats.${rank}.json")
  if(NOT EXISTS "${f}")
    message(FATAL_ERROR "no ${f}")
  endif()
  file(READ "${f}" text)
  string(JSON policy GET "${text}" policy)
  string(JSON waits GET "${text}" waits)
  if(NOT policy STREQUAL "sleep" OR waits LESS 8)
    message(FATAL_ERROR "rank ${rank}: policy ${policy}, ${waits} waits:\n${text}")
  endif()
endforeach()
file(READ "${DIR}/wait-stats.0.json" text)
string(JSON wall GET "${text}" wait_wall_s)
string(JSON cpu GET "${text}" wait_cpu_s)
string(JSON sleeps GET "${text}" sleeps)
# CMake compares numbers as floats in math-free form: scale to milliseconds.
string(REGEX REPLACE "^([0-9]+)\\.([0-9][0-9][0-9]).*" "\\1\\2" wall_ms "${wall}")
string(REGEX REPLACE "^([0-9]+)\\.([0-9][0-9][0-9]).*" "\\1\\2" cpu_ms "${cpu}")
math(EXPR cpu_x10 "${cpu_ms} * 10")
if(wall_ms LESS 300 OR NOT cpu_x10 LESS wall_ms OR sleeps LESS 20)
  message(FATAL_ERROR "rank 0: ${wall} s waiting, ${cpu} s CPU, ${sleeps} sleeps:\n${text}")
endif()
message("rank 0: ${wall} s waiting, ${cpu} s CPU, ${sleeps} sleeps")
