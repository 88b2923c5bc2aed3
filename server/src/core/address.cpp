#include "core/address.hpp"

#include <arpa/inet.h>

#include <charconv>
#include <cstring>

namespace im {

namespace {

constexpr std::array<unsigned char, 12> v4_mapped_prefix{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

std::string trimmed(const std::string& s) {
    const auto b = s.find_first_not_of(" \t");
    if (b == std::string::npos) return {};
    return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

} // namespace

bool IpAddress::is_v4() const { return std::memcmp(bytes.data(), v4_mapped_prefix.data(), 12) == 0; }

std::optional<IpAddress> parse_ip(const std::string& text) {
    IpAddress a;
    unsigned char v4[4];
    if (inet_pton(AF_INET, text.c_str(), v4) == 1) {
        std::memcpy(a.bytes.data(), v4_mapped_prefix.data(), 12);
        std::memcpy(a.bytes.data() + 12, v4, 4);
        return a;
    }
    if (inet_pton(AF_INET6, text.c_str(), a.bytes.data()) == 1) return a;
    return std::nullopt;
}

std::string to_string(const IpAddress& a) {
    char buf[INET6_ADDRSTRLEN] = {};
    if (a.is_v4()) inet_ntop(AF_INET, a.bytes.data() + 12, buf, sizeof buf);
    else inet_ntop(AF_INET6, a.bytes.data(), buf, sizeof buf);
    return buf;
}

bool IpNetwork::contains(const IpAddress& a) const {
    const int whole = prefix / 8, rest = prefix % 8;
    if (std::memcmp(a.bytes.data(), base.bytes.data(), static_cast<std::size_t>(whole)) != 0) return false;
    if (rest == 0) return true;
    const auto mask = static_cast<unsigned char>(0xff << (8 - rest));
    return (a.bytes[static_cast<std::size_t>(whole)] & mask) == (base.bytes[static_cast<std::size_t>(whole)] & mask);
}

std::optional<std::string> parse_cidr(const std::string& text, IpNetwork& out) {
    const auto slash = text.find('/');
    const std::string host = text.substr(0, slash);
    auto a = parse_ip(host);
    // A bare IPv4 address is not taken as IPv4-mapped: "::ffff:10.0.0.1" is an
    // IPv6 spelling and its prefix counts IPv6 bits.
    const bool v4 = a && host.find(':') == std::string::npos;
    if (!a) return "'" + text + "' is not an IP address or CIDR range";
    const int width = v4 ? 32 : 128;
    int bits = width;
    if (slash != std::string::npos) {
        const std::string p = text.substr(slash + 1);
        auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), bits);
        if (p.empty() || ec != std::errc() || end != p.data() + p.size() || bits < 0 || bits > width)
            return "'" + text + "': the prefix length must be 0.." + std::to_string(width);
    }
    IpNetwork n{*a, bits + (v4 ? 96 : 0)};
    IpNetwork masked = n;
    for (int i = n.prefix; i < 128; ++i)
        masked.base.bytes[static_cast<std::size_t>(i / 8)] &= static_cast<unsigned char>(~(0x80 >> (i % 8)));
    if (!(masked.base == n.base))
        return "'" + text + "' has bits set past its prefix (the range is " + to_string(masked) + ")";
    out = n;
    return std::nullopt;
}

std::optional<std::string> parse_cidr_list(const std::string& text, std::vector<IpNetwork>& out) {
    std::vector<IpNetwork> list;
    if (trimmed(text).empty()) {
        out.clear();
        return std::nullopt;
    }
    std::size_t start = 0;
    for (;;) {
        const auto comma = text.find(',', start);
        IpNetwork n;
        if (auto e = parse_cidr(trimmed(text.substr(start, comma - start)), n)) return e;
        list.push_back(n);
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    out = std::move(list);
    return std::nullopt;
}

std::string to_string(const IpNetwork& n) {
    const bool v4 = n.base.is_v4() && n.prefix >= 96;
    return to_string(n.base) + "/" + std::to_string(v4 ? n.prefix - 96 : n.prefix);
}

bool in_any(const std::vector<IpNetwork>& nets, const IpAddress& a) {
    for (const auto& n : nets)
        if (n.contains(a)) return true;
    return false;
}

std::string address_key(const std::string& address) {
    auto a = parse_ip(address);
    if (!a) return address;
    if (a->is_v4()) return to_string(*a);
    std::fill(a->bytes.begin() + 8, a->bytes.end(), 0);
    return to_string(*a) + "/64";
}

} // namespace im
