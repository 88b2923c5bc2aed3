// A small pool of database worker threads, one pqxx connection each.
// I/O threads never touch the database: they submit jobs here and the job
// posts its result back to the session's strand.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <pqxx/pqxx>

namespace im {

/// Notices a database that stopped answering without refusing connections
/// (a frozen host, a dropped network path, SIGSTOPped processes): a round
/// trip watched for longer than the limit has its socket shut down, so the
/// blocked libpq call fails at once (broken connection -> UNAVAILABLE) and
/// the connection is replaced. Works for TCP and Unix sockets alike.
///
/// The limit bounds one round trip, not a whole job: every result the
/// connection receives restarts the clock of its watch (a libpq event
/// procedure that attach() registers), so a job of many short statements
/// (a 5,000-member create, a purge in batches) runs as long as it needs
/// while one statement that gets no answer is cut after the limit.
class Watchdog {
public:
    explicit Watchdog(std::chrono::milliseconds limit);
    ~Watchdog();
    Watchdog(const Watchdog&) = delete;
    Watchdog& operator=(const Watchdog&) = delete;

    /// Watches one connection while it lives.
    class Watch {
    public:
        Watch(Watchdog& w, pqxx::connection_base& c);
        ~Watch();
        Watch(const Watch&) = delete;
        Watch& operator=(const Watch&) = delete;

    private:
        Watchdog& w_;
        std::size_t id_;
    };

    long long fired() const { return fired_.load(); }
    /// Restarts the clock of the calling thread's watch: called for every
    /// result received on an attached connection, and by a job that waits
    /// between round trips for something other than the database (the send
    /// scheduler lingering for a group).
    static void progress();
    /// Registers the event procedure that calls progress() for every
    /// result received on `c` (one BEGIN/ROLLBACK round trip: libpqxx 6
    /// hands out its libpq handle only through a transaction). Returns the
    /// backend pid it attached to; a connection libpqxx reopened on its own
    /// has another pid and must be attached again (DbPool does), else its
    /// watches fall back to bounding the whole job.
    static int attach(pqxx::connection_base& c);

private:
    void run();
    // fd: the watch's own duplicate of the connection's socket (closed when
    // the watch ends), so its number cannot be reused by another socket
    // while the watchdog may shut it down; shut: the watchdog fired.
    struct Entry { int fd; std::chrono::steady_clock::time_point since; bool shut = false; };
    std::chrono::milliseconds limit_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::map<std::size_t, Entry> watches_;
    std::size_t next_id_ = 0;
    bool stop_ = false;
    std::atomic<long long> fired_{0};
    std::thread thread_;
};

class DbPool {
public:
    /// A job gets the worker's connection, or nullptr when the database
    /// cannot be reached right now (the job then answers UNAVAILABLE).
    using Job = std::function<void(pqxx::connection_base*)>;

    /// round_trip_limit: see Watchdog (--db-timeout-ms). `name`: the
    /// connections' application_name is name-N (pg_stat_activity), and the
    /// worker threads are named after it (top -H, perf). `nice` > 0: the
    /// workers run at that CPU priority (setpriority of each thread), and so
    /// do their PostgreSQL backends when a backend is a process of this
    /// host (a Unix socket connection, e.g. the embedded cluster) that this
    /// process may renice; a refusal is logged once.
    DbPool(std::string url, std::size_t workers, std::size_t max_queue,
           std::chrono::milliseconds round_trip_limit = std::chrono::milliseconds(5000),
           std::string name = "imserver-pool", int nice = 0);
    ~DbPool();
    DbPool(const DbPool&) = delete;
    DbPool& operator=(const DbPool&) = delete;

    /// Queues a job; false when the queue is full (pool exhausted).
    bool submit(Job job);
    void stop(); // finishes queued jobs, then joins the workers

    std::size_t in_use() const { return busy_.load(); }
    std::size_t queued() const;
    std::size_t size() const { return threads_.size(); }
    Watchdog& watchdog() { return watchdog_; }
    /// The workers' lock_timeout: half the round-trip limit, so a lock wait
    /// fails as a statement error before the watchdog cuts the connection.
    std::chrono::milliseconds lock_timeout() const { return std::max(round_trip_limit_ / 2, std::chrono::milliseconds(100)); }

private:
    void run(std::size_t index);

    std::string url_;
    std::string name_;
    std::chrono::milliseconds round_trip_limit_;
    std::size_t max_queue_;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Job> jobs_;
    bool stopping_ = false;
    std::atomic<bool> stopping_flag_{false}; // read without the lock: no new connects while stopping
    std::atomic<std::size_t> busy_{0};
    int nice_ = 0;
    Watchdog watchdog_;
    std::vector<std::thread> threads_;
};

/// Sets a session variable (`sql_value` is an SQL literal, quoted) so that
/// libpqxx sets it again on every connection it reopens in this one's place.
/// Every SET of a long-lived connection goes through this.
void set_session_variable(pqxx::connection_base& c, const std::string& name, const std::string& sql_value);

/// Opens a connection with a short connect timeout and the session settings
/// (set_session_variable); throws on failure.
std::unique_ptr<pqxx::connection> open_connection(const std::string& url, const std::string& app_name);
/// Overrides, on this session, the operator's settings the contract cannot
/// run under (docs/operations.md, "Database settings the gateway pins"):
/// client_encoding, default_transaction_isolation,
/// default_transaction_read_only, standard_conforming_strings,
/// idle_session_timeout, and synchronous_commit = off. Logs
/// db_setting_overridden once per setting.
/// open_connection() calls it.
void pin_operator_settings(pqxx::connection_base& c);

} // namespace im
