#include "migrations.hpp"

#include "log.hpp"

#include <pqxx/pqxx>

#include <set>

namespace im {

namespace {
constexpr long long migration_lock_key = 0x696d736368656d61; // "imschema"
}

int migrate(pqxx::connection_base& c) {
    pqxx::work tx(c);
    tx.exec_params("SELECT pg_advisory_xact_lock($1)", migration_lock_key);
    tx.exec("CREATE TABLE IF NOT EXISTS schema_migrations ("
            "version integer PRIMARY KEY, name text NOT NULL, "
            "applied_at timestamptz NOT NULL DEFAULT now())");
    std::set<int> applied;
    for (const auto& row : tx.exec("SELECT version FROM schema_migrations")) applied.insert(row[0].as<int>());
    int n = 0;
    for (const auto& m : all_migrations()) {
        if (applied.count(m.version)) continue;
        tx.exec(m.sql);
        tx.exec_params("INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", m.version, m.name);
        log_info("migration_applied", {{"version", m.version}, {"name", m.name}});
        ++n;
    }
    tx.commit();
    return n;
}

bool migrations_current(pqxx::connection_base& c) {
    pqxx::nontransaction tx(c);
    auto r = tx.exec("SELECT count(*) FROM schema_migrations");
    return r[0][0].as<std::size_t>() >= all_migrations().size();
}

} // namespace im
