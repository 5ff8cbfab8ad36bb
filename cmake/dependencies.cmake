# Finds every dependency of tprun. Nothing is fetched here: tools/setup.sh
# installs the Debian packages and the torch wheel.

# --- libtorch -----------------------------------------------------------------
# Order: Torch_DIR / CMAKE_PREFIX_PATH given by the user (an unpacked libtorch
# archive works), else the torch wheel in the venv that tools/setup.sh made
# ($TPRUN_VENV, default ~/.cache/tprun/venv).
if(DEFINED ENV{TPRUN_VENV})
  set(_tprun_venv "$ENV{TPRUN_VENV}")
else()
  set(_tprun_venv "$ENV{HOME}/.cache/tprun/venv")
endif()
# The venv's Python (diffusers, transformers) runs the script and parity tests; tests/CMakeLists.txt
# checks it holds tools/requirements.txt and says what is missing where it does not.
set(TPRUN_VENV_PYTHON "${_tprun_venv}/bin/python")
if(NOT Torch_DIR AND NOT DEFINED ENV{Torch_DIR})
  if(EXISTS "${_tprun_venv}/bin/python")
    execute_process(
      COMMAND "${_tprun_venv}/bin/python" -c
              "import torch.utils, os; print(torch.utils.cmake_prefix_path)"
      OUTPUT_VARIABLE _torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
      RESULT_VARIABLE _torch_rc ERROR_QUIET)
    if(_torch_rc EQUAL 0 AND _torch_prefix)
      list(APPEND CMAKE_PREFIX_PATH "${_torch_prefix}")
      set(TPRUN_TORCH_WHEEL_PREFIX "${_torch_prefix}")
    endif()
  endif()
endif()

# The CUDA build of libtorch looks for the CUDA toolkit; the nvcc on PATH (or
# /usr/local/cuda) serves. The CUDA architecture list only matters for CUDA
# sources, which tprun does not compile; keep torch from probing for a GPU.
if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(ENV{TORCH_CUDA_ARCH_LIST} "9.0")
endif()
find_package(Torch REQUIRED)
message(STATUS "tprun: libtorch ${Torch_VERSION} from ${Torch_DIR}")

# libtorch's CUDA libraries depend on the NVIDIA wheels (cuBLAS, cuDNN, NCCL,
# ...). Their RUNPATH finds them at run time; the linker needs -rpath-link.
set(TPRUN_TORCH_LIB_DIR "")
foreach(_lib IN LISTS TORCH_LIBRARIES)
  if(_lib MATCHES "libtorch\\.so$" OR _lib MATCHES "libc10\\.so$")
    get_filename_component(TPRUN_TORCH_LIB_DIR "${_lib}" DIRECTORY)
    break()
  endif()
endforeach()
if(NOT TPRUN_TORCH_LIB_DIR)
  get_filename_component(TPRUN_TORCH_LIB_DIR "${TORCH_INSTALL_PREFIX}/lib" ABSOLUTE)
endif()
set(TPRUN_NVIDIA_LIB_DIRS "")
file(GLOB _nv_dirs LIST_DIRECTORIES true
     "${TPRUN_TORCH_LIB_DIR}/../../nvidia/*/lib" "${TPRUN_TORCH_LIB_DIR}/../../nvidia/cu*/lib")
foreach(_d IN LISTS _nv_dirs)
  get_filename_component(_d "${_d}" ABSOLUTE)
  list(APPEND TPRUN_NVIDIA_LIB_DIRS "${_d}")
endforeach()
list(REMOVE_DUPLICATES TPRUN_NVIDIA_LIB_DIRS)
foreach(_d IN LISTS TPRUN_NVIDIA_LIB_DIRS)
  string(APPEND CMAKE_EXE_LINKER_FLAGS " -Wl,-rpath-link,${_d}")
  string(APPEND CMAKE_SHARED_LINKER_FLAGS " -Wl,-rpath-link,${_d}")
endforeach()

# Does this libtorch carry CUDA?
set(TPRUN_TORCH_HAS_CUDA OFF)
if(TARGET torch_cuda OR TORCH_LIBRARIES MATCHES "torch_cuda")
  set(TPRUN_TORCH_HAS_CUDA ON)
endif()

# --- a build host without the Debian packages -----------------------------------
# tools/gpu/fallback_build.sh builds on a GPU host from a bundle: TPRUN_DEV_ROOT is
# the bundle's dev/ folder (headers, CMake and pkg-config files, link-time names),
# TPRUN_MPI_INCLUDE_DIR / TPRUN_MPI_LIBRARY name its Open MPI (no mpicc there).
if(TPRUN_DEV_ROOT)
  list(PREPEND CMAKE_PREFIX_PATH "${TPRUN_DEV_ROOT}/usr")
endif()

# --- MPI ------------------------------------------------------------------------
if(TPRUN_MPI_INCLUDE_DIR AND TPRUN_MPI_LIBRARY)
  add_library(MPI::MPI_C INTERFACE IMPORTED)
  set_target_properties(MPI::MPI_C PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${TPRUN_MPI_INCLUDE_DIR}"
                                              INTERFACE_LINK_LIBRARIES "${TPRUN_MPI_LIBRARY}")
else()
  find_package(MPI REQUIRED COMPONENTS C)
endif()
find_program(TPRUN_MPIEXEC NAMES mpirun mpiexec REQUIRED)

# --- NCCL: compiled whenever libtorch has CUDA and nccl.h is found ---------------
set(TPRUN_HAVE_NCCL OFF)
if(TPRUN_WITH_NCCL AND TPRUN_TORCH_HAS_CUDA)
  # Prefer the NCCL that libtorch itself loads (the nvidia-nccl wheel), so one
  # process never holds two NCCL libraries; fall back to the CUDA toolkit's.
  find_path(NCCL_INCLUDE_DIR nccl.h NO_CACHE
            HINTS "${TPRUN_TORCH_LIB_DIR}/../../nvidia/nccl/include"
                  ENV NCCL_HOME ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include
            PATH_SUFFIXES include)
  find_library(NCCL_LIBRARY NAMES libnccl.so.2 nccl NAMES_PER_DIR
               HINTS "${TPRUN_TORCH_LIB_DIR}/../../nvidia/nccl/lib"
                     ENV NCCL_HOME /usr/local/cuda/lib64
               PATH_SUFFIXES lib lib64)
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(TPRUN_HAVE_NCCL ON)
    message(STATUS "tprun: NCCL backend on (${NCCL_LIBRARY})")
  else()
    message(STATUS "tprun: NCCL backend off (nccl.h or libnccl not found)")
  endif()
else()
  message(STATUS "tprun: NCCL backend off (libtorch without CUDA or TPRUN_WITH_NCCL=OFF)")
endif()

# --- the rest, from Debian's packages ----------------------------------------------
find_package(Threads REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(Boost REQUIRED COMPONENTS program_options)
find_package(nlohmann_json 3.9 REQUIRED)
find_package(tomlplusplus QUIET)
find_package(PkgConfig REQUIRED)
if(NOT tomlplusplus_FOUND)
  pkg_check_modules(TOMLPP REQUIRED IMPORTED_TARGET tomlplusplus)
endif()
find_package(GTest REQUIRED)

# Parallel HDF5 (the Open MPI build of libhdf5): the second checkpoint format,
# read with hyperslabs, collectively through MPI-IO.
pkg_check_modules(HDF5P REQUIRED IMPORTED_TARGET hdf5-openmpi)

# Tokenizers: SentencePiece (T5) and ICU: Unicode properties, NFC,
# lower-casing (CLIP's text clean-up), regexes (tokenizer.json pre-tokenizers).
pkg_check_modules(SPM REQUIRED IMPORTED_TARGET sentencepiece)
# The trainer (`tprun init-model` learns its tiny T5 vocabulary): Debian's
# sentencepiece.pc lists it, other builds may not, so it is added explicitly.
find_library(SPM_TRAIN_LIBRARY NAMES sentencepiece_train HINTS ${SPM_LIBRARY_DIRS} REQUIRED)
set_property(TARGET PkgConfig::SPM APPEND PROPERTY INTERFACE_LINK_LIBRARIES "${SPM_TRAIN_LIBRARY}")
pkg_check_modules(ICU REQUIRED IMPORTED_TARGET icu-uc icu-i18n)

# User-supplied regular expressions (runtime/user_pattern.h): RE2's
# linear-time matching. xxHash: the XXH3 content hash of disk-offload group
# files (memory/group_offloader.cpp).
pkg_check_modules(RE2 REQUIRED IMPORTED_TARGET re2)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)

# PNG output of generated images (pipelines/png_image.cpp).
find_package(PNG REQUIRED)

# libtorch's include folder carries its own, newer {fmt} headers, which would
# shadow the {fmt} that Debian's spdlog was compiled against. tprun's code and
# spdlog must see the system {fmt}: a folder of links to it goes first on the
# include path (-I comes before libtorch's -isystem).
find_path(TPRUN_FMT_INCLUDE_DIR fmt/format.h NO_CACHE
          PATHS ${TPRUN_DEV_ROOT}/usr/include /usr/include /usr/local/include NO_DEFAULT_PATH)
find_path(TPRUN_SPDLOG_INCLUDE_DIR spdlog/spdlog.h NO_CACHE
          PATHS ${TPRUN_DEV_ROOT}/usr/include /usr/include /usr/local/include NO_DEFAULT_PATH)
if(NOT TPRUN_FMT_INCLUDE_DIR OR NOT TPRUN_SPDLOG_INCLUDE_DIR)
  message(FATAL_ERROR "tprun: system fmt/spdlog headers not found (tools/setup.sh installs them)")
endif()
set(TPRUN_SYSINC_DIR "${CMAKE_BINARY_DIR}/sysinc")
file(MAKE_DIRECTORY "${TPRUN_SYSINC_DIR}")
foreach(_pair "fmt;${TPRUN_FMT_INCLUDE_DIR}" "spdlog;${TPRUN_SPDLOG_INCLUDE_DIR}")
  list(GET _pair 0 _name)
  list(GET _pair 1 _dir)
  if(NOT EXISTS "${TPRUN_SYSINC_DIR}/${_name}")
    file(CREATE_LINK "${_dir}/${_name}" "${TPRUN_SYSINC_DIR}/${_name}" SYMBOLIC)
  endif()
endforeach()
