// libFuzzer target: the server's request parser (server/src/core/protocol.cpp),
// the first code every WebSocket text frame reaches. Besides crashes and
// sanitizer reports it checks what the contract promises for any input: a
// rejected frame gets a clear error code and its error reply is valid JSON
// that echoes a readable rid.
#include "core/protocol.hpp"

#include <boost/json.hpp>

#include <cstdint>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    std::string_view frame(reinterpret_cast<const char*>(data), size);
    im::Parsed p = im::parse_request(frame);
    if (auto* e = std::get_if<im::Error>(&p.body)) {
        if (im::code_name(e->code).empty() || e->msg.empty()) std::abort();
        std::string reply = im::encode_error(*e, p.rid);
        boost::json::error_code ec;
        auto v = boost::json::parse(reply, ec);
        if (ec || !v.is_object()) std::abort();
        auto* rid = v.as_object().if_contains("rid");
        if (p.rid && (!rid || !rid->is_string() || rid->get_string() != *p.rid)) std::abort();
    } else {
        if (im::request_name(std::get<im::Request>(p.body)).empty()) std::abort();
    }
    return 0;
}
