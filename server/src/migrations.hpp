// Schema migrations: the numbered files of schema/, compiled into the binary,
// applied in order at start under an advisory lock and recorded in
// schema_migrations. Several gateways may start at once.
#pragma once

#include <string>
#include <vector>

#include <pqxx/pqxx>

namespace im {

struct Migration {
    int version;
    std::string name;
    std::string sql;
};

const std::vector<Migration>& all_migrations(); // generated from schema/*.sql

/// Applies what is missing; returns how many were applied.
int migrate(pqxx::connection_base& c);
/// True when every known migration is recorded (for /readyz).
bool migrations_current(pqxx::connection_base& c);

} // namespace im
