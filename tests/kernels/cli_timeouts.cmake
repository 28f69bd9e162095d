# Read by ctest after the discovered tests of kernels_cli_test are defined (TEST_INCLUDE_FILES):
# a test whose CLI could block on an input (a FIFO) fails at this limit instead of hanging.
set_tests_properties("kernels_cli_test.CliAttention.AFifoAsInputIsRefusedWithoutBlocking" PROPERTIES TIMEOUT 60)
