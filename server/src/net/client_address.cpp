#include "net/client_address.hpp"

#include <cstring>

namespace im {

namespace {

ProxyHeader malformed(std::string why) {
    ProxyHeader h;
    h.status = ProxyHeader::Status::malformed;
    h.error = std::move(why);
    return h;
}

// "192.0.2.7", "192.0.2.7:5678", "2001:db8::1", "[2001:db8::1]", "[2001:db8::1]:443".
std::optional<IpAddress> forwarded_entry(std::string_view e) {
    while (!e.empty() && (e.front() == ' ' || e.front() == '\t')) e.remove_prefix(1);
    while (!e.empty() && (e.back() == ' ' || e.back() == '\t')) e.remove_suffix(1);
    if (!e.empty() && e.front() == '[') {
        const auto close = e.find(']');
        if (close == std::string_view::npos) return std::nullopt;
        const auto rest = e.substr(close + 1);
        if (!rest.empty() && (rest.front() != ':' || rest.size() == 1)) return std::nullopt;
        e = e.substr(1, close - 1);
    } else if (const auto colon = e.find(':'); colon != std::string_view::npos && e.find(':', colon + 1) == e.npos) {
        e = e.substr(0, colon); // IPv4 with a port (one colon: never IPv6)
    }
    return parse_ip(std::string(e));
}

} // namespace

ProxyHeader parse_proxy_v2(std::string_view b) {
    ProxyHeader h;
    const std::size_t have_sig = std::min(b.size(), proxy_v2_signature.size());
    if (b.substr(0, have_sig) != proxy_v2_signature.substr(0, have_sig)) {
        h.status = ProxyHeader::Status::absent;
        return h;
    }
    if (b.size() < 16) {
        h.length = 16;
        return h; // need_more
    }
    const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(b[i]); };
    const unsigned version = byte(12) >> 4, command = byte(12) & 0x0f;
    const unsigned family = byte(13) >> 4, transport = byte(13) & 0x0f;
    const std::size_t length = 16 + (std::size_t(byte(14)) << 8 | byte(15));
    if (version != 2) return malformed("PROXY header version " + std::to_string(version) + " (only 2 is read)");
    if (command > 1) return malformed("PROXY header command " + std::to_string(command));
    if (family > 3 || transport > 2) return malformed("PROXY header address family or transport unknown");
    if (length > proxy_v2_max_bytes)
        return malformed("PROXY header of " + std::to_string(length) + " bytes (at most " +
                         std::to_string(proxy_v2_max_bytes) + ")");
    // The address block's size for INET, INET6 and UNIX.
    static constexpr std::size_t block[] = {0, 12, 36, 216};
    // LOCAL discards the address block whatever its family says.
    if (command == 1 && length - 16 < block[family]) return malformed("PROXY header too short for its addresses");
    if (b.size() < length) {
        h.length = length;
        return h; // need_more
    }
    h.status = ProxyHeader::Status::ok;
    h.length = length;
    if (command == 0) return h; // LOCAL: the proxy's own connection; the address block is ignored
    if (family == 1 || family == 2) {
        if (transport != 1) return malformed("PROXY header for a datagram connection");
        IpAddress a;
        if (family == 1) {
            a = *parse_ip("0.0.0.0");
            std::memcpy(a.bytes.data() + 12, b.data() + 16, 4);
        } else {
            std::memcpy(a.bytes.data(), b.data() + 16, 16);
        }
        h.source = a;
    }
    // UNSPEC or UNIX: no IP address given; the peer stands for the client.
    return h;
}

std::optional<IpAddress> forwarded_client(const IpAddress& hop, const std::vector<std::string_view>& xff,
                                          const std::vector<IpNetwork>& trusted) {
    IpAddress client = hop;
    if (!in_any(trusted, client)) return client;
    // Right to left over every entry of every header line.
    for (auto line = xff.rbegin(); line != xff.rend(); ++line) {
        std::string_view rest = *line;
        for (;;) {
            const auto comma = rest.rfind(',');
            const auto item = comma == std::string_view::npos ? rest : rest.substr(comma + 1);
            auto a = forwarded_entry(item);
            if (!a) {
                // Blank items ("a, , b") are skipped; anything else is not an address.
                if (item.find_first_not_of(" \t") != std::string_view::npos) return std::nullopt;
            } else {
                client = *a;
                if (!in_any(trusted, client)) return client;
            }
            if (comma == std::string_view::npos) break;
            rest = rest.substr(0, comma);
        }
    }
    return client; // every hop was a trusted proxy: the left-most one
}

} // namespace im
