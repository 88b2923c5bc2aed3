#include "net/net_common.hpp"

#include "core/log.hpp"

namespace im {

void fail(beast::error_code ec, const char* what) {
    if (ec == net::error::operation_aborted || ec == websocket::error::closed || ec == http::error::end_of_stream ||
        ec == net::error::eof || ec == beast::error::timeout || ec == net::error::connection_reset)
        return;
    log_info("conn_error", {{"op", what}, {"err", ec.message()}});
}

bool is_loopback_address(const std::string& address) {
    beast::error_code ec;
    auto a = net::ip::make_address(address, ec);
    return !ec && (a.is_loopback() || (a.is_v6() && a.to_v6().is_v4_mapped() &&
                                       net::ip::make_address_v4(net::ip::v4_mapped, a.to_v6()).is_loopback()));
}

} // namespace im
