#include "net/backend_api.hpp"

#include "api/api.hpp"
#include "bus/bus.hpp"
#include "store/db_pool.hpp"
#include "net/gateway.hpp"
#include "net/listener.hpp"
#include "core/log.hpp"
#include "core/metrics.hpp"
#include "net/net_common.hpp"
#include "core/protocol.hpp"
#include "api/moderation.hpp"
#include "api/userdata.hpp"
#include "api/provisioning.hpp"
#include "api/webhooks.hpp"
#include "store/store.hpp"

#include <pqxx/pqxx>

#include <charconv>
#include <optional>
#include <variant>

namespace im {

namespace json = boost::json;

namespace {

// ---------------------------------------------------------------- the route table

enum class Op {
    user_add, device_add, device_token, device_revoke, conv_create, member_put, member_delete, conv_set, message,
    events, user_convs, purge, epoch, openapi,
    // moderation (api/moderation.cpp; server.md, "Rate limits and moderation")
    mute_put, mute_delete, redact_one, redact_user,
    user_export, user_erase, // a user's data (api/userdata.cpp)
    webhook_add, webhook_list, webhook_remove, webhook_deliveries, webhook_replay, // api/webhooks.hpp
    // Attachments on a user's behalf: served by HttpSession's attachment
    // routes (net/http_attachments.cpp, their bodies streamed); listed here
    // for the document and the router's 405s only.
    upload_start, upload_put, upload_status, upload_delete, attachment_get
};

struct Field {
    const char* name;
    const char* type; // string | integer | id | ids (an array of ids)
    bool required;
    const char* doc;
};

struct Answer {
    int status;
    const char* doc;
};

struct Route {
    http::verb verb;
    const char* path; // segments in {braces} are ids
    const char* scope;
    Op op;
    const char* summary;
    std::vector<Field> body;
    std::vector<Field> query;
    std::vector<Answer> answers; // beyond those of every route (400, 401, 403, 429, 503)
};

const std::vector<Route>& routes() {
    static const std::vector<Route> table = {
        {http::verb::post, "/v1/users", "write", Op::user_add, "Create a user; an existing one is fine",
         {{"user", "id", true, "the user id"}}, {},
         {{201, "created: {\"user\"}"}, {200, "it existed: {\"user\"}"}}},
        {http::verb::post, "/v1/users/{user}/devices", "write", Op::device_add,
         "Create a device; its token is shown only here",
         {{"device", "id", true, "the device id"}}, {},
         {{201, "{\"device\",\"token\"}"}, {404, "no such user"}, {409, "the device exists"}}},
        {http::verb::post, "/v1/devices/{device}/token", "write", Op::device_token,
         "A new token; connections under the old one close", {}, {},
         {{200, "{\"device\",\"token\"}"}, {404, "no such device"}}},
        {http::verb::post, "/v1/devices/{device}/revoke", "admin", Op::device_revoke,
         "Revoke a device; its connections close within 2 s on every gateway", {}, {},
         {{200, "{\"device\"}"}, {404, "no such device"}}},
        {http::verb::post, "/v1/conversations", "write", Op::conv_create,
         "Create a conversation with join events; the same again is fine",
         {{"conv", "id", true, "the conversation id"},
          {"kind", "string", true, "group or direct"},
          {"members", "ids", true, "user ids (2 for direct)"}},
         {},
         {{201, "created: {\"conv\"}"}, {200, "the same existed: {\"conv\"}"}, {404, "no such user"},
          {409, "the conversation exists with another kind or other members"}}},
        {http::verb::put, "/v1/conversations/{conv}/members/{user}", "write", Op::member_put,
         "Join (a member already: nothing new, the seq of the join that opened the period)", {}, {},
         {{200, "{\"seq\"}"}, {404, "no such conversation or user"}}},
        {http::verb::delete_, "/v1/conversations/{conv}/members/{user}", "write", Op::member_delete, "Leave", {}, {},
         {{200, "{\"seq\"}"}, {404, "no such conversation, or the user is no member (code NOT_MEMBER)"}}},
        {http::verb::patch, "/v1/conversations/{conv}", "admin", Op::conv_set, "Settings",
         {{"recall_window_ms", "integer", false, "recall window, ms (>= 0)"},
          {"push_full_max", "integer", false, "largest membership with full event pushes"},
          {"edit_window_ms", "integer", false, "edit window, ms (>= 0; 0: no edits)"}},
         {},
         {{200, "{\"conv\"}"}, {404, "no such conversation"}}},
        {http::verb::post, "/v1/conversations/{conv}/messages", "write", Op::message,
         "A send on the sender's behalf: the rules, idempotency and pushes of a WebSocket send",
         {{"sender", "id", true, "the sending user"},
          {"cmid", "string", true, "the request key (1-64 characters)"},
          {"body", "string", true, "1-4000 Unicode code points"},
          {"reply_to", "integer", false, "the seq of a msg the sender may read (contract section 12)"},
          {"attachments", "att_ids", false,
           "1-10 att_ids, each a complete upload of the sender (contract section 12); the body may then be empty"}},
         {},
         {{200, "{\"seq\",\"mid\",\"dup\",\"epoch\"}"}, {404, "no such conversation or sender, reply_to names no msg the sender may read, or an attachment no complete upload of the sender"},
          {409, "IDEMPOTENCY_MISMATCH or ORIGINAL_EXPIRED"},
          {403, "NOT_MEMBER: the sender is no member"}}},
        {http::verb::get, "/v1/conversations/{conv}/events", "read", Op::events,
         "The newest events below `before`, paged as `history`, every event of the conversation", {},
         {{"before", "integer", false, "0 or absent: from the head"},
          {"limit", "integer", false, "page size (default 50, at most 200)"}},
         {{200, "a history page"}, {404, "no such conversation"}}},
        {http::verb::get, "/v1/users/{user}/conversations", "read", Op::user_convs,
         "The user's conversations, paged as `convs`; `delivered` is the furthest of the user's devices", {},
         {{"after", "id", false, "the last conversation id of the previous page"},
          {"limit", "integer", false, "page size (default 100, at most 500)"}},
         {{200, "a convs page"}, {404, "no such user"}}},
        {http::verb::post, "/v1/conversations/{conv}/purge", "admin", Op::purge,
         "Retention purge with tombstones",
         {{"before_seq", "integer", false, "purge events below this seq"},
          {"older_than", "string", false, "or events older than this (30d, 12h, 15m, 45s, 500ms)"}},
         {},
         {{200, "{\"purged\"}"}, {404, "no such conversation"}}},
        {http::verb::post, "/v1/conversations/{conv}/epoch", "admin", Op::epoch, "Epoch bump", {}, {},
         {{200, "{\"epoch\"}"}, {404, "no such conversation"}}},
        // Moderation (server.md, "Rate limits and moderation"; docs/operations.md, "Moderation").
        {http::verb::put, "/v1/conversations/{conv}/mutes/{user}", "admin", Op::mute_put,
         "Mute a member: their send, edit, react and typing answer MUTED (reads go on); replaces an earlier mute",
         {{"until", "string", false, "the end, an ISO 8601 time (absent: until removed)"}}, {},
         {{200, "{\"conv\",\"user\",\"until\"} (until null: until removed)"},
          {404, "no such conversation or user"}}},
        {http::verb::delete_, "/v1/conversations/{conv}/mutes/{user}", "admin", Op::mute_delete, "End a mute", {}, {},
         {{200, "{\"conv\",\"user\",\"removed\"} (removed false: there was none)"},
          {404, "no such conversation"}}},
        {http::verb::post, "/v1/conversations/{conv}/messages/{seq}/redact", "admin", Op::redact_one,
         "Recall msg `seq` as the operator (a recall event with sender null), whatever the recall window", {}, {},
         {{200, "{\"seq\",\"already\"}: the recall's seq (already: it was recalled before, that recall)"},
          {404, "no such conversation or event"}}},
        {http::verb::post, "/v1/users/{user}/redact", "admin", Op::redact_user,
         "Recall every msg of the user in a conversation as the operator, in batches of 500 (one transaction "
         "each); a rerun after an interruption resumes",
         {{"conv", "id", true, "the conversation"}}, {},
         {{200, "{\"redacted\"}: msgs recalled by this call"}, {404, "no such conversation or user"}}},
        // A user's data (server.md, "A user's data"; docs/operations.md, "GDPR requests step by step").
        {http::verb::get, "/v1/users/{user}/export", "read", Op::user_export,
         "Everything stored for the user as NDJSON (application/x-ndjson, chunked, streamed as it is read): "
         "one object a line with a \"type\": user, device, upload, membership, read_marker, delivery_marker, mute, "
         "event (their messages, edits, reactions and recalls, as pages show them), and last "
         "{\"type\":\"end\",\"records\"}; an export without the end line was cut short", {}, {},
         {{200, "NDJSON lines, the last {\"type\":\"end\",\"records\":N}"}, {404, "no such user"}}},
        {http::verb::delete_, "/v1/users/{user}", "admin", Op::user_erase,
         "Erase the user: revoke their devices, close their memberships (leave events), recall their msgs as the "
         "operator, remove the content of every event of theirs (rows kept, seqs gap-free, \"erased\": true) and "
         "keep their request keys as tombstones (a late resend: ORIGINAL_EXPIRED); batched and resumable: a rerun "
         "finishes an interrupted erase",
         {{"erase", "boolean", true, "must be true"}}, {},
         {{200, "{\"user\",\"devices_revoked\",\"memberships_closed\",\"conversations\",\"events_erased\","
                "\"recalls\",\"uploads_deleted\"}: what this call did"},
          {404, "no such user"}}},
        // Webhooks (server.md "Events to the app's backend"; api/webhooks.cpp).
        {http::verb::post, "/v1/webhooks", "admin", Op::webhook_add,
         "Register a webhook: committed events POSTed at least once, in seq order per conversation, signed",
         {{"url", "string", true, "http:// or https:// URL"},
          {"events", "ids", false, "kinds: msg, edit, recall, reaction, join, leave (absent: all)"},
          {"secret", "string", false, "HMAC-SHA256 key, 16-256 characters (absent: one is made and answered once)"}},
         {},
         {{201, "{\"id\"} (and \"secret\" when the server made it)"}}},
        {http::verb::get, "/v1/webhooks", "admin", Op::webhook_list, "The webhooks, with backlog and last error", {}, {},
         {{200, "{\"webhooks\":[{\"id\",\"url\",\"events\",\"backlog\",\"failed\",\"last_error\",...}]}"}}},
        {http::verb::delete_, "/v1/webhooks/{id}", "admin", Op::webhook_remove, "Remove a webhook", {}, {},
         {{200, "{\"id\"}"}, {404, "no such webhook"}}},
        {http::verb::get, "/v1/webhooks/{id}/deliveries", "admin", Op::webhook_deliveries,
         "What failed for good (after 72 h of retries), replayable", {},
         {{"status", "id", false, "failed (the only kept status)"}, {"limit", "integer", false, "at most 1000 (default 100)"}},
         {{200, "{\"deliveries\":[{\"conv\",\"from_seq\",\"to_seq\",\"attempts\",\"last_error\",\"failed_at\"}]}"},
          {404, "no such webhook"}}},
        {http::verb::post, "/v1/webhooks/{id}/replay", "admin", Op::webhook_replay,
         "Deliver again from a seq of a conversation", {{"conv", "id", true, "the conversation"},
          {"from_seq", "integer", true, "the first seq to deliver again"}}, {},
         {{200, "{\"webhook\",\"conv\",\"from_seq\"}"}, {404, "no such webhook or conversation"}}},
        // Attachments on a user's behalf (server.md "Attachments"; docs/protocol.md).
        {http::verb::post, "/v1/uploads", "write", Op::upload_start,
         "Start an upload on a user's behalf; then PUT its bytes and name it in a message's attachments",
         {{"user", "id", true, "the uploading user (the upload is theirs, as if their device made it)"},
          {"name", "string", true, "file name: 1-255 bytes of UTF-8 without '/', '\\' or control characters"},
          {"mime", "string", true, "type/subtype"},
          {"size", "integer", true, "bytes, at most --max-attachment-bytes (default 104857600)"},
          {"sha256", "string", true, "64 hex digits of the whole file's SHA-256"}},
         {},
         {{201, "{\"att_id\",\"offset\":0,\"complete\"}"}, {404, "no such user"},
          {413, "TOO_LARGE: over --max-attachment-bytes"}}},
        {http::verb::put, "/v1/uploads/{att_id}", "write", Op::upload_put,
         "Append the bytes from `offset` (at most 8 MiB a request; application/octet-stream)", {},
         {{"offset", "integer", true, "where these bytes start: where the upload stands"}},
         {{200, "{\"offset\",\"complete\"}"}, {404, "no such upload"},
          {409, "OFFSET_MISMATCH with the upload's \"offset\""}, {413, "TOO_LARGE: over 8 MiB or past the size"},
          {422, "DIGEST_MISMATCH: the upload starts again at 0"}}},
        {http::verb::get, "/v1/uploads/{att_id}", "read", Op::upload_status, "Where an upload stands", {}, {},
         {{200, "{\"offset\",\"size\",\"complete\"}"}, {404, "no such upload"}}},
        {http::verb::delete_, "/v1/uploads/{att_id}", "write", Op::upload_delete,
         "Cancel an upload no message references", {}, {},
         {{200, "{\"att_id\",\"removed\":true}"}, {404, "no such upload"},
          {409, "ATTACHMENT_IN_USE: a message references it"}}},
        {http::verb::get, "/v1/attachments/{att_id}", "read", Op::attachment_get,
         "The bytes of any complete upload (Range, ETag as on the gateway)", {}, {},
         {{200, "the bytes"}, {206, "a Range"}, {404, "no such complete upload"}}},
        {http::verb::get, "/v1/openapi.json", "read", Op::openapi, "This document", {}, {},
         {{200, "the OpenAPI 3 document"}}},
    };
    return table;
}

// The answers every route can give.
const Answer common_answers[] = {
    {400, "INVALID_ARGUMENT: malformed JSON, a wrong type, an unknown field, a bad id or value"},
    {401, "UNAUTHENTICATED: no, unknown or revoked API key"},
    {403, "PERMISSION_DENIED: the key's scope is too small"},
    {413, "INVALID_ARGUMENT: the body is over 64 KiB"},
    {429, "RATE_LIMITED: too many failed authentications from this address"},
    {503, "UNAVAILABLE: the database (retry the same request)"},
};

int scope_rank(std::string_view s) { return s == "admin" ? 3 : s == "write" ? 2 : s == "read" ? 1 : 0; }

// ---------------------------------------------------------------- replies

ApiReply reply(http::status st, json::object o) { return ApiReply{st, json::serialize(o), {}, {}}; }

ApiReply error(http::status st, std::string_view code, std::string_view message) {
    return reply(st, {{"code", code}, {"message", message}});
}

ApiReply bad(std::string_view message) { return error(http::status::bad_request, "INVALID_ARGUMENT", message); }

ApiReply unavailable_reply(std::string_view message = "database unavailable, retry the same request") {
    auto r = error(http::status::service_unavailable, "UNAVAILABLE", message);
    r.headers.emplace_back(http::field::retry_after, "1");
    return r;
}

// A WebSocket reply frame as an API answer (the frame's `t` dropped).
json::object frame_object(const std::string& frame) {
    auto o = json::parse(frame).as_object();
    o.erase("t");
    return o;
}

// A contract error (from the store or the send path) as an HTTP answer.
ApiReply contract_error(std::string_view code, std::string_view msg) {
    http::status st = http::status::bad_request;
    if (code == "NOT_MEMBER" || code == "MUTED") st = http::status::forbidden;
    else if (code == "IDEMPOTENCY_MISMATCH" || code == "ORIGINAL_EXPIRED") st = http::status::conflict;
    else if (code == "NOT_FOUND") st = http::status::not_found;
    else if (code == "UNAVAILABLE" || code == "UNAUTHENTICATED") return unavailable_reply(msg);
    return error(st, code, msg);
}

ApiReply admin_error(const AdminError& e) {
    switch (e.kind) {
    case AdminError::invalid: return bad(e.what());
    case AdminError::not_found: return error(http::status::not_found, "NOT_FOUND", e.what());
    case AdminError::not_member: return error(http::status::not_found, "NOT_MEMBER", e.what());
    case AdminError::exists: break;
    }
    return error(http::status::conflict, "ALREADY_EXISTS", e.what());
}

// ---------------------------------------------------------------- parsing

// The path's segments matched against a route's; ids captured by name.
std::optional<std::map<std::string, std::string>> match(std::string_view pattern, std::string_view path) {
    std::map<std::string, std::string> ids;
    for (;;) {
        if (pattern.empty() || path.empty()) {
            if (pattern.empty() && path.empty()) return ids;
            return std::nullopt;
        }
        auto pe = pattern.find('/', 1), se = path.find('/', 1);
        auto pseg = pattern.substr(0, pe), sseg = path.substr(0, se);
        if (pseg.size() > 2 && pseg[1] == '{') ids[std::string(pseg.substr(2, pseg.size() - 3))] = std::string(sseg.substr(1));
        else if (pseg != sseg) return std::nullopt;
        pattern = pe == std::string_view::npos ? std::string_view() : pattern.substr(pe);
        path = se == std::string_view::npos ? std::string_view() : path.substr(se);
    }
}

std::optional<std::string> check_field(const Field& f, const json::value& v) {
    const std::string what = std::string("field '") + f.name + "'";
    if (std::string_view(f.type) == "boolean") {
        if (!v.is_bool()) return what + " must be true or false";
    } else if (std::string_view(f.type) == "integer") {
        if (!v.is_int64() && !(v.is_uint64() && v.as_uint64() <= INT64_MAX)) return what + " must be an integer";
    } else if (std::string_view(f.type) == "att_ids") {
        if (!v.is_array()) return what + " must be an array of att_ids"; // the codec checks the rest
    } else if (std::string_view(f.type) == "ids") {
        if (!v.is_array()) return what + " must be an array of ids";
        for (const auto& item : v.as_array())
            if (!item.is_string() || !valid_id(item.as_string()))
                return what + " must hold ids of 1-64 characters of [A-Za-z0-9._:-]";
    } else {
        if (!v.is_string()) return what + " must be a string";
        if (std::string_view(f.type) == "id" && !valid_id(v.as_string()))
            return what + " must be 1-64 characters of [A-Za-z0-9._:-]";
    }
    return std::nullopt;
}

// The body as the route's fields: a JSON object, no unknown field, the types right.
std::variant<json::object, std::string> parse_body(const Route& r, const std::string& body) {
    if (r.body.empty()) {
        // No body expected: nothing, or an empty object.
        if (body.find_first_not_of(" \t\r\n") == std::string::npos) return json::object{};
    }
    json::error_code ec;
    auto v = json::parse(body, ec);
    if (ec) return std::string("the body is not JSON (") + ec.message() + ")";
    if (!v.is_object()) return std::string("the body must be a JSON object");
    auto& o = v.as_object();
    for (const auto& [k, val] : o) {
        const Field* f = nullptr;
        for (const auto& x : r.body)
            if (k == x.name) f = &x;
        if (!f) return "unknown field '" + std::string(k) + "'";
        if (auto e = check_field(*f, val)) return *e;
    }
    for (const auto& f : r.body)
        if (f.required && !o.contains(f.name)) return std::string("missing field '") + f.name + "'";
    return std::move(o);
}

// The query string as the route's parameters (no unknown ones), as a JSON
// object of integers and ids.
std::variant<json::object, std::string> parse_query(const Route& r, std::string_view q) {
    json::object out;
    while (!q.empty()) {
        auto amp = q.find('&');
        auto item = q.substr(0, amp);
        q = amp == std::string_view::npos ? std::string_view() : q.substr(amp + 1);
        if (item.empty()) continue;
        auto eq = item.find('=');
        auto key = item.substr(0, eq);
        auto value = eq == std::string_view::npos ? std::string_view() : item.substr(eq + 1);
        const Field* f = nullptr;
        for (const auto& x : r.query)
            if (key == x.name) f = &x;
        if (!f) return "unknown query parameter '" + std::string(key) + "'";
        if (value.empty()) continue; // `before=`: absent
        if (std::string_view(f->type) == "integer") {
            std::int64_t n = 0;
            auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
            if (ec != std::errc() || p != value.data() + value.size())
                return "query parameter '" + std::string(key) + "' must be an integer";
            out[key] = n;
        } else {
            if (!valid_id(value)) return "query parameter '" + std::string(key) + "' must be 1-64 characters of [A-Za-z0-9._:-]";
            out[key] = value;
        }
    }
    return out;
}

std::string str_of(const json::object& o, const char* k) { return std::string(o.at(k).as_string()); }
std::optional<std::int64_t> int_of(const json::object& o, const char* k) {
    if (!o.contains(k)) return std::nullopt;
    const auto& v = o.at(k);
    return v.is_int64() ? v.as_int64() : static_cast<std::int64_t>(v.as_uint64());
}

std::string bearer(const http::request<http::string_body>& req) {
    auto it = req.find(http::field::authorization);
    if (it == req.end()) return {};
    std::string_view v = it->value();
    if (v.size() < 7 || !beast::iequals(v.substr(0, 7), "Bearer ")) return {};
    v.remove_prefix(7);
    while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
    return std::string(v);
}

} // namespace

// ---------------------------------------------------------------- a call

struct BackendApi::Call {
    const Route* route = nullptr;
    http::verb method;
    std::string target, key, address, proxy; // the client's address; the trusted proxy that named it
    std::map<std::string, std::string> ids; // path ids
    json::object body, query;
    std::optional<std::string> invalid; // a 400 to give once authenticated
    std::string key_name;               // once authenticated
    std::function<void(ApiReply)> done;
};

BackendApi::BackendApi(Gateway& gw) : gw_(gw), failures_(gw.config().api_auth_failures) {}
BackendApi::~BackendApi() = default;

unsigned short BackendApi::listen(net::io_context& ioc, std::shared_ptr<Gateway> gw) {
    const auto& spec = gw_.config().api_listen;
    auto colon = spec.rfind(':');
    auto host = spec.substr(0, colon);
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    int port = std::stoi(spec.substr(colon + 1));
    listener_ = std::make_shared<Listener>(ioc, std::move(gw), this);
    return listener_->run(net::ip::make_address(host), static_cast<unsigned short>(port));
}

void BackendApi::close() {
    if (!listener_) return;
    net::post(listener_->executor(), [l = listener_] { l->close(); });
}

void BackendApi::release_listener() { listener_.reset(); }

ApiReply BackendApi::too_large() {
    return error(http::status::payload_too_large, "INVALID_ARGUMENT",
                 "the body is over " + std::to_string(api_max_body_bytes / 1024) + " KiB");
}

ApiReply BackendApi::bad_forwarded_for() {
    return bad("X-Forwarded-For from a trusted proxy is not a list of addresses");
}

bool BackendApi::counts_failures(const std::string& address) const {
    return gw_.config().api_auth_failures_loopback || !is_loopback_address(address);
}

bool BackendApi::limited(const std::string& address) {
    return counts_failures(address) && failures_.limited(address);
}

void BackendApi::failed_auth(const std::string& address) {
    if (counts_failures(address)) failures_.failed(address);
}

void BackendApi::handle(http::request<http::string_body> req, ClientAddress client, std::function<void(ApiReply)> done) {
    auto call = std::make_shared<Call>();
    call->method = req.method();
    call->target = std::string(req.target());
    call->address = std::move(client.address);
    call->proxy = std::move(client.proxy);
    // Every answer is logged: key name (once known), method, path, status,
    // the client's address (and the trusted proxy that named it); never the key.
    call->done = [call_ptr = call.get(), done = std::move(done)](ApiReply r) {
        log_info("api_call", {{"key", call_ptr->key_name.empty() ? std::string("-") : call_ptr->key_name},
                              {"method", std::string(http::to_string(call_ptr->method))},
                              {"path", call_ptr->target},
                              {"status", static_cast<int>(r.status)},
                              {"address", call_ptr->address},
                              {"proxy", call_ptr->proxy.empty() ? std::string("-") : call_ptr->proxy}});
        done(std::move(r));
    };
    const std::string_view target = call->target;
    const auto qpos = target.find('?');
    const std::string_view path = target.substr(0, qpos);
    const std::string_view query = qpos == std::string_view::npos ? std::string_view() : target.substr(qpos + 1);

    bool path_known = false;
    for (const auto& r : routes()) {
        auto ids = match(r.path, path);
        if (!ids) continue;
        path_known = true;
        if (r.verb != req.method()) continue;
        call->route = &r;
        call->ids = std::move(*ids);
        break;
    }
    if (!call->route) {
        if (!path_known) return call->done(error(http::status::not_found, "NOT_FOUND", "no such endpoint"));
        std::string allow;
        for (const auto& r : routes())
            if (match(r.path, path)) allow += (allow.empty() ? "" : ", ") + std::string(http::to_string(r.verb));
        auto rep = error(http::status::method_not_allowed, "INVALID_ARGUMENT", "method not allowed here");
        rep.headers.emplace_back(http::field::allow, allow);
        return call->done(std::move(rep));
    }
    if (limited(call->address)) {
        auto rep = error(http::status::too_many_requests, "RATE_LIMITED",
                         "too many failed authentications from this address; try again within a minute");
        rep.headers.emplace_back(http::field::retry_after, "60");
        return call->done(std::move(rep));
    }
    call->key = bearer(req);
    if (call->key.empty()) {
        failed_auth(call->address);
        auto rep = error(http::status::unauthorized, "UNAUTHENTICATED", "missing 'Authorization: Bearer <API key>'");
        rep.headers.emplace_back(http::field::www_authenticate, "Bearer");
        return call->done(std::move(rep));
    }
    // Judged now, answered after the key (an unauthenticated caller learns nothing).
    for (const auto& [name, id] : call->ids)
        if (!valid_id(id)) call->invalid = "path segment '" + name + "' must be 1-64 characters of [A-Za-z0-9._:-]";
    if (!call->invalid) {
        auto b = parse_body(*call->route, req.body());
        if (auto* e = std::get_if<std::string>(&b)) call->invalid = *e;
        else call->body = std::move(std::get<json::object>(b));
    }
    if (!call->invalid) {
        auto q = parse_query(*call->route, query);
        if (auto* e = std::get_if<std::string>(&q)) call->invalid = *e;
        else call->query = std::move(std::get<json::object>(q));
    }
    bool queued = gw_.pool().submit([this, call](pqxx::connection_base* c) {
        if (!c) return call->done(unavailable_reply());
        std::optional<std::pair<std::string, std::string>> key;
        try {
            key = gw_.api().store.check_api_key(*c, call->key);
        } catch (const std::exception& e) {
            log_warn("api_key_check_failed", {{"err", e.what()}});
            return call->done(unavailable_reply());
        }
        if (!key) {
            failed_auth(call->address);
            auto rep = error(http::status::unauthorized, "UNAUTHENTICATED", "unknown or revoked API key");
            rep.headers.emplace_back(http::field::www_authenticate, "Bearer error=\"invalid_token\"");
            return call->done(std::move(rep));
        }
        call->key_name = key->first;
        if (scope_rank(key->second) < scope_rank(call->route->scope))
            return call->done(error(http::status::forbidden, "PERMISSION_DENIED",
                                    "this needs a key of scope '" + std::string(call->route->scope) + "'"));
        if (call->invalid) return call->done(bad(*call->invalid));
        authenticated(call, *c);
    });
    if (!queued) call->done(unavailable_reply("the server is busy, retry the same request"));
}

// On a pool worker, the key checked: the command itself.
void BackendApi::authenticated(const std::shared_ptr<Call>& call, pqxx::connection_base& conn) {
    auto finish = call->done;
    if (call->route->op == Op::openapi) return finish(reply(http::status::ok, openapi()));
    if (call->route->op == Op::message) {
        // Validated exactly as a WebSocket send (the codec's checks), then the same send path.
        json::object frame{{"t", "send"}, {"conv", call->ids.at("conv")}, {"cmid", call->body.at("cmid")},
                           {"body", call->body.at("body")}};
        if (call->body.contains("reply_to")) frame["reply_to"] = call->body.at("reply_to");
        if (call->body.contains("attachments")) frame["attachments"] = call->body.at("attachments");
        auto parsed = parse_request(json::serialize(frame));
        if (auto* e = std::get_if<Error>(&parsed.body)) return finish(bad(e->msg));
        const auto send = std::get<req::Send>(std::get<Request>(parsed.body));
        {
            std::optional<Identity> sender;
            bool conv_known = false;
            try {
                conv_known = gw_.api().store.conversation_exists(conn, send.conv);
                if (conv_known) sender = gw_.api().store.backend_sender(conn, str_of(call->body, "sender"));
            } catch (const std::exception& e) {
                log_warn("api_sender_failed", {{"err", e.what()}});
                return finish(unavailable_reply());
            }
            // 404 for an unknown conversation or sender (server.md); a known
            // sender who is no member is the send's own 403 NOT_MEMBER.
            if (!conv_known) return finish(error(http::status::not_found, "NOT_FOUND", "no such conversation"));
            if (!sender) return finish(error(http::status::not_found, "NOT_FOUND", "no such user (sender)"));
            auto& metrics = gw_.metrics();
            ++metrics.send_transactions;
            const auto received = std::chrono::steady_clock::now();
            bool queued = gw_.sends().submit(*sender, {send}, {std::nullopt}, [&metrics, call, finish, received](std::vector<Handled> hs) {
                const Handled& h = hs.front();
                metrics.count_request("send", h.code);
                if (h.code == "OK")
                    metrics.observe_send_seconds(
                        std::chrono::duration<double>(std::chrono::steady_clock::now() - received).count());
                if (h.frame.empty()) return finish(unavailable_reply("the outcome is unknown, retry the same request"));
                auto o = frame_object(h.frame);
                if (h.code != "OK") return finish(contract_error(h.code, o.contains("msg") ? o.at("msg").as_string() : ""));
                finish(reply(http::status::ok,
                             {{"seq", o.at("seq")}, {"mid", o.at("mid")}, {"dup", o.at("dup")}, {"epoch", o.at("epoch")}}));
            });
            if (!queued) {
                metrics.count_request("send", "UNAVAILABLE");
                finish(unavailable_reply("the server is busy, retry the same request"));
            }
        }
        return;
    }
    // Everything else: one command on this worker's connection.
    {
        auto* c = &conn;
        // A store of its own per call: no lab faults, and with another bus
        // than PostgreSQL the notifications go out after COMMIT.
        Store store(no_faults_, gw_.config().lab);
        Notes notes;
        if (gw_.config().bus != "postgres") store.notify_after_commit(&notes);
        const auto& ids = call->ids;
        const auto& b = call->body;
        ApiReply out;
        try {
            switch (call->route->op) {
            case Op::user_add: {
                const std::string user = str_of(b, "user");
                bool made = prov::user_add(store, *c, user);
                out = reply(made ? http::status::created : http::status::ok, {{"user", user}});
                break;
            }
            case Op::device_add: {
                const std::string device = str_of(b, "device");
                out = reply(http::status::created,
                            {{"device", device}, {"token", prov::device_add(store, *c, ids.at("user"), device)}});
                break;
            }
            case Op::device_token:
                out = reply(http::status::ok,
                            {{"device", ids.at("device")}, {"token", prov::device_token(store, *c, ids.at("device"))}});
                break;
            case Op::device_revoke:
                prov::device_revoke(store, *c, ids.at("device"));
                out = reply(http::status::ok, {{"device", ids.at("device")}});
                break;
            case Op::conv_create: {
                const std::string conv = str_of(b, "conv");
                std::vector<std::string> members;
                for (const auto& m : b.at("members").as_array()) members.emplace_back(m.as_string());
                bool made = prov::conv_create(store, *c, conv, str_of(b, "kind"), members);
                out = reply(made ? http::status::created : http::status::ok, {{"conv", conv}});
                break;
            }
            case Op::member_put:
                out = reply(http::status::ok, {{"seq", prov::member_add(store, *c, ids.at("conv"), ids.at("user"))}});
                break;
            case Op::member_delete:
                out = reply(http::status::ok, {{"seq", prov::member_remove(store, *c, ids.at("conv"), ids.at("user"))}});
                break;
            case Op::conv_set:
                prov::conv_set(store, *c, ids.at("conv"), int_of(b, "recall_window_ms"), int_of(b, "push_full_max"),
                               int_of(b, "edit_window_ms"));
                out = reply(http::status::ok, {{"conv", ids.at("conv")}});
                break;
            case Op::purge: {
                std::optional<std::int64_t> older;
                if (b.contains("older_than")) older = prov::duration_ms(str_of(b, "older_than"));
                out = reply(http::status::ok, {{"purged", prov::purge(store, *c, ids.at("conv"), int_of(b, "before_seq"), older)}});
                break;
            }
            case Op::epoch:
                out = reply(http::status::ok, {{"epoch", prov::epoch_bump(store, *c, ids.at("conv"))}});
                break;
            case Op::events:
            case Op::user_convs: {
                // Validated exactly as the WebSocket requests they page like.
                json::object frame = call->query;
                const bool events = call->route->op == Op::events;
                frame["t"] = events ? "history" : "convs";
                if (events) {
                    frame["conv"] = ids.at("conv");
                    if (!frame.contains("before")) frame["before"] = 0; // from the head
                }
                auto parsed = parse_request(json::serialize(frame));
                if (auto* e = std::get_if<Error>(&parsed.body)) {
                    out = bad(e->msg);
                    break;
                }
                Identity who;
                who.backend = true;
                const auto& rq = std::get<Request>(parsed.body);
                std::string page;
                std::optional<Error> err;
                if (events) {
                    auto o = store.history(*c, who, std::get<req::History>(rq));
                    if (o) page = encode_reply(Reply{o.value()}, std::nullopt);
                    else err = o.error();
                } else {
                    who.user = ids.at("user");
                    auto o = store.convs(*c, who, std::get<req::Convs>(rq));
                    if (o) page = encode_reply(Reply{o.value()}, std::nullopt);
                    else err = o.error();
                }
                out = err ? contract_error(code_name(err->code), err->msg) : reply(http::status::ok, frame_object(page));
                break;
            }
            case Op::mute_put: {
                const std::string until = b.contains("until") ? str_of(b, "until") : std::string();
                const std::string end = mod::mute(store, *c, ids.at("conv"), ids.at("user"), until);
                json::object o{{"conv", ids.at("conv")}, {"user", ids.at("user")}};
                if (end.empty()) o["until"] = nullptr;
                else o["until"] = end;
                out = reply(http::status::ok, std::move(o));
                break;
            }
            case Op::mute_delete:
                out = reply(http::status::ok, {{"conv", ids.at("conv")}, {"user", ids.at("user")},
                                               {"removed", mod::unmute(store, *c, ids.at("conv"), ids.at("user"))}});
                break;
            case Op::redact_one: {
                const auto r = mod::redact(store, *c, ids.at("conv"), ids.at("seq"));
                out = reply(http::status::ok, {{"seq", r.seq}, {"already", r.already}});
                break;
            }
            case Op::redact_user:
                out = reply(http::status::ok,
                            {{"redacted", mod::redact_user(store, *c, str_of(b, "conv"), ids.at("user"))}});
                break;
            case Op::user_export: {
                // The first chunk here (an unknown user is a 404 before any
                // header goes out); the rest streamed by the session.
                struct Export : ApiStream {
                    Store store;
                    std::string user;
                    Store::ExportCursor cur;
                    bool ended = false;
                    Export(FaultRegistry& f, LabSwitches lab, std::string u) : store(f, lab), user(std::move(u)) {}
                    std::string next(pqxx::connection_base& conn) override {
                        return userdata::next_chunk(store, conn, user, cur, ended);
                    }
                };
                auto ex = std::make_shared<Export>(no_faults_, gw_.config().lab, ids.at("user"));
                out.status = http::status::ok;
                out.body = ex->next(*c);
                out.headers.emplace_back(http::field::content_type, "application/x-ndjson");
                out.stream = std::move(ex);
                break;
            }
            case Op::user_erase:
                if (!b.at("erase").as_bool()) {
                    out = bad("field 'erase' must be true: this call erases the user");
                    break;
                }
                out = reply(http::status::ok, userdata::erase(store, *c, ids.at("user")));
                break;
            case Op::webhook_add:
            case Op::webhook_list:
            case Op::webhook_remove:
            case Op::webhook_deliveries:
            case Op::webhook_replay: {
                const auto op = call->route->op;
                auto w = op == Op::webhook_add      ? webhooks::api_add(*c, b)
                         : op == Op::webhook_list   ? webhooks::api_list(*c)
                         : op == Op::webhook_remove ? webhooks::api_remove(*c, ids.at("id"))
                         : op == Op::webhook_replay ? webhooks::api_replay(*c, ids.at("id"), b)
                                                    : webhooks::api_deliveries(*c, ids.at("id"), call->query);
                out = reply(static_cast<http::status>(w.status), std::move(w.body));
                break;
            }
            case Op::message:
            case Op::openapi: break; // answered above
            case Op::upload_start:
            case Op::upload_put:
            case Op::upload_status:
            case Op::upload_delete:
            case Op::attachment_get: // HttpSession serves these before the router sees them
                out = error(http::status::not_found, "NOT_FOUND", "no such endpoint");
                break;
            }
        } catch (const AdminError& e) {
            return finish(admin_error(e));
        } catch (const pqxx::sql_error& e) {
            const std::string& st = e.sqlstate();
            if ((st.rfind("22", 0) == 0 || st.rfind("23", 0) == 0) && st != "23505")
                return finish(bad("the database refused the value (" + st + ")"));
            log_warn("api_command_failed", {{"err", e.what()}});
            return finish(unavailable_reply());
        } catch (const std::exception& e) {
            log_warn("api_command_failed", {{"err", e.what()}});
            return finish(unavailable_reply());
        }
        if (!notes.empty() && gw_.api().bus && !gw_.api().bus->publish_and_wait(notes))
            return finish(unavailable_reply("committed, but the gateways were not notified; repeat the request"));
        finish(std::move(out));
    }
}

// ---------------------------------------------------------------- OpenAPI

json::object BackendApi::openapi() {
    auto schema_of = [](const Field& f) -> json::object {
        std::string_view t = f.type;
        if (t == "integer") return {{"type", "integer"}, {"format", "int64"}, {"description", f.doc}};
        if (t == "boolean") return {{"type", "boolean"}, {"description", f.doc}};
        json::object id{{"type", "string"}, {"pattern", "^[A-Za-z0-9._:-]{1,64}$"}};
        if (t == "ids") return {{"type", "array"}, {"items", id}, {"description", f.doc}};
        if (t == "att_ids")
            return {{"type", "array"},
                    {"items", {{"type", "string"}, {"format", "uuid"}}},
                    {"minItems", 1},
                    {"maxItems", static_cast<std::int64_t>(max_message_attachments)},
                    {"description", f.doc}};
        if (t == "id") {
            id["description"] = f.doc;
            return id;
        }
        return {{"type", "string"}, {"description", f.doc}};
    };
    json::object paths;
    for (const auto& r : routes()) {
        json::object op{{"operationId", std::string(r.path) + " " + std::string(http::to_string(r.verb))},
                        {"summary", r.summary},
                        {"x-scope", r.scope},
                        {"security", json::array{json::object{{"apiKey", json::array{}}}}}};
        json::array params;
        std::string_view p = r.path;
        for (auto open = p.find('{'); open != std::string_view::npos; open = p.find('{', open + 1)) {
            auto name = p.substr(open + 1, p.find('}', open) - open - 1);
            params.push_back({{"name", name}, {"in", "path"}, {"required", true},
                              {"schema", {{"type", "string"}, {"pattern", "^[A-Za-z0-9._:-]{1,64}$"}}}});
        }
        for (const auto& f : r.query)
            params.push_back({{"name", f.name}, {"in", "query"}, {"required", false}, {"schema", schema_of(f)}});
        if (!params.empty()) op["parameters"] = std::move(params);
        if (r.op == Op::upload_put) {
            op["requestBody"] = {{"required", true},
                                 {"content", {{"application/octet-stream",
                                               {{"schema", {{"type", "string"}, {"format", "binary"}}}}}}}};
        } else if (!r.body.empty()) {
            json::object props;
            json::array required;
            for (const auto& f : r.body) {
                props[f.name] = schema_of(f);
                if (f.required) required.push_back(json::string(f.name));
            }
            json::object schema{{"type", "object"}, {"properties", std::move(props)}, {"additionalProperties", false}};
            if (!required.empty()) schema["required"] = std::move(required);
            op["requestBody"] = {{"required", true}, {"content", {{"application/json", {{"schema", std::move(schema)}}}}}};
        }
        json::object responses;
        auto add = [&](const Answer& a, bool ok) {
            json::object resp{{"description", a.doc}};
            json::object schema = ok ? json::object{{"type", "object"}}
                                     : json::object{{"$ref", "#/components/schemas/Error"}};
            json::object media{{"schema", std::move(schema)}};
            resp["content"] = json::object{{"application/json", std::move(media)}};
            responses[std::to_string(a.status)] = std::move(resp);
        };
        for (const auto& a : r.answers) add(a, a.status < 300);
        for (const auto& a : common_answers)
            if ((a.status != 413 || !r.body.empty()) && !responses.contains(std::to_string(a.status))) add(a, false);
        if (r.op == Op::attachment_get)
            for (const char* code : {"200", "206"})
                responses[code] = {{"description", code == std::string("200") ? "the bytes" : "a Range"},
                                   {"content", {{"application/octet-stream",
                                                 {{"schema", {{"type", "string"}, {"format", "binary"}}}}}}}};
        op["responses"] = std::move(responses);
        std::string method(http::to_string(r.verb));
        for (auto& ch : method) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
        auto& item = paths[r.path];
        if (!item.is_object()) item = json::object{};
        item.as_object()[method] = std::move(op);
    }
    return {
        {"openapi", "3.0.3"},
        {"info", {{"title", "imserver backend API"}, {"version", "1"},
                  {"description", "Provisioning and messages for the product's own server (docs/integration.md). "
                                  "Bearer API keys made with `imserver admin apikey add NAME --scope read|write|admin`; "
                                  "scopes: read < write < admin (x-scope of each operation). Bodies over 64 KiB: 413."}}},
        {"paths", std::move(paths)},
        {"components",
         {{"securitySchemes", {{"apiKey", {{"type", "http"}, {"scheme", "bearer"}}}}},
          {"schemas",
           {{"Error",
             {{"type", "object"},
              {"required", json::array{"code", "message"}},
              {"properties", {{"code", {{"type", "string"}}}, {"message", {{"type", "string"}}}}}}}}}}},
    };
}

} // namespace im
