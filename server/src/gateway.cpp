#include "gateway.hpp"

#include "listener.hpp"
#include "log.hpp"
#include "tls.hpp"
#include "ws_session.hpp"

#include <chrono>
#include <set>

namespace im {

Gateway::Gateway(net::io_context& ioc, const Config& cfg, DbPool& pool, Store& store, Metrics& metrics,
                 FaultRegistry& faults, std::unique_ptr<jwt::Verifier> jwt)
    : ioc_(ioc), cfg_(cfg), pool_(pool), metrics_(metrics), faults_(faults), api_{store, faults, cfg.gateway_id, nullptr, {}},
      sends_(api_, pool, metrics, static_cast<std::size_t>(cfg.send_group_max),
             static_cast<std::size_t>(effective_send_workers(cfg)), cfg.db_queue, !cfg.lab.no_unique_index,
             std::chrono::milliseconds(cfg.db_timeout_ms)),
      jwt_(std::move(jwt)) {
    if (!cfg.tls_cert.empty()) {
        tls_ = std::make_shared<TlsContexts>(cfg.tls_cert, cfg.tls_key);
        log_info("tls_enabled", {{"cert", cfg.tls_cert}, {"certificate", tls_->describe()}});
    }
    if (jwt_) {
        api_.jwt = jwt_.get();
        log_info("jwt_enabled", {{"keys", jwt_->describe()}});
    }
}

void Gateway::reload_on_hup() {
    if (jwt_) {
        if (auto e = jwt_->reload()) {
            ++metrics_.jwt_reload_failures_total;
            log_error("jwt_reload_failed", {{"err", *e}, {"kept", jwt_->describe()}});
        } else {
            ++metrics_.jwt_reloads_total;
            log_info("jwt_reloaded", {{"keys", jwt_->describe()}});
        }
    }
    if (!tls_) {
        if (!jwt_) log_info("sighup_ignored", {{"reason", "no TLS or JWT keys configured"}});
        return;
    }
    if (auto e = tls_->reload()) {
        ++metrics_.tls_reload_failures_total;
        log_error("tls_reload_failed", {{"err", *e}, {"kept", tls_->describe()}});
        return;
    }
    ++metrics_.tls_reloads_total;
    log_info("tls_reloaded", {{"certificate", tls_->describe()}});
}

unsigned short Gateway::listen() {
    listener_ = std::make_shared<Listener>(ioc_, shared_from_this());
    return listener_->run(net::ip::make_address(cfg_.listen_host), cfg_.listen_port);
}

void Gateway::drain(std::function<void()> done) {
    net::post(listener_->executor(), [self = shared_from_this(), done = std::move(done)]() mutable {
        if (self->draining_) return;
        self->draining_ = true;
        self->listener_->close();
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
    authed_.erase(s);
    if (user.empty()) return;
    auto it = subscribers_.find(user);
    if (it == subscribers_.end()) return;
    it->second.erase(s);
    if (it->second.empty()) subscribers_.erase(it);
}

std::optional<std::string> Gateway::admit(const std::string& address) {
    std::lock_guard lk(mu_);
    if (admitted_ >= cfg_.max_connections) {
        ++metrics_.rejected_total_cap;
        return std::string("server full");
    }
    int& n = per_address_[address];
    if (n >= cfg_.max_connections_per_address) {
        if (n == 0) per_address_.erase(address);
        ++metrics_.rejected_address_cap;
        return std::string("too many connections from this address");
    }
    ++n;
    ++admitted_;
    return std::nullopt;
}

void Gateway::release(const std::string& address) {
    std::lock_guard lk(mu_);
    --admitted_;
    auto it = per_address_.find(address);
    if (it != per_address_.end() && --it->second <= 0) per_address_.erase(it);
}

void Gateway::close_device(const std::string& device, const std::string& token_sha256) {
    std::vector<std::shared_ptr<WsSession>> targets;
    {
        std::lock_guard lk(mu_);
        for (auto& [p, w] : sessions_)
            if (auto s = w.lock()) targets.push_back(s);
    }
    for (auto& s : targets) s->post_revoked(device, token_sha256);
}

void Gateway::authenticated(WsSession* s, const Identity& who, std::uint64_t hello_generation) {
    {
        std::lock_guard lk(mu_);
        authed_[s] = {who.device, who.token_sha256};
    }
    // A resync's check ran while this hello was in flight and did not see
    // it: a revocation whose notification was lost may have committed after
    // the hello read the token. Check again, now with this connection.
    if (hello_generation != resync_generation_) recheck_tokens();
}

void Gateway::recheck_tokens() {
    ++resync_generation_; // before the snapshot: hellos not in it check again
    Store::TokenPairs open;
    {
        std::lock_guard lk(mu_);
        std::set<std::pair<std::string, std::string>> unique;
        for (const auto& [s, a] : authed_) unique.insert(a);
        open.assign(unique.begin(), unique.end());
    }
    if (open.empty()) return;
    auto self = shared_from_this();
    auto retry = [self] {
        auto timer = std::make_shared<net::steady_timer>(self->ioc_, std::chrono::seconds(1));
        timer->async_wait([self, timer](beast::error_code ec) {
            if (!ec && !self->draining()) self->recheck_tokens();
        });
    };
    bool queued = pool_.submit([self, open = std::move(open), retry](pqxx::connection_base* c) {
        std::optional<Store::TokenPairs> stale;
        if (c) {
            try {
                stale = self->api_.store.stale_tokens(*c, open);
            } catch (const std::exception& e) {
                log_warn("token_recheck_failed", {{"err", e.what()}});
            }
        }
        if (!stale) return retry();
        ++self->metrics_.token_rechecks;
        for (const auto& [device, hash] : *stale) self->close_device(device, hash);
    });
    if (!queued) retry();
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
