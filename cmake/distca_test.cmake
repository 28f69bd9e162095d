include(GoogleTest)

# distca_test(NAME SOURCES ... DEPS ... [LABELS ...]): one GoogleTest program; every TEST
# becomes its own CTest entry. Label `slow` keeps a test out of the CI command. A program whose
# sources run the CLI (they name DISTCA_CLI or include support/cli_fixture.h) depends on the
# distca target, so building the test rebuilds the binary it runs.
function(distca_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)  # support/*.h
  target_compile_definitions(${name} PRIVATE
    DISTCA_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
    DISTCA_SHARED_DATA_DIR="${PROJECT_SOURCE_DIR}/../shared/data")
  if(TARGET distca)  # not in the kernels-only configuration, which has no CLI
    target_compile_definitions(${name} PRIVATE DISTCA_CLI="$<TARGET_FILE:distca>")
  endif()
  distca_target_flags(${name})
  foreach(src IN LISTS ARG_SOURCES)
    file(READ ${CMAKE_CURRENT_SOURCE_DIR}/${src} text)
    if(TARGET distca AND text MATCHES "DISTCA_CLI|cli_fixture\\.h")
      add_dependencies(${name} distca)
      break()
    endif()
  endforeach()
  set(labels unit ${ARG_LABELS})
  gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST TEST_PREFIX "${name}." PROPERTIES LABELS "${labels}"
                       DISCOVERY_TIMEOUT 60)
endfunction()
