# Use ccache when present. Precompiled headers need the pch sloppiness so that
# ccache can still hit; the launcher passes it through the environment.
find_program(TPRUN_CCACHE ccache)
if(TPRUN_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(CMAKE_CXX_COMPILER_LAUNCHER
      ${CMAKE_COMMAND} -E env
      "CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime"
      ${TPRUN_CCACHE})
  set(CMAKE_C_COMPILER_LAUNCHER ${CMAKE_CXX_COMPILER_LAUNCHER})
  message(STATUS "tprun: compiling through ccache (${TPRUN_CCACHE})")
endif()
