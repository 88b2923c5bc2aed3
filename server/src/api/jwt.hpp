// Signed device tokens from the app's backend (contract section 4a): JWTs
// (compact JWS) verified with HS256 (a shared secret), RS256 or ES256 (public
// keys of a JWKS, selected by `kid`). Pure: no database, no sockets, no
// logging (the key files are read by JwtVerifier::load/reload only), so the
// parsing is fuzzed (tests/fuzz/fuzz_jwt.cpp).
//
// The algorithm is pinned to the key BEFORE the signature is checked: the
// header (`alg`, `kid`) is read here with Boost.JSON, the key chosen from it,
// and only then is the token handed to libjwt with that one key. HS256 needs
// the secret; RS256 needs a `kid` naming an RSA key; ES256 a `kid` naming an
// EC P-256 key. Everything else (`none`, HS384, PS256, an RS256 header naming
// an EC key, ...) is refused without calling libjwt, so a public key is never
// used as an HMAC secret.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace im::jwt {

/// A public key of the JWKS, as PEM (SubjectPublicKeyInfo) for libjwt.
struct PublicKey {
    enum class Type { rsa, ec_p256 } type;
    std::string pem;
};

/// The verification keys: the HS256 secret (empty: none) and the JWKS keys by kid.
struct KeySet {
    std::string hs256_secret;
    std::map<std::string, PublicKey> by_kid;
    bool empty() const { return hs256_secret.empty() && by_kid.empty(); }
};

/// Claim checks the server is configured with.
struct Settings {
    std::string issuer;   // empty: `iss` not checked
    std::string audience; // empty: `aud` not checked
};

/// Leeway for `nbf` and `iat` (the backend's clock may run ahead of ours).
/// `exp` has none: a connection closes at `exp` by this server's clock, so a
/// token past it would be closed at once anyway.
inline constexpr std::int64_t leeway_seconds = 30;
/// Shortest HS256 secret accepted (RFC 7518 3.2: at least the hash size).
inline constexpr std::size_t min_hs256_secret_bytes = 32;
/// Smallest RSA modulus accepted in the JWKS.
inline constexpr int min_rsa_bits = 2048;

/// What a valid token vouches for.
struct Claims {
    std::string sub, device;
    std::int64_t exp_ms = 0; // `exp` in ms since the epoch
};

/// A token that is not accepted: why, for the logs (the client sees only
/// UNAUTHENTICATED).
struct Refusal {
    std::string reason;
};

using Verdict = std::variant<Claims, Refusal>;

/// True when `token` has the shape of a compact JWS (three base64url parts,
/// two dots); random device tokens never do.
bool looks_like_jwt(std::string_view token);

/// Base64url (RFC 4648 section 5, no padding) decode; nullopt when invalid.
std::optional<std::string> base64url_decode(std::string_view in);

/// The protected header's `alg` and `kid`, read without trusting anything.
struct Header {
    std::string alg, kid;
};
std::variant<Header, Refusal> parse_header(std::string_view token);

/// The claims of a token whose signature was checked: `sub`, `device` (ids
/// of [A-Za-z0-9._:-]{1,64}), `exp` required; `nbf`, `iat` checked with
/// leeway_seconds; `iss`, `aud` when `s` names them. now_s: seconds since
/// the epoch.
Verdict check_claims(std::string_view payload_json, const Settings& s, std::int64_t now_s);

/// The whole check: header, key choice, signature (libjwt), claims.
Verdict verify(std::string_view token, const KeySet& keys, const Settings& s, std::int64_t now_s);

/// Parses a JWKS document ({"keys":[...]}): RSA keys (`n`, `e`, at least
/// min_rsa_bits) and EC P-256 keys (`crv` "P-256", `x`, `y`), each with a
/// unique `kid`; keys with `use` other than "sig", or of another type or
/// curve, are skipped (named in `skipped`). A malformed key of a supported
/// type, or no usable key at all, is an error.
std::variant<std::map<std::string, PublicKey>, std::string> parse_jwks(std::string_view json,
                                                                       std::vector<std::string>* skipped = nullptr);

/// The configured key files and the keys read from them, swapped whole on
/// reload (SIGHUP). Thread-safe.
class Verifier {
public:
    Verifier(std::string hs256_secret_file, std::string jwks_file, Settings settings);
    /// Reads the files; on error returns the message and keeps the keys it
    /// had (none before the first successful load).
    std::optional<std::string> reload();
    /// "hs256, 2 JWKS keys (kid a, b)" for the logs.
    std::string describe() const;
    Verdict verify(std::string_view token, std::int64_t now_s) const;
    const Settings& settings() const { return settings_; }

private:
    std::string hs_file_, jwks_file_;
    Settings settings_;
    mutable std::mutex mu_;
    std::shared_ptr<const KeySet> keys_;
    std::vector<std::string> skipped_;
};

} // namespace im::jwt
