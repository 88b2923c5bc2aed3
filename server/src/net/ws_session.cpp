#include "net/ws_session.hpp"

#include "net/gateway.hpp"
#include "core/log.hpp"

#include <algorithm>
#include <chrono>
#include <limits>

namespace im {

WsSession::WsSession(tcp::socket&& socket, std::shared_ptr<Gateway> gw, ClientAddress client)
    : ws_(make_ws_stream(std::move(socket))), gw_(std::move(gw)),
      ping_timer_(executor()), token_timer_(executor()), client_(std::move(client)) {}

WsSession::WsSession(tls_stream&& stream, std::shared_ptr<ssl::context> tls, std::shared_ptr<Gateway> gw,
                     ClientAddress client)
    : tls_(std::move(tls)), ws_(make_ws_stream(std::move(stream))),
      gw_(std::move(gw)), ping_timer_(executor()), token_timer_(executor()), client_(std::move(client)) {}

WsSession::~WsSession() {
    if (admitted_) gw_->release(client_.address);
    gw_->metrics().unsent_bytes -= static_cast<long long>(out_bytes_);
    gw_->buffered(-held_.load());
}

void WsSession::hold(std::size_t n) {
    held_ += static_cast<long long>(n);
    gw_->buffered(static_cast<long long>(n));
    if (gw_->budget_reached()) gw_->shed_soon();
}

void WsSession::unhold(std::size_t n) {
    if (n == 0) return;
    held_ -= static_cast<long long>(n);
    gw_->buffered(-static_cast<long long>(n));
}

// Drops the queued requests (unanswered) and gives their bytes back.
void WsSession::clear_queue() {
    std::size_t n = 0;
    for (const auto& p : queue_) n += p.bytes;
    queue_.clear();
    unhold(n);
}

void WsSession::post_shed() {
    net::post(executor(), [self = shared_from_this()] { self->shed(); });
}

void WsSession::post_budget_resume() {
    net::post(executor(), [self = shared_from_this()] {
        self->budget_wait_ = false;
        self->do_read();
    });
}

// The process-wide buffer budget is reached and this connection is among
// the biggest holders: its queued requests (unanswered: the client resends
// them with the same keys) and unsent output go, and it closes with 1013.
void WsSession::shed() {
    if (closed_ || close_requested_) return;
    ++gw_->metrics().buffered_budget_closes;
    log_warn("buffer_budget_closed", {{"held", static_cast<long>(held_.load())}});
    drop_unsent();
    clear_queue();
    close({websocket::close_code::try_again_later, "server buffer budget"}); // 1013
}

void WsSession::run(http::request<http::string_body> req) {
    // Liveness is ours (see tick()): every control frame counts as traffic.
    ws_->configure(max_frame_bytes, [this] { last_rx_ = Clock::now(); });
    // A connection over a cap is told so in a close frame (1013) once the
    // handshake is done, rather than with a bare reset.
    reject_ = gw_->admit(client_.address);
    admitted_ = !reject_;
    ws_->async_accept(req, beast::bind_front_handler(&WsSession::on_accept, shared_from_this()));
}

void WsSession::post_frame(std::shared_ptr<const std::string> frame) {
    net::post(executor(), [self = shared_from_this(), f = std::move(frame)]() mutable {
        self->send(std::move(f));
    });
}

void WsSession::post_goaway() {
    net::post(executor(), [self = shared_from_this()] { self->goaway(); });
}

void WsSession::post_revoked(std::string device, std::string token_sha256) {
    net::post(executor(), [self = shared_from_this(), d = std::move(device), h = std::move(token_sha256)] {
        self->revoked(d, h);
    });
}

// The device lost its access (revoked, or a new token): nothing more is
// read or written for it. Requests still queued are answered
// UNAUTHENTICATED, unsent pushes are dropped, and the connection closes with
// 1008 at once, even with a request in the database: that request either
// committed before the revocation (the database orders them, im_send),
// and a resend with a valid token finds it as a duplicate, or it is refused
// there. Its reply, if it comes, is not written.
void WsSession::revoked(const std::string& device, const std::string& token_sha256) {
    if (!who_ || who_->device != device || revoked_ || closed_) return;
    if (!token_sha256.empty() && who_->token_sha256 != token_sha256) return; // a newer token's connection
    revoked_ = true;
    ++gw_->metrics().revoked_closes;
    log_info("revoked_closed", {{"device", device}});
    drop_unsent();
    for (auto& p : queue_) {
        gw_->metrics().count_request(p.type, code_name(Code::unauthenticated));
        send(encode_error(device_revoked(), p.rid));
    }
    clear_queue();
    close({websocket::close_code::policy_error, "device revoked"});
}

namespace {
std::int64_t system_now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}
constexpr std::int64_t token_warning_ms = 60000; // token_expiring this long before exp
} // namespace

// A JWT connection (re)armed with its token's exp: token_expiring once,
// 60 s before exp (at once if less is left), then close 4001 at exp. The
// exp is wall-clock time (the backend's); the timer re-checks the wall
// clock when it fires and waits again if it fired early.
void WsSession::arm_token_timer() {
    token_warned_ = false;
    wait_token_timer(++token_gen_);
}

void WsSession::wait_token_timer(std::uint64_t gen) {
    const std::int64_t left = who_->token_exp_ms - system_now_ms();
    const std::int64_t wait = token_warned_ ? left : left - token_warning_ms;
    // At most an hour per wait (a far exp must not overflow the timer); it re-checks then.
    token_timer_.expires_after(std::chrono::milliseconds(std::clamp<std::int64_t>(wait, 0, 3600000)));
    token_timer_.async_wait([self = shared_from_this(), gen](beast::error_code ec) {
        if (ec || gen != self->token_gen_) return; // cancelled or re-armed by a refresh
        self->on_token_timer(gen);
    });
}

void WsSession::on_token_timer(std::uint64_t gen) {
    if (closed_ || close_requested_ || revoked_ || expired_) return;
    if (token_past_exp()) return token_expired();
    if (!token_warned_ && system_now_ms() >= who_->token_exp_ms - token_warning_ms) {
        token_warned_ = true;
        send(encode_token_expiring(who_->token_exp_ms));
    }
    wait_token_timer(gen);
}

bool WsSession::token_past_exp() const { return who_ && who_->token_exp_ms && system_now_ms() >= who_->token_exp_ms; }

// The token reached exp unrefreshed: as for a revocation, nothing more is
// read or written for it; requests still queued are answered
// UNAUTHENTICATED and the connection closes with 4001.
void WsSession::token_expired() {
    if (expired_ || closed_) return;
    expired_ = true;
    ++gw_->metrics().jwt_expired_closes;
    log_info("token_expired_closed", {{"device", who_->device}});
    drop_unsent();
    for (auto& p : queue_) {
        gw_->metrics().count_request(p.type, code_name(Code::unauthenticated));
        send(encode_error({Code::unauthenticated, "token expired"}, p.rid));
    }
    clear_queue();
    websocket::close_reason reason;
    reason.code = 4001;
    reason.reason = "token expired";
    close(std::move(reason));
}

// refresh (section 4a, api.cpp handle_refresh): an accepted token moves
// the connection's exp.
Handled WsSession::refresh(const req::Refresh& r, const std::optional<std::string>& rid) {
    std::optional<std::int64_t> exp_ms;
    Handled h = handle_refresh(gw_->api(), refresh_budget_, *who_, r, rid, exp_ms);
    if (exp_ms) {
        who_->token_exp_ms = *exp_ms;
        arm_token_timer();
    }
    return h;
}

// Drops the frames not yet handed to the socket (the front one is).
void WsSession::drop_unsent() {
    if (out_.size() <= 1) return;
    std::size_t dropped = 0;
    for (auto it = out_.begin() + 1; it != out_.end(); ++it) dropped += (*it)->size();
    out_.erase(out_.begin() + 1, out_.end());
    out_bytes_ -= dropped;
    gw_->metrics().unsent_bytes -= static_cast<long long>(dropped);
    unhold(dropped);
}

void WsSession::on_accept(beast::error_code ec) {
    if (ec) return fail(ec, "ws_accept");
    if (reject_) {
        log_warn("connection_rejected", {{"address", client_.address}, {"proxy", proxy()}, {"reason", *reject_}});
        ws_->async_close({websocket::close_code::try_again_later, *reject_},
                         [self = shared_from_this()](beast::error_code cec) {
                             if (cec) fail(cec, "ws_close");
                         });
        return;
    }
    gw_->session_opened(shared_from_this());
    opened_ = true;
    last_rx_ = last_ping_ = opened_at_ = Clock::now();
    schedule_tick();
    do_read();
}

// Every tick: ping when a ping period has passed, and close a connection
// from which nothing (no frame, no pong) came for the idle timeout, that
// sent no hello in time, or whose current write is stuck. The timer wakes at
// the earliest of those deadlines (so a ping goes out every ping period, not
// at the next multiple of some shorter tick), and at least every quarter of
// the write timeout, since a write that starts later has its own deadline.
void WsSession::schedule_tick() {
    using std::chrono::milliseconds;
    const auto& cfg = gw_->config();
    const auto now = Clock::now();
    auto next = std::min(now + milliseconds(cfg.write_timeout_ms / 4), last_rx_ + milliseconds(cfg.idle_timeout_ms));
    if (writing_) next = std::min(next, write_started_ + milliseconds(cfg.write_timeout_ms));
    if (!who_ && !hello_pending_ && !close_requested_)
        next = std::min(next, opened_at_ + milliseconds(cfg.hello_timeout_ms));
    if (!pinging_) next = std::min(next, last_ping_ + milliseconds(cfg.ping_interval_ms));
    ping_timer_.expires_after(std::max<Clock::duration>(milliseconds(50), next - now));
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
        ws_->socket().close(ignored); // the pending read fails: shutdown()
        return;
    }
    if (writing_ && now - write_started_ >= std::chrono::milliseconds(cfg.write_timeout_ms)) {
        // The peer takes nothing: a close frame would never get through.
        ++gw_->metrics().write_timeouts;
        log_info("write_timeout_closed", {{"unsent", static_cast<long>(out_bytes_)}});
        beast::error_code ignored;
        ws_->socket().close(ignored);
        return;
    }
    // A hello read in time but still waiting for the database is not late:
    // its answer decides (the database timeout bounds the wait).
    if (!who_ && !hello_pending_ && !close_requested_ &&
        now - opened_at_ >= std::chrono::milliseconds(cfg.hello_timeout_ms)) {
        ++gw_->metrics().hello_timeouts;
        log_info("hello_timeout_closed");
        close({websocket::close_code::policy_error, "hello timeout"});
    }
    if (!pinging_ && now - last_ping_ >= std::chrono::milliseconds(cfg.ping_interval_ms)) {
        pinging_ = true;
        last_ping_ = now;
        ws_->async_ping([self = shared_from_this()](beast::error_code ec) {
            self->pinging_ = false;
            if (ec) fail(ec, "ping");
        });
    }
    schedule_tick();
}

// Reads the next request unless too many are waiting or too much output is
// unsent; resumes (with some slack) once the writes catch up.
void WsSession::do_read() {
    if (reading_ || closed_ || close_requested_ || revoked_ || expired_) return;
    const std::size_t high = gw_->config().max_unsent_bytes / 2;
    if (out_bytes_ >= high && !output_paused_) { // counted once per episode
        output_paused_ = true;
        ++gw_->metrics().read_pauses;
    }
    if (queue_.size() >= max_queued_ || out_bytes_ >= high) {
        read_paused_ = true;
        return;
    }
    if (read_paused_ && (queue_.size() >= max_queued_ / 2 || out_bytes_ > high / 2)) return;
    read_paused_ = output_paused_ = false;
    // The process-wide budget (--max-buffered-bytes): no more input while
    // it is reached; the gateway sheds the biggest holders and wakes us.
    if (budget_wait_) return;
    if (gw_->budget_reached()) {
        budget_wait_ = true;
        return gw_->wait_for_budget(shared_from_this());
    }
    reading_ = true;
    ws_->async_read(buffer_, beast::bind_front_handler(&WsSession::on_read, shared_from_this()));
}

void WsSession::on_read(beast::error_code ec, std::size_t) {
    reading_ = false;
    last_rx_ = Clock::now();
    if (ec) {
        // message_too_big: Beast has already sent close 1009.
        fail(ec, "ws_read");
        return shutdown();
    }
    if (!ws_->got_text()) {
        buffer_.consume(buffer_.size());
        return close(websocket::close_code::unknown_data); // 1003
    }
    std::string text = beast::buffers_to_string(buffer_.data());
    buffer_.consume(buffer_.size());
    // A large frame grew the buffer: give the memory back, idle connections
    // must stay cheap.
    if (buffer_.capacity() > 4096) buffer_.shrink_to_fit();
    if (close_requested_) return; // closing (shed, over a budget): nothing more is taken in
    on_frame(text);
    do_read(); // unless paused: then resumed as the queue and the output drain
}

namespace {
// Lab negative control only (rule.limits): the field bounds switched off, so
// the acceptance lab's 04-limits sees a server that takes over-limit values.
constexpr FieldBounds lab_unbounded{.min_cmid_chars = 0,
                                    .max_cmid_chars = std::numeric_limits<std::size_t>::max(),
                                    .min_body_code_points = 0,
                                    .max_body_code_points = std::numeric_limits<std::size_t>::max(),
                                    .min_limit = std::numeric_limits<std::int64_t>::min(),
                                    .min_after = std::numeric_limits<std::int64_t>::min()};
} // namespace

namespace {
// The writes --send-rate counts (server.md): send, edit, react.
bool limited_write(const Request& r) {
    return std::holds_alternative<req::Send>(r) || std::holds_alternative<req::Edit>(r) ||
           std::holds_alternative<req::React>(r);
}
// The writes that ride the send scheduler's runs (send_scheduler.hpp): a
// send, an edit, a react. An edit with an empty body is not one: it needs a
// lookup of its target first (Store::edit) and runs alone, as before.
const std::string* run_write_conv(const Request& r) {
    if (const auto* s = std::get_if<req::Send>(&r)) return &s->conv;
    if (const auto* e = std::get_if<req::Edit>(&r)) return e->body.empty() ? nullptr : &e->conv;
    if (const auto* x = std::get_if<req::React>(&r)) return &x->conv;
    return nullptr;
}
req::Write as_write(Request&& r) {
    if (auto* s = std::get_if<req::Send>(&r)) return std::move(*s);
    if (auto* e = std::get_if<req::Edit>(&r)) return std::move(*e);
    return std::get<req::React>(std::move(r));
}
} // namespace

void WsSession::on_frame(const std::string& text) {
    Parsed p = parse_request(text, gw_->faults().broken("rule.limits") ? lab_unbounded : contract_bounds);
    if (auto* e = std::get_if<Error>(&p.body)) {
        queue_.push_back(Pending{p.rid, p.type.empty() ? "invalid" : p.type, req::Sub{},
                                 std::chrono::steady_clock::now(), text.size(), *e, draining_});
    } else {
        queue_.push_back(Pending{p.rid, p.type, std::get<Request>(std::move(p.body)),
                                 std::chrono::steady_clock::now(), text.size(), std::nullopt, draining_});
    }
    hold(text.size());
    next();
}

void WsSession::next() {
    if (busy_ || queue_.empty() || closed_ || revoked_ || expired_) return;
    // A request taken after the token's exp (racing the timer) is answered
    // UNAUTHENTICATED with the rest of the queue and does nothing.
    if (token_past_exp()) return token_expired();
    Pending item = std::move(queue_.front());
    queue_.pop_front();
    do_read();

    if (item.refused) {
        // Contract 4: before a successful hello, any request but hello is
        // UNAUTHENTICATED, a malformed one of a known type too; a frame that
        // names no request type (not JSON, no or an unknown `t`) is not a
        // request and stays INVALID_ARGUMENT.
        const bool request = item.type != "invalid" && item.type != "other" && item.type != "hello";
        if (!who_ && request) {
            Handled h = error_reply({Code::unauthenticated, "send hello first"}, item.rid);
            h.close_after = false;
            return finish(item, std::move(h));
        }
        return finish(item, error_reply(*item.refused, item.rid));
    }
    // Draining (contract 7): what was read before this connection's goaway is
    // finished; what came after it is refused, retryable elsewhere.
    if (item.after_goaway) return finish(item, error_reply(unavailable("gateway is draining; reconnect"), item.rid));
    if (auto refused = out_of_order(who_, item.req, item.rid)) return finish(item, std::move(*refused));
    if (std::holds_alternative<req::Hello>(item.req)) {
        if (gw_->hello_limited(client_.address)) {
            // Too many failed hellos from this address this minute: no
            // database check, no token check; retryable later (UNAVAILABLE, 1013).
            ++gw_->metrics().hello_rate_limited;
            log_warn("hello_rate_limited", {{"address", client_.address}, {"proxy", proxy()}});
            Handled h = error_reply(unavailable("too many failed hellos from this address; retry later"), item.rid);
            unhold(item.bytes);
            if (!deliver(item, std::move(h))) return;
            return close({websocket::close_code::try_again_later, "too many failed hellos"});
        }
        hello_generation_ = gw_->resync_generation();
        hello_pending_ = true;
    }
    if (const auto* rf = std::get_if<req::Refresh>(&item.req)) return finish(item, refresh(*rf, item.rid));
    // --send-rate (server.md, "Rate limits and moderation"): in memory, before
    // any worker or statement; a limited write is answered at once, unwritten.
    // The lab's control rule.send_rate switches it off (14-rate-limited).
    if (limited_write(item.req) && !gw_->faults().broken("rule.send_rate")) {
        if (const auto wait_ms = gw_->write_limiter().take(who_->user)) {
            ++gw_->metrics().writes_rate_limited;
            return finish(item, error_reply({Code::rate_limited, "over the sender's rate; retry after retry_ms"},
                                            item.rid, wait_ms));
        }
    }
    if (std::holds_alternative<req::Sub>(item.req)) {
        gw_->subscribe(who_->user, shared_from_this());
        subscribed_ = true;
        Handled h;
        h.frame = encode_reply(Subscribed{}, item.rid);
        return finish(item, std::move(h));
    }
    // A run of writes (sends, edits, reacts) to one conversation goes to
    // the database as one transaction (one lock, one commit), each judged on
    // its own, in order.
    auto batch = std::make_shared<std::vector<Pending>>();
    batch->push_back(std::move(item));
    const bool run = run_write_conv(batch->front().req) != nullptr;
    if (run) {
        // A copy: push_back below may move batch's elements.
        const std::string conv = *run_write_conv(batch->front().req);
        while (!queue_.empty() && batch->size() < max_send_batch_) {
            const auto* c = run_write_conv(queue_.front().req);
            if (!c || *c != conv) break;
            // Each send of the run takes its own token; the first one over
            // the rate ends the run and is answered RATE_LIMITED on its turn.
            if (!gw_->faults().broken("rule.send_rate") && gw_->write_limiter().take(who_->user) != 0) break;
            batch->push_back(std::move(queue_.front()));
            queue_.pop_front();
        }
    }
    if (std::holds_alternative<req::Send>(batch->front().req)) ++gw_->metrics().send_transactions;
    busy_ = true;
    auto self = shared_from_this();
    auto who = who_;
    auto replies = [self, batch](std::vector<Handled> hs) {
        net::post(self->executor(), [self, batch, hs = std::move(hs)]() mutable {
            self->busy_ = false;
            std::size_t bytes = 0;
            for (const auto& p : *batch) bytes += p.bytes;
            self->unhold(bytes);
            for (std::size_t i = 0; i < hs.size(); ++i)
                if (!self->deliver((*batch)[i], std::move(hs[i]))) return;
            self->after_reply();
        });
    };
    bool queued;
    if (run) {
        std::vector<req::Write> writes;
        std::vector<std::optional<std::string>> rids;
        for (const auto& p : *batch) {
            writes.push_back(as_write(Request(p.req)));
            rids.push_back(p.rid);
        }
        // Group commit with other connections' writes when workers are busy;
        // the replies come once the events were handed to the bus.
        queued = gw_->sends().submit(*who, std::move(writes), std::move(rids), std::move(replies));
    } else {
        queued = gw_->pool().submit([self, who, batch, replies](pqxx::connection_base* c) {
            // The store on this worker's connection, for this request only
            // (the bus's callbacks never reach it); none: UNAVAILABLE.
            std::optional<PgSessionStore> db;
            if (c) db.emplace(self->gw_->api().store, *c);
            handle_request(self->gw_->api(), db ? &*db : nullptr, who, batch->front().req, batch->front().rid,
                           [replies](Handled h) { replies({std::move(h)}); });
        });
    }
    if (!queued) {
        busy_ = false;
        std::size_t bytes = 0;
        for (const auto& p : *batch) bytes += p.bytes;
        unhold(bytes);
        for (auto& p : *batch)
            if (!deliver(p, error_reply(unavailable("server busy, retry with the same request"), p.rid))) return;
        after_reply();
    }
    do_read();
}

// Writes one reply; false when the connection is closing because of it.
bool WsSession::deliver(const Pending& item, Handled h) {
    if (revoked_ || expired_) { // revoked or expired while this request ran: not written (closing)
        h = error_reply(revoked_ ? device_revoked() : Error{Code::unauthenticated, "token expired"}, item.rid);
        h.close_after = false;
    }
    if (h.code == "UNAVAILABLE" && gw_->faults().broken("rule.unavailable_terminal")) // lab negative control only
        h = error_reply(invalid("the database rejected this message (lab: rule.unavailable_terminal)"), item.rid);
    gw_->metrics().count_request(item.type, h.code);
    if (std::holds_alternative<req::Hello>(item.req)) {
        hello_pending_ = false;
        if (h.code == code_name(Code::unauthenticated)) gw_->hello_failed(client_.address);
    }
    if (item.type == "send" && !item.refused) {
        const auto now = std::chrono::steady_clock::now();
        gw_->metrics().observe_send_seconds(std::chrono::duration<double>(now - item.received).count());
        if (h.answered != std::chrono::steady_clock::time_point{})
            gw_->metrics().observe_send_stage(Metrics::SendStage::strand,
                                              std::chrono::duration<double>(now - h.answered).count());
    }
    // A connection that closed while its hello was in the database is gone:
    // nothing to authenticate (the gateway would track its token forever).
    if (h.identity && closed_) h.identity.reset();
    if (h.identity) {
        who_ = std::move(h.identity);
        gw_->authenticated(this, *who_, hello_generation_);
        log_info("hello", {{"user", who_->user}, {"device", who_->device}, {"auth", who_->token_exp_ms ? "jwt" : "token"}});
        if (who_->token_exp_ms) arm_token_timer();
    }
    if (h.watch) gw_->watch(shared_from_this(), std::move(*h.watch));
    if (!h.frame.empty()) send(std::move(h.frame));
    if (h.close_after) {
        close(websocket::close_code::policy_error);
        return false;
    }
    return true;
}

void WsSession::after_reply() {
    if (revoked_) return close({websocket::close_code::policy_error, "device revoked"});
    if (expired_) return; // token_expired() is closing it
    if (draining_ && queue_.empty() && !busy_) return close(websocket::close_code::going_away);
    next();
}

void WsSession::finish(const Pending& item, Handled h) {
    unhold(item.bytes);
    if (deliver(item, std::move(h))) after_reply();
}

void WsSession::send(std::string frame) { send(std::make_shared<const std::string>(std::move(frame))); }

void WsSession::send(std::shared_ptr<const std::string> frame) {
    if (closed_ || close_requested_) return;
    if (!out_.empty() && out_bytes_ + frame->size() > gw_->config().max_unsent_bytes) {
        // A client that stopped reading: drop it rather than buffer
        // without bound. It resyncs from its cursor when it reconnects.
        ++gw_->metrics().unsent_budget_closes;
        log_warn("slow_consumer_closed", {{"unsent", static_cast<long>(out_bytes_)}});
        drop_unsent();
        return close({websocket::close_code::try_again_later, "unsent output over budget"}); // 1013
    }
    out_bytes_ += frame->size();
    gw_->metrics().unsent_bytes += static_cast<long long>(frame->size());
    hold(frame->size());
    out_.push_back(std::move(frame));
    if (out_.size() == 1) do_write();
}

void WsSession::do_write() {
    writing_ = true;
    write_started_ = Clock::now();
    ws_->async_write_text(net::buffer(*out_.front()), beast::bind_front_handler(&WsSession::on_write, shared_from_this()));
}

void WsSession::on_write(beast::error_code ec, std::size_t) {
    writing_ = false;
    if (ec) {
        fail(ec, "ws_write");
        return shutdown();
    }
    out_bytes_ -= out_.front()->size();
    gw_->metrics().unsent_bytes -= static_cast<long long>(out_.front()->size());
    unhold(out_.front()->size());
    out_.pop_front();
    if (!out_.empty()) do_write();
    else if (close_requested_) return do_close();
    if (read_paused_) do_read();
}

void WsSession::goaway() {
    if (closed_ || draining_) return;
    draining_ = true;
    if (!gw_->faults().broken("rule.goaway")) send(encode_goaway("shutdown", 1000)); // else: lab negative control
    if (queue_.empty() && !busy_) close(websocket::close_code::going_away);
}

// Close after the queued frames are written.
void WsSession::close(websocket::close_reason reason) {
    if (closed_ || close_requested_) return;
    close_requested_ = true;
    close_reason_ = std::move(reason);
    if (out_.empty()) do_close();
}

void WsSession::do_close() {
    ws_->async_close(close_reason_, [self = shared_from_this()](beast::error_code ec) {
        if (ec) fail(ec, "ws_close");
        self->shutdown();
    });
}

void WsSession::shutdown() {
    if (closed_) return;
    closed_ = true;
    ping_timer_.cancel();
    token_timer_.cancel();
    clear_queue();
    if (opened_) gw_->session_closed(this, subscribed_ ? who_->user : std::string());
}

} // namespace im
