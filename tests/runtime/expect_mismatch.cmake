# Runs runtime_mpi_test --disagree (every rank plans its own batch) and checks that the job
# ends (bounded, so a hang fails), mpirun exits non-zero, and a rank reported the exchange's
# count mismatch ("distca: rank R failed: disagreeing plans: ... which expects ...").
# Usage: cmake -DMPIEXEC=... -DNP=... -DPROGRAM=... -P expect_mismatch.cmake
execute_process(
  COMMAND ${MPIEXEC} --oversubscribe --allow-run-as-root -np ${NP} ${PROGRAM} --disagree
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 90)
message("mpirun result: ${rc}\n--- stdout ---\n${out}\n--- stderr ---\n${err}")
if("${rc}" STREQUAL "0")
  message(FATAL_ERROR "mpirun exited 0 although the ranks' plans disagree")
endif()
if(NOT "${rc}" MATCHES "^[0-9]+$")
  message(FATAL_ERROR "mpirun did not exit by itself: ${rc}")
endif()
if(NOT "${err}" MATCHES "distca: rank [0-9]+ failed: disagreeing plans: [^\n]*which expects")
  message(FATAL_ERROR "stderr lacks a rank's count mismatch")
endif()
