// One plain HTTP connection: /healthz, /readyz, /metrics, the lab endpoint
// (only with --enable-faults), and the upgrade to /v1/ws.
#pragma once

#include "net_common.hpp"

#include <memory>
#include <optional>
#include <string>

namespace im {

class Gateway;

class HttpSession : public std::enable_shared_from_this<HttpSession> {
public:
    HttpSession(tcp::socket&& socket, std::shared_ptr<Gateway> gw);
    void run();

private:
    void do_read();
    void on_read(beast::error_code ec, std::size_t);
    bool from_loopback();
    void readyz(http::request<http::string_body> req);
    void respond(const http::request<http::string_body>& req, http::status status, std::string body,
                 const char* type = "text/plain");

    beast::tcp_stream stream_;
    beast::flat_buffer buffer_;
    std::optional<http::request_parser<http::string_body>> parser_;
    std::shared_ptr<Gateway> gw_;
};

} // namespace im
