// The notification bus on NATS (`--bus nats://host:port`), for deployments
// where PostgreSQL's NOTIFY should not carry every gateway's commits (or
// cannot: a distributed PostgreSQL fires NOTIFY on the worker that ran the
// statement). Same payloads and semantics as the PostgreSQL bus (bus.hpp):
//
// Publishing: payloads queued while the previous publish ran go out as one
// NATS message (collapsed like PgBus::collapse, lines joined by '\n') on
// subject `im.notify`, followed by a flush, so `done(true)` means the NATS
// server has them. A publish while the connection is down answers false
// (the request answers UNAVAILABLE; the client's resend publishes again).
//
// Listening: every gateway subscribes to `im.notify` (core NATS, no
// persistence). Whatever is missed while the connection is down, or dropped
// because this subscriber fell behind (slow consumer), ends in `resync` to
// every subscriber once the connection is back. Deliveries and resyncs run
// on one thread of this class, in the order they happened.
#pragma once

#include "bus/bus.hpp"
#include "core/metrics.hpp"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <variant>

struct __natsConnection;
struct __natsSubscription;
struct __natsOptions;

namespace im {

class NatsBus : public NotificationBus {
public:
    /// url: nats://host:port (comma-separated for a NATS cluster). Connects
    /// in the background, retrying forever; never throws for an absent server.
    NatsBus(std::string url, std::string gateway_id, Metrics& metrics);
    ~NatsBus() override;
    void subscribe(Handlers h) override;
    void stop() override;
    void publish(std::vector<std::string> payloads, std::function<void(bool)> done) override;
    bool connected() const override { return connected_; }

    static constexpr const char* subject = "im.notify";
    /// Joins payloads into NATS messages of at most max_bytes each.
    static std::vector<std::string> pack(const std::vector<std::string>& payloads, std::size_t max_bytes);
    /// The payloads of one NATS message.
    static std::vector<std::string> unpack(const char* data, std::size_t len);

private:
    friend struct NatsCallbacks; // the C library's callbacks (nats_bus.cpp)
    void received(std::vector<std::string> payloads);
    void mark_lost(const char* why);
    void mark_back();
    void publish_loop();
    void deliver_loop();

    std::string url_, gateway_id_;
    Metrics& metrics_;
    Handlers handlers_;
    __natsOptions* opts_ = nullptr;
    __natsConnection* conn_ = nullptr;
    __natsSubscription* sub_ = nullptr;
    std::atomic<bool> stop_{false};
    std::atomic<bool> connected_{false};
    bool lost_ = false; // under in_mu_: something may have been missed since the last resync

    struct Pending {
        std::vector<std::string> payloads;
        std::function<void(bool)> done;
    };
    std::mutex out_mu_;
    std::condition_variable out_cv_;
    std::deque<Pending> out_;
    std::thread publisher_;

    struct Resync {};
    std::mutex in_mu_;
    std::condition_variable in_cv_;
    // The library's callbacks run on its own thread and may still come after
    // natsConnection_Close: stop() waits for the closed callback, the last
    // one, before this object can go away.
    std::mutex closed_mu_;
    std::condition_variable closed_cv_;
    bool closed_ = false;
    std::deque<std::variant<std::vector<std::string>, Resync>> in_;
    std::thread deliverer_;
};

} // namespace im
