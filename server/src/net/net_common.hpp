// Names and helpers shared by the network layer's files (listener,
// http_session, ws_session, gateway).
#pragma once

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>

#include <string>

namespace im {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using tcp = net::ip::tcp;

/// Logs a failed socket operation, except the ordinary ends of a connection.
void fail(beast::error_code ec, const char* what);

/// Whether a peer's address (as the listeners print it) is a loopback one,
/// IPv4-mapped IPv6 included: the callers the failure limits exempt.
bool is_loopback_address(const std::string& address);

} // namespace im
