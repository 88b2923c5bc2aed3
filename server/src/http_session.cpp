#include "http_session.hpp"

#include "backend_api.hpp"
#include "gateway.hpp"
#include "log.hpp"
#include "migrations.hpp"
#include "ws_session.hpp"

#include <array>
#include <chrono>
#include <functional>

namespace im {

namespace {

std::variant<beast::tcp_stream, tls_stream> make_stream(tcp::socket&& socket, ssl::context* tls) {
    if (tls) return std::variant<beast::tcp_stream, tls_stream>(std::in_place_type<tls_stream>, std::move(socket), *tls);
    return std::variant<beast::tcp_stream, tls_stream>(std::in_place_type<beast::tcp_stream>, std::move(socket));
}

} // namespace

HttpSession::HttpSession(tcp::socket&& socket, std::shared_ptr<Gateway> gw, BackendApi* api)
    : tls_(gw->tls() ? gw->tls()->current() : nullptr), stream_(make_stream(std::move(socket), tls_.get())),
      gw_(std::move(gw)), api_(api) {
    beast::error_code ec;
    auto ep = with_stream([&](auto& s) { return beast::get_lowest_layer(s).socket().remote_endpoint(ec); });
    if (!ec) address_ = ep.address().to_string();
}

void HttpSession::run() {
    auto exec = with_stream([](auto& s) { return s.get_executor(); });
    net::dispatch(exec, [self = shared_from_this()] {
        if (auto* tls = std::get_if<tls_stream>(&self->stream_)) {
            beast::get_lowest_layer(*tls).expires_after(std::chrono::seconds(30));
            tls->async_handshake(ssl::stream_base::server, self->buffer_.data(),
                                 beast::bind_front_handler(&HttpSession::on_handshake, self));
            return;
        }
        self->do_read();
    });
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
    parser_.emplace();
    parser_->body_limit(api_ ? api_max_body_bytes : 8 * 1024);
    with_stream([this](auto& s) {
        beast::get_lowest_layer(s).expires_after(std::chrono::seconds(30));
        http::async_read(s, buffer_, *parser_, beast::bind_front_handler(&HttpSession::on_read, shared_from_this()));
    });
}

void HttpSession::on_read(beast::error_code ec, std::size_t) {
    if (api_) return on_api_read(ec);
    if (ec) return fail(ec, "http_read");
    auto req = parser_->release();
    if (websocket::is_upgrade(req)) {
        if (req.target() != "/v1/ws" || gw_->draining()) return respond(req, http::status::not_found, "not found\n");
        with_stream([](auto& s) { beast::get_lowest_layer(s).expires_never(); });
        if (auto* tls = std::get_if<tls_stream>(&stream_))
            std::make_shared<WsSession>(std::move(*tls), tls_, gw_)->run(std::move(req));
        else
            std::make_shared<WsSession>(std::get<beast::tcp_stream>(stream_).release_socket(), gw_)->run(std::move(req));
        return;
    }
    auto target = std::string(req.target());
    if (req.method() == http::verb::get && target == "/healthz") return respond(req, http::status::ok, "ok\n");
    if (req.method() == http::verb::get && target == "/metrics") {
        auto& p = gw_->pool();
        gw_->metrics().db_timeouts = p.watchdog().fired();
        return respond(req, http::status::ok, gw_->metrics().render(p.in_use(), p.size(), p.queued()),
                       "text/plain; version=0.0.4");
    }
    if (req.method() == http::verb::get && target == "/readyz") return readyz(std::move(req));
    if (gw_->faults().enabled() && target == "/lab/fault" && req.method() == http::verb::post && from_loopback()) {
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
    const unsigned version = req.version();
    const bool keep_alive = req.keep_alive();
    auto exec = with_stream([](auto& s) { return s.get_executor(); });
    api_->handle(std::move(req), address_, [self = shared_from_this(), exec, version, keep_alive](ApiReply r) {
        net::post(exec, [self, version, keep_alive, r = std::move(r)]() mutable {
            self->api_respond(version, keep_alive, std::move(r));
        });
    });
}

void HttpSession::api_respond(unsigned version, bool keep_alive, ApiReply reply) {
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

// The lab endpoint answers only local callers, whatever --listen says.
bool HttpSession::from_loopback() {
    beast::error_code ec;
    auto ep = with_stream([&](auto& s) { return beast::get_lowest_layer(s).socket().remote_endpoint(ec); });
    return !ec && ep.address().is_loopback();
}

void HttpSession::readyz(http::request<http::string_body> req) {
    auto self = shared_from_this();
    auto shared_req = std::make_shared<http::request<http::string_body>>(std::move(req));
    bool ok = gw_->pool().submit([self, shared_req](pqxx::connection_base* c) {
        bool ready = false;
        if (c) {
            try {
                ready = self->gw_->api().store.ping(*c) && migrations_current(*c) &&
                        (self->gw_->config().lab.no_unique_index || self->gw_->api().store.idempotency_index_present(*c));
            } catch (const std::exception&) {
                ready = false;
            }
        }
        // Without its bus a gateway cannot push other gateways' commits nor
        // publish its own (sends answer UNAVAILABLE): not ready either.
        const auto* bus = self->gw_->api().bus;
        const bool bus_up = !bus || bus->connected();
        auto exec = self->with_stream([](auto& s) { return s.get_executor(); });
        net::post(exec, [self, shared_req, ready, bus_up] {
            if (ready && bus_up) self->respond(*shared_req, http::status::ok, "ready\n");
            else self->respond(*shared_req, http::status::service_unavailable,
                               ready ? "notification bus unavailable\n" : "database unavailable\n");
        });
    });
    if (!ok) respond(*shared_req, http::status::service_unavailable, "busy\n");
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
    if (!api_) return;
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
