#include "store/database.hpp"

#include "store/db_pool.hpp"
#include "core/log.hpp"
#include "store/migrations.hpp"
#include "store/store.hpp"

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

std::unique_ptr<pqxx::connection> open_connection_waiting(const std::string& url, const std::string& app_name,
                                                          std::chrono::milliseconds wait) {
    const auto deadline = std::chrono::steady_clock::now() + wait;
    for (;;) {
        try {
            return open_connection(url, app_name);
        } catch (const pqxx::broken_connection& e) {
            if (std::chrono::steady_clock::now() >= deadline) throw;
            log_warn("db_not_ready", {{"err", e.what()}});
            std::this_thread::sleep_for(std::chrono::milliseconds(500));
        }
    }
}

std::optional<std::string> unsupported_postgres(int num) {
    if (num >= min_server_version_num) return std::nullopt;
    // Since 10 the major version is num / 10000; before, two parts (9.6 = 90600).
    const std::string major = num >= 100000 ? std::to_string(num / 10000)
                                            : std::to_string(num / 10000) + "." + std::to_string(num / 100 % 100);
    return "the database server is PostgreSQL " + major + " (server_version_num " + std::to_string(num) +
           "); imserver needs PostgreSQL " + std::to_string(min_server_version_num / 10000) +
           " or newer (client_connection_check_interval, SQL-standard function bodies): upgrade the server "
           "(docs/operations.md, \"Starting\")";
}

UnsupportedPostgres::UnsupportedPostgres(int num, const std::string& why)
    : std::runtime_error(why), server_version_num(num) {}

int prepare_schema(const std::string& url, std::chrono::milliseconds wait) {
    auto c = open_connection_waiting(url, "imserver-migrate", wait);
    {
        // Before any change: a server too old refuses the schema halfway
        // (a function body) or runs without a setting the gateway relies on.
        pqxx::nontransaction tx(*c);
        const int num = tx.exec("SELECT current_setting('server_version_num')::int")[0][0].as<int>();
        if (auto why = unsupported_postgres(num)) throw UnsupportedPostgres(num, *why);
    }
    return migrate(*c).migrations;
}

std::optional<std::string> refuse_foreign_lab_database(const std::string& url, int applied, const Config& cfg) {
    if (!cfg.enable_faults) return std::nullopt; // parse_config refuses every --lab-* without it
    const bool fresh = applied == static_cast<int>(all_migrations().size());
    auto c = open_connection_waiting(url, "imserver-lab");
    const bool lab = Store::lab_database(*c, fresh); // marks the database this start created
    const char* harmful = cfg.lab.no_unique_index            ? "--lab-no-unique-index"
                          : cfg.lab.purge_without_tombstones ? "--lab-purge-without-tombstones"
                          : cfg.lab.erase_without_tombstones ? "--lab-erase-without-tombstones"
                                                             : nullptr;
    if (!harmful || lab) return std::nullopt;
    return std::string(harmful) +
           " refuses this database: it was not created by a lab run (its schema existed before; a lab run "
           "only alters a database whose schema a start with --enable-faults made)";
}

} // namespace im
