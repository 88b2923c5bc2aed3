# sdk.package_consumer: install this build into a temporary prefix, then
# configure and build tests/sdk/package against it with find_package(ImSdk).
# Then, given RUNNER (quickstart_run.cpp), run the built quick start against
# the real server on a clean data folder.
# Inputs: BUILD_DIR, SOURCE_DIR, WORK_DIR, optional RUNNER, optional CXX (the
# compiler for the pkg-config build).
file(REMOVE_RECURSE "${WORK_DIR}")
# Only the SDK's components (the packages libimsdk<SOVERSION> and
# libimsdk-dev): the server's component writes to /etc and /lib/systemd.
foreach(component ${SDK_COMPONENT} libimsdk-dev)
  execute_process(COMMAND "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${WORK_DIR}/prefix"
                          --component ${component}
                  RESULT_VARIABLE rc OUTPUT_QUIET)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "cmake --install --component ${component} failed: ${rc}")
  endif()
endforeach()
foreach(f lib/cmake/ImSdk/ImSdkConfig.cmake include/im/client.h)
  if(NOT EXISTS "${WORK_DIR}/prefix/${f}")
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()
# The QA hooks are not API: im/testing.h is not installed, and no installed
# header declares a hook (docs/sdk.md, "Testing hooks").
if(EXISTS "${WORK_DIR}/prefix/include/im/testing.h")
  message(FATAL_ERROR "installed: include/im/testing.h (the QA hooks are not part of the package)")
endif()
file(GLOB _im_headers "${WORK_DIR}/prefix/include/im/*.h")
foreach(h ${_im_headers})
  file(STRINGS "${h}" _hooks REGEX "setOffline|dropNextReply|closeSocketNow|offlineChanged|corruptNextUploadChunk")
  if(_hooks)
    message(FATAL_ERROR "${h} declares a QA hook: ${_hooks}")
  endif()
endforeach()
# Without CMake: imsdk.pc beside the CMake package. The same quick start,
# compiled and linked by hand with `pkg-config --cflags --libs imsdk` only
# (no -D of our own: the shared library needs none, docs/sdk.md "Building").
if(CXX)
  set(_pc_dir "${WORK_DIR}/prefix/lib/pkgconfig")
  if(NOT EXISTS "${_pc_dir}/imsdk.pc")
    message(FATAL_ERROR "not installed: lib/pkgconfig/imsdk.pc")
  endif()
  execute_process(COMMAND "${CMAKE_COMMAND}" -E env "PKG_CONFIG_PATH=${_pc_dir}"
                          pkg-config --cflags --libs imsdk
                  OUTPUT_VARIABLE _pc_flags OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "pkg-config --cflags --libs imsdk failed: ${rc}")
  endif()
  separate_arguments(_pc_flags UNIX_COMMAND "${_pc_flags}")
  file(MAKE_DIRECTORY "${WORK_DIR}/pc")
  execute_process(COMMAND "${CXX}" -std=c++17 -fPIC "${SOURCE_DIR}/main.cpp" ${_pc_flags} -o "${WORK_DIR}/pc/mychat"
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0 OR NOT EXISTS "${WORK_DIR}/pc/mychat")
    message(FATAL_ERROR "the quick start did not build with pkg-config (flags: ${_pc_flags}): ${rc}")
  endif()
endif()
execute_process(COMMAND "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${WORK_DIR}/build"
                        "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix" -DCMAKE_BUILD_TYPE=Release
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "find_package(ImSdk) consumer did not configure: ${rc}")
endif()
execute_process(COMMAND "${CMAKE_COMMAND}" --build "${WORK_DIR}/build" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT EXISTS "${WORK_DIR}/build/mychat")
  message(FATAL_ERROR "consumer did not build: ${rc}")
endif()
if(RUNNER)
  execute_process(COMMAND "${RUNNER}" "${WORK_DIR}/build/mychat" RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the quick start did not run against the real server: ${rc}")
  endif()
endif()
file(REMOVE_RECURSE "${WORK_DIR}")
message(STATUS "installed ImSdk package builds an outside app (C++17, with CMake and with pkg-config) and its quick start runs")
