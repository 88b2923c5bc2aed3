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
#include "store/attachments.hpp"

#include <memory>
#include <optional>
#include <functional>
#include <string>
#include <string_view>
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
    std::optional<ClientAddress> client_of(const http::request_header<>& req) const;
    void on_handshake(beast::error_code ec, std::size_t used);
    void do_read();
    /// The header read: the attachment routes take the request from here
    /// (their bodies are streamed); every other request's body is read whole.
    void on_header(beast::error_code ec, std::size_t);
    void on_read(beast::error_code ec, std::size_t);
    bool from_loopback(const ClientAddress& client) const;
    bool serves_metrics() const;
    void metrics(const http::request<http::string_body>& req);
    void readyz(http::request<http::string_body> req);
    void on_api_read(beast::error_code ec);
    void api_respond(unsigned version, bool keep_alive, ApiReply reply);
    /// A streamed API answer (ApiReply::stream): chunked, one chunk in memory.
    struct ApiStreaming;
    void api_stream(unsigned version, bool keep_alive, ApiReply reply);
    void api_stream_write(std::shared_ptr<ApiStreaming> st);
    void respond(const http::request<http::string_body>& req, http::status status, std::string body,
                 const char* type = "text/plain");
    void write(std::shared_ptr<http::response<http::string_body>> res);
    void close();

    // ---- the attachment routes (http_attachments.cpp; server.md "Attachments")
    struct Transfer;
    static bool attachment_target(std::string_view target);
    void attachments();                                    // a request on those paths, its header in head_
    void att_route(http::request<http::string_body> req);  // POST /v1/uploads and the GETs, body read whole
    void att_put();                                        // PUT /v1/uploads/{id}?offset=N, body streamed
    void att_put_read();
    void on_att_put_read(beast::error_code ec);
    void att_put_flush();
    void att_download(std::string att, std::string range, std::string if_none_match, std::string if_range);
    void att_send_piece();  // a download's body: att_read_ahead and att_write_next in turn
    void att_read_ahead();
    void att_write_next();
    /// Runs `work(connection, user)` on a database worker once the request's
    /// bearer credentials name a user; its returned callable runs on this
    /// connection's strand. A refusal answers the request.
    void att_authorized(std::function<std::function<void()>(pqxx::connection_base&, const std::string&)> work);
    /// att_authorized on the backend API's listener (an API key).
    void att_api_authorized(std::function<std::function<void()>(pqxx::connection_base&, const std::string&)> work);
    void att_json(http::status status, std::string body);
    /// The attachment routes' database workers (--attachment-db-pool, else the gateway's).
    DbPool& att_pool();
    /// The backend API's log line of an attachment request (as its other
    /// routes log theirs), once, with the answer's status.
    void att_api_logged(unsigned status);
    void att_failed(const AttFailure& f);
    template <class F>
    decltype(auto) with_stream(F&& f) { return std::visit(std::forward<F>(f), stream_); }

    std::shared_ptr<ssl::context> tls_;   // outlives stream_: this connection's context, even after a reload
    std::variant<beast::tcp_stream, tls_stream> stream_;
    beast::flat_buffer buffer_;
    std::optional<http::request_parser<http::empty_body>> head_; // the header, before the route chooses a body
    std::optional<http::request_parser<http::string_body>> parser_;
    std::shared_ptr<Transfer> att_;  // the attachment request in progress
    bool drain_on_close_ = false;    // an answer before the request's whole body was read
    std::shared_ptr<Gateway> gw_;
    BackendApi* api_;
    bool metrics_only_;
    bool http_slot_;
    std::string address_;  // the connection's peer (TCP)
    bool trusted_ = false; // the peer is in --trusted-proxies (not on the metrics listener)
    IpAddress hop_;        // where the connection comes from: the peer, or its PROXY header's source
};

} // namespace im
