// WsStream over TLS (see ws_stream.hpp).
#include "net/ws_stream_impl.hpp"

namespace im {

std::unique_ptr<WsStream> make_ws_stream(tls_stream&& stream) {
    return std::make_unique<WsStreamOver<tls_stream>>(std::move(stream));
}

} // namespace im
