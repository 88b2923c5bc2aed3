// Schema as code (docs/operations.md, "Schema"): the numbered, append-only
// migrations of schema/NNN_name.sql and the functions of
// schema/functions/NAME.sql, compiled into the binary. At start, under one
// advisory lock (several gateways may start at once):
//   * every applied migration's recorded checksum must equal its file's,
//     else the start is refused (SchemaMismatch);
//   * the missing migrations are applied in version order (numbers may have
//     gaps), each recorded with its checksum in schema_migrations;
//   * the function files are one versioned set (schema/functions/versions.txt,
//     the highest version compiled in): over a database whose recorded set
//     (schema_function_set) is older or the same, every file whose checksum
//     differs from the one recorded in schema_function_files is applied
//     (CREATE OR REPLACE) and recorded; over a newer set nothing is applied
//     (a gateway of the previous release restarting during a rolling
//     upgrade, or a rollback: it serves on the newer functions).
#pragma once

#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <pqxx/pqxx>

namespace im {

struct Migration {
    int version;
    std::string name; // the file name without .sql, e.g. 001_baseline
    std::string sql;
};

struct SchemaFunction {
    std::string name; // the file name without .sql, e.g. im_send
    std::string sql;  // CREATE OR REPLACE FUNCTION ...
};

/// One line of schema/functions/versions.txt: a file of a version of the set.
struct FunctionSetEntry {
    int version;
    std::string name;     // the file name without .sql
    std::string checksum; // schema_checksum of the file
};

const std::vector<Migration>& all_migrations();               // generated from schema/NNN_*.sql
const std::vector<SchemaFunction>& all_functions();           // generated from schema/functions/*.sql
const std::vector<FunctionSetEntry>& function_set_history(); // generated from schema/functions/versions.txt

/// What migrate() works from: the embedded files, or a test's own.
struct Schema {
    std::vector<Migration> migrations;
    std::vector<SchemaFunction> functions;
    /// The version of `functions` (the highest of versions.txt).
    int function_version = 0;
    /// name -> checksum written to schema_functions, what the gateways of the
    /// releases before function-set versions compare their files against
    /// (version 1's: theirs, so they leave a newer set alone).
    std::map<std::string, std::string> legacy_function_checksums;
};
const Schema& embedded_schema();

/// SHA-256 of a file's text, as hex: the checksum recorded for it.
std::string schema_checksum(std::string_view sql);

/// An applied migration whose file changed since (or a database whose
/// history is not this schema's): the start must stop.
class SchemaMismatch : public std::runtime_error {
public:
    SchemaMismatch(int version, std::string recorded_name, std::string file_name, std::string recorded_checksum,
                   std::string file_checksum);
    int version;
    std::string recorded_name, file_name, recorded_checksum, file_checksum;
};

struct MigrateResult {
    int migrations = 0; // numbered migrations applied by this call
    int functions = 0;  // function files (re)applied by this call
    /// The function set's version recorded in the database after the call
    /// (higher than the schema's when a newer gateway applied its set: this
    /// call then applied no function).
    int database_function_version = 0;
};

/// Applies what is missing or changed, in one transaction under the
/// advisory lock. Throws SchemaMismatch (nothing applied) when an applied
/// migration differs from its file.
MigrateResult migrate(pqxx::connection_base& c, const Schema& schema = embedded_schema());
/// Takes the schema's advisory lock for the rest of the transaction (what
/// migrate() holds; the lab installs its functions under it too).
void lock_schema(pqxx::transaction_base& tx);
/// True when every known migration is recorded with its file's checksum
/// (for /readyz: 503 when an applied migration was changed).
bool migrations_current(pqxx::connection_base& c, const Schema& schema = embedded_schema());

} // namespace im
