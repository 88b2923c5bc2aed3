#include "net/http_session.hpp"

#include "net/backend_api.hpp"
#include "net/gateway.hpp"
#include "core/log.hpp"
#include "net/ws_session.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <functional>

namespace im {

namespace {

// The peer's address in the limits' form (a link-local IPv6 scope is dropped).
IpAddress ip_of(const net::ip::address& a) {
    IpAddress ip;
    if (a.is_v6()) {
        const auto b = a.to_v6().to_bytes();
        std::copy(b.begin(), b.end(), ip.bytes.begin());
    } else {
        ip = *parse_ip("0.0.0.0"); // the IPv4-mapped prefix
        const auto b = a.to_v4().to_bytes();
        std::copy(b.begin(), b.end(), ip.bytes.begin() + 12);
    }
    return ip;
}

std::variant<beast::tcp_stream, tls_stream> make_stream(tcp::socket&& socket, ssl::context* tls) {
    if (tls) return std::variant<beast::tcp_stream, tls_stream>(std::in_place_type<tls_stream>, std::move(socket), *tls);
    return std::variant<beast::tcp_stream, tls_stream>(std::in_place_type<beast::tcp_stream>, std::move(socket));
}

} // namespace

HttpSession::HttpSession(tcp::socket&& socket, std::shared_ptr<Gateway> gw, BackendApi* api, bool metrics_only,
                         bool http_slot)
    : tls_(gw->tls() && !metrics_only ? gw->tls()->current() : nullptr),
      stream_(make_stream(std::move(socket), tls_.get())), gw_(std::move(gw)), api_(api), metrics_only_(metrics_only),
      http_slot_(http_slot) {
    beast::error_code ec;
    auto ep = with_stream([&](auto& s) { return beast::get_lowest_layer(s).socket().remote_endpoint(ec); });
    if (ec) return;
    hop_ = ip_of(ep.address());
    address_ = to_string(hop_); // IPv4-mapped IPv6 as IPv4
    trusted_ = !metrics_only_ && in_any(gw_->config().trusted_proxies, hop_);
}

HttpSession::~HttpSession() {
    if (http_slot_) gw_->put_http_slot();
}

// GET /metrics where --metrics-listen puts it.
bool HttpSession::serves_metrics() const {
    const auto& where = gw_->config().metrics_listen;
    if (metrics_only_) return true;
    return api_ ? where == "api" : where == "public";
}

void HttpSession::metrics(const http::request<http::string_body>& req) {
    auto& p = gw_->pool();
    gw_->metrics().db_timeouts = p.watchdog().fired();
    respond(req, http::status::ok, gw_->metrics().render(p.in_use(), p.size(), p.queued()), "text/plain; version=0.0.4");
}

void HttpSession::run() {
    auto exec = with_stream([](auto& s) { return s.get_executor(); });
    net::dispatch(exec, [self = shared_from_this()] {
        if (self->trusted_) return self->read_proxy_header();
        self->start();
    });
}

void HttpSession::start() {
    if (auto* tls = std::get_if<tls_stream>(&stream_)) {
        beast::get_lowest_layer(*tls).expires_after(std::chrono::seconds(30));
        // Bytes read after a PROXY header already belong to the handshake.
        tls->async_handshake(ssl::stream_base::server, buffer_.data(),
                             beast::bind_front_handler(&HttpSession::on_handshake, shared_from_this()));
        return;
    }
    do_read();
}

// A trusted proxy MAY start the connection with a PROXY v2 header (docs/
// operations.md, "Behind a proxy"): its first bytes are read until they
// either differ from the signature (no header: HTTP or TLS follows, one byte
// tells) or make a whole header. A header begun but malformed, or cut short
// by the end of the connection or the 30 s deadline, closes the connection.
void HttpSession::read_proxy_header() {
    auto& tcp = with_stream([](auto& s) -> beast::tcp_stream& { return beast::get_lowest_layer(s); });
    tcp.expires_after(std::chrono::seconds(30));
    const auto header = parse_proxy_v2({static_cast<const char*>(buffer_.data().data()), buffer_.size()});
    const std::size_t want = std::max<std::size_t>(header.length, 16) - buffer_.size();
    tcp.async_read_some(buffer_.prepare(std::max<std::size_t>(want, 512)),
                        beast::bind_front_handler(&HttpSession::on_proxy_bytes, shared_from_this()));
}

void HttpSession::on_proxy_bytes(beast::error_code ec, std::size_t n) {
    buffer_.commit(n);
    const auto header = parse_proxy_v2({static_cast<const char*>(buffer_.data().data()), buffer_.size()});
    using S = ProxyHeader::Status;
    if (header.status == S::absent) return start();
    if (header.status == S::malformed || (ec && header.status == S::need_more)) {
        log_warn("proxy_header_refused", {{"proxy", address_},
                                          {"err", header.status == S::malformed ? header.error
                                                  : ec == beast::error::timeout ? std::string("timed out in the header")
                                                  : "connection ended in the header: " + ec.message()}});
        beast::error_code ignored;
        with_stream([&](auto& s) { beast::get_lowest_layer(s).socket().close(ignored); });
        return;
    }
    if (header.status == S::need_more) return read_proxy_header();
    buffer_.consume(header.length);
    if (header.source) hop_ = *header.source;
    start();
}

std::optional<ClientAddress> HttpSession::client_of(const http::request_header<>& req) const {
    if (!trusted_) return ClientAddress{address_, {}};
    std::vector<std::string_view> xff;
    for (auto [it, end] = req.equal_range("X-Forwarded-For"); it != end; ++it) xff.push_back(it->value());
    auto client = forwarded_client(hop_, xff, gw_->config().trusted_proxies);
    if (!client) return std::nullopt;
    ClientAddress c{to_string(*client), {}};
    if (c.address != address_) c.proxy = address_;
    return c;
}

void HttpSession::on_handshake(beast::error_code ec, std::size_t used) {
    if (ec) {
        ++gw_->metrics().tls_handshake_failures;
        log_info("tls_handshake_failed", {{"err", ec.message()}});
        return;
    }
    buffer_.consume(used);
    do_read();
}

void HttpSession::do_read() {
    head_.emplace();
    head_->body_limit(boost::none); // judged by the route below (a Content-Length is checked against it at once)
    with_stream([this](auto& s) {
        beast::get_lowest_layer(s).expires_after(std::chrono::seconds(30));
        http::async_read_header(s, buffer_, *head_,
                                beast::bind_front_handler(&HttpSession::on_header, shared_from_this()));
    });
}

void HttpSession::on_header(beast::error_code ec, std::size_t n) {
    if (ec) return api_ ? on_api_read(ec) : fail(ec, "http_read");
    // The attachment routes, on the backend API's listener too (uploads on a
    // user's behalf, an API key instead of the device's credentials).
    if (!metrics_only_ && attachment_target(head_->get().target())) return attachments();
    const std::size_t limit = api_ ? api_max_body_bytes : 8 * 1024;
    const auto length = head_->content_length();
    parser_.emplace(std::move(*head_));
    head_.reset();
    parser_->body_limit(limit);
    if (length && *length > limit) return on_read(http::error::body_limit, n); // as the whole-body read answered it
    with_stream([this](auto& s) {
        http::async_read(s, buffer_, *parser_, beast::bind_front_handler(&HttpSession::on_read, shared_from_this()));
    });
}

void HttpSession::on_read(beast::error_code ec, std::size_t) {
    if (api_) return on_api_read(ec);
    if (ec) return fail(ec, "http_read");
    auto req = parser_->release();
    if (metrics_only_) {
        if (req.method() == http::verb::get && req.target() == "/metrics") return metrics(req);
        return respond(req, http::status::not_found, "not found\n");
    }
    const auto client = client_of(req);
    if (!client) {
        log_warn("forwarded_for_refused", {{"proxy", address_}});
        req.keep_alive(false);
        return respond(req, http::status::bad_request, "X-Forwarded-For from a trusted proxy is not an address list\n");
    }
    if (websocket::is_upgrade(req)) {
        if (req.target() != "/v1/ws" || gw_->draining()) return respond(req, http::status::not_found, "not found\n");
        with_stream([](auto& s) { beast::get_lowest_layer(s).expires_never(); });
        // Upgraded: the WebSocket caps take over from the pre-upgrade one.
        if (http_slot_) {
            http_slot_ = false;
            gw_->put_http_slot();
        }
        if (auto* tls = std::get_if<tls_stream>(&stream_))
            std::make_shared<WsSession>(std::move(*tls), tls_, gw_, *client)->run(std::move(req));
        else
            std::make_shared<WsSession>(std::get<beast::tcp_stream>(stream_).release_socket(), gw_, *client)
                ->run(std::move(req));
        return;
    }
    auto target = std::string(req.target());
    if (req.method() == http::verb::get && target == "/healthz") return respond(req, http::status::ok, "ok\n");
    if (req.method() == http::verb::get && target == "/metrics" && serves_metrics()) return metrics(req);
    if (req.method() == http::verb::get && target == "/readyz") return readyz(std::move(req));
    if (gw_->faults().enabled() && target == "/lab/fault" && req.method() == http::verb::post && from_loopback(*client)) {
        std::string spec = req.body();
        while (!spec.empty() && (spec.back() == '\n' || spec.back() == '\r' || spec.back() == ' ')) spec.pop_back();
        if (spec == "off") {
            gw_->faults().clear();
            return respond(req, http::status::ok, "cleared\n");
        }
        if (auto e = gw_->faults().arm(spec)) return respond(req, http::status::bad_request, *e + "\n");
        log_warn("fault_armed", {{"spec", spec}});
        return respond(req, http::status::ok, "armed\n");
    }
    respond(req, http::status::not_found, "not found\n");
}

// The backend API's listener: its routes only (no WebSocket, no lab endpoint).
void HttpSession::on_api_read(beast::error_code ec) {
    if (ec == http::error::body_limit) {
        const auto& h = parser_->get();
        return api_respond(h.version(), false, BackendApi::too_large());
    }
    if (ec) return fail(ec, "api_read");
    auto req = parser_->release();
    if (req.method() == http::verb::get && req.target() == "/metrics" && serves_metrics()) {
        // --metrics-listen api: the backend's network scrapes it here.
        auto res = std::make_shared<http::response<http::string_body>>(http::status::ok, req.version());
        auto& p = gw_->pool();
        gw_->metrics().db_timeouts = p.watchdog().fired();
        res->set(http::field::server, "imserver");
        res->set(http::field::content_type, "text/plain; version=0.0.4");
        res->keep_alive(req.keep_alive());
        res->body() = gw_->metrics().render(p.in_use(), p.size(), p.queued());
        res->prepare_payload();
        return write(std::move(res));
    }
    auto client = client_of(req);
    if (!client) {
        log_warn("forwarded_for_refused", {{"proxy", address_}});
        return api_respond(req.version(), false, BackendApi::bad_forwarded_for());
    }
    const unsigned version = req.version();
    const bool keep_alive = req.keep_alive();
    auto exec = with_stream([](auto& s) { return s.get_executor(); });
    api_->handle(std::move(req), std::move(*client), [self = shared_from_this(), exec, version, keep_alive](ApiReply r) {
        net::post(exec, [self, version, keep_alive, r = std::move(r)]() mutable {
            self->api_respond(version, keep_alive, std::move(r));
        });
    });
}

void HttpSession::api_respond(unsigned version, bool keep_alive, ApiReply reply) {
    if (reply.stream) return api_stream(version, keep_alive, std::move(reply));
    auto res = std::make_shared<http::response<http::string_body>>(reply.status, version);
    res->set(http::field::server, "imserver");
    res->set(http::field::content_type, "application/json");
    res->set(http::field::cache_control, "no-store");
    for (auto& [field, value] : reply.headers) res->set(field, value);
    res->keep_alive(keep_alive);
    res->body() = std::move(reply.body);
    res->prepare_payload();
    write(std::move(res));
}

// ---------------------------------------------------------------- streamed API answers

struct HttpSession::ApiStreaming {
    std::shared_ptr<ApiStream> source;
    http::response<http::buffer_body> res;
    std::optional<http::response_serializer<http::buffer_body>> sr;
    std::string out;   // the chunk being written
    bool last = false; // `out` is the last one (the final chunk follows)
};

// The header and the first chunk, then each next chunk read on a database
// worker only after the one before was written: however slow the reader,
// the session holds one chunk and no database connection while it writes.
void HttpSession::api_stream(unsigned version, bool keep_alive, ApiReply reply) {
    auto st = std::make_shared<ApiStreaming>();
    st->source = std::move(reply.stream);
    st->res = http::response<http::buffer_body>(reply.status, version);
    st->res.set(http::field::server, "imserver");
    st->res.set(http::field::cache_control, "no-store");
    for (auto& [field, value] : reply.headers) st->res.set(field, value);
    st->res.keep_alive(keep_alive);
    st->res.chunked(true);
    st->res.body().data = nullptr;
    st->res.body().more = true;
    st->sr.emplace(st->res);
    st->out = std::move(reply.body);
    st->last = st->out.empty();
    api_stream_write(std::move(st));
}

void HttpSession::api_stream_write(std::shared_ptr<ApiStreaming> st) {
    auto self = shared_from_this();
    auto& body = st->res.body();
    body.data = st->out.empty() ? nullptr : st->out.data();
    body.size = st->out.size();
    body.more = !st->last;
    with_stream([&](auto& s) {
        beast::get_lowest_layer(s).expires_after(std::chrono::seconds(30));
        http::async_write(s, *st->sr, [self, st](beast::error_code ec, std::size_t) {
            if (ec == http::error::need_buffer) ec = {};
            if (ec) return fail(ec, "api_stream_write");
            if (st->sr->is_done()) {
                if (!st->res.keep_alive()) return self->close();
                return self->do_read();
            }
            st->out.clear();
            auto exec = self->with_stream([](auto& s) { return s.get_executor(); });
            const bool ok = self->gw_->pool().submit([self, st, exec](pqxx::connection_base* c) {
                std::string chunk;
                bool failed = !c;
                if (c) {
                    try {
                        chunk = st->source->next(*c);
                    } catch (const std::exception& e) {
                        log_warn("api_stream_failed", {{"err", e.what()}});
                        failed = true;
                    }
                }
                net::post(exec, [self, st, failed, chunk = std::move(chunk)]() mutable {
                    // The header is out: a failure can only cut the answer
                    // short (no final chunk; the reader sees it incomplete).
                    if (failed) return self->close();
                    st->last = chunk.empty();
                    st->out = std::move(chunk);
                    self->api_stream_write(st);
                });
            });
            if (!ok) self->close();
        });
    });
}

// The lab endpoint answers only local callers, whatever --listen says (and
// not a remote client that a proxy on this host forwards).
bool HttpSession::from_loopback(const ClientAddress& client) const {
    return is_loopback_address(address_) && is_loopback_address(client.address);
}

// At most one database check a second (Gateway::readiness): /readyz is
// unauthenticated, and each check would take a database worker.
void HttpSession::readyz(http::request<http::string_body> req) {
    auto self = shared_from_this();
    auto shared_req = std::make_shared<http::request<http::string_body>>(std::move(req));
    auto exec = with_stream([](auto& s) { return s.get_executor(); });
    gw_->readiness([self, shared_req, exec](bool ready, const char* why) {
        std::string body = std::string(why) + "\n";
        net::post(exec, [self, shared_req, ready, body = std::move(body)]() mutable {
            self->respond(*shared_req, ready ? http::status::ok : http::status::service_unavailable, std::move(body));
        });
    });
}

void HttpSession::respond(const http::request<http::string_body>& req, http::status status, std::string body,
                          const char* type) {
    auto res = std::make_shared<http::response<http::string_body>>(status, req.version());
    res->set(http::field::server, "imserver");
    res->set(http::field::content_type, type);
    res->keep_alive(req.keep_alive());
    res->body() = std::move(body);
    res->prepare_payload();
    write(std::move(res));
}

void HttpSession::write(std::shared_ptr<http::response<http::string_body>> res) {
    with_stream([&](auto& s) {
        http::async_write(s, *res, [self = shared_from_this(), res](beast::error_code ec, std::size_t) {
            if (ec) return fail(ec, "http_write");
            if (!res->keep_alive()) return self->close();
            self->do_read();
        });
    });
}

void HttpSession::close() {
    if (auto* tls = std::get_if<tls_stream>(&stream_)) {
        beast::get_lowest_layer(*tls).expires_after(std::chrono::seconds(5));
        tls->async_shutdown([self = shared_from_this()](beast::error_code) {});
        return;
    }
    beast::error_code ignored;
    auto& plain = std::get<beast::tcp_stream>(stream_);
    plain.socket().shutdown(tcp::socket::shutdown_send, ignored);
    if (!api_ && !drain_on_close_) return;
    // The API may close with a request body unread (413): read it away
    // until the client closes (at most 5 s), so the close sends no RST that
    // could destroy the answer before the client read it.
    plain.expires_after(std::chrono::seconds(5));
    auto sink = std::make_shared<std::array<char, 4096>>();
    auto drain = std::make_shared<std::function<void(beast::error_code, std::size_t)>>();
    *drain = [self = shared_from_this(), sink, drain](beast::error_code ec, std::size_t) {
        if (ec) {
            *drain = nullptr; // break the cycle
            return;
        }
        std::get<beast::tcp_stream>(self->stream_).async_read_some(net::buffer(*sink), *drain);
    };
    (*drain)({}, 0);
}

} // namespace im
