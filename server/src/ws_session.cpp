#include "ws_session.hpp"

#include "gateway.hpp"
#include "log.hpp"

#include <algorithm>
#include <chrono>

namespace im {

WsSession::WsSession(tcp::socket&& socket, std::shared_ptr<Gateway> gw)
    : ws_(std::move(socket)), gw_(std::move(gw)), ping_timer_(ws_.get_executor()) {}

void WsSession::run(http::request<http::string_body> req) {
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

void WsSession::post_frame(std::string frame) {
    net::post(ws_.get_executor(), [self = shared_from_this(), f = std::move(frame)]() mutable {
        self->send(std::move(f));
    });
}

void WsSession::post_goaway() {
    net::post(ws_.get_executor(), [self = shared_from_this()] { self->goaway(); });
}

void WsSession::on_accept(beast::error_code ec) {
    if (ec) return fail(ec, "ws_accept");
    gw_->session_opened(shared_from_this());
    opened_ = true;
    last_rx_ = last_ping_ = Clock::now();
    schedule_tick();
    do_read();
}

// Every tick: ping when a ping period has passed, and close a connection
// from which nothing (no frame, no pong) came for the idle timeout.
void WsSession::schedule_tick() {
    const auto& cfg = gw_->config();
    auto tick = std::chrono::milliseconds(std::max(50, std::min(cfg.ping_interval_ms, cfg.idle_timeout_ms / 4)));
    ping_timer_.expires_after(tick);
    ping_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
        if (ec || self->closed_) return;
        self->tick();
    });
}

void WsSession::tick() {
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

void WsSession::do_read() {
    if (reading_ || closed_ || close_requested_) return;
    reading_ = true;
    ws_.async_read(buffer_, beast::bind_front_handler(&WsSession::on_read, shared_from_this()));
}

void WsSession::on_read(beast::error_code ec, std::size_t) {
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
    on_frame(text);
    if (queue_.size() < max_queued_) do_read(); // else resumed as the queue drains
}

void WsSession::on_frame(const std::string& text) {
    Parsed p = parse_request(text);
    if (auto* e = std::get_if<Error>(&p.body)) {
        gw_->metrics().count_request(p.type.empty() ? "invalid" : p.type, code_name(e->code));
        return send(encode_error(*e, p.rid));
    }
    queue_.push_back(Pending{p.rid, p.type, std::get<Request>(std::move(p.body)), std::chrono::steady_clock::now()});
    next();
}

void WsSession::next() {
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
bool WsSession::deliver(const Pending& item, Handled h) {
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

void WsSession::after_reply() {
    if (draining_ && queue_.empty() && !busy_) return close(websocket::close_code::going_away);
    next();
}

void WsSession::finish(const Pending& item, Handled h) {
    if (deliver(item, std::move(h))) after_reply();
}

void WsSession::send(std::string frame) {
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

void WsSession::do_write() {
    ws_.text(true);
    ws_.async_write(net::buffer(out_.front()),
                    beast::bind_front_handler(&WsSession::on_write, shared_from_this()));
}

void WsSession::on_write(beast::error_code ec, std::size_t) {
    if (ec) {
        fail(ec, "ws_write");
        return shutdown();
    }
    out_.pop_front();
    if (!out_.empty()) return do_write();
    if (close_requested_) do_close();
}

void WsSession::goaway() {
    if (closed_ || draining_) return;
    draining_ = true;
    send(encode_goaway("shutdown", 1000));
    if (queue_.empty() && !busy_) close(websocket::close_code::going_away);
}

// Close after the queued frames are written.
void WsSession::close(websocket::close_code code) {
    if (closed_ || close_requested_) return;
    close_requested_ = true;
    close_code_ = code;
    if (out_.empty()) do_close();
}

void WsSession::do_close() {
    ws_.async_close(close_code_, [self = shared_from_this()](beast::error_code ec) {
        if (ec) fail(ec, "ws_close");
        self->shutdown();
    });
}

void WsSession::shutdown() {
    if (closed_) return;
    closed_ = true;
    ping_timer_.cancel();
    queue_.clear();
    if (opened_) gw_->session_closed(this);
}

} // namespace im
