// Where the server's database is: --db, or the embedded cluster of a state
// directory, started on demand.
#pragma once

#include "pg_cluster.hpp"

#include <memory>
#include <optional>
#include <string>

namespace im {

struct Database {
    std::string url;
    std::unique_ptr<PgCluster> cluster; // set in embedded mode
    bool started_cluster = false;       // this process started it
};

/// Embedded mode initialises and starts STATE/pg when needed.
Database open_database(const std::optional<std::string>& db_url, const std::string& state_dir);

/// Connects and applies migrations, retrying for up to `wait_ms` while the
/// database is not reachable yet. Throws on failure.
int prepare_schema(const std::string& url, int wait_ms);

} // namespace im
