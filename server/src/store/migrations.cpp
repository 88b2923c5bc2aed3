#include "store/migrations.hpp"

#include <stdexcept>

#include "core/digest.hpp"
#include "core/log.hpp"

#include <pqxx/pqxx>

#include <algorithm>
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
    static const Schema s = [] {
        Schema out{all_migrations(), all_functions(), 0, {}};
        for (const auto& e : function_set_history()) out.function_version = std::max(out.function_version, e.version);
        for (const auto& e : function_set_history())
            if (e.version == 1) out.legacy_function_checksums[e.name] = e.checksum;
        return out;
    }();
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
    // What the gateways of the releases before function-set versions compare
    // their files against (see the end of this function).
    tx.exec("CREATE TABLE IF NOT EXISTS schema_functions ("
            "name text PRIMARY KEY, checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())");
    // Each version of the function set applied (the newest is the
    // database's), and each file applied with the version that applied it.
    tx.exec("CREATE TABLE IF NOT EXISTS schema_function_set ("
            "version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())");
    tx.exec("CREATE TABLE IF NOT EXISTS schema_function_files ("
            "name text PRIMARY KEY, checksum text NOT NULL, version integer NOT NULL, "
            "applied_at timestamptz NOT NULL DEFAULT now())");
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
    // Functions after the tables they read, as one versioned set: never an
    // older set over a newer one. A gateway of the previous release that
    // restarts during a rolling upgrade (or a rollback) would otherwise put
    // its functions back for every gateway, and the newer gateways' rows
    // (a column the newer function fills) would meet the older function.
    out.database_function_version =
        tx.exec("SELECT coalesce(max(version), 0) FROM schema_function_set")[0][0].as<int>();
    if (schema.function_version < out.database_function_version) {
        log_warn("functions_newer_in_database",
                 {{"version", schema.function_version}, {"database_version", out.database_function_version}});
        tx.commit();
        return out;
    }
    std::map<std::string, std::string> sums;
    for (const auto& row : tx.exec("SELECT name, checksum FROM schema_function_files"))
        sums[row[0].c_str()] = row[1].c_str();
    for (const auto& f : schema.functions) {
        const std::string sum = schema_checksum(f.sql);
        auto it = sums.find(f.name);
        if (it != sums.end() && it->second == sum) continue;
        // The same version with another file: a build of a version that
        // was corrected before its release (the build refuses a changed
        // file under a released version's number). Applied, and said.
        if (schema.function_version == out.database_function_version && it != sums.end())
            log_warn("function_changed_within_version", {{"name", f.name}, {"version", schema.function_version}});
        tx.exec(f.sql);
        tx.exec_params("INSERT INTO schema_function_files (name, checksum, version) VALUES ($1, $2, $3) "
                       "ON CONFLICT (name) DO UPDATE SET checksum = EXCLUDED.checksum, version = EXCLUDED.version, "
                       "applied_at = now()",
                       f.name, sum, schema.function_version);
        log_info("function_applied", {{"name", f.name}, {"checksum", sum}, {"version", schema.function_version}});
        ++out.functions;
    }
    if (schema.function_version > out.database_function_version) {
        tx.exec_params("INSERT INTO schema_function_set (version) VALUES ($1)", schema.function_version);
        log_info("function_set_applied",
                 {{"version", schema.function_version}, {"previous_version", out.database_function_version}});
        out.database_function_version = schema.function_version;
    }
    // The gateways of the releases before these versions re-apply each file
    // whose checksum differs from schema_functions: it keeps version 1's
    // checksums, theirs, so they leave this set alone.
    for (const auto& [name, sum] : schema.legacy_function_checksums)
        tx.exec_params("INSERT INTO schema_functions (name, checksum) VALUES ($1, $2) "
                       "ON CONFLICT (name) DO UPDATE SET checksum = EXCLUDED.checksum, applied_at = now() "
                       "WHERE schema_functions.checksum <> EXCLUDED.checksum",
                       name, sum);
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
