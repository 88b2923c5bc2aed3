#include "api/jwt.hpp"

#include "core/protocol.hpp" // valid_id

#include <boost/json.hpp>

#include <jwt.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/param_build.h>
#include <openssl/pem.h>

#include <cmath>
#include <fstream>
#include <sstream>

namespace im::jwt {
namespace json = boost::json;

namespace {

Refusal refuse(std::string why) { return Refusal{std::move(why)}; }

int b64url_value(char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '-') return 62;
    if (c == '_') return 63;
    return -1;
}

// The three parts of a compact JWS (already known to have two dots).
struct Parts {
    std::string_view header, payload, signature;
};

std::optional<Parts> split(std::string_view token) {
    auto a = token.find('.');
    if (a == std::string_view::npos) return std::nullopt;
    auto b = token.find('.', a + 1);
    if (b == std::string_view::npos || token.find('.', b + 1) != std::string_view::npos) return std::nullopt;
    return Parts{token.substr(0, a), token.substr(a + 1, b - a - 1), token.substr(b + 1)};
}

// A JSON object from a base64url part; nullopt when either layer is bad.
std::optional<json::object> decode_object(std::string_view part) {
    auto raw = base64url_decode(part);
    if (!raw) return std::nullopt;
    json::error_code ec;
    json::value v = json::parse(*raw, ec);
    if (ec || !v.is_object()) return std::nullopt;
    return std::move(v.get_object());
}

// A NumericDate claim (RFC 7519: seconds, may have a fraction), floored.
// nullopt when absent; a Refusal reason in `bad` when present but unusable.
std::optional<std::int64_t> numeric_date(const json::object& o, std::string_view key, std::string& bad) {
    const auto* v = o.if_contains(key);
    if (!v) return std::nullopt;
    // Far beyond any real date, small enough for milliseconds in int64.
    constexpr std::int64_t max_s = 253402300799; // 9999-12-31
    if (v->is_int64() && v->get_int64() >= 0 && v->get_int64() <= max_s) return v->get_int64();
    if (v->is_double() && std::isfinite(v->get_double()) && v->get_double() >= 0 &&
        v->get_double() <= static_cast<double>(max_s))
        return static_cast<std::int64_t>(std::floor(v->get_double()));
    bad = "claim '" + std::string(key) + "' must be a date (seconds since 1970)";
    return std::nullopt;
}

struct Pkey {
    EVP_PKEY* p = nullptr;
    ~Pkey() { EVP_PKEY_free(p); }
};

// A key's PEM, or why there is none.
struct Pem {
    std::string text, error;
};

// Builds the key from OpenSSL parameters and checks it.
Pem to_pem(const char* type, OSSL_PARAM_BLD* bld, int min_bits) {
    struct Guard {
        OSSL_PARAM_BLD* bld;
        OSSL_PARAM* params = nullptr;
        EVP_PKEY_CTX* ctx = nullptr;
        EVP_PKEY_CTX* check = nullptr;
        BIO* bio = nullptr;
        ~Guard() {
            BIO_free(bio);
            EVP_PKEY_CTX_free(check);
            EVP_PKEY_CTX_free(ctx);
            OSSL_PARAM_free(params);
            OSSL_PARAM_BLD_free(bld);
        }
    } g{bld};
    Pkey key;
    g.params = OSSL_PARAM_BLD_to_param(bld);
    g.ctx = EVP_PKEY_CTX_new_from_name(nullptr, type, nullptr);
    if (!g.params || !g.ctx || EVP_PKEY_fromdata_init(g.ctx) != 1 ||
        EVP_PKEY_fromdata(g.ctx, &key.p, EVP_PKEY_PUBLIC_KEY, g.params) != 1)
        return {{}, "not a valid public key"};
    g.check = EVP_PKEY_CTX_new_from_pkey(nullptr, key.p, nullptr);
    if (!g.check || EVP_PKEY_public_check(g.check) != 1)
        return {{}, "not a valid public key"};
    if (EVP_PKEY_get_bits(key.p) < min_bits)
        return {{}, "key shorter than " + std::to_string(min_bits) + " bits"};
    g.bio = BIO_new(BIO_s_mem());
    if (!g.bio || PEM_write_bio_PUBKEY(g.bio, key.p) != 1)
        return {{}, "cannot encode the key"};
    char* data = nullptr;
    long n = BIO_get_mem_data(g.bio, &data);
    return {std::string(data, static_cast<std::size_t>(n)), {}};
}

// A base64url member of a JWK, decoded; empty when missing or invalid.
std::string jwk_bytes(const json::object& k, std::string_view key) {
    const auto* v = k.if_contains(key);
    if (!v || !v->is_string()) return {};
    return base64url_decode(v->get_string()).value_or(std::string());
}

std::variant<PublicKey, std::string> rsa_key(const json::object& k) {
    std::string n = jwk_bytes(k, "n"), e = jwk_bytes(k, "e");
    if (n.empty() || e.empty() || e.size() > 8) return std::string("RSA key needs 'n' and 'e' (base64url)");
    BIGNUM* bn_n = BN_bin2bn(reinterpret_cast<const unsigned char*>(n.data()), static_cast<int>(n.size()), nullptr);
    BIGNUM* bn_e = BN_bin2bn(reinterpret_cast<const unsigned char*>(e.data()), static_cast<int>(e.size()), nullptr);
    OSSL_PARAM_BLD* bld = OSSL_PARAM_BLD_new();
    bool ok = bn_n && bn_e && bld && OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_N, bn_n) == 1 &&
              OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_E, bn_e) == 1;
    Pem pem;
    if (ok) pem = to_pem("RSA", bld, min_rsa_bits);
    else OSSL_PARAM_BLD_free(bld);
    BN_free(bn_n); // the built parameters hold copies
    BN_free(bn_e);
    if (!ok) return std::string("RSA key: out of memory");
    if (!pem.error.empty()) return "RSA key: " + pem.error;
    return PublicKey{PublicKey::Type::rsa, std::move(pem.text)};
}

std::variant<PublicKey, std::string> ec_key(const json::object& k) {
    std::string x = jwk_bytes(k, "x"), y = jwk_bytes(k, "y");
    if (x.size() != 32 || y.size() != 32) return std::string("EC P-256 key needs 'x' and 'y' of 32 bytes each");
    std::string point = '\x04' + x + y; // uncompressed SEC1 point
    OSSL_PARAM_BLD* bld = OSSL_PARAM_BLD_new();
    if (!bld || OSSL_PARAM_BLD_push_utf8_string(bld, OSSL_PKEY_PARAM_GROUP_NAME, "prime256v1", 0) != 1 ||
        OSSL_PARAM_BLD_push_octet_string(bld, OSSL_PKEY_PARAM_PUB_KEY, point.data(), point.size()) != 1) {
        OSSL_PARAM_BLD_free(bld);
        return std::string("EC key: out of memory");
    }
    auto pem = to_pem("EC", bld, 256);
    if (!pem.error.empty()) return "EC key: " + pem.error;
    return PublicKey{PublicKey::Type::ec_p256, std::move(pem.text)};
}

// libjwt checks the signature with exactly the key chosen for the pinned
// algorithm; it must then agree on that algorithm.
bool signature_ok(std::string_view token, jwt_alg_t alg, const std::string& key) {
    std::string text(token); // libjwt wants a NUL-terminated string
    jwt_t* j = nullptr;
    int rc = jwt_decode(&j, text.c_str(), reinterpret_cast<const unsigned char*>(key.data()),
                        static_cast<int>(key.size()));
    bool ok = rc == 0 && j && jwt_get_alg(j) == alg;
    jwt_free(j);
    return ok;
}

std::optional<std::string> read_file(const std::string& path, std::string& out) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return "cannot read " + path;
    std::ostringstream s;
    s << in.rdbuf();
    out = s.str();
    return std::nullopt;
}

} // namespace

bool looks_like_jwt(std::string_view token) {
    auto p = split(token);
    if (!p || p->header.empty() || p->payload.empty()) return false;
    for (char c : token)
        if (c != '.' && b64url_value(c) < 0) return false;
    return true;
}

std::optional<std::string> base64url_decode(std::string_view in) {
    if (in.size() % 4 == 1) return std::nullopt;
    std::string out;
    out.reserve(in.size() * 3 / 4);
    std::uint32_t acc = 0;
    int bits = 0;
    for (char c : in) {
        int v = b64url_value(c);
        if (v < 0) return std::nullopt;
        acc = (acc << 6) | static_cast<std::uint32_t>(v);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out += static_cast<char>((acc >> bits) & 0xFF);
        }
    }
    // The leftover bits of the last character must be zero (one encoding per value).
    if (bits > 0 && (acc & ((1u << bits) - 1)) != 0) return std::nullopt;
    return out;
}

std::variant<Header, Refusal> parse_header(std::string_view token) {
    if (token.size() > max_token_chars) return refuse("token too long");
    auto parts = split(token);
    if (!parts) return refuse("not a compact JWS (three parts)");
    auto h = decode_object(parts->header);
    if (!h) return refuse("header is not a base64url JSON object");
    Header out;
    const auto* alg = h->if_contains("alg");
    if (!alg || !alg->is_string()) return refuse("header has no 'alg'");
    out.alg = std::string(alg->get_string());
    if (const auto* kid = h->if_contains("kid")) {
        if (!kid->is_string()) return refuse("header 'kid' must be a string");
        out.kid = std::string(kid->get_string());
    }
    // Extensions we do not understand must not be ignored (RFC 7515 4.1.11).
    if (h->contains("crit")) return refuse("header 'crit' is not supported");
    return out;
}

Verdict check_claims(std::string_view payload_json, const Settings& s, std::int64_t now_s) {
    json::error_code ec;
    json::value v = json::parse(payload_json, ec);
    if (ec || !v.is_object()) return refuse("claims are not a JSON object");
    const auto& o = v.get_object();
    Claims c;
    for (auto [key, out] : {std::pair<std::string_view, std::string*>{"sub", &c.sub}, {"device", &c.device}}) {
        const auto* x = o.if_contains(key);
        if (!x || !x->is_string() || !valid_id(x->get_string()))
            return refuse("claim '" + std::string(key) + "' must be an id of [A-Za-z0-9._:-]{1,64}");
        *out = std::string(x->get_string());
    }
    std::string bad;
    auto exp = numeric_date(o, "exp", bad);
    auto nbf = numeric_date(o, "nbf", bad);
    auto iat = numeric_date(o, "iat", bad);
    if (!bad.empty()) return refuse(bad);
    if (!exp) return refuse("claim 'exp' is required");
    if (now_s >= *exp) return refuse("token expired");
    if (nbf && now_s + leeway_seconds < *nbf) return refuse("token not valid yet (nbf)");
    if (iat && now_s + leeway_seconds < *iat) return refuse("token issued in the future (iat)");
    if (!s.issuer.empty()) {
        const auto* iss = o.if_contains("iss");
        if (!iss || !iss->is_string() || iss->get_string() != s.issuer) return refuse("issuer does not match");
    }
    if (!s.audience.empty()) {
        // `aud`: one string or an array of them; ours must be among them.
        const auto* aud = o.if_contains("aud");
        bool found = false;
        if (aud && aud->is_string()) found = aud->get_string() == s.audience;
        else if (aud && aud->is_array())
            for (const auto& a : aud->get_array()) found = found || (a.is_string() && a.get_string() == s.audience);
        if (!found) return refuse("audience does not match");
    }
    c.exp_ms = *exp * 1000;
    return c;
}

Verdict verify(std::string_view token, const KeySet& keys, const Settings& s, std::int64_t now_s) {
    auto h = parse_header(token);
    if (auto* r = std::get_if<Refusal>(&h)) return *r;
    const Header& hd = std::get<Header>(h);
    // Pin the algorithm to the key before any signature is checked.
    jwt_alg_t alg;
    const std::string* key = nullptr;
    if (hd.alg == "HS256") {
        if (keys.hs256_secret.empty()) return refuse("HS256 is not configured");
        alg = JWT_ALG_HS256;
        key = &keys.hs256_secret;
    } else if (hd.alg == "RS256" || hd.alg == "ES256") {
        if (hd.kid.empty()) return refuse(hd.alg + " needs a 'kid'");
        auto it = keys.by_kid.find(hd.kid);
        if (it == keys.by_kid.end()) return refuse("unknown kid");
        const bool rsa = hd.alg == "RS256";
        if (it->second.type != (rsa ? PublicKey::Type::rsa : PublicKey::Type::ec_p256))
            return refuse(hd.alg + " does not match the type of key " + hd.kid);
        alg = rsa ? JWT_ALG_RS256 : JWT_ALG_ES256;
        key = &it->second.pem;
    } else {
        return refuse("algorithm '" + hd.alg + "' is not accepted");
    }
    if (!signature_ok(token, alg, *key)) return refuse("bad signature");
    auto payload = base64url_decode(split(token)->payload);
    if (!payload) return refuse("claims are not base64url");
    return check_claims(*payload, s, now_s);
}

std::variant<std::map<std::string, PublicKey>, std::string> parse_jwks(std::string_view text,
                                                                       std::vector<std::string>* skipped) {
    using Result = std::variant<std::map<std::string, PublicKey>, std::string>;
    auto fail = [](std::string m) { return Result(std::in_place_index<1>, std::move(m)); };
    json::error_code ec;
    json::value v = json::parse(text, ec);
    if (ec || !v.is_object()) return fail("not a JSON object");
    const auto* list = v.get_object().if_contains("keys");
    if (!list || !list->is_array()) return fail("no 'keys' array");
    std::map<std::string, PublicKey> out;
    std::size_t i = 0;
    for (const auto& kv : list->get_array()) {
        const std::string where = "key " + std::to_string(i++);
        if (!kv.is_object()) return fail(where + ": not an object");
        const auto& k = kv.get_object();
        auto text_of = [&](std::string_view f) {
            const auto* x = k.if_contains(f);
            return x && x->is_string() ? std::string(x->get_string()) : std::string();
        };
        const std::string kty = text_of("kty"), kid = text_of("kid"), use = text_of("use"), alg = text_of("alg");
        const bool rsa = kty == "RSA", ec = kty == "EC" && text_of("crv") == "P-256";
        if ((k.contains("use") && use != "sig") || (!rsa && !ec) || (!alg.empty() && alg != (rsa ? "RS256" : "ES256"))) {
            if (skipped) skipped->push_back(where + (kid.empty() ? "" : " (kid " + kid + ")"));
            continue;
        }
        if (kid.empty()) return fail(where + ": no 'kid'");
        if (out.count(kid)) return fail(where + ": kid '" + kid + "' appears twice");
        auto key = rsa ? rsa_key(k) : ec_key(k);
        if (auto* e = std::get_if<std::string>(&key)) return fail(where + " (kid " + kid + "): " + *e);
        out.emplace(kid, std::get<PublicKey>(std::move(key)));
    }
    if (out.empty()) return fail("no usable RS256 or ES256 key");
    return out;
}

Verifier::Verifier(std::string hs256_secret_file, std::string jwks_file, Settings settings)
    : hs_file_(std::move(hs256_secret_file)), jwks_file_(std::move(jwks_file)), settings_(std::move(settings)) {}

std::optional<std::string> Verifier::reload() {
    auto fresh = std::make_shared<KeySet>();
    std::vector<std::string> skipped;
    if (!hs_file_.empty()) {
        if (auto e = read_file(hs_file_, fresh->hs256_secret)) return "--jwt-hs256-secret-file: " + *e;
        // The file's first line, without its line end (docs/operations.md).
        auto& sec = fresh->hs256_secret;
        if (auto eol = sec.find('\n'); eol != std::string::npos) sec.resize(eol);
        if (!sec.empty() && sec.back() == '\r') sec.pop_back();
        if (sec.size() < min_hs256_secret_bytes)
            return "--jwt-hs256-secret-file: " + hs_file_ + ": the secret must be at least " +
                   std::to_string(min_hs256_secret_bytes) + " bytes";
    }
    if (!jwks_file_.empty()) {
        std::string text;
        if (auto e = read_file(jwks_file_, text)) return "--jwt-jwks: " + *e;
        auto keys = parse_jwks(text, &skipped);
        if (auto* e = std::get_if<std::string>(&keys)) return "--jwt-jwks: " + jwks_file_ + ": " + *e;
        fresh->by_kid = std::get<0>(std::move(keys));
    }
    std::lock_guard lk(mu_);
    keys_ = std::move(fresh);
    skipped_ = std::move(skipped);
    return std::nullopt;
}

std::string Verifier::describe() const {
    std::lock_guard lk(mu_);
    if (!keys_) return "no keys";
    std::string out = keys_->hs256_secret.empty() ? "" : "HS256 secret";
    if (!keys_->by_kid.empty()) {
        std::string kids;
        for (const auto& [kid, k] : keys_->by_kid)
            kids += (kids.empty() ? "" : ", ") + kid + (k.type == PublicKey::Type::rsa ? " (RSA)" : " (EC P-256)");
        out += (out.empty() ? "" : "; ") + std::string("JWKS keys ") + kids;
    }
    for (const auto& s : skipped_) out += "; skipped " + s;
    return out;
}

Verdict Verifier::verify(std::string_view token, std::int64_t now_s) const {
    std::shared_ptr<const KeySet> keys;
    {
        std::lock_guard lk(mu_);
        keys = keys_;
    }
    if (!keys) return refuse("no keys loaded");
    return jwt::verify(token, *keys, settings_, now_s);
}

} // namespace im::jwt
