# Finds required and optional dependencies; results are printed by TeraioSummary.
find_package(Threads REQUIRED)
# Machines without Debian's -dev packages (the GPU machines) build with copies of them carried
# in .deps/ (scripts/gpu/stage-deps.sh makes it); the system packages win where they exist.
set(TERAIO_DEPS_DIR ${PROJECT_SOURCE_DIR}/.deps)

find_package(nlohmann_json 3.10 QUIET)
if(NOT nlohmann_json_FOUND)
  find_path(NLOHMANN_JSON_INCLUDE_DIR nlohmann/json.hpp PATHS ${TERAIO_DEPS_DIR}/nlohmann/include REQUIRED)
  add_library(nlohmann_json::nlohmann_json INTERFACE IMPORTED)
  set_target_properties(nlohmann_json::nlohmann_json PROPERTIES INTERFACE_INCLUDE_DIRECTORIES ${NLOHMANN_JSON_INCLUDE_DIR})
endif()

# xxHash, used header-only (XXH_INLINE_ALL) so no shared library has to travel with the build.
find_path(XXHASH_INCLUDE_DIR xxhash.h PATHS ${TERAIO_DEPS_DIR}/xxhash/include REQUIRED)
add_library(teraio::xxhash INTERFACE IMPORTED)
set_target_properties(teraio::xxhash PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES ${XXHASH_INCLUDE_DIR} INTERFACE_COMPILE_DEFINITIONS XXH_INLINE_ALL)

if(TERAIO_BUILD_TESTS)
  find_package(GTest QUIET)
  if(NOT GTest_FOUND)
    if(NOT EXISTS ${TERAIO_DEPS_DIR}/googletest/CMakeLists.txt)
      message(FATAL_ERROR "GoogleTest not found: install libgtest-dev (scripts/install-deps.sh) or stage .deps/googletest")
    endif()
    set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
    add_subdirectory(${TERAIO_DEPS_DIR}/googletest ${CMAKE_BINARY_DIR}/googletest EXCLUDE_FROM_ALL SYSTEM)
  endif()
  include(GoogleTest)
endif()
if(TERAIO_BUILD_BENCHMARKS)
  find_package(benchmark REQUIRED)
endif()

# liburing: system package, or a carried copy (headers + static lib) under .deps/liburing.
set(TERAIO_HAVE_URING OFF)
if(NOT TERAIO_WITH_URING STREQUAL "OFF")
  find_path(URING_INCLUDE_DIR liburing.h PATHS ${TERAIO_DEPS_DIR}/liburing/usr/include)
  find_library(URING_LIBRARY NAMES liburing.a uring
    PATHS ${TERAIO_DEPS_DIR}/liburing/usr/lib/x86_64-linux-gnu)
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

# PyTorch: the binding is built against the torch that this interpreter imports (TeraioTorch).
set(TERAIO_TORCH_VERSION "not found")
find_package(Python3 COMPONENTS Interpreter QUIET)
include(TeraioTorch)
