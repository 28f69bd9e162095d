# The fuzz targets, one per parser (fuzz/<name>.cpp, seeds in fuzz/corpus/<name>/). Read by
# fuzz/CMakeLists.txt (to build them) and cmake/distca_fuzz.cmake (to register their tests).
set(DISTCA_FUZZ_TARGETS fuzz_batch_json fuzz_length_file fuzz_cost_table fuzz_toml_config fuzz_npy
    fuzz_checkpoint fuzz_hardware_profile fuzz_cost_csv)
# The CLI's flag parser comes with apps/distca/flags.cpp; built once both exist.
get_filename_component(_distca_fuzz_root "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
if(EXISTS "${_distca_fuzz_root}/fuzz/fuzz_cli_flags.cpp" AND EXISTS "${_distca_fuzz_root}/apps/distca/flags.cpp")
  set(DISTCA_FUZZ_CLI_FLAGS ON)
  list(APPEND DISTCA_FUZZ_TARGETS fuzz_cli_flags)
else()
  set(DISTCA_FUZZ_CLI_FLAGS OFF)
endif()
