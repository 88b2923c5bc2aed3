// A user's data (server.md, "A user's data"; issue 52 item 4): the export
// as NDJSON and the erase, one implementation for both callers, as
// moderation.hpp: the admin CLI (admin.cpp) and the backend API
// (backend_api.cpp, which streams the export: http_session.cpp).
#pragma once

#include "store/store.hpp"

#include <boost/json.hpp>

#include <cstdint>
#include <string>

namespace im::userdata {

/// One NDJSON line (with its '\n') of an export record:
/// {"type":"event", ...the event as pages show it} or {"type":..., fields}.
std::string ndjson_line(const Store::ExportRecord& r);
/// The last line of a complete export: {"type":"end","records":N}. An
/// export without it was cut short (the reader asks again).
std::string end_line(std::int64_t records);

/// The next lines of `user`'s export (one database batch); empty when the
/// end line was given. AdminError::not_found for an unknown user.
std::string next_chunk(Store& s, pqxx::connection_base& c, const std::string& user, Store::ExportCursor& cur,
                       bool& ended);

/// Erases `user` (Store::erase_user); the counts as the API answers them.
boost::json::object erase(Store& s, pqxx::connection_base& c, const std::string& user);

} // namespace im::userdata
