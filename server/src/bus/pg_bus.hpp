// The default notification bus: PostgreSQL LISTEN/NOTIFY on the gateway's
// own connections. One listening session (application_name
// imserver-listen-GATEWAY) and one publishing session per gateway.
//
// Publishing. Sends, by default, need none: their NOTIFY is inside their
// own transaction (Store::notify_in_commit, --notify-in-commit on), so a
// reply waits for one commit. PostgreSQL serialises the commits of
// notifying transactions (a database-wide lock held through the WAL
// flush); the send path's group commit already puts a whole group in one
// transaction, and at 2 --send-workers (1, auto, on 2 cores now) that
// cost less than the second transaction did (docs/benchmarks.md, "The
// publish in the commit"). Everything else (reads, recalls, and sends with
// --notify-in-commit off): every payload queued while the previous NOTIFY
// ran goes out in one statement (collapsed: per conversation only the
// highest event seq), in a transaction of its own with synchronous_commit
// off. The rows it announces were committed durably before; a crash loses
// the notification anyway (every listener is cut and resyncs), so waiting
// for its WAL flush buys nothing.
//
// Listening: the thread sleeps in poll() on the session's socket only after
// everything libpq has already read was delivered, and probes the session
// every `probe_ms` when idle.
#pragma once

#include "bus/bus.hpp"
#include "store/db_pool.hpp"
#include "core/metrics.hpp"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

namespace im {

class PgBus : public NotificationBus {
public:
    /// `db_timeout_ms`: a round trip of the bus's own sessions stuck longer is
    /// cut (a frozen database must not hang the bus, nor SIGTERM).
    PgBus(std::string url, std::string gateway_id, Metrics& metrics, int probe_ms, int db_timeout_ms = 5000);
    ~PgBus() override;
    void subscribe(Handlers h) override;
    void stop() override;
    void publish(std::vector<std::string> payloads, std::function<void(bool)> done) override;
    bool connected() const override { return listening_; }

    /// Per conversation one "e CONV SEQ [FROM]" is kept: the highest seq and,
    /// when lower, the lowest one (consumers read ranges); other payloads are
    /// kept once each, in order.
    static std::vector<std::string> collapse(const std::vector<std::string>& payloads);

private:
    void listen_loop();
    void publish_loop();

    std::string url_, gateway_id_;
    Metrics& metrics_;
    int probe_ms_;
    Watchdog watchdog_;
    Handlers handlers_;
    std::atomic<bool> stop_{false};
    std::atomic<bool> listening_{false}; // the LISTEN session is up
    int wake_fd_ = -1; // eventfd: wakes the listener's poll() on stop
    std::thread listener_, publisher_;

    struct Pending {
        std::vector<std::string> payloads;
        std::function<void(bool)> done;
    };
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Pending> queue_;
};

} // namespace im
