// `imserver admin ...`: provisioning and operator commands (spec/server.md).
#pragma once

namespace im {

/// argv[0] is "admin". Exit status: 0 success, 2 bad usage, 1 failure.
int admin_main(int argc, char** argv);

} // namespace im
