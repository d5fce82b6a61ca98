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
