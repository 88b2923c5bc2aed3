#include "api/provisioning.hpp"

#include <cctype>
#include <charconv>
#include <limits>

namespace im::prov {

namespace {

AdminError invalid(const std::string& msg) { return AdminError(AdminError::invalid, msg); }

void not_reserved(const std::string& device) {
    if (device.rfind(Store::backend_device_prefix, 0) == 0)
        throw invalid("device ids starting with " + std::string(Store::backend_device_prefix) +
                      " belong to the backend API");
}

} // namespace

std::int64_t duration_ms(const std::string& s) {
    std::size_t i = 0;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
    std::int64_t n = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + i, n);
    if (i == 0 || ec != std::errc() || p != s.data() + i)
        throw invalid("bad duration '" + s + "' (e.g. 30d, 12h, 15m, 45s, 500ms)");
    const std::string unit = s.substr(i);
    std::int64_t factor = 0;
    if (unit == "ms") factor = 1;
    else if (unit == "s") factor = 1000;
    else if (unit == "m") factor = 60 * 1000;
    else if (unit == "h") factor = 3600 * 1000;
    else if (unit == "d") factor = 24 * 3600 * 1000;
    else throw invalid("bad duration unit in '" + s + "' (ms, s, m, h, d)");
    if (n > std::numeric_limits<std::int64_t>::max() / factor) throw invalid("duration too long: '" + s + "'");
    return n * factor;
}

bool user_add(Store& s, pqxx::connection_base& c, const std::string& user) { return s.add_user(c, user); }

std::string device_add(Store& s, pqxx::connection_base& c, const std::string& user, const std::string& device) {
    not_reserved(device);
    return s.add_device(c, user, device);
}

std::string device_token(Store& s, pqxx::connection_base& c, const std::string& device) {
    not_reserved(device);
    return s.reissue_token(c, device);
}

void device_revoke(Store& s, pqxx::connection_base& c, const std::string& device) {
    not_reserved(device);
    s.revoke_device(c, device);
}

bool conv_create(Store& s, pqxx::connection_base& c, const std::string& conv, const std::string& kind,
                 const std::vector<std::string>& members) {
    return s.create_conv(c, conv, kind, members);
}

std::int64_t member_add(Store& s, pqxx::connection_base& c, const std::string& conv, const std::string& user) {
    bool already = false;
    return s.add_member(c, conv, user, &already);
}

std::int64_t member_remove(Store& s, pqxx::connection_base& c, const std::string& conv, const std::string& user) {
    return s.remove_member(c, conv, user);
}

void conv_set(Store& s, pqxx::connection_base& c, const std::string& conv, std::optional<std::int64_t> recall_window_ms,
              std::optional<std::int64_t> push_full_max, std::optional<std::int64_t> edit_window_ms) {
    if (!recall_window_ms && !push_full_max && !edit_window_ms)
        throw invalid("give recall_window_ms, push_full_max and/or edit_window_ms");
    if (edit_window_ms && *edit_window_ms < 0) throw invalid("edit_window_ms must be >= 0 (0: no edits)");
    if (recall_window_ms && *recall_window_ms < 0) throw invalid("recall_window_ms must be >= 0");
    if (push_full_max && (*push_full_max < 0 || *push_full_max > std::numeric_limits<std::int32_t>::max()))
        throw invalid("push_full_max must be in [0, 2147483647]");
    s.set_conv(c, conv, recall_window_ms, push_full_max, edit_window_ms);
}

std::int64_t epoch_bump(Store& s, pqxx::connection_base& c, const std::string& conv) { return s.bump_epoch(c, conv); }

std::int64_t purge(Store& s, pqxx::connection_base& c, const std::string& conv, std::optional<std::int64_t> before_seq,
                   std::optional<std::int64_t> older_than_ms) {
    if (before_seq.has_value() == older_than_ms.has_value()) throw invalid("purge needs exactly one of before_seq, older_than");
    if ((before_seq && *before_seq < 0) || (older_than_ms && *older_than_ms < 0))
        throw invalid("purge bounds must be >= 0");
    return s.purge(c, conv, before_seq, older_than_ms);
}

std::string apikey_add(Store& s, pqxx::connection_base& c, const std::string& name, const std::string& scope) {
    return s.add_api_key(c, name, scope);
}

void apikey_revoke(Store& s, pqxx::connection_base& c, const std::string& name) { s.revoke_api_key(c, name); }

} // namespace im::prov
