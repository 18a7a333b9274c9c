# One target per folder: kv_cc_library() for a library, kv_cc_test() for a GoogleTest binary
# registered with CTest, kv_cc_binary() for an executable. Adding a file is one line.

set(KVSTRATA_WARNINGS -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers)

# kv_cc_library(NAME name SRCS ... [CUDA_SRCS ...] [DEPS ...])
function(kv_cc_library)
  cmake_parse_arguments(KV "" "NAME" "SRCS;CUDA_SRCS;DEPS;PUBLIC_DEFS" ${ARGN})
  set(_srcs ${KV_SRCS})
  if(KVSTRATA_CUDA)
    list(APPEND _srcs ${KV_CUDA_SRCS})
  endif()
  add_library(${KV_NAME} STATIC ${_srcs})
  target_include_directories(${KV_NAME} PUBLIC ${PROJECT_SOURCE_DIR})
  target_compile_options(${KV_NAME} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${KVSTRATA_WARNINGS}>)
  target_link_libraries(${KV_NAME} PUBLIC ${KV_DEPS})
  if(KV_PUBLIC_DEFS)
    target_compile_definitions(${KV_NAME} PUBLIC ${KV_PUBLIC_DEFS})
  endif()
endfunction()

# kv_cc_test(NAME name SRCS ... [DEPS ...] [LABELS ...])
# GPU tests carry the label "gpu" and skip themselves (GTEST_SKIP) when no device is present.
function(kv_cc_test)
  cmake_parse_arguments(KV "" "NAME;TIMEOUT" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${KV_NAME} ${KV_SRCS})
  target_include_directories(${KV_NAME} PRIVATE ${PROJECT_SOURCE_DIR})
  target_compile_options(${KV_NAME} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${KVSTRATA_WARNINGS}>)
  target_link_libraries(${KV_NAME} PRIVATE ${KV_DEPS} GTest::gtest GTest::gtest_main GTest::gmock)
  add_test(NAME ${KV_NAME} COMMAND ${KV_NAME})
  set(_labels ${KV_LABELS})
  if(NOT _labels)
    set(_labels unit)
  endif()
  if(NOT KV_TIMEOUT)
    set(KV_TIMEOUT 300)
  endif()
  set_tests_properties(${KV_NAME} PROPERTIES LABELS "${_labels}" TIMEOUT ${KV_TIMEOUT}
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR} SKIP_RETURN_CODE 77
    ENVIRONMENT "KVSTRATA_MODEL=${KVSTRATA_DEFAULT_MODEL};KVSTRATA_TEST_PYTHON=${KVSTRATA_TEST_PYTHON}")
  if("gpu" IN_LIST _labels)
    # GoogleTest exits 0 when every test skips itself; report that as skipped, not passed.
    set_tests_properties(${KV_NAME} PROPERTIES SKIP_REGULAR_EXPRESSION "Skipped\nno CUDA device")
  endif()
endfunction()

# kv_cc_binary(NAME name SRCS ... [DEPS ...]) — lands in build/bin.
function(kv_cc_binary)
  cmake_parse_arguments(KV "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${KV_NAME} ${KV_SRCS})
  target_include_directories(${KV_NAME} PRIVATE ${PROJECT_SOURCE_DIR})
  target_compile_options(${KV_NAME} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${KVSTRATA_WARNINGS}>)
  target_link_libraries(${KV_NAME} PRIVATE ${KV_DEPS})
  set_target_properties(${KV_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bin)
endfunction()
