#include "app/startup.hpp"

#include "core/faults.hpp"
#include "core/log.hpp"
#include "store/database.hpp"
#include "store/db_pool.hpp"
#include "store/lab_schema.hpp"
#include "store/migrations.hpp"
#include "store/store.hpp"

#include <pqxx/pqxx>

#include <iostream>

namespace im {

std::optional<int> load_jwt_keys(const Config& cfg, std::unique_ptr<jwt::Verifier>& out) {
    if (!cfg.jwt_enabled()) return std::nullopt;
    out = std::make_unique<jwt::Verifier>(cfg.jwt_hs256_secret_file, cfg.jwt_jwks,
                                          jwt::Settings{cfg.jwt_issuer, cfg.jwt_audience});
    if (auto e = out->reload()) {
        std::cerr << "imserver: " << *e << '\n';
        return 1;
    }
    return std::nullopt;
}

std::optional<int> prepare_database(const Config& cfg, const std::string& url) {
    // The start's own connections wait (start_wait each) for a database
    // that is starting, or slow to take a connection on a loaded machine.
    int applied = 0;
    try {
        applied = prepare_schema(url);
    } catch (const SchemaMismatch& e) {
        // An applied migration was edited (or the database's history is
        // another schema's): nothing is altered, the start stops.
        log_error("schema_migration_changed", {{"version", e.version}, {"recorded", e.recorded_name},
                                               {"file", e.file_name}, {"recorded_checksum", e.recorded_checksum},
                                               {"file_checksum", e.file_checksum}});
        std::cerr << "imserver: " << e.what() << '\n';
        return 1;
    } catch (const UnsupportedPostgres& e) {
        log_error("postgres_unsupported",
                  {{"server_version_num", e.server_version_num}, {"required", min_server_version_num}});
        std::cerr << "imserver: " << e.what() << '\n';
        return 1;
    }
    if (auto refusal = refuse_foreign_lab_database(url, applied, cfg)) {
        std::cerr << "imserver: " << *refusal << '\n';
        return 2;
    }

    if (cfg.enable_faults) {
        // The lab's broken send functions, only into a database the lab
        // created (checked by the marker): production SQL has no lab switch.
        auto c = open_connection_waiting(url, "imserver-lab");
        if (Store::lab_database(*c, false)) install_lab_send_functions(*c);
        else log_warn("lab_send_functions_not_installed", {{"reason", "not a database the lab created"}});
    }
    if (cfg.lab.no_unique_index) {
        // The switch drops an index: only on a database a lab run created
        // (checked above).
        auto c = open_connection_waiting(url, "imserver-lab");
        Store::lab_drop_unique_index(*c);
        log_warn("lab_control_no_unique_index");
    } else {
        auto c = open_connection_waiting(url, "imserver-check");
        FaultRegistry none(false);
        if (!Store(none, {}).idempotency_index_present(*c)) {
            log_error("idempotency_index_missing");
            std::cerr << "imserver: the unique index events_idempotency is missing, so resends could be stored "
                         "twice; recreate it (see docs/operations.md) before starting\n";
            return 1;
        }
    }
    if (cfg.lab.purge_without_tombstones) log_warn("lab_control_purge_without_tombstones");
    if (cfg.lab.erase_without_tombstones) log_warn("lab_control_erase_without_tombstones");
    return std::nullopt;
}

std::optional<int> arm_faults(const Config& cfg, FaultRegistry& faults) {
    for (const auto& f : cfg.faults) {
        if (auto e = faults.arm(f)) {
            std::cerr << "imserver: --fault " << f << ": " << *e << '\n';
            return 2;
        }
    }
    if (cfg.enable_faults) log_warn("faults_enabled");
    return std::nullopt;
}

} // namespace im
