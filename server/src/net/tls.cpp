#include "net/tls.hpp"

#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <stdexcept>

namespace im {

namespace {

// Mozilla's "intermediate" TLS 1.2 suites (TLS 1.3 suites are all fine).
constexpr const char* tls12_ciphers =
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:"
    "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305";

std::string x509_name(X509_NAME* name) {
    if (!name) return {};
    char buf[512];
    X509_NAME_oneline(name, buf, sizeof buf);
    return buf;
}

std::string not_after(X509* cert) {
    const ASN1_TIME* t = X509_get0_notAfter(cert);
    struct tm tm {};
    if (!t || ASN1_TIME_to_tm(t, &tm) != 1) return {};
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

std::shared_ptr<ssl::context> load(const std::string& cert_file, const std::string& key_file, std::string& description) {
    auto ctx = std::make_shared<ssl::context>(ssl::context::tls_server);
    ctx->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                     ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1 | ssl::context::single_dh_use |
                     ssl::context::no_compression);
    SSL_CTX* native = ctx->native_handle();
    if (SSL_CTX_set_min_proto_version(native, TLS1_2_VERSION) != 1 ||
        SSL_CTX_set_cipher_list(native, tls12_ciphers) != 1)
        throw std::runtime_error("OpenSSL refused the TLS settings");
    boost::system::error_code ec;
    ctx->use_certificate_chain_file(cert_file, ec);
    if (ec) throw std::runtime_error("--tls-cert " + cert_file + ": " + ec.message());
    ctx->use_private_key_file(key_file, ssl::context::pem, ec);
    if (ec) throw std::runtime_error("--tls-key " + key_file + ": " + ec.message());
    if (SSL_CTX_check_private_key(native) != 1)
        throw std::runtime_error("--tls-key " + key_file + " does not match the certificate in " + cert_file);
    X509* cert = SSL_CTX_get0_certificate(native);
    description = "subject " + x509_name(X509_get_subject_name(cert)) + ", issuer " +
                  x509_name(X509_get_issuer_name(cert)) + ", not after " + not_after(cert);
    return ctx;
}

} // namespace

TlsContexts::TlsContexts(std::string cert_file, std::string key_file)
    : cert_file_(std::move(cert_file)), key_file_(std::move(key_file)) {
    ctx_ = load(cert_file_, key_file_, description_);
}

std::shared_ptr<ssl::context> TlsContexts::current() const {
    std::lock_guard lk(mu_);
    return ctx_;
}

std::optional<std::string> TlsContexts::reload() {
    std::string description;
    std::shared_ptr<ssl::context> fresh;
    try {
        fresh = load(cert_file_, key_file_, description);
    } catch (const std::exception& e) {
        return std::string(e.what());
    }
    std::lock_guard lk(mu_);
    ctx_ = std::move(fresh);
    description_ = std::move(description);
    return std::nullopt;
}

std::string TlsContexts::describe() const {
    std::lock_guard lk(mu_);
    return description_;
}

} // namespace im
