// Real parts for tests: a throwaway PostgreSQL cluster, an imserver child
// process, a WebSocket client, the admin CLI. Shared by tests/server and
// tests/acceptance. Nothing here is a fake.
#pragma once

#include <boost/json.hpp>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <sys/types.h>

namespace im::test {

namespace json = boost::json;
using namespace std::chrono_literals;

/// A fresh temporary directory, removed (with any cluster) on destruction.
class TempDir {
public:
    explicit TempDir(const std::string& prefix = "imtest");
    ~TempDir();
    const std::string& path() const { return path_; }

private:
    std::string path_;
};

/// A throwaway PostgreSQL cluster on a Unix socket in a temp dir.
class TestPostgres {
public:
    TestPostgres();
    ~TestPostgres();
    std::string url(const std::string& db = "im") const;
    void stop_immediate();  // like a crash: pg_ctl stop -m immediate
    void start();
    /// Creates (if needed) and returns the URL of another database.
    std::string create_database(const std::string& name);
    /// Runs one SQL statement and returns the first column of the first row
    /// as text ("" when no row). For assertions on real rows.
    std::string scalar(const std::string& sql, const std::string& db = "im") const;
    /// The PIDs of this cluster's processes (postmaster first), and only
    /// of this cluster: for freezing it with SIGSTOP.
    std::vector<pid_t> pids() const;
    /// imserver's database workers (any gateway's pool) now waiting on a
    /// lock, e.g. a conversation's row lock held by the test.
    long long pool_workers_waiting_on_locks() const;

private:
    TempDir dir_;
    std::string root_;
};

/// Path of the imserver binary (from IMSERVER_BIN, set by CMake).
std::string imserver_bin();

/// Runs `imserver admin --db URL args...`; returns {exit code, stdout}.
std::pair<int, std::string> admin(const std::string& db_url, const std::vector<std::string>& args);
/// Runs `imserver ARGS...` (stdout discarded) and returns its exit status;
/// -1 when it was still running after `timeout` (then it is SIGKILLed).
int imserver_exit_code(const std::vector<std::string>& args, std::chrono::milliseconds timeout);
/// As admin(), but throws unless it exits 0; returns stdout trimmed.
std::string admin_ok(const std::string& db_url, const std::vector<std::string>& args);

/// Under a sanitizer build: records that a child imserver reported an error
/// (printing `log`); the test binary then exits 1 at exit.
void note_sanitizer_failure(const std::string& what, const std::string& log);

/// An imserver child process on 127.0.0.1 with an OS-chosen port. On
/// destruction it is SIGKILLed, or, in a sanitizer build, stopped with
/// SIGTERM and its exit status and stderr checked (note_sanitizer_failure).
class ServerProcess {
public:
    /// extra: more flags, e.g. {"--enable-faults", "--fault", "..."}.
    ServerProcess(const std::string& db_url, std::vector<std::string> extra = {}, const std::string& gateway = "gw-1");
    ~ServerProcess();
    unsigned short port() const { return port_; }
    std::string url() const; // ws://127.0.0.1:PORT/v1/ws
    pid_t pid() const { return pid_; }
    /// SIGTERM and wait; returns the exit status (or -1 on timeout).
    int terminate(std::chrono::milliseconds wait = 15s);
    /// SIGKILL and reap.
    void kill();
    /// Waits for the process to exit on its own (e.g. a crash fault).
    std::optional<int> wait_exit(std::chrono::milliseconds wait);
    std::string log() const; // its stderr so far
    /// Starts again with the same arguments (after a crash or kill); with
    /// `extra`, the extra flags are replaced (e.g. to drop a --fault).
    void restart();
    void restart(std::vector<std::string> extra);
    /// As restart(), listening on the port it had (clients keep their URL).
    void restart_on_same_port();
    /// Plain HTTP request to the gateway; returns {status, body}.
    std::pair<int, std::string> http(const std::string& method, const std::string& target,
                                     const std::string& body = {}) const;
    /// The backend API's port: with "--api-listen" among the extra flags
    /// (e.g. "127.0.0.1:0"); 0 when it has none (the harness turns it off
    /// otherwise, so test servers never compete for the default port).
    unsigned short api_port() const;
    /// A request to the backend API (`key`: the bearer key, "" for none);
    /// {status, body}.
    std::pair<int, std::string> api(const std::string& method, const std::string& target, const std::string& body = {},
                                    const std::string& key = {}) const;
    /// One counter or gauge of GET /metrics ("name" or "name{labels}"); -1
    /// when it is not there or /metrics does not answer 200.
    long long metric(const std::string& name) const;

private:
    void spawn();
    std::vector<std::string> base_, extra_;
    TempDir dir_;
    pid_t pid_ = -1;
    unsigned short port_ = 0;
};

/// A WebSocket client with its own I/O thread. Replies are matched by rid;
/// frames without rid (pushes) are kept in order for the test to inspect.
class WsClient {
public:
    explicit WsClient(unsigned short port, const std::string& path = "/v1/ws");
    ~WsClient();
    WsClient(const WsClient&) = delete;

    void send_text(const std::string& text);
    void send_binary(const std::string& data);
    void send_json(const json::object& o) { send_text(json::serialize(o)); }
    /// Sends o with a fresh rid and waits for the frame carrying that rid.
    json::object request(json::object o, std::chrono::milliseconds timeout = 10s);
    /// Waits for the frame carrying `rid` (a request sent with send_json and
    /// its own rid, e.g. the first of a pipelined pair) and takes it out of
    /// the queue; {"t":"timeout"} or {"t":"closed"} as request() does.
    json::object reply(const std::string& rid, std::chrono::milliseconds timeout = 10s);
    /// Next frame of any kind, in arrival order.
    std::optional<json::object> next(std::chrono::milliseconds timeout = 5s);
    /// Next server-initiated frame (no rid); replies are skipped.
    std::optional<json::object> next_push(std::chrono::milliseconds timeout = 5s);
    /// Waits for a push matching pred; others are dropped.
    std::optional<json::object> wait_push(const std::function<bool(const json::object&)>& pred,
                                          std::chrono::milliseconds timeout = 10s);
    bool closed() const;
    /// Sends a WebSocket ping after every frame queued before it and waits
    /// for the pong. The server reads frames in order, so a pong means it has
    /// read (and queued) every frame sent before the ping. False on timeout
    /// or a closed connection.
    bool ping(std::chrono::milliseconds timeout = 10s);
    /// Size in bytes of the largest frame received so far.
    std::size_t largest_frame() const;
    /// Frames read from the server (replies and pushes), frames written, and
    /// frames dropped unwritten because a write failed (connection gone).
    struct Counts { std::size_t received = 0, written = 0, dropped = 0; };
    Counts counts() const;
    /// Waits until the server closes; returns its close code (or -1).
    int wait_closed(std::chrono::milliseconds timeout = 10s);
    /// hello with a fresh install id unless given; returns the reply.
    json::object hello(const std::string& token, const std::string& install = {});

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    int next_rid_ = 0;
};

/// A user with one device and its token, created through the admin CLI.
struct TestUser {
    std::string user, device, token;
};
TestUser make_user(const std::string& db_url, const std::string& user);
std::string unique_name(const std::string& prefix);

/// Users named after `prefix` and one conversation holding them all
/// (created with join events at seq 1..members).
struct World {
    std::string conv;
    std::vector<TestUser> users;
};
World make_world(const std::string& db_url, const std::string& prefix, int members, const std::string& kind = "group");

// ------------------------------------------------- helpers shared by every C++ test
// (tests/server, tests/acceptance, tests/scaleout, tests/bench, tests/examples):
// one wait, one free port, one connect-and-hello. The Qt tests have theirs in
// tests/sdk/sdktestutil.h.

/// Polls `pred` every 10 ms until it holds or `timeout` passes; returns its
/// last answer (so a condition met at the deadline still counts).
bool wait_until(const std::function<bool()>& pred, std::chrono::milliseconds timeout);
/// As above, but throws std::runtime_error("timed out waiting for WHAT")
/// when `pred` never held.
void wait_until(const std::function<bool()>& pred, std::chrono::milliseconds timeout, const std::string& what);

/// A 127.0.0.1 TCP port reserved for the whole run: a socket bound to it
/// (SO_REUSEADDR, never listening, close-on-exec) stays open, so neither the
/// kernel (ephemeral ports, another program's bind to 0) nor another
/// free_port() can hand it out between its choice and its use. The program
/// given the port binds it beside the reservation (Linux allows that while
/// the reserving socket does not listen, and every program the tests start
/// sets SO_REUSEADDR: imserver, HAProxy, nats-server, etcd, PostgreSQL,
/// Patroni's REST API), also when restarted on it.
unsigned short free_port();

/// The server's answer to a hello was not `welcome` (what(): the reply).
struct HelloRefused : std::runtime_error {
    using std::runtime_error::runtime_error;
};
/// A WebSocket client on 127.0.0.1:port that said hello with `token` (and
/// `install`, fresh unless given); throws HelloRefused unless the server
/// answered `welcome`.
std::unique_ptr<WsClient> login(unsigned short port, const std::string& token, const std::string& install = {});
/// The same for a user of make_user()/make_world().
std::unique_ptr<WsClient> login(unsigned short port, const TestUser& u, const std::string& install = {});

/// count(*) of events matching a WHERE clause, as text.
std::string count_rows(const TestPostgres& pg, const std::string& where);
/// A quoted SQL literal (test data only: our own generated names).
inline std::string q(const std::string& s) { return "'" + s + "'"; }
std::string uuid4();

/// Convenience accessors on frames.
std::string str(const json::object& o, const char* key);
std::int64_t num(const json::object& o, const char* key);

} // namespace im::test
