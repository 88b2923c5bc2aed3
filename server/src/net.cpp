#include "net.hpp"

#include "log.hpp"
#include "migrations.hpp"

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>

#include <chrono>
#include <deque>

namespace im {

namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using tcp = net::ip::tcp;

namespace {

void fail(beast::error_code ec, const char* what) {
    if (ec == net::error::operation_aborted || ec == websocket::error::closed || ec == http::error::end_of_stream ||
        ec == net::error::eof || ec == beast::error::timeout || ec == net::error::connection_reset)
        return;
    log_info("conn_error", {{"op", what}, {"err", ec.message()}});
}

} // namespace

// ======================================================================
// WebSocket session: one strand, one read and one write in flight, a FIFO
// of outgoing frames, requests handled one at a time in arrival order.
// ======================================================================

class WsSession : public std::enable_shared_from_this<WsSession> {
public:
    WsSession(tcp::socket&& socket, std::shared_ptr<Gateway> gw)
        : ws_(std::move(socket)), gw_(std::move(gw)), ping_timer_(ws_.get_executor()) {}

    void run(http::request<http::string_body> req) {
        // Beast times the handshake and the close; liveness is ours (see
        // tick()): Beast's own idle timer is re-armed only when the app starts
        // a read, so a quiet peer that answers every ping would still be cut.
        websocket::stream_base::timeout opt{std::chrono::seconds(30), websocket::stream_base::none(), false};
        ws_.set_option(opt);
        ws_.control_callback([this](websocket::frame_type, beast::string_view) { last_rx_ = Clock::now(); });
        ws_.read_message_max(max_frame_bytes);
        ws_.set_option(websocket::stream_base::decorator(
            [](websocket::response_type& res) { res.set(http::field::server, "imserver"); }));
        ws_.async_accept(req, beast::bind_front_handler(&WsSession::on_accept, shared_from_this()));
    }

    /// Queue a (shared) frame from any thread.
    void post_frame(std::shared_ptr<const std::string> frame) {
        net::post(ws_.get_executor(), [self = shared_from_this(), f = std::move(frame)]() mutable {
            self->send(std::move(f));
        });
    }

    void post_goaway() {
        net::post(ws_.get_executor(), [self = shared_from_this()] { self->goaway(); });
    }

    const std::optional<Identity>& identity() const { return who_; }
    std::string device() const { return who_ ? who_->device : std::string(); }

private:
    struct Pending {
        std::optional<std::string> rid;
        std::string type;
        Request req;
        std::chrono::steady_clock::time_point received;
    };

    void on_accept(beast::error_code ec) {
        if (ec) return fail(ec, "ws_accept");
        gw_->session_opened(shared_from_this());
        opened_ = true;
        last_rx_ = last_ping_ = Clock::now();
        schedule_tick();
        do_read();
    }

    // Every tick: ping when a ping period has passed, and close a connection
    // from which nothing (no frame, no pong) came for the idle timeout.
    void schedule_tick() {
        const auto& cfg = gw_->config();
        auto tick = std::chrono::milliseconds(std::max(50, std::min(cfg.ping_interval_ms, cfg.idle_timeout_ms / 4)));
        ping_timer_.expires_after(tick);
        ping_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
            if (ec || self->closed_) return;
            self->tick();
        });
    }

    void tick() {
        const auto& cfg = gw_->config();
        const auto now = Clock::now();
        if (now - last_rx_ >= std::chrono::milliseconds(cfg.idle_timeout_ms)) {
            log_info("idle_closed");
            beast::error_code ignored;
            beast::get_lowest_layer(ws_).socket().close(ignored); // the pending read fails: shutdown()
            return;
        }
        if (!pinging_ && now - last_ping_ >= std::chrono::milliseconds(cfg.ping_interval_ms)) {
            pinging_ = true;
            last_ping_ = now;
            ws_.async_ping({}, [self = shared_from_this()](beast::error_code ec) {
                self->pinging_ = false;
                if (ec) fail(ec, "ping");
            });
        }
        schedule_tick();
    }

    void do_read() {
        if (reading_ || closed_ || close_requested_) return;
        reading_ = true;
        ws_.async_read(buffer_, beast::bind_front_handler(&WsSession::on_read, shared_from_this()));
    }

    void on_read(beast::error_code ec, std::size_t) {
        reading_ = false;
        last_rx_ = Clock::now();
        if (ec) {
            // message_too_big: Beast has already sent close 1009.
            fail(ec, "ws_read");
            return shutdown();
        }
        if (!ws_.got_text()) {
            buffer_.consume(buffer_.size());
            return close(websocket::close_code::unknown_data); // 1003
        }
        std::string text = beast::buffers_to_string(buffer_.data());
        buffer_.consume(buffer_.size());
        // A large frame grew the buffer: give the memory back, idle
        // connections must stay cheap.
        if (buffer_.capacity() > 4096) buffer_.shrink_to_fit();
        on_frame(text);
        if (queue_.size() < max_queued_) do_read(); // else resumed as the queue drains
    }

    void on_frame(const std::string& text) {
        Parsed p = parse_request(text);
        if (auto* e = std::get_if<Error>(&p.body)) {
            gw_->metrics().count_request(p.type.empty() ? "invalid" : p.type, code_name(e->code));
            return send(encode_error(*e, p.rid));
        }
        queue_.push_back(Pending{p.rid, p.type, std::get<Request>(std::move(p.body)), std::chrono::steady_clock::now()});
        next();
    }

    void next() {
        if (busy_ || queue_.empty() || closed_) return;
        Pending item = std::move(queue_.front());
        queue_.pop_front();
        if (!reading_ && queue_.size() < max_queued_ / 2) do_read();

        if (gw_->draining()) return finish(item, error_reply(unavailable("gateway is draining; reconnect"), item.rid));
        if (std::holds_alternative<req::Hello>(item.req)) {
            if (who_) return finish(item, error_reply(invalid("already authenticated"), item.rid));
        } else if (!who_) {
            Handled h = error_reply({Code::unauthenticated, "send hello first"}, item.rid);
            h.close_after = false; // only a failed hello closes the connection
            return finish(item, std::move(h));
        }
        if (std::holds_alternative<req::Sub>(item.req)) {
            gw_->subscribe(who_->user, shared_from_this());
            subscribed_ = true;
            Handled h;
            h.frame = encode_reply(Subscribed{}, item.rid);
            return finish(item, std::move(h));
        }
        // A run of sends to one conversation goes to the database as one
        // transaction (one lock, one commit), each judged on its own, in order.
        auto batch = std::make_shared<std::vector<Pending>>();
        batch->push_back(std::move(item));
        if (const auto* first = std::get_if<req::Send>(&batch->front().req)) {
            while (!queue_.empty() && batch->size() < max_send_batch_) {
                const auto* s = std::get_if<req::Send>(&queue_.front().req);
                if (!s || s->conv != first->conv) break;
                batch->push_back(std::move(queue_.front()));
                queue_.pop_front();
            }
        }
        if (std::holds_alternative<req::Send>(batch->front().req)) ++gw_->metrics().send_transactions;
        busy_ = true;
        auto self = shared_from_this();
        auto who = who_;
        bool queued = gw_->pool().submit([self, who, batch](pqxx::connection_base* c) {
            std::vector<Handled> hs;
            if (std::holds_alternative<req::Send>(batch->front().req)) {
                std::vector<req::Send> sends;
                std::vector<std::optional<std::string>> rids;
                for (const auto& p : *batch) {
                    sends.push_back(std::get<req::Send>(p.req));
                    rids.push_back(p.rid);
                }
                hs = handle_send_batch(self->gw_->api(), c, *who, sends, rids);
            } else {
                hs.push_back(handle_request(self->gw_->api(), c, who, batch->front().req, batch->front().rid));
            }
            net::post(self->ws_.get_executor(), [self, batch, hs = std::move(hs)]() mutable {
                self->busy_ = false;
                for (std::size_t i = 0; i < hs.size(); ++i)
                    if (!self->deliver((*batch)[i], std::move(hs[i]))) return;
                self->after_reply();
            });
        });
        if (!queued) {
            busy_ = false;
            for (auto& p : *batch)
                if (!deliver(p, error_reply(unavailable("server busy, retry with the same request"), p.rid))) return;
            after_reply();
        }
        if (!reading_ && queue_.size() < max_queued_ / 2) do_read();
    }

    // Writes one reply; false when the connection is closing because of it.
    bool deliver(const Pending& item, Handled h) {
        gw_->metrics().count_request(item.type, h.code);
        if (item.type == "send")
            gw_->metrics().observe_send_seconds(
                std::chrono::duration<double>(std::chrono::steady_clock::now() - item.received).count());
        if (h.identity) {
            who_ = std::move(h.identity);
            log_info("hello", {{"user", who_->user}, {"device", who_->device}});
        }
        if (!h.frame.empty()) send(std::move(h.frame));
        if (h.close_after) {
            close(websocket::close_code::policy_error);
            return false;
        }
        return true;
    }

    void after_reply() {
        if (draining_ && queue_.empty() && !busy_) return close(websocket::close_code::going_away);
        next();
    }

    void finish(const Pending& item, Handled h) {
        if (deliver(item, std::move(h))) after_reply();
    }

    void send(std::string frame) { send(std::make_shared<const std::string>(std::move(frame))); }

    void send(std::shared_ptr<const std::string> frame) {
        if (closed_ || close_requested_) return;
        if (out_.size() >= max_outgoing_) {
            // A client that stopped reading: drop it rather than buffer
            // without bound. It resyncs from its cursor when it reconnects.
            log_warn("slow_consumer_closed", {{"queued", static_cast<long>(out_.size())}});
            out_.erase(out_.begin() + 1, out_.end()); // the front is being written
            return close(websocket::close_code::try_again_later); // 1013
        }
        out_.push_back(std::move(frame));
        if (out_.size() == 1) do_write();
    }

    void do_write() {
        ws_.text(true);
        ws_.async_write(net::buffer(*out_.front()),
                        beast::bind_front_handler(&WsSession::on_write, shared_from_this()));
    }

    void on_write(beast::error_code ec, std::size_t) {
        if (ec) {
            fail(ec, "ws_write");
            return shutdown();
        }
        out_.pop_front();
        if (!out_.empty()) return do_write();
        if (close_requested_) do_close();
    }

    void goaway() {
        if (closed_ || draining_) return;
        draining_ = true;
        send(encode_goaway("shutdown", 1000));
        if (queue_.empty() && !busy_) close(websocket::close_code::going_away);
    }

    // Close after the queued frames are written.
    void close(websocket::close_code code) {
        if (closed_ || close_requested_) return;
        close_requested_ = true;
        close_code_ = code;
        if (out_.empty()) do_close();
    }

    void do_close() {
        ws_.async_close(close_code_, [self = shared_from_this()](beast::error_code ec) {
            if (ec) fail(ec, "ws_close");
            self->shutdown();
        });
    }

    void shutdown() {
        if (closed_) return;
        closed_ = true;
        ping_timer_.cancel();
        queue_.clear();
        if (opened_) gw_->session_closed(this, subscribed_ ? who_->user : std::string());
    }

    static constexpr std::size_t max_queued_ = 64;        // requests read ahead
    static constexpr std::size_t max_send_batch_ = 64;    // sends per transaction
    static constexpr std::size_t max_outgoing_ = 10000;   // frames waiting to be written

    websocket::stream<beast::tcp_stream> ws_;
    beast::flat_buffer buffer_;
    std::shared_ptr<Gateway> gw_;
    net::steady_timer ping_timer_;
    std::deque<std::shared_ptr<const std::string>> out_;
    std::deque<Pending> queue_;
    std::optional<Identity> who_;
    websocket::close_code close_code_ = websocket::close_code::normal;
    using Clock = std::chrono::steady_clock;
    Clock::time_point last_rx_{}, last_ping_{};
    bool opened_ = false, reading_ = false, busy_ = false, pinging_ = false, subscribed_ = false;
    bool draining_ = false, close_requested_ = false, closed_ = false;
};

// ======================================================================
// HTTP session: /healthz, /readyz, /metrics, the lab endpoint (only with
// --enable-faults), and the upgrade to /v1/ws.
// ======================================================================

class HttpSession : public std::enable_shared_from_this<HttpSession> {
public:
    HttpSession(tcp::socket&& socket, std::shared_ptr<Gateway> gw) : stream_(std::move(socket)), gw_(std::move(gw)) {}

    void run() {
        net::dispatch(stream_.get_executor(), beast::bind_front_handler(&HttpSession::do_read, shared_from_this()));
    }

private:
    void do_read() {
        parser_.emplace();
        parser_->body_limit(8 * 1024);
        stream_.expires_after(std::chrono::seconds(30));
        http::async_read(stream_, buffer_, *parser_, beast::bind_front_handler(&HttpSession::on_read, shared_from_this()));
    }

    void on_read(beast::error_code ec, std::size_t) {
        if (ec) return fail(ec, "http_read");
        auto req = parser_->release();
        if (websocket::is_upgrade(req)) {
            if (req.target() != "/v1/ws" || gw_->draining()) return respond(req, http::status::not_found, "not found\n");
            stream_.expires_never();
            std::make_shared<WsSession>(stream_.release_socket(), gw_)->run(std::move(req));
            return;
        }
        auto target = std::string(req.target());
        if (req.method() == http::verb::get && target == "/healthz") return respond(req, http::status::ok, "ok\n");
        if (req.method() == http::verb::get && target == "/metrics") {
            auto& p = gw_->pool();
            return respond(req, http::status::ok, gw_->metrics().render(p.in_use(), p.size(), p.queued()),
                           "text/plain; version=0.0.4");
        }
        if (req.method() == http::verb::get && target == "/readyz") return readyz(std::move(req));
        if (gw_->faults().enabled() && target == "/lab/fault" && req.method() == http::verb::post) {
            std::string spec = req.body();
            while (!spec.empty() && (spec.back() == '\n' || spec.back() == '\r' || spec.back() == ' ')) spec.pop_back();
            if (spec == "off") {
                gw_->faults().clear();
                return respond(req, http::status::ok, "cleared\n");
            }
            if (auto e = gw_->faults().arm(spec)) return respond(req, http::status::bad_request, *e + "\n");
            log_warn("fault_armed", {{"spec", spec}});
            return respond(req, http::status::ok, "armed\n");
        }
        respond(req, http::status::not_found, "not found\n");
    }

    void readyz(http::request<http::string_body> req) {
        auto self = shared_from_this();
        auto shared_req = std::make_shared<http::request<http::string_body>>(std::move(req));
        bool ok = gw_->pool().submit([self, shared_req](pqxx::connection_base* c) {
            bool ready = false;
            if (c) {
                try {
                    ready = self->gw_->api().store.ping(*c) && migrations_current(*c);
                } catch (const std::exception&) {
                    ready = false;
                }
            }
            net::post(self->stream_.get_executor(), [self, shared_req, ready] {
                if (ready) self->respond(*shared_req, http::status::ok, "ready\n");
                else self->respond(*shared_req, http::status::service_unavailable, "database unavailable\n");
            });
        });
        if (!ok) respond(*shared_req, http::status::service_unavailable, "busy\n");
    }

    void respond(const http::request<http::string_body>& req, http::status status, std::string body,
                 const char* type = "text/plain") {
        auto res = std::make_shared<http::response<http::string_body>>(status, req.version());
        res->set(http::field::server, "imserver");
        res->set(http::field::content_type, type);
        res->keep_alive(req.keep_alive());
        res->body() = std::move(body);
        res->prepare_payload();
        http::async_write(stream_, *res, [self = shared_from_this(), res](beast::error_code ec, std::size_t) {
            if (ec) return fail(ec, "http_write");
            if (!res->keep_alive()) {
                beast::error_code ignored;
                self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
                return;
            }
            self->do_read();
        });
    }

    beast::tcp_stream stream_;
    beast::flat_buffer buffer_;
    std::optional<http::request_parser<http::string_body>> parser_;
    std::shared_ptr<Gateway> gw_;
};

// ======================================================================
// Gateway
// ======================================================================

Gateway::Gateway(net::io_context& ioc, const Config& cfg, DbPool& pool, Store& store, Metrics& metrics,
                 FaultRegistry& faults)
    : ioc_(ioc), cfg_(cfg), pool_(pool), metrics_(metrics), faults_(faults), api_{store, faults, cfg.gateway_id, nullptr, {}},
      acceptor_(net::make_strand(ioc)) {}

unsigned short Gateway::listen() {
    auto addr = net::ip::make_address(cfg_.listen_host);
    tcp::endpoint ep{addr, cfg_.listen_port};
    acceptor_.open(ep.protocol());
    acceptor_.set_option(net::socket_base::reuse_address(true));
    acceptor_.bind(ep);
    acceptor_.listen(net::socket_base::max_listen_connections);
    do_accept();
    return acceptor_.local_endpoint().port();
}

void Gateway::do_accept() {
    acceptor_.async_accept(net::make_strand(ioc_), [self = shared_from_this()](beast::error_code ec, tcp::socket s) {
        if (ec) {
            if (ec != net::error::operation_aborted) fail(ec, "accept");
            if (!self->acceptor_.is_open()) return;
        } else {
            // A send puts two small frames on the sender's socket (its own
            // pushed event and the reply): without this the second waits for
            // the client's delayed ACK.
            beast::error_code ignored;
            s.set_option(tcp::no_delay(true), ignored);
            std::make_shared<HttpSession>(std::move(s), self)->run();
        }
        if (!self->draining_) self->do_accept();
    });
}

void Gateway::drain(std::function<void()> done) {
    net::post(acceptor_.get_executor(), [self = shared_from_this(), done = std::move(done)]() mutable {
        if (self->draining_) return;
        self->draining_ = true;
        beast::error_code ec;
        self->acceptor_.close(ec);
        std::vector<std::shared_ptr<WsSession>> all;
        {
            std::lock_guard lk(self->mu_);
            for (auto& [p, w] : self->sessions_)
                if (auto s = w.lock()) all.push_back(s);
        }
        log_info("draining", {{"connections", static_cast<long>(all.size())}});
        for (auto& s : all) s->post_goaway();
        auto timer = std::make_shared<net::steady_timer>(self->ioc_);
        auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(self->cfg_.drain_timeout_ms);
        auto poll = std::make_shared<std::function<void()>>();
        *poll = [self, timer, deadline, done, poll]() {
            bool empty;
            {
                std::lock_guard lk(self->mu_);
                empty = self->sessions_.empty();
            }
            if (empty || std::chrono::steady_clock::now() >= deadline) {
                done();
                *poll = nullptr; // break the cycle
                return;
            }
            timer->expires_after(std::chrono::milliseconds(20));
            timer->async_wait([poll](beast::error_code) {
                if (*poll) (*poll)();
            });
        };
        (*poll)();
    });
}

void Gateway::session_opened(const std::shared_ptr<WsSession>& s) {
    ++metrics_.connections;
    ++metrics_.connections_total;
    std::lock_guard lk(mu_);
    sessions_[s.get()] = s;
}

void Gateway::session_closed(WsSession* s, const std::string& user) {
    --metrics_.connections;
    std::lock_guard lk(mu_);
    sessions_.erase(s);
    if (user.empty()) return;
    auto it = subscribers_.find(user);
    if (it == subscribers_.end()) return;
    it->second.erase(s);
    if (it->second.empty()) subscribers_.erase(it);
}

void Gateway::subscribe(const std::string& user, const std::shared_ptr<WsSession>& s) {
    std::lock_guard lk(mu_);
    subscribers_[user][s.get()] = s;
}

void Gateway::push_to_user(const std::string& user, const std::shared_ptr<const std::string>& frame,
                           const std::string& skip_device) {
    std::vector<std::shared_ptr<WsSession>> targets;
    {
        std::lock_guard lk(mu_);
        auto it = subscribers_.find(user);
        if (it == subscribers_.end()) return;
        for (auto& [p, w] : it->second)
            if (auto s = w.lock()) targets.push_back(s);
    }
    for (auto& s : targets) {
        if (!skip_device.empty() && s->device() == skip_device) continue;
        s->post_frame(frame);
    }
}

bool Gateway::has_subscribers(const std::string& user) const {
    std::lock_guard lk(mu_);
    return subscribers_.count(user) > 0;
}

bool Gateway::has_any_subscriber() const {
    std::lock_guard lk(mu_);
    return !subscribers_.empty();
}

void Gateway::resync_all() {
    std::vector<std::shared_ptr<WsSession>> targets;
    {
        std::lock_guard lk(mu_);
        for (auto& [u, m] : subscribers_)
            for (auto& [p, w] : m)
                if (auto s = w.lock()) targets.push_back(s);
    }
    auto frame = std::make_shared<const std::string>(encode_resync());
    for (auto& s : targets) {
        s->post_frame(frame);
        ++metrics_.pushes_resync;
    }
    log_info("resync_sent", {{"connections", static_cast<long>(targets.size())}});
}

} // namespace im
