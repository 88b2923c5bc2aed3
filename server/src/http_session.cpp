#include "http_session.hpp"

#include "gateway.hpp"
#include "log.hpp"
#include "migrations.hpp"
#include "ws_session.hpp"

#include <chrono>

namespace im {

HttpSession::HttpSession(tcp::socket&& socket, std::shared_ptr<Gateway> gw)
    : stream_(std::move(socket)), gw_(std::move(gw)) {}

void HttpSession::run() {
    net::dispatch(stream_.get_executor(), beast::bind_front_handler(&HttpSession::do_read, shared_from_this()));
}

void HttpSession::do_read() {
    parser_.emplace();
    parser_->body_limit(8 * 1024);
    stream_.expires_after(std::chrono::seconds(30));
    http::async_read(stream_, buffer_, *parser_, beast::bind_front_handler(&HttpSession::on_read, shared_from_this()));
}

void HttpSession::on_read(beast::error_code ec, std::size_t) {
    if (ec) return fail(ec, "http_read");
    auto req = parser_->release();
    if (websocket::is_upgrade(req)) {
        if (req.target() != "/v1/ws" || gw_->draining()) return respond(req, http::status::not_found, "not found\n");
        stream_.expires_never();
        std::make_shared<WsSession>(stream_.release_socket(), gw_)->run(std::move(req));
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

// The lab endpoint answers only local callers, whatever --listen says.
bool HttpSession::from_loopback() {
    beast::error_code ec;
    auto ep = stream_.socket().remote_endpoint(ec);
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
        net::post(self->stream_.get_executor(), [self, shared_req, ready, bus_up] {
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
    http::async_write(stream_, *res, [self = shared_from_this(), res](beast::error_code ec, std::size_t) {
        if (ec) return fail(ec, "http_write");
        if (!res->keep_alive()) {
            beast::error_code ignored;
            self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
            return;
        }
        self->do_read();
    });
}

} // namespace im
