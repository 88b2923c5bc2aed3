// IP addresses as the per-address limits and --trusted-proxies see them:
// every address in one 16-byte form (IPv4 as IPv4-mapped IPv6), CIDR ranges,
// and the key a client is counted under (IPv4 as itself, IPv6 by its /64).
// Pure: no sockets.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

namespace im {

/// An IPv4 or IPv6 address; IPv4 is held as ::ffff:a.b.c.d, so an IPv4
/// address and its IPv4-mapped IPv6 spelling are the same value.
struct IpAddress {
    std::array<unsigned char, 16> bytes{};
    bool is_v4() const; // IPv4 or IPv4-mapped IPv6
    bool operator==(const IpAddress& o) const { return bytes == o.bytes; }
};

/// "192.0.2.7", "2001:db8::1", "::ffff:192.0.2.7" (nothing else: no port,
/// no brackets, no zone); nullopt if it is not an address.
std::optional<IpAddress> parse_ip(const std::string& text);

/// The usual spelling: dotted quad for IPv4 (IPv4-mapped included),
/// RFC 5952 for IPv6.
std::string to_string(const IpAddress& a);

/// A CIDR range; `prefix` counts bits of the 16-byte form (an IPv4 /24 is 120).
struct IpNetwork {
    IpAddress base;
    int prefix = 128;
    bool contains(const IpAddress& a) const;
    bool operator==(const IpNetwork& o) const { return base == o.base && prefix == o.prefix; }
};

/// Parses one CIDR range: "10.0.0.0/8", "2001:db8::/32", or a bare address
/// (one host: /32 or /128). Refused with a message: a prefix out of range,
/// bits set past the prefix ("10.0.0.1/8": a typo for 10.0.0.0/8 or for one
/// host?), anything that is not an address.
std::optional<std::string> parse_cidr(const std::string& text, IpNetwork& out);

/// A comma-separated list of parse_cidr ranges (spaces around items allowed,
/// empty text = none); on error `out` is unchanged.
std::optional<std::string> parse_cidr_list(const std::string& text, std::vector<IpNetwork>& out);

/// How parse_cidr spells it back ("10.0.0.0/8", "2001:db8::/32").
std::string to_string(const IpNetwork& n);

/// True when some range of `nets` contains `a`.
bool in_any(const std::vector<IpNetwork>& nets, const IpAddress& a);

/// The key a client address is counted under by every per-address limit:
/// IPv4 (IPv4-mapped IPv6 included) as itself, IPv6 by its /64 ("2001:db8:1:2::/64"),
/// since one IPv6 host usually holds a whole /64. Text that is no address is
/// its own key.
std::string address_key(const std::string& address);

} // namespace im
