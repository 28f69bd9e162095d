# Runs the MPI test program with --inject-failure and checks the failure contract: the job
# ends (bounded by TIMEOUT, so a hang fails this test), mpirun exits non-zero, and stderr
# carries the failing rank's line exactly once.
# Usage: cmake -DMPIEXEC=... -DNP=... -DPROGRAM=... [-DFLAG=--inject-p2p-failure
#        -DWHAT="injected failure during p2p"] -P expect_failure.cmake
# With -DPATTERN=REGEX instead of WHAT: stderr must match REGEX (any rank may report it, and
# more than one may).
if(NOT DEFINED FLAG)
  set(FLAG --inject-failure)
endif()
if(NOT DEFINED WHAT)
  set(WHAT "injected failure during exchange 3")
endif()
execute_process(
  COMMAND ${MPIEXEC} --oversubscribe --allow-run-as-root -np ${NP} ${PROGRAM} ${FLAG}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 90)
message("mpirun result: ${rc}\n--- stderr ---\n${err}")
if("${rc}" STREQUAL "0")
  message(FATAL_ERROR "mpirun exited 0 although rank 1 failed")
endif()
if(NOT "${rc}" MATCHES "^[0-9]+$")
  message(FATAL_ERROR "mpirun did not exit by itself: ${rc}")
endif()
if(DEFINED PATTERN)
  if(NOT "${err}" MATCHES "${PATTERN}")
    message(FATAL_ERROR "stderr does not match '${PATTERN}'")
  endif()
  return()
endif()
set(line "distca: rank 1 failed: ${WHAT}")
string(FIND "${err}" "${line}" first)
string(FIND "${err}" "${line}" last REVERSE)
if(first EQUAL -1)
  message(FATAL_ERROR "stderr lacks '${line}'")
endif()
if(NOT first EQUAL last)
  message(FATAL_ERROR "'${line}' printed more than once")
endif()
string(FIND "${err}" "distca: rank 0 failed" other)
if(NOT other EQUAL -1)
  message(FATAL_ERROR "a rank other than 1 reported a failure")
endif()
