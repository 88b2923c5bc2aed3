// Paths that the build compiles into a test (IM_DEFAULT_IMSERVER_BIN,
// IMSERVER_BIN_DEFAULT, ...) are relative to the folder of the test's own
// executable (CMake's im_exe_relative_define), so that the compile command,
// and with it the compiler cache's key, is the same in every clone
// (scripts/ccache-env.sh). This resolves one at run time. Linux only
// (/proc/self/exe), as the tests are; Qt code with an application object
// uses tests/sdk/exerelative.h instead.
#pragma once

#include <filesystem>
#include <string>

namespace im::test {

inline std::string exe_relative(const char* relative_to_executable) {
    const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe"); // throws if unreadable
    return (exe.parent_path() / relative_to_executable).lexically_normal().string();
}

} // namespace im::test
