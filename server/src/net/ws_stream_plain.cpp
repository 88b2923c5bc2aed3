// WsStream over plain TCP (see ws_stream.hpp).
#include "net/ws_stream_impl.hpp"

namespace im {

std::unique_ptr<WsStream> make_ws_stream(tcp::socket&& socket) {
    return std::make_unique<WsStreamOver<beast::tcp_stream>>(beast::tcp_stream(std::move(socket)));
}

} // namespace im
