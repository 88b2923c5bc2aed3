#include "database.hpp"

#include "db_pool.hpp"
#include "log.hpp"
#include "migrations.hpp"

#include <pqxx/pqxx>

#include <chrono>
#include <thread>

namespace im {

Database open_database(const std::optional<std::string>& db_url, const std::string& state_dir) {
    Database d;
    if (db_url) {
        d.url = *db_url;
        return d;
    }
    d.cluster = std::make_unique<PgCluster>(cluster_root_for_state_dir(state_dir));
    d.cluster->ensure_initialized();
    d.started_cluster = d.cluster->start();
    if (d.started_cluster) log_info("embedded_pg_started", {{"dir", d.cluster->root()}});
    d.cluster->ensure_database("im");
    d.url = d.cluster->url("im");
    return d;
}

int prepare_schema(const std::string& url, int wait_ms) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
    for (;;) {
        try {
            auto c = open_connection(url, "imserver-migrate");
            return migrate(*c);
        } catch (const pqxx::broken_connection& e) {
            if (std::chrono::steady_clock::now() >= deadline) throw;
            log_warn("db_not_ready", {{"err", e.what()}});
            std::this_thread::sleep_for(std::chrono::milliseconds(500));
        }
    }
}

} // namespace im
