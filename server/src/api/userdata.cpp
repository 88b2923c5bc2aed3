#include "api/userdata.hpp"

#include "core/protocol.hpp"

namespace im::userdata {

namespace json = boost::json;

std::string ndjson_line(const Store::ExportRecord& r) {
    if (r.event) {
        std::string ev = encode_event(*r.event); // "{...}"
        return "{\"type\":\"event\"," + ev.substr(1) + "\n";
    }
    std::string line = "{\"type\":" + json::serialize(json::value(json::string(r.type)));
    for (const auto& [name, value] : r.fields) {
        line += ",\"" + name + "\":"; // names are this file's and the store's own identifiers
        line += value.empty() ? std::string("null") : value;
    }
    return line + "}\n";
}

std::string end_line(std::int64_t records) {
    return json::serialize(json::object{{"type", "end"}, {"records", records}}) + "\n";
}

std::string next_chunk(Store& s, pqxx::connection_base& c, const std::string& user, Store::ExportCursor& cur,
                       bool& ended) {
    if (cur.phase >= 3) {
        if (ended) return {};
        ended = true;
        return end_line(cur.counted);
    }
    std::string out;
    for (const auto& r : s.export_batch(c, user, cur)) out += ndjson_line(r);
    if (out.empty() && cur.phase >= 3 && !ended) {
        ended = true;
        out = end_line(cur.counted);
    }
    return out;
}

json::object erase(Store& s, pqxx::connection_base& c, const std::string& user) {
    const auto e = s.erase_user(c, user);
    return json::object{{"user", user},           {"devices_revoked", e.devices}, {"memberships_closed", e.memberships},
                        {"conversations", e.convs}, {"events_erased", e.events},  {"recalls", e.recalls},
                        {"uploads_deleted", e.uploads}};
}

} // namespace im::userdata
