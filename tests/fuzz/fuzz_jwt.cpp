// libFuzzer target: everything that parses a JWT or a JWKS on the server
// (server/src/api/jwt.cpp), the code a hello or refresh token reaches before
// any database. Each input goes through the whole verification (header,
// key choice, libjwt, claims), the claim checks alone (as if the signature
// were good), and the JWKS parser. Besides crashes and sanitizer reports it
// checks the promises: an accepted token or claim set names valid ids and
// an exp in the future; a token whose header is not HS256/RS256/ES256 with a
// key of that type is never accepted.
#include "api/jwt.hpp"
#include "core/protocol.hpp"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include <cstdint>
#include <cstdlib>
#include <string_view>

namespace {

constexpr std::int64_t now_s = 1764633600; // fixed: runs are reproducible

const im::jwt::KeySet& keys() {
    static const im::jwt::KeySet k = [] {
        im::jwt::KeySet s;
        s.hs256_secret = "fuzz-secret-0123456789abcdef-0123456789"; // signs the seeds in jwt_seeds.txt
        // The P-256 generator point as a public key (valid, its private key is 1).
        auto jwks = im::jwt::parse_jwks(
            R"({"keys":[{"kty":"EC","kid":"ec","crv":"P-256","x":"axfR8uEsQkf4vOblY6RA8ncDfYEt6zOg9KE5RdiYwpY",)"
            R"("y":"T-NC4v4af5uO5-tKfA-eFivOM1drMV7Oy7ZAaDe_UfU"}]})");
        if (jwks.index() != 0) std::abort();
        s.by_kid = std::get<0>(jwks);
        EVP_PKEY* rsa = EVP_PKEY_Q_keygen(nullptr, nullptr, "RSA", static_cast<size_t>(2048));
        BIO* bio = BIO_new(BIO_s_mem());
        PEM_write_bio_PUBKEY(bio, rsa);
        char* data = nullptr;
        long n = BIO_get_mem_data(bio, &data);
        s.by_kid["rsa"] = {im::jwt::PublicKey::Type::rsa, std::string(data, static_cast<std::size_t>(n))};
        BIO_free(bio);
        EVP_PKEY_free(rsa);
        return s;
    }();
    return k;
}

void check(const im::jwt::Verdict& v) {
    if (const auto* c = std::get_if<im::jwt::Claims>(&v)) {
        if (!im::valid_id(c->sub) || !im::valid_id(c->device) || c->exp_ms <= now_s * 1000) std::abort();
    } else if (std::get<im::jwt::Refusal>(v).reason.empty()) {
        std::abort();
    }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    std::string_view in(reinterpret_cast<const char*>(data), size);
    const im::jwt::Settings settings{"https://backend.example", "im"};
    auto v = im::jwt::verify(in, keys(), settings, now_s);
    check(v);
    if (std::holds_alternative<im::jwt::Claims>(v)) {
        auto h = im::jwt::parse_header(in);
        const auto* hd = std::get_if<im::jwt::Header>(&h);
        if (!hd || (hd->alg != "HS256" && hd->alg != "RS256" && hd->alg != "ES256")) std::abort();
        if (hd->alg == "RS256" && hd->kid != "rsa") std::abort();
        if (hd->alg == "ES256" && hd->kid != "ec") std::abort();
    }
    check(im::jwt::check_claims(in, settings, now_s));
    check(im::jwt::check_claims(in, {}, now_s));
    std::vector<std::string> skipped;
    auto jwks = im::jwt::parse_jwks(in, &skipped);
    if (const auto* m = std::get_if<0>(&jwks)) {
        if (m->empty()) std::abort();
        for (const auto& [kid, k] : *m)
            if (kid.empty() || k.pem.rfind("-----BEGIN PUBLIC KEY-----", 0) != 0) std::abort();
    }
    if (auto raw = im::jwt::base64url_decode(in); raw && raw->size() > in.size()) std::abort();
    return 0;
}
