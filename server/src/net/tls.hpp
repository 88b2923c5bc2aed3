// TLS of the gateway: the OpenSSL server context made from --tls-cert and
// --tls-key (PEM; the certificate file may hold the chain), TLS 1.2 and 1.3
// only, forward-secret AEAD ciphers. reload() (SIGHUP) builds a new context
// from the files; connections keep the context they were accepted with, new
// ones get the new one, so a reload drops nothing.
#pragma once

#include "net/net_common.hpp"

#include <boost/asio/ssl.hpp>
#include <boost/beast/ssl.hpp>

#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace im {

namespace ssl = net::ssl;
using tls_stream = beast::ssl_stream<beast::tcp_stream>;

class TlsContexts {
public:
    /// Throws std::runtime_error naming the file when it cannot be used.
    TlsContexts(std::string cert_file, std::string key_file);

    std::shared_ptr<ssl::context> current() const;
    /// Re-reads both files. On error the old context stays and the message
    /// is returned.
    std::optional<std::string> reload();
    /// "subject ... not after ..." of the current certificate, for the logs.
    std::string describe() const;

private:
    std::string cert_file_, key_file_;
    mutable std::mutex mu_;
    std::shared_ptr<ssl::context> ctx_;
    std::string description_;
};

} // namespace im
