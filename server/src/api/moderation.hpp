// The moderation commands (server.md, "Rate limits and moderation"; issue 52
// item 3), one implementation for both callers, as provisioning.hpp: the
// admin CLI (admin.cpp) and the backend API (backend_api.cpp). Failures are
// AdminError (bad input, unknown) or a database exception.
#pragma once

#include "store/store.hpp"

#include <cstdint>
#include <optional>
#include <string>

namespace im::mod {

/// Mutes `user` in `conv`: until `until_iso` (ISO 8601), for `for_ms` from
/// now, or (neither) until unmuted. Returns the end ("" when open-ended).
std::string mute(Store& s, pqxx::connection_base& c, const std::string& conv, const std::string& user,
                 const std::string& until_iso, std::optional<std::int64_t> for_ms = std::nullopt);
/// False when `user` was not muted there.
bool unmute(Store& s, pqxx::connection_base& c, const std::string& conv, const std::string& user);
/// The operator's recall of msg `seq` (a decimal seq, as in a path).
Store::Redacted redact(Store& s, pqxx::connection_base& c, const std::string& conv, const std::string& seq);
/// Every msg of `user` in `conv`, in batches; the count recalled by this run.
std::int64_t redact_user(Store& s, pqxx::connection_base& c, const std::string& conv, const std::string& user);

} // namespace im::mod
