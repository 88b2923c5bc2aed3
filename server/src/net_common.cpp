#include "net_common.hpp"

#include "log.hpp"

namespace im {

void fail(beast::error_code ec, const char* what) {
    if (ec == net::error::operation_aborted || ec == websocket::error::closed || ec == http::error::end_of_stream ||
        ec == net::error::eof || ec == beast::error::timeout || ec == net::error::connection_reset)
        return;
    log_info("conn_error", {{"op", what}, {"err", ec.message()}});
}

} // namespace im
