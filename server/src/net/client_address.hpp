// Who the client is behind a trusted proxy (--trusted-proxies, server.md
// "Scaling out", docs/operations.md "Behind a proxy"): the PROXY protocol v2
// header a proxy writes before the connection's first byte (HAProxy
// `send-proxy-v2`), and X-Forwarded-For on an HTTP request. Both are read
// only from a peer in --trusted-proxies; from any other peer neither is
// looked at. Pure functions: http_session.cpp does the reading.
#pragma once

#include "core/address.hpp"

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace im {

/// The 12 bytes every PROXY v2 header starts with.
inline constexpr std::string_view proxy_v2_signature{"\r\n\r\n\0\r\nQUIT\n", 12};
/// The longest header read (16 fixed bytes + addresses + TLVs); a longer one
/// is refused as malformed. HAProxy's headers with its usual TLVs are far shorter.
inline constexpr std::size_t proxy_v2_max_bytes = 16 + 2048;

struct ProxyHeader {
    enum class Status {
        need_more, // a prefix of a header: read at least `length` bytes in all
        absent,    // the bytes do not start with the signature: no header
        ok,        // a whole header of `length` bytes
        malformed, // starts like one but is not a valid v2 header (`error` says why)
    };
    Status status = Status::need_more;
    std::size_t length = 0;
    /// ok: the client's address of a PROXY command over TCP. Empty for LOCAL
    /// (the proxy's own connection, e.g. its health check) and for PROXY with
    /// an unspecified or UNIX family: the connection's peer is the client.
    std::optional<IpAddress> source;
    std::string error;
};

/// Reads a PROXY v2 header at the start of `bytes` (the connection's first
/// bytes, possibly followed by the HTTP request or TLS handshake).
ProxyHeader parse_proxy_v2(std::string_view bytes);

/// The client of one request: `address` is what the limits count; `proxy`
/// the connection's peer when that was a trusted proxy that named someone
/// else (empty otherwise). Logs name both.
struct ClientAddress {
    std::string address;
    std::string proxy;
};

/// The client from X-Forwarded-For (`xff`: the request's header values in
/// order, as a trusted proxy appends to them) behind `hop`, the address the
/// connection comes from (its peer, or the source of its PROXY header).
/// X-Forwarded-For counts only if `hop` is a trusted proxy; then the client
/// is the right-most address that is not one (the left-most if all are).
/// Entries may carry a port ("192.0.2.7:5678", "[2001:db8::1]:443").
/// nullopt when an entry that has to be read is not an address: the
/// trusted proxy that wrote it is misconfigured (the caller answers 400).
std::optional<IpAddress> forwarded_client(const IpAddress& hop, const std::vector<std::string_view>& xff,
                                          const std::vector<IpNetwork>& trusted);

} // namespace im
