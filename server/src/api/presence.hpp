// Typing and presence (contract section 13): ephemeral, never in the log.
//
// typing: answered after a membership check (one indexed read); forwarded
// on the notification bus ("t CONV USER 1|0") at most twice a second per
// (device, conversation) (TypingLimiter); every gateway's notifier pushes
// it to the other members' subscribed connections.
//
// presence: a user is online while one of their connections is past
// `welcome` on any gateway. Each gateway counts its own connections in
// memory (PresenceTracker); only a user's first connection and last close
// on this gateway are written, by this class's thread, in batches, after
// the hello was answered (a hello never waits for presence). A change of a
// user's aggregate state goes on the bus ("p USER 1|0 LAST_SEEN VERSION").
// The gateway holds a lease in presence_gateways, renewed every third of
// --presence-lease-ms; each heartbeat also sweeps the gateways whose lease
// ran out (docs/scaling.md, "Presence").
#pragma once

#include "api/api.hpp"
#include "bus/bus.hpp"
#include "core/metrics.hpp"
#include "store/db_pool.hpp"
#include "store/store.hpp"

#include <chrono>
#include <array>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>

namespace im {

/// At most `per_second` typing frames forwarded per (device, conversation)
/// in any second. Thread-safe.
class TypingLimiter {
public:
    using Clock = std::chrono::steady_clock;
    static constexpr int per_second = 2;
    /// True when this frame may be forwarded (it is counted).
    bool take(const std::string& device, const std::string& conv, Clock::time_point now);

private:
    std::mutex mu_;
    // The times of the last `per_second` forwards, oldest first.
    std::unordered_map<std::string, std::array<Clock::time_point, per_second>> recent_;
    Clock::time_point pruned_{};
};

/// typing and presence requests (api.cpp's handle_request).
Handled handle_typing(ApiContext& ctx, SessionStore& db, const Identity& who, const req::Typing& r,
                      const std::optional<std::string>& rid);
Handled handle_presence(SessionStore& db, const Identity& who, const req::Presence& r,
                        const std::optional<std::string>& rid);

class PresenceTracker {
public:
    /// lease_ms: --presence-lease-ms. Starts its thread, which first claims
    /// the gateway's rows (those of an earlier run with this id go offline).
    PresenceTracker(std::string url, std::string gateway_id, NotificationBus& bus, Metrics& metrics,
                    std::int64_t lease_ms, int db_timeout_ms);
    ~PresenceTracker();
    /// A connection of `user` got past welcome / one that had closed. Any thread.
    void connected(const std::string& user);
    void disconnected(const std::string& user);
    /// Writes what is pending, releases the gateway's rows (its users go
    /// offline unless online elsewhere), publishes, and stops.
    void stop();

private:
    void loop();
    /// One transaction; false when the database failed (retried later).
    bool write(pqxx::connection_base& c, bool full);
    void publish(const std::vector<Store::PresenceChange>& changes);

    std::string url_, gateway_id_;
    NotificationBus& bus_;
    Metrics& metrics_;
    std::int64_t lease_ms_;
    Watchdog watchdog_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::map<std::string, int> local_;              // user -> connections past welcome here
    std::map<std::string, std::int64_t> closed_at_; // users whose count fell to 0, not yet written
    std::set<std::string> opened_;                  // users whose count rose from 0, not yet written
    bool full_ = true;                              // write the whole state (start, lease lost, a failure)
    bool claimed_ = false;                          // the first whole state is written (the loop's thread only)
    bool stop_ = false;
    std::thread thread_;
};

} // namespace im
