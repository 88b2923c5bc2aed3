// The attachment routes of the gateway's listener (server.md "Attachments";
// docs/protocol.md "Attachments over HTTP"), plain or TLS like the rest:
//
//   POST /v1/uploads                   {"name","mime","size","sha256"} -> 201 {"att_id","offset","complete"}
//   PUT  /v1/uploads/{id}?offset=N     the bytes from N               -> 200 {"offset","complete"}
//   GET  /v1/uploads/{id}              where it stands                -> 200 {"offset","size","complete"}
//   DELETE /v1/uploads/{id}            cancel (not once a msg uses it) -> 200 {"att_id","removed"}; 409 ATTACHMENT_IN_USE
//   GET  /v1/attachments/{id}          the bytes (Range, ETag)        -> 200 / 206 / 304 / 416
//
// Authorised by `Authorization: Bearer <device token or JWT>`, as a hello
// is. A PUT's body is never held whole: it is read into one piece buffer
// (attachment_piece_bytes) at a time, each full piece written in its own
// transaction (the offset a client resumes from moves with it), and the
// next read starts only after that commit. A download is read from the
// store one piece at a time, each written before the next is read.
// Answers that come before a request's body was read close the connection
// (after draining what the client still sends, at most 5 s).
#include "net/http_session.hpp"

#include "api/api.hpp"
#include "core/digest.hpp"
#include "core/log.hpp"
#include "net/backend_api.hpp"
#include "net/gateway.hpp"

#include <boost/json.hpp>

#include <charconv>

namespace im {

namespace json = boost::json;

struct HttpSession::Transfer {
    unsigned version = 11;
    bool keep_alive = true;
    bool body_unread = false; // an answer now leaves body bytes unread: close after it
    std::string bearer;
    // PUT
    std::optional<http::request_parser<http::buffer_body>> put;
    std::string user, att;
    std::int64_t offset = 0, size = 0;
    std::string piece;
    std::size_t filled = 0;
    bool counted = false; // in Metrics::uploads_in_progress
    // GET /v1/attachments/{id}
    std::optional<http::response<http::buffer_body>> res;
    std::optional<http::response_serializer<http::buffer_body>> sr;
    std::int64_t pos = 0, end = 0; // pos: the next byte to write
    std::string out, kind;         // kind: the upload's store
    // The piece read ahead (att_read_ahead): from read_pos, while `out` is written.
    std::int64_t read_pos = 0;
    std::string ahead;
    std::string spare; // the buffer of the piece written last, for the next read (no allocation per piece)
    bool reading = false, ahead_ready = false, read_failed = false, writing = false;

    bool sending = false; // in Metrics::downloads_in_progress

    // On the backend API's listener: an API key authorises, the upload is
    // made on behalf of `on_behalf` (POST's "user"), the later requests act
    // as the upload's owner (`path_att`), and a download reads any complete
    // upload (`any_reader`).
    bool api = false;
    std::string on_behalf, path_att;
    bool any_reader = false;
    bool head_get = false; // a GET: the API's read scope is enough
    // The API's log line: the client (behind a trusted proxy: the address
    // it named), the key's name once known, the request; logged once.
    std::string address, proxy, key_name, method, target;
    bool logged = false;

    Metrics* metrics = nullptr;
    ~Transfer() {
        if (metrics && counted) --metrics->uploads_in_progress;
        if (metrics && sending) --metrics->downloads_in_progress;
    }
};

namespace {

// "/v1/uploads/ID?offset=N" -> path and query.
std::pair<std::string_view, std::string_view> split_target(std::string_view target) {
    const auto q = target.find('?');
    if (q == std::string_view::npos) return {target, {}};
    return {target.substr(0, q), target.substr(q + 1)};
}

// The value of `key` in a query string ("" and false when absent).
bool query_value(std::string_view query, std::string_view key, std::string_view& out) {
    while (!query.empty()) {
        const auto amp = query.find('&');
        const auto part = query.substr(0, amp);
        const auto eq = part.find('=');
        if (part.substr(0, eq) == key) {
            out = eq == std::string_view::npos ? std::string_view{} : part.substr(eq + 1);
            return true;
        }
        if (amp == std::string_view::npos) break;
        query.remove_prefix(amp + 1);
    }
    return false;
}

std::optional<std::int64_t> non_negative(std::string_view s) {
    std::int64_t v = 0;
    if (s.empty()) return std::nullopt;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || p != s.data() + s.size() || v < 0) return std::nullopt;
    return v;
}

AttFailure failure(unsigned status, std::string code, std::string message) {
    return AttFailure{status, std::move(code), std::move(message), std::nullopt};
}

// The receive size of a PUT's body (Beast's largest read_some).
constexpr std::size_t put_read_bytes = 64 * 1024;

AttFailure busy() { return failure(503, "UNAVAILABLE", "service unavailable, retry"); }

// RFC 5987 / 8187 value of a Content-Disposition filename*.
std::string pct_encoded(std::string_view s) {
    static const char* hex = "0123456789ABCDEF";
    std::string out;
    for (unsigned char ch : s) {
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
            std::string_view("!#$&+-.^_`|~").find(static_cast<char>(ch)) != std::string_view::npos) {
            out += static_cast<char>(ch);
        } else {
            out += '%';
            out += hex[ch >> 4];
            out += hex[ch & 15];
        }
    }
    return out;
}

// One "bytes=" range of a file of `size` bytes (RFC 9110 14.1.2). nullopt:
// no usable Range (absent, malformed or several ranges: the whole file is
// sent, as the RFC allows); {-1, -1}: not satisfiable (416).
std::optional<std::pair<std::int64_t, std::int64_t>> byte_range(std::string_view h, std::int64_t size) {
    if (h.substr(0, 6) != "bytes=") return std::nullopt;
    h.remove_prefix(6);
    if (h.find(',') != std::string_view::npos) return std::nullopt;
    const auto dash = h.find('-');
    if (dash == std::string_view::npos) return std::nullopt;
    const auto first = h.substr(0, dash), last = h.substr(dash + 1);
    if (first.empty()) { // the last N bytes
        auto n = non_negative(last);
        if (!n) return std::nullopt;
        if (*n == 0 || size == 0) return std::pair<std::int64_t, std::int64_t>{-1, -1};
        return std::pair<std::int64_t, std::int64_t>{std::max<std::int64_t>(0, size - *n), size};
    }
    auto a = non_negative(first);
    if (!a) return std::nullopt;
    std::int64_t b = size - 1;
    if (!last.empty()) {
        auto l = non_negative(last);
        if (!l || *l < *a) return std::nullopt;
        b = std::min(*l, size - 1);
    }
    if (*a >= size) return std::pair<std::int64_t, std::int64_t>{-1, -1};
    return std::pair<std::int64_t, std::int64_t>{*a, b + 1};
}

} // namespace

bool HttpSession::attachment_target(std::string_view target) {
    auto path = split_target(target).first;
    return path == "/v1/uploads" || path.substr(0, 12) == "/v1/uploads/" || path.substr(0, 16) == "/v1/attachments/";
}

void HttpSession::attachments() {
    auto& h = head_->get();
    att_ = std::make_shared<Transfer>();
    att_->metrics = &gw_->metrics();
    att_->version = h.version();
    att_->keep_alive = h.keep_alive();
    att_->body_unread = !head_->is_done();
    att_->api = api_ != nullptr;
    att_->head_get = h.method() == http::verb::get;
    if (att_->api) {
        att_->method = std::string(http::to_string(h.method()));
        att_->target = std::string(h.target());
        const auto client = client_of(h);
        if (!client) {
            att_->address = address_;
            return att_failed(failure(400, "INVALID_ARGUMENT",
                                      "X-Forwarded-For from a trusted proxy is not a list of addresses"));
        }
        att_->address = client->address;
        att_->proxy = client->proxy;
    }
    const std::string_view auth = h[http::field::authorization];
    if (auth.size() > 7 && beast::iequals(auth.substr(0, 7), "Bearer ")) {
        auto token = auth.substr(7);
        while (!token.empty() && token.front() == ' ') token.remove_prefix(1);
        while (!token.empty() && token.back() == ' ') token.remove_suffix(1);
        att_->bearer = std::string(token);
    }
    if (!gw_->attachments()) return att_failed(failure(404, "NOT_FOUND", "not found"));
    if (h.method() == http::verb::put) return att_put();
    // The other routes: a small body (POST's JSON), read whole.
    const auto length = head_->content_length();
    parser_.emplace(std::move(*head_));
    head_.reset();
    parser_->body_limit(max_upload_json_bytes);
    if (length && *length > max_upload_json_bytes)
        return att_failed(failure(413, "TOO_LARGE", "request body too large"));
    with_stream([this](auto& s) {
        http::async_read(s, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
            if (ec == http::error::body_limit) return self->att_failed(failure(413, "TOO_LARGE", "request body too large"));
            if (ec) return fail(ec, "http_read");
            self->att_->body_unread = false;
            self->att_route(self->parser_->release());
        });
    });
}

void HttpSession::att_route(http::request<http::string_body> req) {
    const auto [path, query] = split_target(req.target());
    auto* store = gw_->attachments();
    if (path == "/v1/uploads") {
        if (req.method() != http::verb::post)
            return att_failed(failure(405, "METHOD_NOT_ALLOWED", "POST /v1/uploads starts an upload"));
        json::error_code ec;
        auto v = json::parse(req.body(), ec);
        const json::object* o = !ec && v.is_object() ? &v.as_object() : nullptr;
        auto text = [&](const char* k) -> const json::string* {
            auto* f = o ? o->if_contains(k) : nullptr;
            return f && f->is_string() ? &f->as_string() : nullptr;
        };
        const json::value* size = o ? o->if_contains("size") : nullptr;
        if (att_->api) {
            // The backend API's rules: "user" names whose upload it is; no unknown field.
            if (!text("user") || !valid_id(*text("user")))
                return att_failed(failure(400, "INVALID_ARGUMENT",
                                          "field 'user' must be 1-64 characters of [A-Za-z0-9._:-]"));
            for (const auto& [k, v] : *o)
                if (k != "user" && k != "name" && k != "mime" && k != "size" && k != "sha256")
                    return att_failed(failure(400, "INVALID_ARGUMENT", "unknown field '" + std::string(k) + "'"));
            att_->on_behalf = std::string(*text("user"));
        }
        if (!text("name") || !text("mime") || !text("sha256") || !size || !(size->is_int64() || size->is_uint64()))
            return att_failed(failure(400, "INVALID_ARGUMENT", "expected {\"name\",\"mime\",\"size\",\"sha256\"}"));
        const std::int64_t n = size->is_int64() ? size->as_int64()
                                : size->as_uint64() > static_cast<std::uint64_t>(INT64_MAX) ? INT64_MAX
                                                                                             : static_cast<std::int64_t>(size->as_uint64());
        std::string name(*text("name")), mime(*text("mime")), sha(*text("sha256"));
        return att_authorized([self = shared_from_this(), store, name, mime, n, sha](pqxx::connection_base& c,
                                                                                     const std::string& user) {
            auto made = store->create(c, user, name, mime, n, sha);
            return std::function<void()>([self, made] {
                if (auto* f = std::get_if<AttFailure>(&made)) return self->att_failed(*f);
                const auto& s = std::get<UploadState>(made);
                log_info("upload_started", {{"att", s.att_id}, {"user", s.owner}, {"size", std::to_string(s.size)}});
                self->att_json(http::status::created,
                               json::serialize(json::object{
                                   {"att_id", s.att_id}, {"offset", s.received}, {"complete", s.complete}}));
            });
        });
    }
    if (path.substr(0, 12) == "/v1/uploads/") {
        std::string att(path.substr(12));
        att_->path_att = att;
        if (req.method() == http::verb::delete_) {
            return att_authorized([self = shared_from_this(), store, att](pqxx::connection_base& c, const std::string& user) {
                auto gone = store->remove(c, user, att);
                return std::function<void()>([self, gone] {
                    if (auto* f = std::get_if<AttFailure>(&gone)) return self->att_failed(*f);
                    const auto& s = std::get<UploadState>(gone);
                    self->att_json(http::status::ok,
                                   json::serialize(json::object{{"att_id", s.att_id}, {"removed", true}}));
                });
            });
        }
        if (req.method() != http::verb::get)
            return att_failed(failure(405, "METHOD_NOT_ALLOWED", "GET, PUT or DELETE /v1/uploads/{att_id}"));
        return att_authorized([self = shared_from_this(), store, att](pqxx::connection_base& c, const std::string& user) {
            auto st = store->resume_status(c, user, att);
            return std::function<void()>([self, st] {
                if (auto* f = std::get_if<AttFailure>(&st)) return self->att_failed(*f);
                const auto& s = std::get<UploadState>(st);
                self->att_json(http::status::ok, json::serialize(json::object{
                                                     {"offset", s.received}, {"size", s.size}, {"complete", s.complete}}));
            });
        });
    }
    if (req.method() != http::verb::get)
        return att_failed(failure(405, "METHOD_NOT_ALLOWED", "GET /v1/attachments/{att_id}"));
    att_->path_att = std::string(path.substr(16));
    att_->any_reader = att_->api;
    att_download(std::string(path.substr(16)), std::string(req[http::field::range]),
                 std::string(req[http::field::if_none_match]), std::string(req[http::field::if_range]));
}

// ---------------------------------------------------------------- PUT

void HttpSession::att_put() {
    const auto [path, query] = split_target(head_->get().target());
    std::string_view offset_text;
    if (path.substr(0, 12) != "/v1/uploads/")
        return att_failed(failure(405, "METHOD_NOT_ALLOWED", "PUT /v1/uploads/{att_id}?offset=N"));
    const auto offset = query_value(query, "offset", offset_text) ? non_negative(offset_text) : std::nullopt;
    if (!offset) return att_failed(failure(400, "INVALID_ARGUMENT", "?offset=N: where these bytes start"));
    const auto length = head_->content_length();
    if (length && *length > max_upload_request_bytes)
        return att_failed(failure(413, "TOO_LARGE", "at most 8388608 bytes a request"));
    const bool expect_continue = beast::iequals(head_->get()[http::field::expect], "100-continue");
    std::string att(path.substr(12));
    att_->path_att = att;
    att_->put.emplace(std::move(*head_));
    head_.reset();
    att_->put->body_limit(max_upload_request_bytes); // a chunked body
    const std::int64_t len = length ? static_cast<std::int64_t>(*length) : -1;
    auto* store = gw_->attachments();
    att_authorized([self = shared_from_this(), store, att, off = *offset, len, expect_continue](
                       pqxx::connection_base& c, const std::string& user) {
        auto st = store->check_put(c, user, att, off, len);
        return std::function<void()>([self, st, user, expect_continue] {
            if (auto* f = std::get_if<AttFailure>(&st)) return self->att_failed(*f);
            const auto& s = std::get<UploadState>(st);
            auto& t = *self->att_;
            t.user = user;
            t.att = s.att_id;
            t.offset = s.received;
            t.size = s.size;
            t.piece.resize(static_cast<std::size_t>(
                std::clamp<std::int64_t>(s.size - s.received, 1, static_cast<std::int64_t>(attachment_piece_bytes))));
            t.counted = true;
            ++self->gw_->metrics().uploads_in_progress;
            if (!expect_continue || t.put->is_done()) return self->att_put_read();
            // The client waits for this before it sends the body.
            auto cont = std::make_shared<http::response<http::empty_body>>(http::status::continue_, t.version);
            self->with_stream([&](auto& s) {
                http::async_write(s, *cont, [self, cont](beast::error_code ec, std::size_t) {
                    if (ec) return fail(ec, "http_write");
                    self->att_put_read();
                });
            });
        });
    });
}

void HttpSession::att_put_read() {
    auto& t = *att_;
    // Nothing left to read (an empty PUT, e.g. the one that completes an
    // upload whose bytes are all stored): flush what is filled (nothing) and
    // finish. The body's size is not set then, so it must not be read as the
    // piece's remainder: that counted one phantom byte past the declared
    // size and answered 413 to a complete upload.
    if (t.put->is_done()) {
        t.body_unread = false;
        return att_put_flush();
    }
    auto& body = t.put->get().body();
    body.data = t.piece.data() + t.filled;
    body.size = t.piece.size() - t.filled;
    // Beast reads at most the buffer's free capacity (at least 512 bytes, at
    // most 64 KiB) per receive: after a header the buffer is small, and the
    // parser hands every byte to the piece, so it never grows by itself. A
    // body read 512 bytes a recv() was the upload's first cost (the profile
    // in docs/benchmarks.md): reserve the 64 KiB once.
    if (buffer_.capacity() - buffer_.size() < put_read_bytes) buffer_.reserve(buffer_.size() + put_read_bytes);
    with_stream([this](auto& s) {
        beast::get_lowest_layer(s).expires_after(std::chrono::seconds(30));
        http::async_read(s, buffer_, *att_->put, [self = shared_from_this()](beast::error_code ec, std::size_t) {
            self->on_att_put_read(ec);
        });
    });
}

void HttpSession::on_att_put_read(beast::error_code ec) {
    auto& t = *att_;
    if (ec == http::error::need_buffer) ec = {};
    if (ec == http::error::body_limit) return att_failed(failure(413, "TOO_LARGE", "at most 8388608 bytes a request"));
    // The connection ended mid-body: the committed pieces stay, the client
    // asks GET /v1/uploads/{id} where to go on from.
    if (ec) return fail(ec, "upload_read");
    t.filled = t.piece.size() - t.put->get().body().size;
    if (t.put->is_done()) t.body_unread = false;
    if (t.filled == t.piece.size() || t.put->is_done()) return att_put_flush();
    att_put_read();
}

void HttpSession::att_put_flush() {
    auto* store = gw_->attachments();
    auto exec = with_stream([](auto& s) { return s.get_executor(); });
    auto self = shared_from_this();
    auto t = att_;
    const bool last = t->put->is_done();
    const bool ok = att_pool().submit([self, exec, store, t, last](pqxx::connection_base* c) {
        std::function<void()> then;
        if (!c) {
            then = [self] { self->att_failed(busy()); };
        } else {
            Att<std::int64_t> moved = t->offset;
            if (t->filled > 0) moved = store->append(*c, t->user, t->att, t->offset, std::string_view(t->piece.data(), t->filled));
            std::optional<Att<UploadState>> done;
            if (att_ok(moved) && last && std::get<std::int64_t>(moved) == t->size)
                done = store->finish(*c, t->user, t->att);
            then = [self, t, moved, done, last] {
                if (auto* f = std::get_if<AttFailure>(&moved)) return self->att_failed(*f);
                self->gw_->metrics().attachment_bytes_in += static_cast<long long>(t->filled);
                t->offset = std::get<std::int64_t>(moved);
                t->filled = 0;
                if (!last) return self->att_put_read();
                if (done) {
                    if (auto* f = std::get_if<AttFailure>(&*done)) {
                        if (f->code == "DIGEST_MISMATCH") ++self->gw_->metrics().attachment_digest_mismatches;
                        return self->att_failed(*f);
                    }
                    log_info("upload_complete", {{"att", t->att}, {"user", t->user}, {"size", std::to_string(t->size)}});
                }
                const bool complete = done.has_value();
                self->att_json(http::status::ok,
                               json::serialize(json::object{{"offset", t->offset}, {"complete", complete}}));
            };
        }
        net::post(exec, std::move(then));
    });
    if (!ok) att_failed(busy());
}

// ---------------------------------------------------------------- GET /v1/attachments/{id}

void HttpSession::att_download(std::string att, std::string range, std::string if_none_match, std::string if_range) {
    auto* store = gw_->attachments();
    att_authorized([self = shared_from_this(), store, att, range, if_none_match, if_range](pqxx::connection_base& c,
                                                                                         const std::string& user) {
        // The backend API reads any complete upload (user empty).
        auto st = user.empty() ? store->open_any(c, att) : store->open(c, user, att);
        return std::function<void()>([self, st, range, if_none_match, if_range] {
            if (auto* f = std::get_if<AttFailure>(&st)) return self->att_failed(*f);
            const auto& s = std::get<UploadState>(st);
            auto& t = *self->att_;
            const std::string etag = "\"" + s.sha256 + "\"";
            if (!if_none_match.empty() && (if_none_match == etag || if_none_match == "*")) {
                auto res = std::make_shared<http::response<http::string_body>>(http::status::not_modified, t.version);
                res->set(http::field::server, "imserver");
                res->set(http::field::etag, etag);
                res->keep_alive(t.keep_alive);
                self->att_api_logged(304);
                self->att_.reset();
                return self->write(std::move(res));
            }
            // RFC 9110 13.1.5: a Range goes with an If-Range only when the
            // validator matches: our strong ETag, compared strongly (a weak
            // tag never matches; a date neither: there is no Last-Modified).
            // Otherwise the client's partial copy is of other bytes: the
            // whole file, 200.
            const bool range_applies = if_range.empty() || if_range == etag;
            auto r = range_applies ? byte_range(range, s.size) : std::nullopt;
            if (r && r->first < 0) {
                auto res = std::make_shared<http::response<http::string_body>>(
                    http::status::range_not_satisfiable, t.version);
                res->set(http::field::server, "imserver");
                res->set(http::field::content_range, "bytes */" + std::to_string(s.size));
                res->set(http::field::content_type, "application/json");
                res->body() = R"({"code":"RANGE_NOT_SATISFIABLE","message":"the range is outside the file"})";
                res->keep_alive(t.keep_alive);
                res->prepare_payload();
                self->att_api_logged(416);
                self->att_.reset();
                return self->write(std::move(res));
            }
            self->att_api_logged(r ? 206 : 200);
            t.att = s.att_id;
            t.kind = s.store;
            t.pos = r ? r->first : 0;
            t.end = r ? r->second : s.size;
            t.res.emplace(r ? http::status::partial_content : http::status::ok, t.version);
            auto& res = *t.res;
            res.set(http::field::server, "imserver");
            res.set(http::field::content_type, s.mime);
            res.set(http::field::etag, etag);
            res.set(http::field::accept_ranges, "bytes");
            res.set(http::field::cache_control, "private, max-age=31536000, immutable");
            res.set(http::field::content_disposition, "attachment; filename*=UTF-8''" + pct_encoded(s.name));
            if (r)
                res.set(http::field::content_range, "bytes " + std::to_string(t.pos) + "-" + std::to_string(t.end - 1) +
                                                        "/" + std::to_string(s.size));
            res.content_length(static_cast<std::uint64_t>(t.end - t.pos));
            res.keep_alive(t.keep_alive);
            res.body().data = nullptr;
            res.body().more = true;
            t.sr.emplace(res);
            t.sending = true;
            ++self->gw_->metrics().downloads_in_progress;
            self->att_send_piece();
        });
    });
}

// A download keeps one piece read ahead: the next piece is read from the
// store while the current one is written to the socket, so the database
// and the network work side by side (two pieces in memory per download).
void HttpSession::att_send_piece() {
    auto t = att_;
    t->read_pos = t->pos;
    if (t->pos == t->end) return att_write_next(); // an empty file (or range)
    att_read_ahead();
}

void HttpSession::att_read_ahead() {
    auto t = att_;
    if (!t || t->reading || t->ahead_ready || t->read_pos == t->end) return;
    t->reading = true;
    auto self = shared_from_this();
    auto* store = gw_->attachments();
    auto exec = with_stream([](auto& s) { return s.get_executor(); });
    const std::int64_t from = t->read_pos;
    const auto want = static_cast<std::size_t>(
        std::min<std::int64_t>(t->end - from, static_cast<std::int64_t>(attachment_piece_bytes)));
    const bool ok = att_pool().submit([self, t, exec, store, from, want,
                                       piece = std::move(t->spare)](pqxx::connection_base* c) mutable {
        if (c) {
            try {
                store->read_into(*c, t->kind, t->att, from, want, piece);
            } catch (const std::exception& e) {
                log_warn("download_read_failed", {{"att", t->att}, {"err", e.what()}});
                piece.clear();
            }
        } else {
            piece.clear();
        }
        net::post(exec, [self, t, piece = std::move(piece)]() mutable {
            t->reading = false;
            if (self->att_ != t) return; // the download ended meanwhile
            // The header may be out already: a failed read can only end the
            // connection (the client resumes with Range).
            if (piece.empty()) {
                t->read_failed = true;
                if (!t->writing) self->close();
                return;
            }
            t->read_pos += static_cast<std::int64_t>(piece.size());
            t->ahead = std::move(piece);
            t->ahead_ready = true;
            if (!t->writing) self->att_write_next();
        });
    });
    if (!ok) {
        t->reading = false;
        t->read_failed = true;
        if (!t->writing) close();
    }
}

void HttpSession::att_write_next() {
    auto t = att_;
    if (t->ahead_ready) {
        t->out = std::move(t->ahead);
        t->ahead.clear();
        t->ahead_ready = false;
        t->pos += static_cast<std::int64_t>(t->out.size());
    } else if (t->pos != t->end) {
        return; // the read in flight writes it when it comes
    }
    t->writing = true;
    att_read_ahead(); // the next piece while this one goes out
    auto self = shared_from_this();
    auto& body = t->res->body();
    body.data = t->out.empty() ? nullptr : t->out.data();
    body.size = t->out.size();
    body.more = t->pos < t->end;
    with_stream([&](auto& s) {
        beast::get_lowest_layer(s).expires_after(std::chrono::seconds(30));
        http::async_write(s, *t->sr, [self, t](beast::error_code ec, std::size_t) {
            t->writing = false;
            if (ec == http::error::need_buffer) ec = {};
            if (ec) return fail(ec, "download_write");
            self->gw_->metrics().attachment_bytes_out += static_cast<long long>(t->out.size());
            t->spare = std::move(t->out); // the next read fills it
            t->out.clear();
            if (t->read_failed) return self->close();
            if (!t->sr->is_done()) return self->att_write_next();
            const bool keep = t->keep_alive;
            self->att_.reset();
            if (!keep) return self->close();
            self->do_read();
        });
    });
}

// ---------------------------------------------------------------- common

DbPool& HttpSession::att_pool() {
    auto* store = gw_->attachments();
    return store && store->pool() ? *store->pool() : gw_->pool();
}

void HttpSession::att_authorized(
    std::function<std::function<void()>(pqxx::connection_base&, const std::string&)> work) {
    const std::string bearer = att_->bearer;
    if (att_->api) return att_api_authorized(std::move(work));
    if (bearer.empty())
        return att_failed(failure(401, "UNAUTHENTICATED", "Authorization: Bearer <device token or JWT> required"));
    std::optional<jwt::Claims> claims;
    if (jwt::looks_like_jwt(bearer)) {
        auto checked = check_jwt(gw_->api(), bearer);
        if (!checked) return att_failed(failure(401, "UNAUTHENTICATED", "token not accepted"));
        claims = checked.value();
    }
    auto* store = gw_->attachments();
    auto exec = with_stream([](auto& s) { return s.get_executor(); });
    auto self = shared_from_this();
    const bool ok = att_pool().submit([self, exec, store, bearer, claims, work = std::move(work)](pqxx::connection_base* c) {
        std::function<void()> then;
        if (!c) {
            then = [self] { self->att_failed(busy()); };
        } else {
            auto who = claims ? store->user_of_jwt(*c, claims->sub, claims->device)
                              : store->user_of_token(*c, sha256_hex(bearer));
            if (auto* f = std::get_if<AttFailure>(&who)) then = [self, f = *f] { self->att_failed(f); };
            else then = work(*c, std::get<std::string>(who));
        }
        net::post(exec, std::move(then));
    });
    if (!ok) att_failed(busy());
}

// The backend API's listener: `Authorization: Bearer <API key>`, scope read
// for the GETs and write for the rest (as the API's other routes); the user
// is the POST's "user" (it must exist) or the upload's owner.
void HttpSession::att_api_authorized(
    std::function<std::function<void()>(pqxx::connection_base&, const std::string&)> work) {
    const std::string key = att_->bearer;
    // --api-auth-failures, as on the API's other routes: an address with its
    // failed keys used up is refused before its key is looked at.
    if (api_->auth_limited(att_->address))
        return att_failed(failure(429, "RATE_LIMITED",
                                  "too many failed authentications from this address; try again within a minute"));
    if (key.empty()) {
        api_->auth_failed(att_->address);
        return att_failed(failure(401, "UNAUTHENTICATED", "missing 'Authorization: Bearer <API key>'"));
    }
    const bool read_only = att_->head_get;
    auto* store = gw_->attachments();
    auto exec = with_stream([](auto& s) { return s.get_executor(); });
    auto self = shared_from_this();
    auto t = att_;
    const bool ok = att_pool().submit([self, exec, store, key, read_only, t, work = std::move(work)](
                                           pqxx::connection_base* c) {
        std::function<void()> then;
        auto refuse = [&](AttFailure f) { then = [self, f = std::move(f)] { self->att_failed(f); }; };
        if (!c) {
            refuse(busy());
        } else {
            std::optional<std::pair<std::string, std::string>> found;
            try {
                found = self->gw_->api().store.check_api_key(*c, key);
            } catch (const std::exception& e) {
                log_warn("api_key_check_failed", {{"err", e.what()}});
            }
            const auto rank = [](const std::string& s) { return s == "admin" ? 3 : s == "write" ? 2 : s == "read" ? 1 : 0; };
            if (found) t->key_name = found->first;
            if (!found) {
                self->api_->auth_failed(t->address);
                refuse(failure(401, "UNAUTHENTICATED", "unknown or revoked API key"));
            } else if (rank(found->second) < (read_only ? 1 : 2)) {
                refuse(failure(403, "PERMISSION_DENIED",
                               std::string("this needs a key of scope '") + (read_only ? "read" : "write") + "'"));
            } else if (t->any_reader) {
                then = work(*c, std::string());
            } else {
                auto who = !t->on_behalf.empty() ? store->user_exists(*c, t->on_behalf) : store->owner_of(*c, t->path_att);
                if (auto* f = std::get_if<AttFailure>(&who)) refuse(*f);
                else then = work(*c, std::get<std::string>(who));
            }
        }
        net::post(exec, std::move(then));
    });
    if (!ok) att_failed(busy());
}

void HttpSession::att_failed(const AttFailure& f) {
    json::object o{{"code", f.code}, {"message", f.message}};
    if (f.offset) o["offset"] = *f.offset;
    att_json(static_cast<http::status>(f.status), json::serialize(o));
}

void HttpSession::att_api_logged(unsigned status) {
    auto& t = att_;
    if (!t || !t->api || t->logged) return;
    t->logged = true;
    // The API's line (backend_api.cpp), with the upload and the user on whose behalf.
    log_info("api_call", {{"key", t->key_name.empty() ? std::string("-") : t->key_name},
                          {"method", t->method},
                          {"path", t->target},
                          {"status", static_cast<int>(status)},
                          {"address", t->address},
                          {"proxy", t->proxy.empty() ? std::string("-") : t->proxy},
                          {"att", t->path_att},
                          {"user", t->on_behalf}});
}

void HttpSession::att_json(http::status status, std::string body) {
    att_api_logged(static_cast<unsigned>(status));
    auto t = att_;
    att_.reset();
    auto res = std::make_shared<http::response<http::string_body>>(status, t ? t->version : 11);
    res->set(http::field::server, "imserver");
    res->set(http::field::content_type, "application/json");
    res->set(http::field::cache_control, "no-store");
    if (status == http::status::unauthorized) res->set(http::field::www_authenticate, "Bearer");
    if (status == http::status::too_many_requests) res->set(http::field::retry_after, "60");
    const bool unread = !t || t->body_unread;
    if (unread) drain_on_close_ = true;
    res->keep_alive(t && t->keep_alive && !unread);
    res->body() = std::move(body);
    res->prepare_payload();
    write(std::move(res));
}

} // namespace im
