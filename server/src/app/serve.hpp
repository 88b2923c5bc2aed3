// `imserver` serving: the database, the notification bus, the gateway and
// its listeners wired together, signals (SIGHUP reload, SIGTERM drain), and
// the I/O threads until the drain ends.
#pragma once

#include "core/config.hpp"

namespace im {

/// Runs a gateway until SIGTERM/SIGINT; the process's exit status.
int serve(const Config& cfg);

} // namespace im
