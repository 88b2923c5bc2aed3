#include "api/presence.hpp"

#include "bus/pg_bus.hpp"
#include "core/log.hpp"
#include "store/db_pool.hpp"

#include <pqxx/pqxx>

#include <algorithm>

namespace im {

namespace {

// The presence session of the tracker's thread (the only thread that
// publishes presence): with the PostgreSQL bus, changes are announced by
// NOTIFY on it, right after the write's COMMIT, so a gateway needs no
// publishing session for them (sends notify inside their own commit).
thread_local pqxx::connection_base* presence_session = nullptr;

std::int64_t wall_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

} // namespace

PresenceTracker::PresenceTracker(std::string url, std::string gateway_id, NotificationBus& bus, Metrics& metrics,
                                 std::int64_t lease_ms, int db_timeout_ms)
    : url_(std::move(url)), gateway_id_(std::move(gateway_id)), bus_(bus), metrics_(metrics), lease_ms_(lease_ms),
      watchdog_(std::chrono::milliseconds(db_timeout_ms)) {
    thread_ = std::thread([this] { loop(); });
}

PresenceTracker::~PresenceTracker() { stop(); }

void PresenceTracker::connected(const std::string& user) {
    std::lock_guard lk(mu_);
    if (stop_) return;
    if (local_[user]++ > 0) return;
    ++metrics_.presence_online_users;
    if (!closed_at_.erase(user)) opened_.insert(user); // closed and reopened before a write: nothing changed
    cv_.notify_one();
}

void PresenceTracker::disconnected(const std::string& user) {
    std::lock_guard lk(mu_);
    auto it = local_.find(user);
    if (it == local_.end() || --it->second > 0) return;
    local_.erase(it);
    --metrics_.presence_online_users;
    if (!opened_.erase(user)) closed_at_[user] = wall_ms();
    cv_.notify_one();
}

void PresenceTracker::stop() {
    {
        std::lock_guard lk(mu_);
        if (stop_) return;
        stop_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
}

void PresenceTracker::publish(const std::vector<Store::PresenceChange>& changes) {
    if (changes.empty()) return;
    // Several changes per payload, one per line: a reconnect wave is some
    // hundred notifications, not one per user (NOTIFY takes < 8000 bytes).
    constexpr std::size_t max_payload = 7000;
    std::vector<std::string> payloads;
    for (const auto& ch : changes) {
        auto p = ch.payload();
        if (!payloads.empty() && payloads.back().size() + 1 + p.size() <= max_payload) payloads.back() += '\n' + p;
        else payloads.push_back(std::move(p));
    }
    // Lost: harmless for typing, and for presence the next `presence` request
    // reads the table (contract 13: no delivery promise on the bus).
    if (presence_session && dynamic_cast<PgBus*>(&bus_)) {
        try {
            // Every caller watches the session already (the database timeout).
            Store::publish(*presence_session, payloads);
            return;
        } catch (const std::exception& e) {
            log_warn("presence_notify_failed", {{"err", e.what()}}); // the bus's own session tries
        }
    }
    bus_.publish(std::move(payloads), [](bool) {});
}

bool PresenceTracker::write(pqxx::connection_base& c, bool full) {
    std::vector<std::string> online;
    std::vector<std::pair<std::string, std::int64_t>> offline;
    {
        std::lock_guard lk(mu_);
        if (full) {
            for (const auto& [u, n] : local_) online.push_back(u);
        } else {
            online.assign(opened_.begin(), opened_.end());
        }
        for (const auto& [u, t] : closed_at_) offline.emplace_back(u, t);
        opened_.clear();
        closed_at_.clear();
        if (full) full_ = false;
    }
    try {
        Watchdog::Watch watch(watchdog_, c);
        auto changes = Store::presence_write(c, gateway_id_, lease_ms_, online, offline, full, wall_ms());
        ++metrics_.presence_writes;
        if (full) claimed_ = true;
        publish(changes);
        return true;
    } catch (const std::exception& e) {
        ++metrics_.presence_write_failures;
        log_warn("presence_write_failed", {{"err", e.what()}});
        // The whole state next time (the closes' times are lost: now then).
        std::lock_guard lk(mu_);
        full_ = true;
        for (const auto& [u, t] : offline) closed_at_.emplace(u, t);
        return false;
    }
}

void PresenceTracker::loop() {
    using Clock = std::chrono::steady_clock;
    const auto beat = std::chrono::milliseconds(std::max<std::int64_t>(1, lease_ms_ / 3));
    std::unique_ptr<pqxx::connection> conn;
    auto next_beat = Clock::now();
    // A gateway restarted under the same id keeps its predecessor's rows for
    // one beat: users who reconnect meanwhile (here or elsewhere) never flap
    // offline, and the reconnect wave writes no change for them. Then the
    // whole state replaces those rows: who did not come back goes offline.
    const auto claim_at = Clock::now() + beat;
    auto full_due = [&] { return full_ && (claimed_ || Clock::now() >= claim_at); };
    auto backoff = std::chrono::milliseconds(100);
    for (;;) {
        bool stopping = false, pending = false, full = false;
        {
            std::unique_lock lk(mu_);
            const auto wake = claimed_ ? next_beat : std::min(next_beat, claim_at);
            cv_.wait_until(lk, wake, [&] { return stop_ || full_due() || !opened_.empty() || !closed_at_.empty(); });
            stopping = stop_;
            full = full_due();
            pending = full || !opened_.empty() || !closed_at_.empty();
        }
        try {
            if (!conn || !conn->is_open()) {
                conn = open_connection(url_, "imserver-presence-" + gateway_id_);
                // Asynchronous commit (no wait for the WAL flush) and NOTIFY:
                // a database crash may lose the last writes, so a session
                // opened again first writes the whole state (below).
                Watchdog::Watch watch(watchdog_, *conn);
                Store::open_publisher(*conn);
            }
            presence_session = conn.get();
            if (stopping) {
                write(*conn, false);
                Watchdog::Watch watch(watchdog_, *conn);
                publish(Store::presence_release(*conn, gateway_id_, wall_ms()));
                return;
            }
            if (pending && !write(*conn, full)) throw std::runtime_error("presence write failed");
            if (Clock::now() >= next_beat) {
                Watchdog::Watch watch(watchdog_, *conn);
                if (!Store::presence_heartbeat(*conn, gateway_id_, lease_ms_) && claimed_) {
                    // Swept while away: our rows are gone.
                    log_warn("presence_lease_lost");
                    std::lock_guard lk(mu_);
                    full_ = true;
                }
                publish(Store::presence_sweep(*conn));
                ++metrics_.presence_writes;
                next_beat = Clock::now() + beat;
            }
            backoff = std::chrono::milliseconds(100);
        } catch (const std::exception& e) {
            if (stopping) {
                log_warn("presence_release_failed", {{"err", e.what()}});
                return;
            }
            log_warn("presence_db_failed", {{"err", e.what()}});
            presence_session = nullptr;
            conn.reset();
            std::unique_lock lk(mu_);
            full_ = true; // what the lost session committed last may be gone
            cv_.wait_for(lk, backoff, [&] { return stop_; });
            backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
        }
    }
}

} // namespace im
