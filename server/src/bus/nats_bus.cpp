#include "bus/nats_bus.hpp"

#include "core/config.hpp"

#include "core/log.hpp"
#include "bus/pg_bus.hpp"

#include <nats/nats.h>

#include <chrono>
#include <stdexcept>

namespace im {

// The C library calls these on its own threads.
struct NatsCallbacks {
    static void message(natsConnection*, natsSubscription*, natsMsg* msg, void* self) {
        auto payloads = NatsBus::unpack(natsMsg_GetData(msg), static_cast<std::size_t>(natsMsg_GetDataLength(msg)));
        natsMsg_Destroy(msg);
        static_cast<NatsBus*>(self)->received(std::move(payloads));
    }
    static void connected(natsConnection*, void* self) {
        auto* bus = static_cast<NatsBus*>(self);
        bus->connected_ = true;
        log_info("bus_connected", {{"bus", "nats"}});
    }
    static void disconnected(natsConnection*, void* self) {
        auto* bus = static_cast<NatsBus*>(self);
        if (!bus->connected_.exchange(false) || bus->stop_) return; // first connect failing, or our own close
        bus->mark_lost("disconnected");
    }
    static void reconnected(natsConnection*, void* self) {
        auto* bus = static_cast<NatsBus*>(self);
        bus->connected_ = true;
        bus->mark_back();
    }
    static void closed(natsConnection*, void* self) {
        auto* bus = static_cast<NatsBus*>(self);
        std::lock_guard lk(bus->closed_mu_);
        bus->closed_ = true;
        bus->closed_cv_.notify_all();
    }
    static void error(natsConnection*, natsSubscription*, natsStatus err, void* self) {
        // A subscriber that fell behind had messages dropped by the library.
        if (err == NATS_SLOW_CONSUMER) {
            auto* bus = static_cast<NatsBus*>(self);
            bus->mark_lost("slow_consumer");
            bus->mark_back();
        } else {
            log_warn("bus_error", {{"bus", "nats"}, {"err", natsStatus_GetText(err)}});
        }
    }
};

namespace {

void check(natsStatus s, const char* what) {
    if (s != NATS_OK) throw std::runtime_error(std::string("nats: ") + what + ": " + natsStatus_GetText(s));
}

constexpr std::size_t max_message_bytes = 256 * 1024; // well under the server's max_payload (1 MB)

} // namespace

NatsBus::NatsBus(std::string url, std::string gateway_id, Metrics& metrics)
    : url_(std::move(url)), gateway_id_(std::move(gateway_id)), metrics_(metrics) {
    check(natsOptions_Create(&opts_), "options");
    const std::string name = "imserver-" + gateway_id_;
    const auto urls = nats_servers(url_);
    std::vector<const char*> list;
    for (const auto& u : urls) list.push_back(u.c_str());
    check(natsOptions_SetServers(opts_, list.data(), static_cast<int>(list.size())), "servers");
    check(natsOptions_SetName(opts_, name.c_str()), "name");
    check(natsOptions_SetMaxReconnect(opts_, -1), "reconnect");
    check(natsOptions_SetReconnectWait(opts_, 100), "reconnect wait");
    check(natsOptions_SetReconnectJitter(opts_, 100, 0), "reconnect jitter");
    check(natsOptions_SetTimeout(opts_, 2000), "timeout");
    // A dead server is noticed within two missed pings.
    check(natsOptions_SetPingInterval(opts_, 1000), "ping interval");
    check(natsOptions_SetMaxPingsOut(opts_, 2), "max pings");
    check(natsOptions_SetRetryOnFailedConnect(opts_, true, &NatsCallbacks::connected, this), "retry");
    check(natsOptions_SetDisconnectedCB(opts_, &NatsCallbacks::disconnected, this), "disconnected cb");
    check(natsOptions_SetReconnectedCB(opts_, &NatsCallbacks::reconnected, this), "reconnected cb");
    check(natsOptions_SetErrorHandler(opts_, &NatsCallbacks::error, this), "error cb");
    check(natsOptions_SetClosedCB(opts_, &NatsCallbacks::closed, this), "closed cb");
    natsStatus s = natsConnection_Connect(&conn_, opts_);
    if (s == NATS_OK) connected_ = true;
    else if (s != NATS_NOT_YET_CONNECTED) check(s, "connect");
    else log_warn("bus_not_yet_connected", {{"bus", "nats"}, {"url", url_}});
    publisher_ = std::thread([this] { publish_loop(); });
    deliverer_ = std::thread([this] { deliver_loop(); });
}

NatsBus::~NatsBus() {
    stop();
    if (sub_) natsSubscription_Destroy(sub_);
    if (conn_) natsConnection_Destroy(conn_);
    if (opts_) natsOptions_Destroy(opts_);
}

void NatsBus::subscribe(Handlers h) {
    handlers_ = std::move(h);
    check(natsConnection_Subscribe(&sub_, conn_, subject, &NatsCallbacks::message, this), "subscribe");
    // No silent drop at the library's default limits: fall behind, then resync.
    check(natsSubscription_SetPendingLimits(sub_, 1000000, 512 * 1024 * 1024), "pending limits");
}

void NatsBus::stop() {
    {
        std::scoped_lock lk(out_mu_, in_mu_);
        if (stop_.exchange(true)) return;
    }
    out_cv_.notify_all();
    in_cv_.notify_all();
    if (publisher_.joinable()) publisher_.join();
    if (sub_) natsSubscription_Unsubscribe(sub_);
    if (conn_) {
        natsConnection_Close(conn_);
        // A callback still queued (a late reconnected, say) must not reach a
        // destroyed object: the closed callback comes last.
        std::unique_lock lk(closed_mu_);
        if (!closed_cv_.wait_for(lk, std::chrono::seconds(5), [&] { return closed_; }))
            log_warn("bus_close_unconfirmed", {{"bus", "nats"}});
    }
    if (deliverer_.joinable()) deliverer_.join();
}

std::vector<std::string> NatsBus::pack(const std::vector<std::string>& payloads, std::size_t max_bytes) {
    std::vector<std::string> out;
    for (const auto& p : payloads) {
        if (out.empty() || out.back().size() + 1 + p.size() > max_bytes) out.emplace_back();
        else out.back() += '\n';
        out.back() += p;
    }
    return out;
}

std::vector<std::string> NatsBus::unpack(const char* data, std::size_t len) {
    std::vector<std::string> out;
    std::size_t start = 0;
    for (std::size_t i = 0; i <= len; ++i)
        if (i == len || data[i] == '\n') {
            if (i > start) out.emplace_back(data + start, i - start);
            start = i + 1;
        }
    return out;
}

void NatsBus::publish(std::vector<std::string> payloads, std::function<void(bool)> done) {
    if (payloads.empty()) return done(true);
    {
        std::lock_guard lk(out_mu_);
        if (!stop_) {
            out_.push_back(Pending{std::move(payloads), std::move(done)});
            out_cv_.notify_one();
            return;
        }
    }
    done(false);
}

void NatsBus::publish_loop() {
    for (;;) {
        std::deque<Pending> batch;
        {
            std::unique_lock lk(out_mu_);
            out_cv_.wait(lk, [&] { return stop_ || !out_.empty(); });
            if (stop_ && out_.empty()) return;
            batch.swap(out_);
        }
        std::vector<std::string> all;
        for (const auto& p : batch) all.insert(all.end(), p.payloads.begin(), p.payloads.end());
        bool ok = connected_;
        for (const auto& m : pack(PgBus::collapse(all), max_message_bytes)) {
            if (!ok) break;
            ok = natsConnection_Publish(conn_, subject, m.data(), static_cast<int>(m.size())) == NATS_OK;
        }
        // The server has them once it answered the flush's PING.
        if (ok) ok = natsConnection_FlushTimeout(conn_, 2000) == NATS_OK;
        if (ok) ++metrics_.bus_publishes;
        else log_warn("notify_publish_failed", {{"bus", "nats"}});
        for (auto& p : batch) p.done(ok);
    }
}

void NatsBus::received(std::vector<std::string> payloads) {
    std::lock_guard lk(in_mu_);
    if (stop_ || payloads.empty()) return;
    in_.emplace_back(std::move(payloads));
    in_cv_.notify_one();
}

void NatsBus::mark_lost(const char* why) {
    log_warn("listen_lost", {{"bus", "nats"}, {"err", why}});
    std::lock_guard lk(in_mu_);
    lost_ = true;
}

void NatsBus::mark_back() {
    std::lock_guard lk(in_mu_);
    if (!lost_ || stop_) return;
    lost_ = false;
    in_.emplace_back(Resync{});
    in_cv_.notify_one();
}

void NatsBus::deliver_loop() {
    for (;;) {
        std::variant<std::vector<std::string>, Resync> item;
        {
            std::unique_lock lk(in_mu_);
            in_cv_.wait(lk, [&] { return stop_ || !in_.empty(); });
            if (stop_) return;
            item = std::move(in_.front());
            in_.pop_front();
        }
        if (auto* batch = std::get_if<std::vector<std::string>>(&item)) {
            handlers_.deliver(*batch);
        } else {
            ++metrics_.listen_reconnects;
            log_warn("listen_restored", {{"bus", "nats"}});
            handlers_.resync();
        }
    }
}

} // namespace im
