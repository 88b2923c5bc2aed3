#include "listener.hpp"

#include "gateway.hpp"
#include "http_session.hpp"

namespace im {

Listener::Listener(net::io_context& ioc, std::shared_ptr<Gateway> gw)
    : ioc_(ioc), gw_(std::move(gw)), acceptor_(net::make_strand(ioc)) {}

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
    beast::error_code ignored;
    acceptor_.close(ignored);
}

void Listener::do_accept() {
    acceptor_.async_accept(net::make_strand(ioc_), beast::bind_front_handler(&Listener::on_accept, shared_from_this()));
}

void Listener::on_accept(beast::error_code ec, tcp::socket socket) {
    if (ec) {
        if (ec != net::error::operation_aborted) fail(ec, "accept");
        if (!acceptor_.is_open()) return;
    } else {
        std::make_shared<HttpSession>(std::move(socket), gw_)->run();
    }
    if (!closed_) do_accept();
}

} // namespace im
