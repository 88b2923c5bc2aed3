#include "store/migrations.hpp"

#include <stdexcept>

#include "core/digest.hpp"
#include "core/log.hpp"

#include <pqxx/pqxx>

#include <map>

namespace im {

namespace {
constexpr long long migration_lock_key = 0x696d736368656d61; // "imschema"

struct Recorded {
    std::string name, checksum; // checksum empty: recorded before checksums were
};

std::map<int, Recorded> recorded_migrations(pqxx::transaction_base& tx) {
    std::map<int, Recorded> out;
    for (const auto& row : tx.exec("SELECT version, name, coalesce(checksum, '') FROM schema_migrations"))
        out[row[0].as<int>()] = {row[1].c_str(), row[2].c_str()};
    return out;
}
} // namespace

const Schema& embedded_schema() {
    static const Schema s{all_migrations(), all_functions()};
    return s;
}

std::string schema_checksum(std::string_view sql) { return sha256_hex(sql); }

SchemaMismatch::SchemaMismatch(int v, std::string rn, std::string fn, std::string rc, std::string fc)
    : std::runtime_error("applied migration " + std::to_string(v) + " (" + rn + ", checksum " +
                         (rc.empty() ? std::string("none") : rc) + ") differs from schema/" + fn + ".sql (checksum " +
                         fc +
                         "): an applied migration is never edited; restore the file, or use a database whose "
                         "history is this schema's (docs/operations.md, \"Schema\")"),
      version(v), recorded_name(std::move(rn)), file_name(std::move(fn)), recorded_checksum(std::move(rc)),
      file_checksum(std::move(fc)) {}

void lock_schema(pqxx::transaction_base& tx) {
    tx.exec_params("SELECT pg_advisory_xact_lock($1)", migration_lock_key);
}

MigrateResult migrate(pqxx::connection_base& c, const Schema& schema) {
    pqxx::work tx(c);
    // Bodies, names and cmids are UTF-8; a database in another encoding
    // would refuse some of them or store them altered. Refused before any
    // change (docs/operations.md, "Database settings the gateway pins").
    const std::string encoding = tx.exec("SELECT current_setting('server_encoding')")[0][0].c_str();
    if (encoding != "UTF8")
        throw std::runtime_error("the database's encoding is " + encoding +
                                 "; imserver needs UTF8 (CREATE DATABASE ... ENCODING 'UTF8' TEMPLATE template0)");
    lock_schema(tx);
    tx.exec("CREATE TABLE IF NOT EXISTS schema_migrations ("
            "version integer PRIMARY KEY, name text NOT NULL, checksum text, "
            "applied_at timestamptz NOT NULL DEFAULT now())");
    // A table from before checksums were recorded: its rows have none, and
    // are refused below as changed.
    tx.exec("ALTER TABLE schema_migrations ADD COLUMN IF NOT EXISTS checksum text");
    tx.exec("CREATE TABLE IF NOT EXISTS schema_functions ("
            "name text PRIMARY KEY, checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())");
    const auto recorded = recorded_migrations(tx);
    // First every check, then any change: a refused start alters nothing.
    for (const auto& m : schema.migrations) {
        auto it = recorded.find(m.version);
        if (it == recorded.end()) continue;
        const std::string sum = schema_checksum(m.sql);
        if (it->second.checksum != sum || it->second.name != m.name)
            throw SchemaMismatch(m.version, it->second.name, m.name, it->second.checksum, sum);
    }
    for (const auto& [version, r] : recorded) {
        bool known = false;
        for (const auto& m : schema.migrations) known = known || m.version == version;
        // A newer binary's migration (a rollback, or a rolling upgrade):
        // tables only grow, so this binary can still run on it.
        if (!known) log_warn("migration_unknown", {{"version", version}, {"name", r.name}});
    }
    MigrateResult out;
    for (const auto& m : schema.migrations) { // in version order; gaps are fine
        if (recorded.count(m.version)) continue;
        tx.exec(m.sql);
        tx.exec_params("INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, $3)", m.version,
                       m.name, schema_checksum(m.sql));
        log_info("migration_applied", {{"version", m.version}, {"name", m.name}});
        ++out.migrations;
    }
    // Functions after the tables they read; each applied when its file changed.
    std::map<std::string, std::string> sums;
    for (const auto& row : tx.exec("SELECT name, checksum FROM schema_functions")) sums[row[0].c_str()] = row[1].c_str();
    for (const auto& f : schema.functions) {
        const std::string sum = schema_checksum(f.sql);
        auto it = sums.find(f.name);
        if (it != sums.end() && it->second == sum) continue;
        tx.exec(f.sql);
        tx.exec_params("INSERT INTO schema_functions (name, checksum) VALUES ($1, $2) "
                       "ON CONFLICT (name) DO UPDATE SET checksum = EXCLUDED.checksum, applied_at = now()",
                       f.name, sum);
        log_info("function_applied", {{"name", f.name}, {"checksum", sum}});
        ++out.functions;
    }
    tx.commit();
    return out;
}

bool migrations_current(pqxx::connection_base& c, const Schema& schema) {
    pqxx::nontransaction tx(c);
    const auto recorded = recorded_migrations(tx);
    for (const auto& m : schema.migrations) {
        auto it = recorded.find(m.version);
        if (it == recorded.end() || it->second.checksum != schema_checksum(m.sql)) return false;
    }
    return true;
}

} // namespace im
