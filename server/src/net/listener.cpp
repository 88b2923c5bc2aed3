#include "net/listener.hpp"

#include "net/gateway.hpp"
#include "net/http_session.hpp"
#include "core/log.hpp"

#include <algorithm>

namespace im {

Listener::Listener(net::io_context& ioc, std::shared_ptr<Gateway> gw, BackendApi* api, bool metrics_only)
    : ioc_(ioc), gw_(std::move(gw)), api_(api), metrics_only_(metrics_only), acceptor_(net::make_strand(ioc)), backoff_timer_(acceptor_.get_executor()) {}

unsigned short Listener::run(const net::ip::address& addr, unsigned short port) {
    tcp::endpoint ep{addr, port};
    acceptor_.open(ep.protocol());
    acceptor_.set_option(net::socket_base::reuse_address(true));
    acceptor_.bind(ep);
    acceptor_.listen(net::socket_base::max_listen_connections);
    do_accept();
    return acceptor_.local_endpoint().port();
}

void Listener::close() {
    closed_ = true;
    backoff_timer_.cancel();
    beast::error_code ignored;
    acceptor_.close(ignored);
}

void Listener::do_accept() {
    acceptor_.async_accept(net::make_strand(ioc_), beast::bind_front_handler(&Listener::on_accept, shared_from_this()));
}

namespace {

// Failures that say "no descriptor or memory now": accepting again at once
// would fail again at once (a busy loop), so accepting pauses a while.
bool out_of_resources(const beast::error_code& ec) {
    return ec == net::error::no_descriptors || ec == net::error::no_buffer_space || ec == net::error::no_memory ||
           ec == beast::error_code(ENFILE, beast::system_category());
}

} // namespace

void Listener::on_accept(beast::error_code ec, tcp::socket socket) {
    if (ec) {
        if (ec != net::error::operation_aborted) fail(ec, "accept");
        if (!acceptor_.is_open() || closed_) return;
        if (out_of_resources(ec)) {
            ++gw_->metrics().accept_errors;
            const auto first = std::chrono::milliseconds(gw_->config().accept_backoff_ms);
            backoff_ = backoff_.count() == 0 ? first : std::min(backoff_ * 2, std::chrono::milliseconds(2000));
            log_warn("accept_paused", {{"err", ec.message()}, {"ms", static_cast<long>(backoff_.count())}});
            backoff_timer_.expires_after(backoff_);
            backoff_timer_.async_wait([self = shared_from_this()](beast::error_code wec) {
                if (!wec && !self->closed_) self->do_accept();
            });
            return;
        }
    } else {
        backoff_ = std::chrono::milliseconds(0);
        // A send puts two small frames on the sender's socket (its own pushed
        // event and the reply): without this the second waits for the
        // client's delayed ACK.
        beast::error_code ignored;
        socket.set_option(tcp::no_delay(true), ignored);
        const bool gateway = !api_ && !metrics_only_;
        if (gateway && !gw_->take_http_slot()) {
            // Over --max-http-connections: closed before any byte is read.
            socket.set_option(net::socket_base::linger(true, 0), ignored); // RST: nothing lingers in TIME_WAIT
            socket.close(ignored);
        } else {
            std::make_shared<HttpSession>(std::move(socket), gw_, api_, metrics_only_, gateway)->run();
        }
    }
    if (!closed_) do_accept();
}

} // namespace im
