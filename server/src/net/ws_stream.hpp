// The WebSocket stream under one connection, behind a small interface: the
// session (ws_session.cpp) is written and compiled once, and Beast's
// websocket operations once per transport, each in a file of its own
// (ws_stream_plain.cpp, ws_stream_tls.cpp, both from ws_stream_impl.hpp).
// Those operations are the heaviest code in the server to compile (a
// session over a std::variant of both streams took 120 s at -O2 and 430 s
// under ASan+UBSan, in one file); split, two cores build them side by side.
#pragma once

#include "net/net_common.hpp"
#include "net/tls.hpp"

#include <cstddef>
#include <functional>
#include <memory>

namespace im {

class WsStream {
public:
    // Completion handlers run on the connection's strand (get_executor()).
    // Plain std::function: Boost 1.81's any_completion_handler cannot ride
    // Beast's websocket operations (its executor refuses blocking.never).
    using Done = std::function<void(beast::error_code)>;
    using Transferred = std::function<void(beast::error_code, std::size_t)>;

    virtual ~WsStream() = default;

    /// The connection's strand.
    virtual net::any_io_executor get_executor() = 0;
    /// The TCP socket under it all (the peer's address; a hard close).
    virtual tcp::socket& socket() = 0;
    /// The session's options, set once before the handshake: the largest
    /// message read, and what to call on every control frame (ping, pong,
    /// close) received.
    virtual void configure(std::size_t read_message_max, std::function<void()> on_control) = 0;

    virtual void async_accept(const http::request<http::string_body>& upgrade, Done done) = 0;
    virtual void async_read(beast::flat_buffer& buffer, Transferred done) = 0;
    /// Whether the message just read was text.
    virtual bool got_text() const = 0;
    /// Writes one text message.
    virtual void async_write_text(net::const_buffer text, Transferred done) = 0;
    virtual void async_ping(Done done) = 0;
    virtual void async_close(const websocket::close_reason& reason, Done done) = 0;
};

std::unique_ptr<WsStream> make_ws_stream(tcp::socket&& socket);
/// Over TLS: the stream after its handshake.
std::unique_ptr<WsStream> make_ws_stream(tls_stream&& stream);

} // namespace im
