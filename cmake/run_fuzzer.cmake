# Runs one libFuzzer target for SECONDS from its seed corpus (a CTest entry; scripts/fuzz.sh
# does the same for longer). Inputs it finds go to WORK/corpus, never into the repository's
# seeds; a crash leaves its reproducer in WORK and fails the test naming it.
#   cmake -DFUZZER=bin -DSEEDS=dir -DWORK=dir -DSECONDS=n -P run_fuzzer.cmake
foreach(v FUZZER SEEDS WORK SECONDS)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run_fuzzer.cmake: -D${v}= is required")
  endif()
endforeach()
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK}/corpus ${WORK}/tmp)
# A smaller quarantine keeps ASan from touching fresh pages at every input (several times
# faster on targets that allocate per input); use-after-free within 16 MiB is still caught.
set(ENV{ASAN_OPTIONS} "quarantine_size_mb=16:$ENV{ASAN_OPTIONS}")
set(ENV{TMPDIR} ${WORK}/tmp)
# A dictionary beside the target's source (fuzz/<target>.dict) names the tokens of its format.
set(dict_flag "")
if(DEFINED DICT AND EXISTS "${DICT}")
  set(dict_flag "-dict=${DICT}")
endif()
execute_process(
  COMMAND ${FUZZER} ${dict_flag} -max_total_time=${SECONDS} -timeout=10 -rss_limit_mb=2048
          -print_final_stats=1 -artifact_prefix=${WORK}/ ${WORK}/corpus ${SEEDS}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  file(GLOB found ${WORK}/crash-* ${WORK}/leak-* ${WORK}/timeout-* ${WORK}/oom-*)
  string(LENGTH "${out}" n)
  if(n GREATER 12000)
    math(EXPR start "${n} - 12000")
    string(SUBSTRING "${out}" ${start} -1 out)
  endif()
  message("${out}")
  message(FATAL_ERROR "${FUZZER} failed (exit ${rc}); reproducer: ${found}\n"
                      "add it to ${SEEDS} and a unit test (docs/development.md, Fuzzing)")
endif()
string(REGEX MATCH "stat::number_of_executed_units: *[0-9]+" runs "${out}")
message(STATUS "${runs}")
