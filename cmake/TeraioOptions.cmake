# Compiler flags shared by every TeraIO target, applied through teraio_warnings.
add_library(teraio_warnings INTERFACE)
target_compile_options(teraio_warnings INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wold-style-cast -Wcast-align
  -Woverloaded-virtual -Wnull-dereference -Wimplicit-fallthrough)
if(TERAIO_WERROR)
  target_compile_options(teraio_warnings INTERFACE -Werror)
endif()
# GCC 12 at -O3 reports impossible overlaps and null dereferences inside libstdc++ itself
# (std::string, std::construct_at; GCC bug 105329 and relatives, fixed in 13): those false
# warnings must not fail a Release build.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  target_compile_options(teraio_warnings INTERFACE -Wno-restrict -Wno-null-dereference)
endif()

if(TERAIO_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()

# teraio_add_library(NAME SOURCES... DEPS ...): one library per DESIGN.md module.
function(teraio_add_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/include)
  target_link_libraries(${name} PUBLIC ${ARG_DEPS} PRIVATE teraio_warnings ${ARG_PRIVATE_DEPS})
endfunction()

# teraio_add_test(NAME SOURCES... DEPS ...): a GoogleTest executable registered with CTest.
function(teraio_add_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main GTest::gmock teraio_warnings)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT 300)
endfunction()
