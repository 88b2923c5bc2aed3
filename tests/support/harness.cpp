#include "harness.hpp"

#include "store/pg_cluster.hpp"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <pqxx/pqxx>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

namespace im::test {

namespace fs = std::filesystem;
namespace net = boost::asio;
namespace beast = boost::beast;
namespace websocket = beast::websocket;
namespace http = beast::http;
using tcp = net::ip::tcp;

// ------------------------------------------------------------------ names

std::string unique_name(const std::string& prefix) {
    static std::atomic<int> counter{0};
    static const std::string salt = [] {
        std::random_device rd;
        std::ostringstream o;
        o << std::hex << (rd() & 0xffffff);
        return o.str();
    }();
    return prefix + "-" + salt + "-" + std::to_string(++counter);
}

std::string uuid4() {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    std::uniform_int_distribution<int> d(0, 15);
    const char* hex = "0123456789abcdef";
    std::string s = "xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx";
    for (auto& c : s) {
        if (c == 'x') c = hex[d(rng)];
        else if (c == 'y') c = hex[8 + (d(rng) & 3)];
    }
    return s;
}

std::string str(const json::object& o, const char* key) {
    auto* v = o.if_contains(key);
    return v && v->is_string() ? std::string(v->get_string()) : std::string();
}

std::int64_t num(const json::object& o, const char* key) {
    auto* v = o.if_contains(key);
    return v && v->is_int64() ? v->get_int64() : -999;
}

// ------------------------------------------------------------------ TempDir

TempDir::TempDir(const std::string& prefix) {
    std::string tmpl = (fs::temp_directory_path() / (prefix + "-XXXXXX")).string();
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (!::mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed");
    path_ = buf.data();
    ::chmod(path_.c_str(), 0755); // the postgres account must reach a cluster inside
}

TempDir::~TempDir() {
    std::error_code ec;
    im::remove_cluster_for_state_dir(path_);
    fs::remove_all(path_, ec);
}

// ------------------------------------------------------------------ Postgres

namespace {

// A test that ctest's timeout killed (SIGKILL: no destructor ran) leaves its
// cluster running. Each new test cluster first stops and removes the ones
// whose test process is gone (owner.pid names it).
void sweep_orphan_clusters() {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(fs::temp_directory_path(), ec)) {
        const std::string name = e.path().filename().string();
        if (name.rfind("impg-", 0) != 0 || !e.is_directory(ec)) continue;
        std::ifstream f(e.path() / "owner.pid");
        pid_t owner = 0;
        if (!(f >> owner) || owner <= 0 || ::kill(owner, 0) == 0 || errno != ESRCH) continue;
        try {
            if (fs::exists(e.path() / "pg" / "data", ec)) im::PgCluster(fs::canonical(e.path() / "pg").string()).stop("immediate");
        } catch (...) {
        }
        im::remove_cluster_for_state_dir(e.path().string());
        fs::remove_all(e.path(), ec);
    }
}

} // namespace

TestPostgres::TestPostgres() : dir_("impg") {
    sweep_orphan_clusters();
    std::ofstream(dir_.path() + "/owner.pid") << ::getpid() << '\n';
    root_ = im::cluster_root_for_state_dir(dir_.path());
    im::PgCluster c(root_);
    c.ensure_initialized(/*fast=*/true);
    c.start();
    c.ensure_database("im");
}

TestPostgres::~TestPostgres() {
    try {
        im::PgCluster(root_).stop("immediate");
    } catch (...) {
    }
}

std::string TestPostgres::url(const std::string& db) const { return im::PgCluster(root_).url(db); }

void TestPostgres::stop_immediate() { im::PgCluster(root_).stop("immediate"); }

void TestPostgres::start() { im::PgCluster(root_).start(); }

std::string TestPostgres::create_database(const std::string& name) {
    im::PgCluster(root_).ensure_database(name);
    return url(name);
}

std::string TestPostgres::scalar(const std::string& sql, const std::string& db) const {
    pqxx::connection c(url(db));
    pqxx::nontransaction tx(c);
    auto r = tx.exec(sql);
    if (r.empty() || r[0][0].is_null()) return {};
    return r[0][0].c_str();
}

long long TestPostgres::pool_workers_waiting_on_locks() const {
    return std::stoll(scalar("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                             "AND application_name LIKE 'imserver-pool-%'"));
}

std::vector<pid_t> TestPostgres::pids() const {
    std::vector<pid_t> out;
    std::ifstream pidfile(root_ + "/data/postmaster.pid");
    pid_t master = 0;
    if (!(pidfile >> master) || master <= 0) return out;
    out.push_back(master);
    for (const auto& entry : fs::directory_iterator("/proc")) {
        const std::string name = entry.path().filename().string();
        if (name.find_first_not_of("0123456789") != std::string::npos) continue;
        std::ifstream stat(entry.path() / "stat");
        std::string line;
        if (!std::getline(stat, line)) continue;
        // pid (comm) state ppid ...: comm may hold spaces, so parse after ')'.
        auto close = line.rfind(')');
        if (close == std::string::npos) continue;
        std::istringstream rest(line.substr(close + 1));
        std::string state;
        pid_t ppid = 0;
        rest >> state >> ppid;
        if (ppid == master) out.push_back(static_cast<pid_t>(std::stol(name)));
    }
    return out;
}

// ------------------------------------------------------------------ processes

std::string imserver_bin() {
    const char* p = std::getenv("IMSERVER_BIN");
    if (!p || !*p) throw std::runtime_error("IMSERVER_BIN is not set");
    return p;
}

namespace {

// Runs argv, returns {exit code, stdout}; stderr goes to ours.
std::pair<int, std::string> run_capture(const std::vector<std::string>& argv) {
    int pipefd[2];
    if (::pipe(pipefd) != 0) throw std::runtime_error("pipe failed");
    pid_t pid = ::fork();
    if (pid == 0) {
        ::dup2(pipefd[1], 1);
        ::close(pipefd[0]);
        ::close(pipefd[1]);
        std::vector<char*> a;
        for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
        a.push_back(nullptr);
        ::execv(a[0], a.data());
        ::_exit(127);
    }
    ::close(pipefd[1]);
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(pipefd[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
    ::close(pipefd[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    return {WIFEXITED(status) ? WEXITSTATUS(status) : 128, out};
}

std::string trim(std::string s) {
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
}

} // namespace

int imserver_exit_code(const std::vector<std::string>& args, std::chrono::milliseconds timeout) {
    std::vector<std::string> argv{imserver_bin()};
    argv.insert(argv.end(), args.begin(), args.end());
    pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
        int devnull = ::open("/dev/null", O_WRONLY);
        if (devnull >= 0) ::dup2(devnull, 1);
        std::vector<char*> a;
        for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
        a.push_back(nullptr);
        ::execv(a[0], a.data());
        ::_exit(127);
    }
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        int status = 0;
        pid_t r = ::waitpid(pid, &status, WNOHANG);
        if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (std::chrono::steady_clock::now() >= deadline) {
            ::kill(pid, SIGKILL);
            ::waitpid(pid, &status, 0);
            return -1;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
}

std::pair<int, std::string> admin(const std::string& db_url, const std::vector<std::string>& args) {
    std::vector<std::string> argv{imserver_bin(), "admin", "--db", db_url};
    argv.insert(argv.end(), args.begin(), args.end());
    return run_capture(argv);
}

std::string admin_ok(const std::string& db_url, const std::vector<std::string>& args) {
    auto [rc, out] = admin(db_url, args);
    if (rc != 0) {
        std::string cmd;
        for (auto& a : args) cmd += " " + a;
        throw std::runtime_error("imserver admin" + cmd + " exited " + std::to_string(rc));
    }
    return trim(out);
}

TestUser make_user(const std::string& db_url, const std::string& user) {
    admin_ok(db_url, {"user", "add", user});
    TestUser u{user, user + "-d1", ""};
    u.token = admin_ok(db_url, {"device", "add", user, u.device});
    return u;
}

World make_world(const std::string& db, const std::string& prefix, int members, const std::string& kind) {
    World w;
    w.conv = unique_name(prefix);
    std::string list;
    for (int i = 0; i < members; ++i) {
        w.users.push_back(make_user(db, unique_name(prefix + "u" + std::to_string(i))));
        list += (i ? "," : "") + w.users.back().user;
    }
    admin_ok(db, {"conv", "create", w.conv, "--kind", kind, "--members", list});
    return w;
}

std::string count_rows(const TestPostgres& pg, const std::string& where) {
    return pg.scalar("SELECT count(*) FROM events WHERE " + where);
}

ServerProcess::ServerProcess(const std::string& db_url, std::vector<std::string> extra, const std::string& gateway)
    : dir_("imsrv") {
    base_ = {imserver_bin(), "--db", db_url, "--listen", "127.0.0.1:0", "--gateway-id", gateway,
             "--ready-file", dir_.path() + "/port"};
    extra_ = std::move(extra);
    // Test servers write unlimited unless a test asks for --send-rate: the
    // suites send bursts from one user (the limit's own tests set it).
    if (std::find(extra_.begin(), extra_.end(), "--send-rate") == extra_.end()) {
        base_.push_back("--send-rate");
        base_.push_back("0");
    }
    if (std::find(extra_.begin(), extra_.end(), "--api-listen") == extra_.end()) {
        base_.push_back("--api-listen");
        base_.push_back("");
    } else {
        base_.push_back("--api-ready-file");
        base_.push_back(dir_.path() + "/api-port");
    }
    spawn();
}

namespace {

// Under a sanitizer build (IM_SANITIZED, set by CMake with IM_SANITIZE) a
// report in a child imserver's stderr, or a child that does not stop cleanly
// on SIGTERM (LeakSanitizer runs at exit and exits non-zero), fails the test
// binary: its exit status turns 1 at exit, whatever the tests said.
#ifdef IM_SANITIZED
constexpr bool sanitized_build = true;
#else
constexpr bool sanitized_build = false;
#endif

std::atomic<int> sanitizer_failures{0};

void fail_at_exit_if_reported() {
    if (const int n = sanitizer_failures.load()) {
        std::cerr << "==== " << n << " imserver process(es) of this test reported a sanitizer error or did not "
                     "exit 0 on SIGTERM: failing the test (see above)\n";
        std::fflush(nullptr);
        ::_exit(1);
    }
}

constexpr const char* sanitizer_marks[] = {"ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
                                           "WARNING: ThreadSanitizer", "runtime error:"};

} // namespace

void note_sanitizer_failure(const std::string& what, const std::string& log) {
    static const bool registered = (std::atexit(fail_at_exit_if_reported), true);
    (void)registered;
    ++sanitizer_failures;
    std::cerr << "---- imserver: " << what << "; its stderr:\n" << log << "---- end of imserver stderr\n";
}

ServerProcess::~ServerProcess() {
    std::string stop_problem;
    if (pid_ > 0) {
        if (sanitized_build) {
            // SIGTERM, so the leak check at exit runs and its verdict counts.
            const int rc = terminate(60s);
            if (rc != 0) stop_problem = rc < 0 ? "did not exit within 60 s of SIGTERM" : "exited " + std::to_string(rc) + " on SIGTERM";
        } else {
            kill();
        }
    }
    const std::string text = log();
    for (const char* mark : sanitizer_marks)
        if (text.find(mark) != std::string::npos) {
            if (sanitized_build) note_sanitizer_failure(std::string("sanitizer report (") + mark + ")", text);
            else std::cerr << "---- imserver (" << mark << "), its stderr:\n" << text << "---- end of imserver stderr\n";
            return;
        }
    if (!stop_problem.empty()) note_sanitizer_failure(stop_problem, text);
}

void ServerProcess::spawn() {
    fs::remove(dir_.path() + "/port");
    fs::remove(dir_.path() + "/api-port");
    pid_ = ::fork();
    if (pid_ == 0) {
        // Never outlive the test (an orphan would hold ports and pipes).
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = ::open((dir_.path() + "/stderr.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            ::dup2(fd, 1);
            ::dup2(fd, 2);
        }
        std::vector<char*> a;
        for (auto& s : base_) a.push_back(const_cast<char*>(s.c_str()));
        for (auto& s : extra_) a.push_back(const_cast<char*>(s.c_str()));
        a.push_back(nullptr);
        ::execv(a[0], a.data());
        ::_exit(127);
    }
    auto deadline = std::chrono::steady_clock::now() + 60s;
    while (std::chrono::steady_clock::now() < deadline) {
        std::ifstream f(dir_.path() + "/port");
        int port = 0;
        if (f >> port && port > 0) {
            port_ = static_cast<unsigned short>(port);
            return;
        }
        int status = 0;
        if (::waitpid(pid_, &status, WNOHANG) == pid_) {
            pid_ = -1;
            throw std::runtime_error("imserver exited at start:\n" + log());
        }
        std::this_thread::sleep_for(20ms);
    }
    throw std::runtime_error("imserver did not become ready:\n" + log());
}

void ServerProcess::restart() {
    if (pid_ > 0) kill();
    spawn();
}

void ServerProcess::restart_on_same_port() {
    for (auto& a : base_)
        if (a == "127.0.0.1:0") a = "127.0.0.1:" + std::to_string(port_);
    restart();
}

void ServerProcess::restart(std::vector<std::string> extra) {
    extra_ = std::move(extra);
    restart();
}

std::string ServerProcess::url() const { return "ws://127.0.0.1:" + std::to_string(port_) + "/v1/ws"; }

std::optional<int> ServerProcess::wait_exit(std::chrono::milliseconds wait) {
    if (pid_ <= 0) return std::nullopt;
    auto deadline = std::chrono::steady_clock::now() + wait;
    while (std::chrono::steady_clock::now() < deadline) {
        int status = 0;
        if (::waitpid(pid_, &status, WNOHANG) == pid_) {
            pid_ = -1;
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
        std::this_thread::sleep_for(10ms);
    }
    return std::nullopt;
}

int ServerProcess::terminate(std::chrono::milliseconds wait) {
    if (pid_ <= 0) return -1;
    ::kill(pid_, SIGTERM);
    auto rc = wait_exit(wait);
    if (!rc) {
        kill();
        return -1;
    }
    return *rc;
}

void ServerProcess::kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
}

std::string ServerProcess::log() const {
    std::ifstream f(dir_.path() + "/stderr.log");
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

std::pair<int, std::string> ServerProcess::http(const std::string& method, const std::string& target,
                                                const std::string& body) const {
    net::io_context ioc;
    beast::tcp_stream stream(ioc);
    stream.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port_));
    http::request<http::string_body> req{http::string_to_verb(method), target, 11};
    req.set(http::field::host, "127.0.0.1");
    req.body() = body;
    req.prepare_payload();
    http::write(stream, req);
    beast::flat_buffer buf;
    http::response<http::string_body> res;
    http::read(stream, buf, res);
    beast::error_code ec;
    stream.socket().shutdown(tcp::socket::shutdown_both, ec);
    return {static_cast<int>(res.result_int()), res.body()};
}

unsigned short ServerProcess::api_port() const {
    std::ifstream f(dir_.path() + "/api-port");
    int port = 0;
    return f >> port ? static_cast<unsigned short>(port) : 0;
}

std::pair<int, std::string> ServerProcess::api(const std::string& method, const std::string& target,
                                               const std::string& body, const std::string& key) const {
    net::io_context ioc;
    beast::tcp_stream stream(ioc);
    stream.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), api_port()));
    stream.expires_after(30s);
    http::request<http::string_body> req{http::string_to_verb(method), target, 11};
    req.set(http::field::host, "127.0.0.1");
    if (!key.empty()) req.set(http::field::authorization, "Bearer " + key);
    if (!body.empty()) req.set(http::field::content_type, "application/json");
    req.body() = body;
    req.prepare_payload();
    http::write(stream, req);
    beast::flat_buffer buf;
    http::response_parser<http::string_body> res;
    res.body_limit(16 * 1024 * 1024);
    http::read(stream, buf, res);
    beast::error_code ec;
    stream.socket().shutdown(tcp::socket::shutdown_both, ec);
    return {static_cast<int>(res.get().result_int()), res.get().body()};
}

long long ServerProcess::metric(const std::string& name) const {
    auto [status, body] = http("GET", "/metrics");
    if (status != 200) return -1;
    std::istringstream in(body);
    std::string line;
    while (std::getline(in, line))
        if (line.rfind(name + " ", 0) == 0) return std::stoll(line.substr(name.size() + 1));
    return -1;
}

// ------------------------------------------------------------------ WsClient

struct WsClient::Impl {
    net::io_context ioc;
    websocket::stream<beast::tcp_stream> ws{ioc};
    beast::flat_buffer buf;
    std::deque<std::pair<std::string, int>> out; // (data, kind: 0 binary, 1 text, 2 ping)
    std::size_t pongs = 0;
    std::thread thread;

    std::mutex mu;
    std::condition_variable cv;
    std::deque<json::object> frames;
    bool is_closed = false;
    int close_code = -1;
    std::size_t largest = 0;
    std::size_t received = 0; // frames read (replies and pushes, parsable or not)
    std::size_t written = 0;  // frames fully written
    std::size_t dropped = 0;  // frames never written because a write failed

    void do_read() {
        ws.async_read(buf, [this](beast::error_code ec, std::size_t) {
            if (ec) {
                std::lock_guard lk(mu);
                is_closed = true;
                close_code = ws.reason().code;
                cv.notify_all();
                return;
            }
            std::string text = beast::buffers_to_string(buf.data());
            buf.consume(buf.size());
            json::error_code jec;
            auto v = json::parse(text, jec);
            {
                std::lock_guard lk(mu);
                largest = std::max(largest, text.size());
                ++received;
                frames.push_back(!jec && v.is_object() ? std::move(v.as_object()) : json::object{{"t", "unparsable"}});
                cv.notify_all();
            }
            do_read();
        });
    }

    void do_write() {
        auto done = [this](beast::error_code ec, std::size_t = 0) {
            if (ec) {
                // The connection is gone: nothing queued will ever be written.
                // Count it (the test can see it) and empty the queue, so a
                // later send is not stuck behind a write that never finishes.
                std::lock_guard lk(mu);
                dropped += out.size();
                out.clear();
                cv.notify_all();
                return;
            }
            {
                std::lock_guard lk(mu);
                ++written;
            }
            out.pop_front();
            if (!out.empty()) do_write();
        };
        if (out.front().second == 2) return ws.async_ping({}, [done](beast::error_code ec) { done(ec); });
        ws.text(out.front().second == 1);
        ws.async_write(net::buffer(out.front().first), done);
    }
};

WsClient::WsClient(unsigned short port, const std::string& path) : impl_(std::make_unique<Impl>()) {
    auto& ws = impl_->ws;
    beast::get_lowest_layer(ws).connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
    ws.read_message_max(16 * 1024 * 1024);
    ws.control_callback([impl = impl_.get()](websocket::frame_type kind, beast::string_view) {
        if (kind != websocket::frame_type::pong) return;
        std::lock_guard lk(impl->mu);
        ++impl->pongs;
        impl->cv.notify_all();
    });
    ws.handshake("127.0.0.1:" + std::to_string(port), path);
    impl_->do_read();
    impl_->thread = std::thread([this] { impl_->ioc.run(); });
}

WsClient::~WsClient() {
    net::post(impl_->ioc, [this] {
        beast::error_code ec;
        beast::get_lowest_layer(impl_->ws).socket().close(ec);
    });
    impl_->thread.join();
}

void WsClient::send_text(const std::string& text) {
    net::post(impl_->ioc, [this, text] {
        impl_->out.emplace_back(text, true);
        if (impl_->out.size() == 1) impl_->do_write();
    });
}

void WsClient::send_binary(const std::string& data) {
    net::post(impl_->ioc, [this, data] {
        impl_->out.emplace_back(data, false);
        if (impl_->out.size() == 1) impl_->do_write();
    });
}

bool WsClient::ping(std::chrono::milliseconds timeout) {
    std::size_t before;
    {
        std::lock_guard lk(impl_->mu);
        before = impl_->pongs;
    }
    net::post(impl_->ioc, [this] {
        impl_->out.emplace_back(std::string(), 2);
        if (impl_->out.size() == 1) impl_->do_write();
    });
    std::unique_lock lk(impl_->mu);
    return impl_->cv.wait_for(lk, timeout, [&] { return impl_->pongs > before || impl_->is_closed; }) &&
           impl_->pongs > before;
}

json::object WsClient::request(json::object o, std::chrono::milliseconds timeout) {
    std::string rid = "r" + std::to_string(++next_rid_);
    o["rid"] = rid;
    send_json(o);
    return reply(rid, timeout);
}

json::object WsClient::reply(const std::string& rid, std::chrono::milliseconds timeout) {
    std::unique_lock lk(impl_->mu);
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        for (auto it = impl_->frames.begin(); it != impl_->frames.end(); ++it) {
            if (str(*it, "rid") == rid) {
                json::object f = std::move(*it); // a page's tree is large: moved, not copied
                impl_->frames.erase(it);
                return f;
            }
        }
        if (impl_->is_closed) return json::object{{"t", "closed"}, {"code", impl_->close_code}};
        if (impl_->cv.wait_until(lk, deadline) == std::cv_status::timeout)
            return json::object{{"t", "timeout"}};
    }
}

std::optional<json::object> WsClient::next(std::chrono::milliseconds timeout) {
    std::unique_lock lk(impl_->mu);
    if (!impl_->cv.wait_for(lk, timeout, [this] { return !impl_->frames.empty() || impl_->is_closed; }))
        return std::nullopt;
    if (impl_->frames.empty()) return std::nullopt;
    json::object f = impl_->frames.front();
    impl_->frames.pop_front();
    return f;
}

std::optional<json::object> WsClient::next_push(std::chrono::milliseconds timeout) {
    return wait_push([](const json::object&) { return true; }, timeout);
}

std::optional<json::object> WsClient::wait_push(const std::function<bool(const json::object&)>& pred,
                                                std::chrono::milliseconds timeout) {
    std::unique_lock lk(impl_->mu);
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        for (auto it = impl_->frames.begin(); it != impl_->frames.end();) {
            if (it->contains("rid")) { ++it; continue; }
            json::object f = *it;
            it = impl_->frames.erase(it);
            if (pred(f)) return f;
        }
        if (impl_->is_closed) return std::nullopt;
        if (impl_->cv.wait_until(lk, deadline) == std::cv_status::timeout) return std::nullopt;
    }
}

WsClient::Counts WsClient::counts() const {
    std::lock_guard lk(impl_->mu);
    return {impl_->received, impl_->written, impl_->dropped};
}

bool WsClient::closed() const {
    std::lock_guard lk(impl_->mu);
    return impl_->is_closed;
}

std::size_t WsClient::largest_frame() const {
    std::lock_guard lk(impl_->mu);
    return impl_->largest;
}

int WsClient::wait_closed(std::chrono::milliseconds timeout) {
    std::unique_lock lk(impl_->mu);
    impl_->cv.wait_for(lk, timeout, [this] { return impl_->is_closed; });
    return impl_->is_closed ? impl_->close_code : -1;
}

json::object WsClient::hello(const std::string& token, const std::string& install) {
    return request({{"t", "hello"}, {"token", token}, {"install", install.empty() ? uuid4() : install}});
}

// ------------------------------------------------------------------ shared helpers

bool wait_until(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
        if (pred()) return true;
        std::this_thread::sleep_for(10ms);
    }
    return pred();
}

void wait_until(const std::function<bool()>& pred, std::chrono::milliseconds timeout, const std::string& what) {
    if (!wait_until(pred, timeout)) throw std::runtime_error("timed out waiting for " + what);
}

unsigned short free_port() {
    static std::mutex mu;
    static std::vector<int> held; // closed at exit
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw std::runtime_error("free_port: socket failed");
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof addr;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
        ::close(fd);
        throw std::runtime_error("free_port: bind failed");
    }
    std::lock_guard lk(mu);
    held.push_back(fd);
    return ntohs(addr.sin_port);
}

std::unique_ptr<WsClient> login(unsigned short port, const std::string& token, const std::string& install) {
    auto c = std::make_unique<WsClient>(port);
    auto w = c->hello(token, install);
    if (str(w, "t") != "welcome") throw HelloRefused("hello -> " + json::serialize(w));
    return c;
}

std::unique_ptr<WsClient> login(unsigned short port, const TestUser& u, const std::string& install) {
    return login(port, u.token, install);
}

} // namespace im::test
