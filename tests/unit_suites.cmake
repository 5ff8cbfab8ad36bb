# Run by ctest (TEST_INCLUDE_FILES, set in tests/CMakeLists.txt) each time it reads the tests: one
# entry per GoogleTest suite of tprun_unit_tests, named unit_<suite> (label `unit`), so a failing
# case is named by its suite. The suites come from the binary itself (--gtest_list_tests), so a
# suite added to tests/unit/ cannot be left out; the entries are kept in TPRUN_UNIT_LIST and made
# again when the binary (or a setting) is newer. The GPU suites (Gpu*) are the entry gpu_unit's.
#
# Set by the including file (TPRUN_UNIT_SETTINGS, written by tests/CMakeLists.txt):
# TPRUN_UNIT_BINARY, TPRUN_UNIT_LIST (the cached entries), TPRUN_UNIT_ENV (the ENVIRONMENT list),
# TPRUN_UNIT_TIMEOUT, TPRUN_UNIT_SUITE_LABELS ("suite=label,label" entries: labels a suite's entry
# carries besides `unit`).

# ctest reads this file with no policy set (this include's own policy scope).
cmake_policy(VERSION 3.20)

# unit_suites: an entry that fails with `why_text` (the binary cannot list its suites).
macro(tprun_unit_suites_fail why_text)
  string(REPLACE "'" "" _why "${why_text}")
  add_test(unit_suites sh -c "echo '${_why}'; exit 1")
  set_tests_properties(unit_suites PROPERTIES LABELS unit)
  return()
endmacro()

if(NOT EXISTS "${TPRUN_UNIT_BINARY}")
  tprun_unit_suites_fail("${TPRUN_UNIT_BINARY} is not built (tools/build.sh tprun_unit_tests): its suites are not listed")
endif()
# Made again when the binary, these settings or this file changed since.
if(NOT EXISTS "${TPRUN_UNIT_LIST}" OR "${TPRUN_UNIT_BINARY}" IS_NEWER_THAN "${TPRUN_UNIT_LIST}"
   OR "${TPRUN_UNIT_SETTINGS}" IS_NEWER_THAN "${TPRUN_UNIT_LIST}"
   OR "${CMAKE_CURRENT_LIST_FILE}" IS_NEWER_THAN "${TPRUN_UNIT_LIST}")
  execute_process(COMMAND "${TPRUN_UNIT_BINARY}" --gtest_list_tests
                  OUTPUT_VARIABLE _listing ERROR_VARIABLE _listing_err RESULT_VARIABLE _listing_rc TIMEOUT 120
                  ERROR_STRIP_TRAILING_WHITESPACE)
  if(NOT _listing_rc EQUAL 0)
    tprun_unit_suites_fail("${TPRUN_UNIT_BINARY} --gtest_list_tests failed (${_listing_rc}): ${_listing_err}")
  endif()
  # A suite line has no indent and ends with '.' ("Suite.", or "Prefix/Suite." for TEST_P; a
  # comment may follow); its cases follow, indented. Any other line stops the listing.
  string(REPLACE ";" "," _listing "${_listing}")
  string(REPLACE "\n" ";" _lines "${_listing}")
  set(_suites "")
  foreach(_line IN LISTS _lines)
    if(_line MATCHES "^([A-Za-z0-9_/]+)\\.( .*)?$")
      list(APPEND _suites "${CMAKE_MATCH_1}")
    elseif(NOT _line MATCHES "^( |$|Running main\\(\\) from )")  # gtest_main's greeting
      tprun_unit_suites_fail("${TPRUN_UNIT_BINARY} --gtest_list_tests: a line neither a suite nor a case: ${_line}")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES _suites)
  if(NOT _suites)
    tprun_unit_suites_fail("${TPRUN_UNIT_BINARY} --gtest_list_tests listed no suite")
  endif()
  foreach(_pair IN LISTS TPRUN_UNIT_SUITE_LABELS)
    string(REGEX REPLACE "=.*" "" _named "${_pair}")
    if(NOT _named IN_LIST _suites)
      tprun_unit_suites_fail("tests/CMakeLists.txt labels the unit suite ${_named}, which ${TPRUN_UNIT_BINARY} does not have")
    endif()
  endforeach()
  set(_entries "# unit_<suite> entries from ${TPRUN_UNIT_BINARY} --gtest_list_tests (tests/unit_suites.cmake)\n")
  foreach(_suite IN LISTS _suites)
    if(_suite MATCHES "^Gpu")
      continue()
    endif()
    set(_labels unit)
    foreach(_pair IN LISTS TPRUN_UNIT_SUITE_LABELS)
      if(_pair MATCHES "^${_suite}=(.*)$")
        string(REPLACE "," ";" _extra "${CMAKE_MATCH_1}")
        list(APPEND _labels ${_extra})
      endif()
    endforeach()
    string(APPEND _entries
           "add_test([==[unit_${_suite}]==] [==[${TPRUN_UNIT_BINARY}]==] [==[--gtest_filter=${_suite}.*]==] --gtest_brief=1)\n"
           "set_tests_properties([==[unit_${_suite}]==] PROPERTIES LABELS [==[${_labels}]==]"
           " ENVIRONMENT [==[${TPRUN_UNIT_ENV}]==] TIMEOUT ${TPRUN_UNIT_TIMEOUT})\n")
  endforeach()
  file(WRITE "${TPRUN_UNIT_LIST}" "${_entries}")
endif()
include("${TPRUN_UNIT_LIST}")
