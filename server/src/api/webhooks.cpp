#include "api/webhooks.hpp"

#include "store/store.hpp"
#include "store/store_webhooks.hpp"

namespace im::webhooks {

namespace json = boost::json;

namespace {

std::int64_t int_field(const json::value& v) {
    return v.is_int64() ? v.as_int64() : static_cast<std::int64_t>(v.as_uint64());
}

json::value opt(const std::optional<std::string>& s) {
    if (!s) return nullptr;
    return json::string(*s);
}

} // namespace

ApiOut api_add(pqxx::connection_base& c, const json::object& body) {
    std::vector<std::string> kinds;
    if (auto* e = body.if_contains("events"))
        for (const auto& k : e->as_array()) kinds.emplace_back(k.as_string());
    const std::string secret = body.contains("secret") ? std::string(body.at("secret").as_string()) : std::string();
    auto [id, made] = add(c, std::string(body.at("url").as_string()), kinds, secret);
    json::object o{{"id", id}};
    if (secret.empty()) o["secret"] = made; // shown once: the caller did not choose it
    return {201, std::move(o)};
}

ApiOut api_list(pqxx::connection_base& c) {
    json::array hooks;
    for (const auto& w : list(c)) {
        json::array kinds;
        for (const auto& k : w.kinds) kinds.push_back(json::string(k));
        hooks.push_back(json::object{{"id", w.id},
                                     {"url", w.url},
                                     {"events", std::move(kinds)},
                                     {"created", w.created},
                                     {"backlog", w.backlog},
                                     {"failed", w.failed},
                                     {"last_error", opt(w.last_error)},
                                     {"last_error_at", opt(w.last_error_at)},
                                     {"last_success_at", opt(w.last_success_at)}});
    }
    return {200, {{"webhooks", std::move(hooks)}}};
}

ApiOut api_remove(pqxx::connection_base& c, const std::string& id) {
    if (!remove(c, id)) throw AdminError(AdminError::not_found, "no such webhook: " + id);
    return {200, {{"id", id}}};
}

ApiOut api_deliveries(pqxx::connection_base& c, const std::string& id, const json::object& query) {
    if (auto* s = query.if_contains("status"); s && s->as_string() != "failed")
        throw AdminError(AdminError::invalid, "status must be 'failed' (only what failed for good is kept)");
    std::int64_t limit = 100;
    if (auto* l = query.if_contains("limit")) limit = int_field(*l);
    if (limit < 1 || limit > 1000) throw AdminError(AdminError::invalid, "limit must be 1-1000");
    json::array out;
    for (const auto& f : failures(c, id, limit))
        out.push_back(json::object{{"conv", f.conv},
                                   {"from_seq", f.from_seq},
                                   {"to_seq", f.to_seq},
                                   {"attempts", f.attempts},
                                   {"last_error", f.last_error},
                                   {"failed_at", f.failed_at},
                                   {"status", "failed"}});
    return {200, {{"webhook", id}, {"deliveries", std::move(out)}}};
}

ApiOut api_replay(pqxx::connection_base& c, const std::string& id, const json::object& body) {
    const std::string conv(body.at("conv").as_string());
    const std::int64_t from = int_field(body.at("from_seq"));
    replay(c, id, conv, from);
    return {200, {{"webhook", id}, {"conv", conv}, {"from_seq", from}}};
}

} // namespace im::webhooks
