#include "net/gateway.hpp"

#include "net/listener.hpp"
#include "core/log.hpp"
#include "store/migrations.hpp"
#include "net/tls.hpp"
#include "net/ws_session.hpp"

#include <algorithm>
#include <chrono>
#include <set>

namespace im {

Gateway::Gateway(net::io_context& ioc, const Config& cfg, DbPool& pool, Store& store, Metrics& metrics,
                 FaultRegistry& faults, std::unique_ptr<jwt::Verifier> jwt)
    : ioc_(ioc), cfg_(cfg), pool_(pool), metrics_(metrics), faults_(faults), api_{store, faults, cfg.gateway_id, nullptr, {}},
      sends_(api_, pool, metrics, static_cast<std::size_t>(cfg.send_group_max),
             static_cast<std::size_t>(effective_send_workers(cfg)), effective_db_queue(cfg), !cfg.lab.no_unique_index,
             std::chrono::milliseconds(cfg.db_timeout_ms),
             std::chrono::microseconds(cfg.send_linger_us)),
      jwt_(std::move(jwt)) {
    if (!cfg.tls_cert.empty()) {
        tls_ = std::make_shared<TlsContexts>(cfg.tls_cert, cfg.tls_key);
        log_info("tls_enabled", {{"cert", cfg.tls_cert}, {"certificate", tls_->describe()}});
    }
    api_.typing = &typing_;
    api_.metrics = &metrics_;
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

std::optional<unsigned short> Gateway::listen_metrics() {
    if (cfg_.metrics_listen == "public" || cfg_.metrics_listen == "api") return std::nullopt;
    const auto colon = cfg_.metrics_listen.rfind(':');
    metrics_listener_ = std::make_shared<Listener>(ioc_, shared_from_this(), nullptr, true);
    return metrics_listener_->run(net::ip::make_address(cfg_.metrics_listen.substr(0, colon)),
                                  static_cast<unsigned short>(std::stoi(cfg_.metrics_listen.substr(colon + 1))));
}

void Gateway::drain(std::function<void()> done) {
    net::post(listener_->executor(), [self = shared_from_this(), done = std::move(done)]() mutable {
        if (self->draining_) return;
        self->draining_ = true;
        self->listener_->close();
        if (self->metrics_listener_)
            net::post(self->metrics_listener_->executor(), [l = self->metrics_listener_] { l->close(); });
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
    unwatch(s);
    if (auto it = online_.find(s); it != online_.end()) {
        if (presence_) presence_->disconnected(it->second);
        online_.erase(it);
    }
    metrics_.authenticated_connections = static_cast<long long>(authed_.size());
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
    const auto key = address_key(address);
    int& n = per_address_[key];
    if (n >= cfg_.max_connections_per_address) {
        if (n == 0) per_address_.erase(key);
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
    auto it = per_address_.find(address_key(address));
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
        // Only an open connection: one closed meanwhile left sessions_ and
        // would never leave authed_.
        if (!sessions_.count(s)) return;
        authed_[s] = {who.device, who.token_sha256};
        metrics_.authenticated_connections = static_cast<long long>(authed_.size());
        // Past welcome: the user is online (written off this path, presence.hpp).
        if (!who.backend && online_.emplace(s, who.user).second && presence_) presence_->connected(who.user);
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

std::size_t Gateway::push_to_users(const std::vector<std::string>& users,
                                   const std::shared_ptr<const std::string>& frame) {
    std::vector<std::shared_ptr<WsSession>> targets;
    std::size_t reached = 0;
    {
        std::lock_guard lk(mu_);
        auto take = [&](const std::map<WsSession*, std::weak_ptr<WsSession>>& sessions) {
            ++reached;
            for (auto& [p, w] : sessions)
                if (auto s = w.lock()) targets.push_back(std::move(s));
        };
        if (users.size() <= subscribers_.size()) {
            for (const auto& u : users)
                if (auto it = subscribers_.find(u); it != subscribers_.end()) take(it->second);
        } else {
            for (const auto& [u, sessions] : subscribers_)
                if (std::binary_search(users.begin(), users.end(), u)) take(sessions);
        }
    }
    for (auto& s : targets) s->post_frame(frame);
    return reached;
}

bool Gateway::has_subscribers(const std::string& user) const {
    std::lock_guard lk(mu_);
    return subscribers_.count(user) > 0;
}

bool Gateway::has_any_subscriber() const {
    std::lock_guard lk(mu_);
    return !subscribers_.empty();
}

void Gateway::unwatch(WsSession* s) {
    auto it = watching_.find(s);
    if (it == watching_.end()) return;
    for (const auto& u : it->second) {
        auto w = watchers_.find(u);
        if (w == watchers_.end()) continue;
        w->second.erase(s);
        if (w->second.empty()) {
            watchers_.erase(w);
            presence_version_.erase(u);
        }
    }
    watching_.erase(it);
}

void Gateway::watch(const std::shared_ptr<WsSession>& s, std::vector<std::string> users) {
    std::lock_guard lk(mu_);
    if (!sessions_.count(s.get())) return; // closed meanwhile
    unwatch(s.get());
    for (const auto& u : users) watchers_[u][s.get()] = s;
    if (!users.empty()) watching_[s.get()] = std::move(users);
}

void Gateway::push_presence(const PresenceInfo& p, std::int64_t version) {
    std::vector<std::shared_ptr<WsSession>> targets;
    {
        std::lock_guard lk(mu_);
        auto it = watchers_.find(p.user);
        if (it == watchers_.end()) return;
        // The bus may deliver two gateways' changes of one user out of
        // their commit order: the later version wins.
        auto& seen = presence_version_[p.user];
        if (version <= seen) return;
        seen = version;
        for (auto& [ptr, w] : it->second)
            if (auto s = w.lock()) targets.push_back(std::move(s));
    }
    auto frame = std::make_shared<const std::string>(encode_presence_push(p));
    for (auto& s : targets) s->post_frame(frame);
    metrics_.pushes_presence += static_cast<long long>(targets.size());
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

namespace im {

// ------------------------------------------------------------ /readyz

void Gateway::readiness(std::function<void(bool, const char*)> done) {
    // Without its bus a gateway cannot push other gateways' commits nor
    // publish its own (sends answer UNAVAILABLE): not ready either. Cheap,
    // so never cached.
    const auto* bus = api_.bus;
    const bool bus_up = !bus || bus->connected();
    auto answer = [bus_up](const std::function<void(bool, const char*)>& f, bool db_ok, const char* why) {
        if (!db_ok) return f(false, why);
        if (!bus_up) return f(false, "notification bus unavailable");
        f(true, "ready");
    };
    {
        std::lock_guard lk(ready_mu_);
        const auto now = std::chrono::steady_clock::now();
        if (ready_last_ && now - ready_at_ < std::chrono::seconds(1)) {
            auto last = *ready_last_;
            return answer(done, last.first, last.second);
        }
        ready_waiters_.push_back([answer, done](bool ok, const char* why) { answer(done, ok, why); });
        if (ready_checking_) return; // answered with the check in flight
        ready_checking_ = true;
    }
    ++metrics_.readyz_checks;
    auto self = shared_from_this();
    auto finish = [self](bool ok, const char* why) {
        std::vector<std::function<void(bool, const char*)>> waiters;
        {
            std::lock_guard lk(self->ready_mu_);
            self->ready_checking_ = false;
            self->ready_last_ = std::make_pair(ok, why);
            self->ready_at_ = std::chrono::steady_clock::now();
            waiters.swap(self->ready_waiters_);
        }
        for (auto& w : waiters) w(ok, why);
    };
    bool queued = pool_.submit([self, finish](pqxx::connection_base* c) {
        bool ready = false;
        if (c) {
            try {
                ready = self->api_.store.ping(*c) && migrations_current(*c) &&
                        (self->cfg_.lab.no_unique_index || self->api_.store.idempotency_index_present(*c));
            } catch (const std::exception&) {
                ready = false;
            }
        }
        finish(ready, "database unavailable");
    });
    if (!queued) {
        // Not cached: the next call tries again.
        std::vector<std::function<void(bool, const char*)>> waiters;
        {
            std::lock_guard lk(ready_mu_);
            ready_checking_ = false;
            waiters.swap(ready_waiters_);
        }
        for (auto& w : waiters) w(false, "busy");
    }
}

// ------------------------------------------------------------ failed hellos

bool Gateway::counts_hello_failures(const std::string& address) const {
    return cfg_.hello_failures_loopback || !is_loopback_address(address);
}

bool Gateway::hello_limited(const std::string& address) {
    return counts_hello_failures(address) && hello_failures_.limited(address);
}

void Gateway::hello_failed(const std::string& address) {
    ++metrics_.hello_failures;
    if (counts_hello_failures(address)) hello_failures_.failed(address);
}

// ------------------------------------------------------------ connections before the upgrade

bool Gateway::take_http_slot() {
    int n = http_pending_.load();
    do {
        if (n >= cfg_.max_http_connections) {
            ++metrics_.http_rejected;
            return false;
        }
    } while (!http_pending_.compare_exchange_weak(n, n + 1));
    ++metrics_.http_pending;
    return true;
}

void Gateway::put_http_slot() {
    --http_pending_;
    --metrics_.http_pending;
}

// ------------------------------------------------------------ the buffer budget

void Gateway::buffered(long long delta) {
    const long long now = metrics_.buffered_bytes += delta;
    if (delta < 0 && cfg_.max_buffered_bytes && now < static_cast<long long>(cfg_.max_buffered_bytes) &&
        metrics_.buffered_read_waits.load() > 0)
        wake_budget_waiters();
}

bool Gateway::budget_reached() const {
    return cfg_.max_buffered_bytes && metrics_.buffered_bytes.load() >= static_cast<long long>(cfg_.max_buffered_bytes);
}

void Gateway::wait_for_budget(const std::shared_ptr<WsSession>& s) {
    {
        std::lock_guard lk(budget_mu_);
        if (budget_waiters_.emplace(s.get(), s).second) ++metrics_.buffered_read_waits;
    }
    if (!budget_reached()) wake_budget_waiters(); // released meanwhile: nobody else would wake it
    shed_soon();
}

void Gateway::wake_budget_waiters() {
    std::map<WsSession*, std::weak_ptr<WsSession>> waiters;
    {
        std::lock_guard lk(budget_mu_);
        waiters.swap(budget_waiters_);
        metrics_.buffered_read_waits -= static_cast<long long>(waiters.size());
    }
    for (auto& [p, w] : waiters)
        if (auto s = w.lock()) s->post_budget_resume();
}

void Gateway::shed_soon() {
    if (!budget_reached() || shedding_.exchange(true)) return;
    net::post(ioc_, [self = shared_from_this()] {
        self->shed();
        self->shedding_ = false;
    });
}

// Closes (1013) the connections holding the most until the others hold at
// most three quarters of the budget. Bytes of connections already shed are
// on their way out (their requests in the database still hold theirs until
// answered): they count, but shedding more cannot free them.
void Gateway::shed() {
    if (!budget_reached()) return;
    std::vector<std::pair<long long, std::shared_ptr<WsSession>>> live;
    {
        std::lock_guard lk(mu_);
        live.reserve(sessions_.size());
        for (auto& [p, w] : sessions_)
            if (auto s = w.lock(); s && !s->shed_marked()) {
                const long long held = s->held();
                if (held > 0) live.emplace_back(held, std::move(s));
            }
    }
    const long long target = static_cast<long long>(cfg_.max_buffered_bytes / 4 * 3);
    long long need = metrics_.buffered_bytes.load() - target;
    std::sort(live.begin(), live.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    long long shed = 0, freed = 0;
    for (auto& [held, s] : live) {
        if (freed >= need) break;
        if (!s->mark_shed()) continue;
        freed += held;
        ++shed;
        s->post_shed();
    }
    if (shed == 0) return; // what is held is on its way out already
    log_warn("buffer_budget_shed", {{"connections", static_cast<long>(shed)},
                                    {"bytes", static_cast<long>(freed)},
                                    {"buffered", static_cast<long>(metrics_.buffered_bytes.load())}});
}

} // namespace im
