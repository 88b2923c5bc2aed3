#include "api/moderation.hpp"

#include <charconv>

namespace im::mod {

std::string mute(Store& s, pqxx::connection_base& c, const std::string& conv, const std::string& user,
                 const std::string& until_iso, std::optional<std::int64_t> for_ms) {
    if (!until_iso.empty() && for_ms) throw AdminError(AdminError::invalid, "give an end time or a duration, not both");
    if (for_ms && *for_ms <= 0) throw AdminError(AdminError::invalid, "the duration must be positive");
    return s.set_mute(c, conv, user, until_iso, for_ms);
}

bool unmute(Store& s, pqxx::connection_base& c, const std::string& conv, const std::string& user) {
    return s.clear_mute(c, conv, user);
}

Store::Redacted redact(Store& s, pqxx::connection_base& c, const std::string& conv, const std::string& seq) {
    std::int64_t n = 0;
    auto [p, ec] = std::from_chars(seq.data(), seq.data() + seq.size(), n);
    if (seq.empty() || ec != std::errc() || p != seq.data() + seq.size() || n < 1)
        throw AdminError(AdminError::invalid, "the seq must be a positive integer, got '" + seq + "'");
    return s.redact(c, conv, n);
}

std::int64_t redact_user(Store& s, pqxx::connection_base& c, const std::string& conv, const std::string& user) {
    return s.redact_user(c, conv, user);
}

} // namespace im::mod
