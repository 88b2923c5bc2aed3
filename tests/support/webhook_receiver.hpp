// A real webhook receiver for tests (server.md "Events to the app's backend
// (webhooks)"): a Beast HTTP server on 127.0.0.1 that answers 200, 500, or
// holds the request (a receiver that hangs mid-delivery), can go down (its
// port refuses connections) and come back on the same port. It checks each
// delivery's signature with its own HMAC-SHA256 (OpenSSL, not the server's
// code) and keeps what it accepted (answered 200), in arrival order.
#pragma once

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>
#include <openssl/crypto.h>
#include <openssl/hmac.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>

namespace im::test {

class WebhookReceiver {
public:
    enum class Mode { ok, fail, hold };

    struct Accepted {
        std::string id, conv, kind;
        std::int64_t seq = 0;
        std::int64_t arrived_ms = 0; // wall clock, when the request was read
        boost::json::object ev;
    };

    explicit WebhookReceiver(std::string secret) : secret_(std::move(secret)) {
        open();
        port_ = acceptor_.local_endpoint().port();
        thread_ = std::thread([this] { run(); });
    }
    ~WebhookReceiver() {
        {
            std::lock_guard lk(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        thread_.join();
        for (auto& t : conns_) t.join();
    }

    unsigned short port() const { return port_; }
    std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/hook"; }

    void set_mode(Mode m) {
        std::lock_guard lk(mu_);
        mode_ = m;
        cv_.notify_all();
    }
    /// The port refuses connections until up().
    void down() { want_up_ = false; }
    void up() { want_up_ = true; }

    // What arrived.
    std::vector<Accepted> accepted() const {
        std::lock_guard lk(mu_);
        return accepted_;
    }
    int requests() const { return requests_.load(); }
    /// Of each accepted POST: its events and the conversations they are of.
    struct Batch {
        std::size_t events = 0, convs = 0;
    };
    std::vector<Batch> batches() const {
        std::lock_guard lk(mu_);
        return batches_;
    }
    int bad_signatures() const { return bad_signatures_.load(); }
    int held() const { return held_.load(); } // requests waiting in Mode::hold now
    /// Ids accepted (deduplicated, as a receiver must).
    std::set<std::string> ids() const {
        std::lock_guard lk(mu_);
        std::set<std::string> s;
        for (const auto& a : accepted_) s.insert(a.id);
        return s;
    }
    /// Per conversation, the first arrival of each seq must come in
    /// increasing order with nothing skipped in between (of what the
    /// receiver saw of that conversation): "" or what went wrong.
    std::string order_violation(const std::set<std::string>& kinds = {}) const {
        std::lock_guard lk(mu_);
        std::map<std::string, std::int64_t> last;
        std::set<std::string> seen;
        for (const auto& a : accepted_) {
            if (!kinds.empty() && !kinds.count(a.kind)) continue;
            if (!seen.insert(a.id).second) continue; // a redelivery
            auto it = last.find(a.conv);
            if (it != last.end() && a.seq <= it->second)
                return a.conv + ": seq " + std::to_string(a.seq) + " first arrived after " + std::to_string(it->second);
            last[a.conv] = a.seq;
        }
        return {};
    }

    static std::string sign(const std::string& secret, const std::string& ts, const std::string& body) {
        const std::string data = ts + "." + body;
        unsigned char mac[EVP_MAX_MD_SIZE];
        unsigned int len = 0;
        HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
             reinterpret_cast<const unsigned char*>(data.data()), data.size(), mac, &len);
        static const char* digits = "0123456789abcdef";
        std::string out = "v1=";
        for (unsigned int i = 0; i < len; ++i) {
            out += digits[mac[i] >> 4];
            out += digits[mac[i] & 15];
        }
        return out;
    }

private:
    using tcp = boost::asio::ip::tcp;

    void open() {
        acceptor_.open(tcp::v4());
        acceptor_.set_option(tcp::acceptor::reuse_address(true));
        acceptor_.bind(tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), port_));
        acceptor_.listen();
        acceptor_.non_blocking(true);
        // Never inherited by a process started later (an imserver): it would
        // keep the port listening after down().
        ::fcntl(acceptor_.native_handle(), F_SETFD, FD_CLOEXEC);
    }

    bool stopping() {
        std::lock_guard lk(mu_);
        return stop_;
    }

    // The accept loop: non-blocking accepts every 2 ms, so down()/up() and
    // the destructor take effect without cancelling a blocked call.
    void run() {
        while (!stopping()) {
            if (!want_up_ && acceptor_.is_open()) acceptor_.close();
            if (want_up_ && !acceptor_.is_open()) {
                boost::system::error_code ec;
                try {
                    open();
                } catch (const std::exception&) {
                    acceptor_.close(ec); // port busy a moment: try again
                }
            }
            if (acceptor_.is_open()) {
                boost::system::error_code ec;
                tcp::socket s(ioc_);
                acceptor_.accept(s, ec);
                if (!ec) {
                    s.non_blocking(false);
                    ::fcntl(s.native_handle(), F_SETFD, FD_CLOEXEC);
                    conns_.emplace_back([this, sock = std::move(s)]() mutable { serve(std::move(sock)); });
                    continue;
                }
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
    }

    void serve(tcp::socket sock) {
        namespace http = boost::beast::http;
        namespace json = boost::json;
        boost::system::error_code ec;
        boost::beast::flat_buffer buf;
        http::request<http::string_body> req;
        http::read(sock, buf, req, ec);
        if (ec) return;
        ++requests_;
        Mode m;
        {
            std::unique_lock lk(mu_);
            m = mode_;
            if (m == Mode::hold) {
                ++held_;
                cv_.wait(lk, [&] { return stop_ || mode_ != Mode::hold; });
                --held_;
                if (stop_) return;
                m = mode_;
            }
        }
        http::response<http::string_body> res{m == Mode::ok ? http::status::ok : http::status::internal_server_error, 11};
        res.set(http::field::content_type, "text/plain");
        res.body() = m == Mode::ok ? "ok" : "failing on purpose";
        res.prepare_payload();
        if (m == Mode::ok) {
            const std::string ts(req["X-Im-Timestamp"]), sig(req["X-Im-Signature"]);
            const std::string want = sign(secret_, ts, req.body());
            if (sig.size() != want.size() || CRYPTO_memcmp(sig.data(), want.data(), want.size()) != 0) {
                ++bad_signatures_;
                res.result(http::status::unauthorized);
            } else {
                auto body = json::parse(req.body()).as_object();
                const std::int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                                std::chrono::system_clock::now().time_since_epoch()).count();
                std::lock_guard lk(mu_);
                std::set<std::string> convs;
                for (const auto& e : body.at("events").as_array()) {
                    const auto& o = e.as_object();
                    Accepted a;
                    a.id = std::string(o.at("id").as_string());
                    a.ev = o.at("ev").as_object();
                    a.conv = std::string(a.ev.at("conv").as_string());
                    a.kind = std::string(a.ev.at("kind").as_string());
                    a.seq = a.ev.at("seq").as_int64();
                    a.arrived_ms = now_ms;
                    convs.insert(a.conv);
                    accepted_.push_back(std::move(a));
                }
                batches_.push_back({body.at("events").as_array().size(), convs.size()});
            }
        }
        http::write(sock, res, ec);
        sock.shutdown(tcp::socket::shutdown_both, ec);
    }

    std::string secret_;
    boost::asio::io_context ioc_;
    tcp::acceptor acceptor_{ioc_};
    unsigned short port_ = 0;
    std::atomic<bool> want_up_{true};
    mutable std::mutex mu_;
    std::condition_variable cv_;
    bool stop_ = false;
    Mode mode_ = Mode::ok;
    std::vector<Accepted> accepted_;
    std::vector<Batch> batches_;
    std::atomic<int> requests_{0}, bad_signatures_{0}, held_{0};
    std::thread thread_;
    std::vector<std::thread> conns_; // the accept thread's only
};

} // namespace im::test
