// TLS in the gateway: certificates from a throwaway CA made with the openssl
// CLI; a real TLS WebSocket client (Beast over OpenSSL) that verifies the
// chain and the host name; SIGHUP reload while connections stay open.
#include "common.hpp"

#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>

#include <openssl/ssl.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

using namespace im::test;

namespace {

namespace net = boost::asio;
namespace ssl = net::ssl;
namespace beast = boost::beast;
namespace websocket = beast::websocket;
namespace http = beast::http;
using tcp = net::ip::tcp;

void sh(const std::string& cmd) {
    if (std::system((cmd + " >/dev/null 2>&1").c_str()) != 0) throw std::runtime_error("failed: " + cmd);
}

// A CA and a server certificate for 127.0.0.1/localhost signed by it.
struct TestCa {
    std::string dir, name;
    std::string ca() const { return dir + "/" + name + "-ca.crt"; }
    std::string cert() const { return dir + "/" + name + "-server.crt"; }
    std::string key() const { return dir + "/" + name + "-server.key"; }
    TestCa(const std::string& d, const std::string& n) : dir(d), name(n) {
        const std::string p = dir + "/" + name;
        sh("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj '/CN=" + name +
           " test CA' -keyout " + p + "-ca.key -out " + p + "-ca.crt");
        sh("openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj '/CN=localhost' -keyout " + key() +
           " -out " + p + "-server.csr");
        std::ofstream(p + "-ext.cnf") << "subjectAltName=IP:127.0.0.1,DNS:localhost\n";
        sh("openssl x509 -req -in " + p + "-server.csr -CA " + p + "-ca.crt -CAkey " + p + "-ca.key -CAcreateserial -days 2 -extfile " +
           p + "-ext.cnf -out " + cert());
    }
};

void copy(const std::string& from, const std::string& to) {
    std::ifstream in(from, std::ios::binary);
    std::ofstream out(to + ".tmp", std::ios::binary | std::ios::trunc);
    out << in.rdbuf();
    out.close();
    std::filesystem::rename(to + ".tmp", to);
}

// A synchronous wss:// client that trusts only `ca_file`.
class TlsClient {
public:
    // The context is complete before the stream is made from it (OpenSSL
    // copies its settings into each connection).
    static ssl::context make_context(const std::string& ca_file, int max_version) {
        ssl::context ctx(ssl::context::tls_client);
        ctx.load_verify_file(ca_file);
        ctx.set_verify_mode(ssl::verify_peer);
        if (max_version) {
            SSL_CTX_set_security_level(ctx.native_handle(), 0);
            SSL_CTX_set_min_proto_version(ctx.native_handle(), TLS1_VERSION);
            SSL_CTX_set_max_proto_version(ctx.native_handle(), max_version);
        }
        return ctx;
    }
    TlsClient(unsigned short port, const std::string& ca_file, int max_version = 0)
        : ctx_(make_context(ca_file, max_version)), ws_(ioc_, ctx_) {
        auto& tls = ws_.next_layer();
        tls.set_verify_callback(ssl::host_name_verification("localhost"));
        SSL_set_tlsext_host_name(tls.native_handle(), "localhost");
        beast::get_lowest_layer(ws_).connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
        tls.handshake(ssl::stream_base::client);   // throws on an untrusted certificate
        ws_.handshake("localhost", "/v1/ws");
    }
    json::object request(json::object o) {
        o["rid"] = "r" + std::to_string(++rid_);
        ws_.write(net::buffer(json::serialize(o)));
        for (;;) {
            beast::flat_buffer b;
            ws_.read(b);
            auto v = json::parse(beast::buffers_to_string(b.data())).as_object();
            if (v.contains("rid") && v.at("rid") == o["rid"]) return v;
        }
    }
    std::string peer_issuer() {
        X509* c = SSL_get1_peer_certificate(ws_.next_layer().native_handle());
        char buf[256];
        X509_NAME_oneline(X509_get_issuer_name(c), buf, sizeof buf);
        X509_free(c);
        return buf;
    }

private:
    net::io_context ioc_;
    ssl::context ctx_;
    websocket::stream<beast::ssl_stream<beast::tcp_stream>> ws_;
    int rid_ = 0;
};

// Whether a TLS handshake trusting `ca_file` succeeds; the error if not.
std::string try_handshake(unsigned short port, const std::string& ca_file, int max_version = 0) {
    try {
        TlsClient c(port, ca_file, max_version);
        return "ok";
    } catch (const std::exception& e) {
        return e.what();
    }
}

std::pair<int, std::string> https_get(unsigned short port, const std::string& ca_file, const std::string& target,
                                      const std::string& bearer = {}) {
    net::io_context ioc;
    ssl::context ctx(ssl::context::tls_client);
    ctx.load_verify_file(ca_file);
    ctx.set_verify_mode(ssl::verify_peer);
    beast::ssl_stream<beast::tcp_stream> s(ioc, ctx);
    s.set_verify_callback(ssl::host_name_verification("127.0.0.1"));
    beast::get_lowest_layer(s).connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
    s.handshake(ssl::stream_base::client);
    http::request<http::empty_body> req{http::verb::get, target, 11};
    req.set(http::field::host, "127.0.0.1");
    if (!bearer.empty()) req.set(http::field::authorization, "Bearer " + bearer);
    http::write(s, req);
    beast::flat_buffer b;
    http::response<http::string_body> res;
    http::read(s, b, res);
    return {res.result_int(), res.body()};
}

class Tls : public ::testing::Test {
protected:
    static void SetUpTestSuite() { pg_ = new TestPostgres(); }
    static void TearDownTestSuite() {
        delete pg_;
        pg_ = nullptr;
    }
    static TestPostgres* pg_;
};
TestPostgres* Tls::pg_ = nullptr;

TEST_F(Tls, wss_and_https_serve_clients_that_trust_the_ca) {
    TempDir dir("imtls");
    TestCa ca(dir.path(), "one");
    ServerProcess srv(pg_->url(), {"--quiet", "--tls-cert", ca.cert(), "--tls-key", ca.key()});
    auto u = make_user(pg_->url(), unique_name("tlsu"));
    TlsClient c(srv.port(), ca.ca());
    auto w = c.request({{"t", "hello"}, {"token", u.token}, {"install", uuid4()}});
    EXPECT_EQ(str(w, "t"), "welcome") << json::serialize(w);
    EXPECT_EQ(https_get(srv.port(), ca.ca(), "/healthz"), (std::pair<int, std::string>{200, "ok\n"}));
    auto metrics = https_get(srv.port(), ca.ca(), "/metrics");
    EXPECT_NE(metrics.second.find("im_tls_handshake_failures_total 0"), std::string::npos) << metrics.second;
}

TEST_F(Tls, a_client_trusting_another_ca_and_a_plain_client_are_refused) {
    TempDir dir("imtls");
    TestCa ca(dir.path(), "one"), other(dir.path(), "other");
    ServerProcess srv(pg_->url(), {"--quiet", "--tls-cert", ca.cert(), "--tls-key", ca.key()});
    EXPECT_NE(try_handshake(srv.port(), other.ca()).find("certificate verify failed"), std::string::npos);
    // Plain ws:// on the TLS port gets no WebSocket (no silent downgrade).
    EXPECT_THROW(WsClient plain(srv.port()), std::exception);
    EXPECT_EQ(try_handshake(srv.port(), ca.ca()), "ok");
    auto metrics = https_get(srv.port(), ca.ca(), "/metrics").second;
    EXPECT_EQ(metrics.find("im_tls_handshake_failures_total 0"), std::string::npos) << metrics;
}

TEST_F(Tls, tls_1_1_is_refused_and_tls_1_2_accepted) {
    TempDir dir("imtls");
    TestCa ca(dir.path(), "one");
    ServerProcess srv(pg_->url(), {"--quiet", "--tls-cert", ca.cert(), "--tls-key", ca.key()});
    EXPECT_NE(try_handshake(srv.port(), ca.ca(), TLS1_1_VERSION), "ok");
    EXPECT_EQ(try_handshake(srv.port(), ca.ca(), TLS1_2_VERSION), "ok");
}

TEST_F(Tls, a_bad_key_stops_the_gateway_at_start_with_a_clear_error) {
    TempDir dir("imtls");
    TestCa ca(dir.path(), "one"), other(dir.path(), "other");
    std::string out = dir.path() + "/err";
    std::string cmd = "'" + imserver_bin() + "' --config '' --db '" + pg_->url() + "' --listen 127.0.0.1:0 --tls-cert " +
                      ca.cert() + " --tls-key " + other.key() + " 2>" + out;
    int st = std::system(cmd.c_str());
    EXPECT_EQ(WEXITSTATUS(st), 1);
    std::ifstream in(out);
    std::string err((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(err.find("--tls-key " + other.key()), std::string::npos) << err;
    EXPECT_NE(err.find("mismatch"), std::string::npos) << err;
}

TEST_F(Tls, sighup_reload_is_used_by_new_connections_while_old_ones_live_on) {
    TempDir dir("imtls");
    TestCa one(dir.path(), "one"), two(dir.path(), "two");
    const std::string cert = dir.path() + "/live.crt", key = dir.path() + "/live.key";
    copy(one.cert(), cert);
    copy(one.key(), key);
    ServerProcess srv(pg_->url(), {"--tls-cert", cert, "--tls-key", key});
    auto u = make_user(pg_->url(), unique_name("tlsr"));
    TlsClient old_conn(srv.port(), one.ca());
    EXPECT_EQ(str(old_conn.request({{"t", "hello"}, {"token", u.token}, {"install", uuid4()}}), "t"),
              "welcome");

    copy(two.cert(), cert);
    copy(two.key(), key);
    ASSERT_EQ(::kill(srv.pid(), SIGHUP), 0);
    std::string result;
    for (int i = 0; i < 300 && (result = try_handshake(srv.port(), two.ca())) != "ok"; ++i)
        std::this_thread::sleep_for(50ms);
    EXPECT_EQ(result, "ok") << "a new connection must get the reloaded certificate";
    EXPECT_NE(try_handshake(srv.port(), one.ca()), "ok");
    // The connection opened before the reload still works.
    EXPECT_EQ(str(old_conn.request({{"t", "convs"}}), "t"), "convs");
    EXPECT_NE(old_conn.peer_issuer().find("one test CA"), std::string::npos);

    // Unusable files on a reload: the current certificate stays.
    std::ofstream(cert, std::ios::trunc) << "not a certificate\n";
    ASSERT_EQ(::kill(srv.pid(), SIGHUP), 0);
    for (int i = 0; i < 300 && srv.log().find("tls_reload_failed") == std::string::npos; ++i)
        std::this_thread::sleep_for(50ms);
    EXPECT_NE(srv.log().find("tls_reload_failed"), std::string::npos) << srv.log();
    EXPECT_EQ(try_handshake(srv.port(), two.ca()), "ok");
    EXPECT_EQ(str(old_conn.request({{"t", "convs"}}), "t"), "convs");
}

TEST_F(Tls, the_backend_api_speaks_https_with_the_gateway_certificate_reloaded_on_sighup) {
    TempDir dir("imtls");
    TestCa one(dir.path(), "one"), two(dir.path(), "two");
    const std::string cert = dir.path() + "/live.crt", key = dir.path() + "/live.key";
    copy(one.cert(), cert);
    copy(one.key(), key);
    ServerProcess srv(pg_->url(), {"--quiet", "--tls-cert", cert, "--tls-key", key, "--api-listen", "127.0.0.1:0"});
    const auto api_key = admin_ok(pg_->url(), {"apikey", "add", "tls", "--scope", "read"});
    auto [st, body] = https_get(srv.api_port(), one.ca(), "/v1/openapi.json", api_key);
    EXPECT_EQ(st, 200);
    EXPECT_NE(body.find("\"openapi\""), std::string::npos);
    EXPECT_EQ(https_get(srv.api_port(), one.ca(), "/v1/openapi.json").first, 401);
    // No plain HTTP on the API's TLS port.
    EXPECT_THROW(srv.api("GET", "/v1/openapi.json", "", api_key), std::exception);
    EXPECT_NE(try_handshake(srv.api_port(), two.ca()), "ok");

    copy(two.cert(), cert);
    copy(two.key(), key);
    ASSERT_EQ(::kill(srv.pid(), SIGHUP), 0);
    bool reloaded = false;
    for (int i = 0; i < 300 && !reloaded; ++i) {
        try {
            reloaded = https_get(srv.api_port(), two.ca(), "/v1/openapi.json", api_key).first == 200;
        } catch (const std::exception&) {
            std::this_thread::sleep_for(50ms);
        }
    }
    EXPECT_TRUE(reloaded) << "the API must serve the reloaded certificate";
}

} // namespace
