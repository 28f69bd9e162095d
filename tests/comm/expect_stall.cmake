# Runs the MPI test program with --stall MODE --timeout 1: the last rank stops itself
# (SIGSTOP) and the others wait for it. Checks the stall contract: the job ends by itself
# (bounded by TIMEOUT here and the CTest TIMEOUT, so a hang fails this test), mpirun exits
# non-zero, and stderr names the silent rank once.
# Usage: cmake -DMPIEXEC=... -DNP=... -DPROGRAM=... -DMODE=barrier|exchange -P expect_stall.cmake
execute_process(
  COMMAND ${MPIEXEC} --oversubscribe --allow-run-as-root -np ${NP} ${PROGRAM} --stall ${MODE} --timeout 1
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
message("mpirun result: ${rc}\n--- stderr ---\n${err}")
if("${rc}" STREQUAL "0")
  message(FATAL_ERROR "mpirun exited 0 although a rank was stopped")
endif()
if(NOT "${rc}" MATCHES "^[0-9]+$")
  message(FATAL_ERROR "mpirun did not exit by itself: ${rc}")
endif()
math(EXPR silent "${NP} - 1")
string(REGEX MATCH "distca: rank [0-9]+ failed: no progress for 1 s \\(--mpi-timeout\\): no data from rank\\(s\\) ${silent} " line "${err}")
if(line STREQUAL "")
  message(FATAL_ERROR "stderr lacks 'no progress ... no data from rank(s) ${silent}'")
endif()
