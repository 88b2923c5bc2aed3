// Accepts TCP connections and hands each to an HttpSession: a gateway's
// (WebSocket, /healthz ...), with `api` the backend API's, or with
// `metrics_only` the metrics listener's. The gateway's connections before
// their upgrade are capped (--max-http-connections): one over it is closed
// at once.
#pragma once

#include "net/net_common.hpp"

#include <chrono>
#include <memory>

namespace im {

class BackendApi;
class Gateway;

class Listener : public std::enable_shared_from_this<Listener> {
public:
    /// `metrics_only`: the --metrics-listen HOST:PORT listener.
    Listener(net::io_context& ioc, std::shared_ptr<Gateway> gw, BackendApi* api = nullptr, bool metrics_only = false);

    /// Binds and starts accepting; returns the bound port.
    unsigned short run(const net::ip::address& addr, unsigned short port);
    /// Stops accepting. Call on executor().
    void close();
    net::any_io_executor executor() { return acceptor_.get_executor(); }

private:
    void do_accept();
    void on_accept(beast::error_code ec, tcp::socket socket);

    net::io_context& ioc_;
    std::shared_ptr<Gateway> gw_;
    BackendApi* api_;
    bool metrics_only_;
    tcp::acceptor acceptor_;
    net::steady_timer backoff_timer_;
    std::chrono::milliseconds backoff_{0};
    bool closed_ = false;
};

} // namespace im
