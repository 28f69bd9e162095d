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
