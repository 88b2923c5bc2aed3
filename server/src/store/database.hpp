// Where the server's database is: --db, or the embedded cluster of a state
// directory, started on demand.
#pragma once

#include "core/config.hpp"
#include "store/pg_cluster.hpp"

#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include <pqxx/pqxx>

namespace im {

struct Database {
    std::string url;
    std::unique_ptr<PgCluster> cluster; // set in embedded mode
    bool started_cluster = false;       // this process started it
};

/// Embedded mode initialises and starts STATE/pg when needed.
Database open_database(const std::optional<std::string>& db_url, const std::string& state_dir);

/// How long a start (or an admin command) waits for its database.
inline constexpr std::chrono::milliseconds start_wait{30000};

/// A connection for a start's (or an admin command's) own steps: a
/// database that is not reachable yet, or slow to take a connection (a
/// loaded machine: the 3 s connect timeout of open_connection expired), is
/// tried again every 500 ms for up to `wait`. Throws the last failure then.
std::unique_ptr<pqxx::connection> open_connection_waiting(const std::string& url, const std::string& app_name,
                                                          std::chrono::milliseconds wait = start_wait);

/// The oldest PostgreSQL the schema runs on, as server_version_num: 14
/// (client_connection_check_interval, the SQL-standard `RETURN` body of
/// schema/functions/im_device_gate.sql). docs/operations.md, "Starting".
inline constexpr int min_server_version_num = 140000;

/// Nothing when a server reporting `server_version_num` (e.g. 150004 for
/// 15.4, 90624 for 9.6.24) is new enough; else the reason to print.
std::optional<std::string> unsupported_postgres(int server_version_num);

/// A database server older than min_server_version_num: the start (or the
/// admin command) stops before it changes anything.
class UnsupportedPostgres : public std::runtime_error {
public:
    UnsupportedPostgres(int server_version_num, const std::string& why);
    int server_version_num;
};

/// Connects (open_connection_waiting, up to `wait`), checks the server's
/// version (UnsupportedPostgres) and applies migrations. Throws on failure.
int prepare_schema(const std::string& url, std::chrono::milliseconds wait = start_wait);

/// The lab's database guard, for the gateway and `imserver admin` alike. A
/// start with --enable-faults whose prepare_schema() made the whole schema
/// (`applied` = every migration) marks the database as the lab's own
/// (`lab_marker`). The switches that harm data (--lab-no-unique-index,
/// --lab-purge-without-tombstones) work only on such a database: otherwise
/// this returns the refusal to print (exit status 2), before anything is
/// altered.
std::optional<std::string> refuse_foreign_lab_database(const std::string& url, int applied, const Config& cfg);

} // namespace im
