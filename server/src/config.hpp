// Server options: flags, each with an environment variable (see --help).
#pragma once

#include "faults.hpp"

#include <optional>
#include <string>
#include <vector>

namespace im {

struct Config {
    std::string listen_host = "127.0.0.1";
    unsigned short listen_port = 8080;
    std::optional<std::string> db_url;   // none: the embedded cluster in state_dir
    std::string state_dir = "./var";
    std::string gateway_id = "gw-1";
    int db_pool = 4;
    std::size_t db_queue = 1024;
    int io_threads = 2;
    std::string ready_file;
    bool enable_faults = false;
    std::vector<std::string> faults;
    LabSwitches lab;
    int drain_timeout_ms = 10000;
    int ping_interval_ms = 20000;
    int idle_timeout_ms = 60000;
    int listen_probe_ms = 1000;
    std::string bus = "postgres";        // or nats://HOST:PORT[,nats://HOST:PORT...]
    bool quiet = false;
};

/// Parses flags and environment. On error returns a message; `help` is set
/// for --help.
std::optional<std::string> parse_config(int argc, char** argv, Config& cfg, bool& help);
std::string config_help();

} // namespace im
