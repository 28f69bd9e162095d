# Per-target flags for everything we build. Nothing here touches CMAKE_CXX_FLAGS: warnings,
# tuning and sanitizers are attached to our own targets only, so third-party code and the
# presets' choices stay apart.
function(distca_target_flags target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Werror)
  if(DISTCA_NATIVE)
    target_compile_options(${target} PRIVATE -march=native)
  endif()
  if(DISTCA_SANITIZE_ADDRESS)
    target_compile_options(${target} PRIVATE -fsanitize=address,undefined -fno-omit-frame-pointer
                                             -fno-sanitize-recover=undefined)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
  endif()
  if(DISTCA_SANITIZE_THREAD)
    target_compile_options(${target} PRIVATE -fsanitize=thread -fno-omit-frame-pointer)
    target_link_options(${target} PRIVATE -fsanitize=thread)
  endif()
endfunction()

# distca_layer(NAME SOURCES... DEPS ...): one static library per layer of docs/architecture.md,
# public headers under include/distca/NAME, linked only against the layers below it.
function(distca_layer name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(distca_${name} STATIC ${ARG_SOURCES})
  add_library(distca::${name} ALIAS distca_${name})
  target_include_directories(distca_${name} PUBLIC ${PROJECT_SOURCE_DIR}/include)
  target_link_libraries(distca_${name} PUBLIC ${ARG_DEPS})
  distca_target_flags(distca_${name})
endfunction()

# distca_optional_part(VAR FOUND_VAR WHAT TOOL): VAR (a part's option, ON) is turned off for
# this configure, with one status line naming TOOL, when FOUND_VAR is false; an error instead
# with DISTCA_REQUIRE_TEST_TOOLS. Nothing is cached, so installing TOOL and configuring again
# brings the part back.
macro(distca_optional_part var found what tool)
  if(NOT ${found})
    if(DISTCA_REQUIRE_TEST_TOOLS)
      message(FATAL_ERROR "distca: the ${what} need ${tool}: run scripts/install-deps.sh")
    endif()
    message(STATUS "distca: ${what} left out: ${tool} is not installed (scripts/install-deps.sh installs it)")
    set(${var} OFF)
  endif()
endmacro()
