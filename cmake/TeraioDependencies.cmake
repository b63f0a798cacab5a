# Finds required and optional dependencies; results are printed by TeraioSummary.
find_package(Threads REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)

# xxHash: Debian ships a header and a shared library but no CMake package.
find_path(XXHASH_INCLUDE_DIR xxhash.h REQUIRED)
find_library(XXHASH_LIBRARY NAMES xxhash REQUIRED)
add_library(teraio::xxhash UNKNOWN IMPORTED)
set_target_properties(teraio::xxhash PROPERTIES
  IMPORTED_LOCATION ${XXHASH_LIBRARY} INTERFACE_INCLUDE_DIRECTORIES ${XXHASH_INCLUDE_DIR})

if(TERAIO_BUILD_TESTS)
  find_package(GTest REQUIRED)
  include(GoogleTest)
endif()
if(TERAIO_BUILD_BENCHMARKS)
  find_package(benchmark REQUIRED)
endif()

# liburing: system package, or a carried copy (headers + static lib) under .deps/liburing.
set(TERAIO_HAVE_URING OFF)
if(NOT TERAIO_WITH_URING STREQUAL "OFF")
  find_path(URING_INCLUDE_DIR liburing.h HINTS ${PROJECT_SOURCE_DIR}/.deps/liburing/usr/include)
  find_library(URING_LIBRARY NAMES liburing.a uring
    HINTS ${PROJECT_SOURCE_DIR}/.deps/liburing/usr/lib/x86_64-linux-gnu)
  if(URING_INCLUDE_DIR AND URING_LIBRARY)
    set(TERAIO_HAVE_URING ON)
    add_library(teraio::uring UNKNOWN IMPORTED)
    set_target_properties(teraio::uring PROPERTIES
      IMPORTED_LOCATION ${URING_LIBRARY} INTERFACE_INCLUDE_DIRECTORIES ${URING_INCLUDE_DIR})
  elseif(TERAIO_WITH_URING STREQUAL "ON")
    message(FATAL_ERROR "TERAIO_WITH_URING=ON but liburing was not found")
  endif()
endif()

# CUDA: only the runtime API (cudart) is used from C++; no kernels are compiled, so no
# CUDA compiler is needed. cuFile is loaded at run time (dlopen), never linked.
set(TERAIO_HAVE_CUDA OFF)
if(NOT TERAIO_WITH_CUDA STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    set(TERAIO_HAVE_CUDA ON)
  elseif(TERAIO_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "TERAIO_WITH_CUDA=ON but the CUDA toolkit was not found")
  endif()
endif()

# PyTorch (used by the runtime binding of a later stage): detected and reported only.
set(TERAIO_TORCH_VERSION "not found")
find_package(Python3 COMPONENTS Interpreter QUIET)
if(Python3_FOUND)
  execute_process(COMMAND ${Python3_EXECUTABLE} -c "import torch; print(torch.__version__)"
    OUTPUT_VARIABLE _torch_version OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET
    RESULT_VARIABLE _torch_rc)
  if(_torch_rc EQUAL 0)
    set(TERAIO_TORCH_VERSION "${_torch_version} (${Python3_EXECUTABLE})")
  endif()
endif()
