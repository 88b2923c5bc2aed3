#include "store/db_pool.hpp"

#include "core/log.hpp"

#include <pqxx/pqxx>

#include <libpq-events.h>

#include <array>
#include <atomic>
#include <chrono>
#include <optional>

#include <cerrno>
#include <fstream>
#include <cstring>
#include <fcntl.h>
#include <sys/resource.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

namespace im {

void set_session_variable(pqxx::connection_base& c, const std::string& name, const std::string& sql_value) {
    c.set_variable(name, sql_value);
}

std::unique_ptr<pqxx::connection> open_connection(const std::string& url, const std::string& app_name) {
    // A short connect timeout: a lost database must turn into UNAVAILABLE
    // quickly, never into a hung request.
    std::string full = url;
    if (url.find("://") != std::string::npos) full += (url.find('?') == std::string::npos ? "?" : "&");
    else full += " ";
    // TCP keepalives and tcp_user_timeout notice a dead network path on
    // idle and busy TCP connections alike (ignored on Unix sockets, where
    // the Watchdog does the job).
    const char* sep = url.find("://") != std::string::npos ? "&" : " ";
    full += std::string("connect_timeout=3") + sep + "keepalives=1" + sep + "keepalives_idle=5" + sep +
            "keepalives_interval=2" + sep + "keepalives_count=3" + sep + "tcp_user_timeout=10000";
    auto c = std::make_unique<pqxx::connection>(full);
    // Session settings through set_variable(): libpqxx remembers them and
    // sets them again on every connection it opens in this object's place
    // (it reconnects on its own, e.g. when a transaction starts on a
    // connection whose backend was terminated); a plain SET would be lost
    // then, and the new session would run with no timeouts.
    set_session_variable(*c, "application_name", c->quote(app_name));
    set_session_variable(*c, "statement_timeout", "'30s'");
    set_session_variable(*c, "lock_timeout", "'10s'");
    // A gateway cut off mid-transaction must not leave a backend holding a
    // conversation's row lock: PostgreSQL ends such a session itself.
    set_session_variable(*c, "idle_in_transaction_session_timeout", "'10s'");
    // A backend whose client went away (a gateway killed, or its watchdog
    // shut the socket) stops its query within a second instead of running
    // (or waiting on a lock) to the end (PostgreSQL 14+).
    set_session_variable(*c, "client_connection_check_interval", "'1s'");
    pin_operator_settings(*c);
    Watchdog::attach(*c);
    return c;
}

namespace {

// A setting the contract rests on, pinned on every session whatever the
// operator's postgresql.conf, ALTER DATABASE or ALTER ROLE says.
struct Pinned {
    const char* name;
    const char* value;     // what the session gets
    bool (*acceptable)(const std::string& current);
    const char* why;
};

bool is_utf8(const std::string& v) { return v == "UTF8"; }
bool is_read_committed(const std::string& v) { return v == "read committed"; }
bool is_off(const std::string& v) { return v == "off"; }
bool is_on(const std::string& v) { return v == "on"; }
// Every level but off waits for the local WAL flush before COMMIT returns;
// remote_write, remote_apply and on with synchronous standbys are the
// operator's replication choice and stay.
bool flushes(const std::string& v) { return v != "off"; }
bool is_zero(const std::string& v) { return v == "0"; }

constexpr std::array<Pinned, 6> pinned{{
    {"client_encoding", "UTF8", is_utf8, "bodies, names and cmids are UTF-8"},
    {"default_transaction_isolation", "read committed", is_read_committed,
     "im_send's row locks re-read the newest row version; under stricter levels a send can fail with a "
     "serialization error"},
    {"default_transaction_read_only", "off", is_off, "the gateway writes"},
    {"standard_conforming_strings", "on", is_on, "the SQL's string literals are standard"},
    {"synchronous_commit", "on", flushes, "a reply follows COMMIT, so COMMIT must wait for the WAL flush"},
    {"idle_session_timeout", "0", is_zero,
     "the gateway's connections idle by design; a LISTEN session ended makes every subscriber resync"},
}};

std::array<std::atomic<bool>, pinned.size()> pin_logged{};

} // namespace

void pin_operator_settings(pqxx::connection_base& c) {
    std::array<std::string, pinned.size()> current;
    {
        // One round trip: the session's values, whatever set them.
        std::string sql = "SELECT ";
        for (std::size_t i = 0; i < pinned.size(); ++i)
            sql += std::string(i ? ", " : "") + "current_setting(" + c.quote(std::string(pinned[i].name)) + ")";
        pqxx::nontransaction tx(c);
        auto r = tx.exec(sql);
        for (std::size_t i = 0; i < pinned.size(); ++i) current[i] = r[0][static_cast<int>(i)].c_str();
    }
    for (std::size_t i = 0; i < pinned.size(); ++i) {
        const Pinned& p = pinned[i];
        if (p.acceptable(current[i])) continue;
        set_session_variable(c, p.name, c.quote(std::string(p.value)));
        // Once per setting and process: every connection gets the same.
        if (!pin_logged[i].exchange(true))
            log_warn("db_setting_overridden",
                     {{"setting", p.name}, {"was", current[i]}, {"now", p.value}, {"why", p.why}});
    }
}

Watchdog::Watchdog(std::chrono::milliseconds limit) : limit_(limit), thread_([this] { run(); }) {}

Watchdog::~Watchdog() {
    {
        std::lock_guard lk(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
}

namespace {
thread_local Watchdog* current_dog = nullptr;
thread_local std::size_t current_watch = 0;
} // namespace

Watchdog::Watch::Watch(Watchdog& w, pqxx::connection_base& c) : w_(w) {
    std::lock_guard lk(w_.mu_);
    id_ = ++w_.next_id_;
    // A duplicate of libpq's descriptor: if libpq closes its own during the
    // job, the number it had may go to another socket (a client's), which a
    // shutdown by number would cut; ours stays this socket until ~Watch.
    const int fd = c.sock() >= 0 ? ::fcntl(c.sock(), F_DUPFD_CLOEXEC, 0) : -1;
    w_.watches_[id_] = Entry{fd, std::chrono::steady_clock::now(), fd < 0};
    current_dog = &w_;
    current_watch = id_;
}

Watchdog::Watch::~Watch() {
    // Under the lock: once this returns, the watchdog never touches the socket.
    std::lock_guard lk(w_.mu_);
    auto it = w_.watches_.find(id_);
    if (it != w_.watches_.end()) {
        if (it->second.fd >= 0) ::close(it->second.fd);
        w_.watches_.erase(it);
    }
    current_dog = nullptr;
}

void Watchdog::progress() {
    if (!current_dog) return;
    std::lock_guard lk(current_dog->mu_);
    auto it = current_dog->watches_.find(current_watch);
    if (it != current_dog->watches_.end() && !it->second.shut) it->second.since = std::chrono::steady_clock::now();
}

namespace {

// libpqxx 6 gives its libpq handle to large objects only, through a
// transaction; a subclass may ask for it.
struct RawConnection : pqxx::largeobject {
    static PGconn* of(const pqxx::dbtransaction& tx) { return raw_connection(tx); }
};

// A result received is an answer from the database: the round trip it
// ended is over, so the calling thread's watch starts again.
int on_libpq_event(PGEventId id, void*, void*) {
    if (id == PGEVT_RESULTCREATE) Watchdog::progress();
    return 1; // success: libpq would otherwise mark the result as failed
}

} // namespace

int Watchdog::attach(pqxx::connection_base& c) {
    pqxx::work tx(c, "watchdog_attach");
    // Fails (harmlessly) when this handle already has it.
    if (PGconn* raw = RawConnection::of(tx)) PQregisterEventProc(raw, on_libpq_event, "imserver-watchdog", nullptr);
    tx.abort();
    return c.backendpid();
}

void Watchdog::run() {
    std::unique_lock lk(mu_);
    while (!stop_) {
        cv_.wait_for(lk, std::chrono::milliseconds(100));
        const auto now = std::chrono::steady_clock::now();
        for (auto& [id, e] : watches_) {
            if (e.shut || now - e.since < limit_) continue;
            // The blocked recv()/send() returns at once; libpq reports a
            // broken connection and the owner replaces it.
            ::shutdown(e.fd, SHUT_RDWR);
            e.shut = true;
            ++fired_;
            log_warn("db_round_trip_timeout", {{"ms", static_cast<long>(limit_.count())}});
        }
    }
}

DbPool::DbPool(std::string url, std::size_t workers, std::size_t max_queue,
               std::chrono::milliseconds round_trip_limit, std::string name, int nice)
    : url_(std::move(url)), name_(std::move(name)), round_trip_limit_(round_trip_limit), max_queue_(max_queue),
      nice_(nice), watchdog_(round_trip_limit) {
    for (std::size_t i = 0; i < workers; ++i) threads_.emplace_back([this, i] { run(i); });
}

DbPool::~DbPool() { stop(); }

bool DbPool::submit(Job job) {
    {
        std::lock_guard lk(mu_);
        if (stopping_ || jobs_.size() >= max_queue_) return false;
        jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
    return true;
}

std::size_t DbPool::queued() const {
    std::lock_guard lk(mu_);
    return jobs_.size();
}

void DbPool::stop() {
    {
        std::lock_guard lk(mu_);
        if (stopping_ && threads_.empty()) return;
        stopping_ = true;
        stopping_flag_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_)
        if (t.joinable()) t.join();
    threads_.clear();
}

namespace {

// The backend of `c` is a process of this host: the connection is over a
// Unix socket and its pid is a PostgreSQL process here (not a pid of
// another host or pid namespace that happens to exist here too).
bool local_backend(pqxx::connection_base& c) {
    const char* host = c.hostname();
    if (!host || host[0] != '/') return false;
    std::ifstream comm("/proc/" + std::to_string(c.backendpid()) + "/comm");
    std::string name;
    std::getline(comm, name);
    return name.rfind("postgres", 0) == 0;
}

} // namespace

void DbPool::run(std::size_t index) {
    // "imserver-pool" -> threads "im-pool-N", "imserver-attachments" ->
    // "im-att-N" (a thread's name has 15 characters at most).
    std::string short_name = name_.rfind("imserver-", 0) == 0 ? name_.substr(9) : name_;
    if (short_name.size() > 8) short_name.resize(3);
    short_name = "im-" + short_name;
    ::pthread_setname_np(::pthread_self(), (short_name + "-" + std::to_string(index)).substr(0, 15).c_str());
    std::unique_ptr<pqxx::connection> conn;
    int attached_pid = 0; // the session whose libpq handle carries the watchdog's event procedure
    int reniced_pid = 0; // the backend this worker last set to nice_
    // Linux: a thread's own nice value (its tid as the "process").
    if (nice_ > 0 && ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), nice_) != 0)
        log_warn("db_worker_nice_failed", {{"pool", name_}, {"nice", nice_}, {"err", std::strerror(errno)}});
    auto retry_after = std::chrono::steady_clock::time_point{};
    for (;;) {
        Job job;
        {
            std::unique_lock lk(mu_);
            cv_.wait(lk, [this] { return stopping_ || !jobs_.empty(); });
            if (jobs_.empty()) return; // stopping and drained
            job = std::move(jobs_.front());
            jobs_.pop_front();
        }
        ++busy_;
        if (conn && !conn->is_open()) conn.reset();
        if (conn && conn->backendpid() != attached_pid) {
            // libpqxx reopened the session on its own: a new libpq handle
            // without our event procedure.
            try {
                attached_pid = Watchdog::attach(*conn);
            } catch (const std::exception& e) {
                log_warn("db_watchdog_attach_failed", {{"worker", static_cast<int>(index)}, {"err", e.what()}});
                conn.reset();
            }
        }
        if (!conn && !stopping_flag_ && std::chrono::steady_clock::now() >= retry_after) {
            try {
                conn = open_connection(url_, name_ + "-" + std::to_string(index));
                // A lock wait ends (55P03, answered UNAVAILABLE) well before
                // the watchdog would cut the connection: the statement
                // fails cleanly and the backend waits no longer either.
                set_session_variable(*conn, "lock_timeout", "'" + std::to_string(lock_timeout().count()) + "ms'");
                attached_pid = conn->backendpid(); // open_connection attached it
            } catch (const std::exception& e) {
                // Don't let every queued job wait for a connect timeout.
                retry_after = std::chrono::steady_clock::now() + std::chrono::milliseconds(250);
                log_warn("db_connect_failed", {{"worker", static_cast<int>(index)}, {"err", e.what()}});
            }
        }
        if (conn && nice_ > 0 && conn->backendpid() != reniced_pid) {
            reniced_pid = conn->backendpid();
            if (local_backend(*conn) && ::setpriority(PRIO_PROCESS, static_cast<id_t>(reniced_pid), nice_) != 0) {
                static std::atomic<bool> logged{false};
                if (!logged.exchange(true))
                    log_warn("db_backend_nice_failed", {{"pool", name_}, {"pid", reniced_pid}, {"err", std::strerror(errno)}});
            }
        }
        try {
            std::optional<Watchdog::Watch> watch;
            if (conn) watch.emplace(watchdog_, *conn);
            job(conn.get());
        } catch (const std::exception& e) {
            log_error("db_job_failed", {{"err", e.what()}});
        }
        if (conn && !conn->is_open()) conn.reset();
        --busy_;
    }
}

} // namespace im
