# Read by ctest after the discovered tests of kernels_cli_test are defined (TEST_INCLUDE_FILES):
# a test whose CLI could block on an input (a FIFO) or start minutes of work where it should
# refuse fails at this limit instead of hanging.
foreach(t AFifoAsInputIsRefusedWithoutBlocking ProfileRefusesProblemsThatDoNotFitInMemory
          ProfileChecksItsSettingsAndOutputFirst)
  set_tests_properties("kernels_cli_test.CliAttention.${t}" PROPERTIES TIMEOUT 60)
endforeach()
