// The provisioning commands, one implementation for both callers: the admin
// CLI (admin.cpp) and the backend API (backend_api.cpp). Each command checks
// its arguments, then runs its transaction in the store; failures are
// AdminError (bad input, unknown, exists) or a database exception.
#pragma once

#include "store/store.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace im::prov {

/// "30d", "12h", "15m", "45s", "500ms" in milliseconds; AdminError::invalid otherwise.
std::int64_t duration_ms(const std::string& s);

/// True when it was made, false when it existed.
bool user_add(Store& s, pqxx::connection_base& c, const std::string& user);
/// The new device's token (shown once). Ids starting with ":api:" are the
/// backend API's own and refused.
std::string device_add(Store& s, pqxx::connection_base& c, const std::string& user, const std::string& device);
std::string device_token(Store& s, pqxx::connection_base& c, const std::string& device);
void device_revoke(Store& s, pqxx::connection_base& c, const std::string& device);
/// True when made, false when the same existed (AdminError::exists if it differs).
bool conv_create(Store& s, pqxx::connection_base& c, const std::string& conv, const std::string& kind,
                 const std::vector<std::string>& members);
/// The join's seq; a member already: the seq of the join that opened the period.
std::int64_t member_add(Store& s, pqxx::connection_base& c, const std::string& conv, const std::string& user);
std::int64_t member_remove(Store& s, pqxx::connection_base& c, const std::string& conv, const std::string& user);
void conv_set(Store& s, pqxx::connection_base& c, const std::string& conv, std::optional<std::int64_t> recall_window_ms,
              std::optional<std::int64_t> push_full_max, std::optional<std::int64_t> edit_window_ms = std::nullopt);
std::int64_t epoch_bump(Store& s, pqxx::connection_base& c, const std::string& conv);
/// Exactly one of before_seq / older_than_ms; the events purged.
std::int64_t purge(Store& s, pqxx::connection_base& c, const std::string& conv, std::optional<std::int64_t> before_seq,
                   std::optional<std::int64_t> older_than_ms);

/// Backend API keys.
std::string apikey_add(Store& s, pqxx::connection_base& c, const std::string& name, const std::string& scope);
void apikey_revoke(Store& s, pqxx::connection_base& c, const std::string& name);

} // namespace im::prov
