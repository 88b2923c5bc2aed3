// Names and helpers shared by the network layer's files (listener,
// http_session, ws_session, gateway).
#pragma once

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>

namespace im {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using tcp = net::ip::tcp;

/// Logs a failed socket operation, except the ordinary ends of a connection.
void fail(beast::error_code ec, const char* what);

} // namespace im
