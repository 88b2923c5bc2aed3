// One HTTP connection, plain or TLS (after its handshake): /healthz, /readyz,
// /metrics, the lab endpoint (only with --enable-faults), and the upgrade to
// /v1/ws, which hands the stream on to a WsSession. On the backend API's
// listener (`api` set) it serves that API and nothing else.
//
// From a peer in --trusted-proxies (gateway and API listeners) the
// connection may start with a PROXY protocol v2 header, read before the TLS
// handshake and the first request, and X-Forwarded-For is read on each
// request: they name the client (client_address.hpp). From other peers
// neither is looked at.
#pragma once

#include "net/client_address.hpp"
#include "net/net_common.hpp"
#include "net/tls.hpp"

#include <memory>
#include <optional>
#include <string>
#include <variant>

namespace im {

class BackendApi;
class Gateway;
struct ApiReply;

class HttpSession : public std::enable_shared_from_this<HttpSession> {
public:
    /// `metrics_only`: the --metrics-listen HOST:PORT listener (GET /metrics
    /// and nothing else). A session of --listen holds one of the gateway's
    /// pre-upgrade slots (`http_slot`) until it upgrades or ends.
    HttpSession(tcp::socket&& socket, std::shared_ptr<Gateway> gw, BackendApi* api = nullptr, bool metrics_only = false,
                bool http_slot = false);
    ~HttpSession();
    void run();

private:
    void read_proxy_header();
    void on_proxy_bytes(beast::error_code ec, std::size_t n);
    void start(); // the TLS handshake or the first read
    /// The client of `req`; nullopt when a trusted proxy's X-Forwarded-For
    /// has no address where one is needed (answered 400).
    std::optional<ClientAddress> client_of(const http::request<http::string_body>& req) const;
    void on_handshake(beast::error_code ec, std::size_t used);
    void do_read();
    void on_read(beast::error_code ec, std::size_t);
    bool from_loopback(const ClientAddress& client) const;
    bool serves_metrics() const;
    void metrics(const http::request<http::string_body>& req);
    void readyz(http::request<http::string_body> req);
    void on_api_read(beast::error_code ec);
    void api_respond(unsigned version, bool keep_alive, ApiReply reply);
    void respond(const http::request<http::string_body>& req, http::status status, std::string body,
                 const char* type = "text/plain");
    void write(std::shared_ptr<http::response<http::string_body>> res);
    void close();

    template <class F>
    decltype(auto) with_stream(F&& f) { return std::visit(std::forward<F>(f), stream_); }

    std::shared_ptr<ssl::context> tls_;   // outlives stream_: this connection's context, even after a reload
    std::variant<beast::tcp_stream, tls_stream> stream_;
    beast::flat_buffer buffer_;
    std::optional<http::request_parser<http::string_body>> parser_;
    std::shared_ptr<Gateway> gw_;
    BackendApi* api_;
    bool metrics_only_;
    bool http_slot_;
    std::string address_;  // the connection's peer (TCP)
    bool trusted_ = false; // the peer is in --trusted-proxies (not on the metrics listener)
    IpAddress hop_;        // where the connection comes from: the peer, or its PROXY header's source
};

} // namespace im
