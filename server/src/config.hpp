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
    std::string db_password_file;        // read at start into libpq's PGPASSWORD (not argv)
    std::string state_dir = "./var";
    std::string gateway_id = "gw-1";
    int db_pool = 4;
    std::size_t db_queue = 1024;
    int send_group_max = 32;             // runs of sends of different connections per commit
    int io_threads = 2;
    std::string ready_file;
    bool enable_faults = false;
    std::vector<std::string> faults;
    LabSwitches lab;
    int drain_timeout_ms = 10000;
    int ping_interval_ms = 20000;
    int idle_timeout_ms = 60000;
    // Admission and back-pressure (contract section 3).
    int hello_timeout_ms = 10000;           // no hello by then: close 1008
    std::size_t max_unsent_bytes = 4 << 20;  // unsent output past this: close 1013
    int write_timeout_ms = 30000;           // a write stuck this long: drop the socket
    int max_connections = 10000;            // WebSocket connections per gateway
    int max_connections_per_address = 1000; // ... per client IP address
    int db_timeout_ms = 5000;               // a database job stuck this long: drop its connection
    int accept_backoff_ms = 100;            // first pause after EMFILE & co. (doubles to 2 s)
    int listen_probe_ms = 1000;
    std::string bus = "postgres";        // or nats://HOST:PORT[,nats://HOST:PORT...]
    bool quiet = false;
};

/// Parses flags and environment. On error returns a message; `help` is set
/// for --help.
std::optional<std::string> parse_config(int argc, char** argv, Config& cfg, bool& help);
std::string config_help();
/// Checks a --bus value: "postgres" or nats://HOST:PORT[,...]; the error, if any.
std::optional<std::string> check_bus(const std::string& v);

} // namespace im
