// `imserver admin ...`: provisioning and operator commands (spec/server.md).
#pragma once

#include <string>

namespace im {

/// argv[0] is "admin". Exit status: 0 success, 2 bad usage, 1 failure.
int admin_main(int argc, char** argv);

/// imserver-admin(8) in roff, from the same tables as --help.
std::string admin_man(const std::string& version);

} // namespace im
