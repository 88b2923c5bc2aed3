// WsStream over a Beast websocket::stream<Next>: included only by
// ws_stream_plain.cpp and ws_stream_tls.cpp, one transport each.
#pragma once

#include "net/ws_stream.hpp"

#include <chrono>
#include <utility>

namespace im {

template <class Next>
class WsStreamOver final : public WsStream {
public:
    explicit WsStreamOver(Next&& next) : ws_(std::move(next)) {}

    net::any_io_executor get_executor() override { return ws_.get_executor(); }
    tcp::socket& socket() override { return beast::get_lowest_layer(ws_).socket(); }

    void configure(std::size_t read_message_max, std::function<void()> on_control) override {
        // Beast times the handshake and the close; liveness is the session's
        // (WsSession::tick): Beast's own idle timer is re-armed only when a
        // read starts, so a quiet peer that answers every ping would still be cut.
        ws_.set_option(websocket::stream_base::timeout{std::chrono::seconds(30), websocket::stream_base::none(), false});
        ws_.control_callback([f = std::move(on_control)](websocket::frame_type, beast::string_view) { f(); });
        ws_.read_message_max(read_message_max);
        // One message, one frame (<= MAX_FRAME anyway). Beast would otherwise
        // cut a message into frames at its write buffer size, anywhere in a
        // UTF-8 sequence; Qt WebSockets (the SDK) checks each text frame on
        // its own and closes with 1007 on a split CJK character or emoji.
        ws_.auto_fragment(false);
        ws_.set_option(websocket::stream_base::decorator(
            [](websocket::response_type& res) { res.set(http::field::server, "imserver"); }));
    }

    void async_accept(const http::request<http::string_body>& upgrade, Done done) override {
        ws_.async_accept(upgrade, std::move(done));
    }
    void async_read(beast::flat_buffer& buffer, Transferred done) override {
        ws_.async_read(buffer, std::move(done));
    }
    bool got_text() const override { return ws_.got_text(); }
    void async_write_text(net::const_buffer text, Transferred done) override {
        ws_.text(true);
        ws_.async_write(text, std::move(done));
    }
    void async_ping(Done done) override { ws_.async_ping({}, std::move(done)); }
    void async_close(const websocket::close_reason& reason, Done done) override {
        ws_.async_close(reason, std::move(done));
    }

private:
    // No permessage-deflate: the server never offers it, so its code is left
    // out of every operation.
    websocket::stream<Next, false> ws_;
};

} // namespace im
