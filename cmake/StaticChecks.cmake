# StaticChecks.cmake - the house checks that need no compiler output: layering, formatting, tidy.
#
# Contract (included from the top-level CMakeLists.txt after enable_testing()):
#   ctest test layering_check          cmake/check_layering.sh over the source tree (always on)
#   ctest test layering_check_selftest the check catches planted upward includes (always on)
#   ctest test format_check            clang-format --dry-run --Werror over every tracked C/C++
#                                      file; only with -DINGERO_FORMAT_CHECK=ON (default OFF until
#                                      the tree has been formatted once; then the default flips)
#   target tidy                        clang-tidy (.clang-tidy) over every translation unit of the
#                                      compile database, -j from INGERO_TIDY_JOBS; not part of ALL
#   target format                      apply clang-format to every tracked C/C++ file (rewrites!)
# The file list for formatting is cmake/format_files.sh (git ls-files minus vendored/BPF files),
# shared by format_check and format so both always agree.

add_test(NAME layering_check
         COMMAND bash ${CMAKE_SOURCE_DIR}/cmake/check_layering.sh ${CMAKE_SOURCE_DIR})
add_test(NAME layering_check_selftest
         COMMAND bash ${CMAKE_SOURCE_DIR}/cmake/check_layering.sh --self-test)
set_tests_properties(layering_check layering_check_selftest PROPERTIES LABELS "unit;static" TIMEOUT 60)

# Formatting. OFF until the tree has been formatted once (cmake/check_format.sh --fix, its own
# commit); then the default flips to ON and CI fails on any unformatted file. ON needs
# clang-format 14 (apt-get install clang-format): configure stops if it is missing, rather than
# letting the check skip silently.
option(INGERO_FORMAT_CHECK "Add the format_check test (clang-format 14 --dry-run --Werror)" ON)
find_program(INGERO_CLANG_FORMAT NAMES clang-format-14 clang-format)
if(INGERO_FORMAT_CHECK)
  if(NOT INGERO_CLANG_FORMAT)
    message(FATAL_ERROR "INGERO_FORMAT_CHECK=ON needs clang-format 14 (apt-get install clang-format)")
  endif()
  add_test(NAME format_check COMMAND bash ${CMAKE_SOURCE_DIR}/cmake/check_format.sh ${CMAKE_SOURCE_DIR})
  set_tests_properties(format_check PROPERTIES LABELS "unit;static" TIMEOUT 300
                       ENVIRONMENT "CLANG_FORMAT=${INGERO_CLANG_FORMAT}")
endif()
if(INGERO_CLANG_FORMAT)
  add_custom_target(format
    COMMAND ${CMAKE_COMMAND} -E env CLANG_FORMAT=${INGERO_CLANG_FORMAT}
            bash ${CMAKE_SOURCE_DIR}/cmake/check_format.sh --fix ${CMAKE_SOURCE_DIR}
    COMMENT "clang-format -i over cmake/format_files.sh's list" VERBATIM)
endif()

# clang-tidy over every translation unit of this build's compile database. Not in CI by default:
# a whole-tree run costs far more than the test suite's time budget on 2 cores (see
# docs/contributing.md); run it before sending a change, or on the changed files only with
# cmake/run_tidy.sh --changed origin/main <build dir>.
set(INGERO_TIDY_JOBS 2 CACHE STRING "Parallel clang-tidy processes for the tidy target")
find_program(INGERO_CLANG_TIDY NAMES clang-tidy-14 clang-tidy)
if(INGERO_CLANG_TIDY)
  set(_tidy_deps)
  if(TARGET ip_bpf_skeletons)
    set(_tidy_deps ip_bpf_skeletons)   # generated headers the BPF loader includes
  endif()
  add_custom_target(tidy
    COMMAND ${CMAKE_COMMAND} -E env CLANG_TIDY=${INGERO_CLANG_TIDY}
            bash ${CMAKE_SOURCE_DIR}/cmake/run_tidy.sh -j ${INGERO_TIDY_JOBS} ${CMAKE_BINARY_DIR}
    DEPENDS ${_tidy_deps}
    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}
    COMMENT "clang-tidy (.clang-tidy) over ${CMAKE_BINARY_DIR}/compile_commands.json" VERBATIM USES_TERMINAL)
endif()
