// im_storm: the reconnect storm (issue 28). N clients are connected to an
// imserver on its PostgreSQL (the 100 x 5 load's members plus idle users in
// conversations of their own), the server is killed and started again, and
// every client reconnects at once, each with hello, sub, convs (all pages)
// and a sync of each of its conversations from its cursor. Measured: the
// time until all are back (every sync done), imserver's and PostgreSQL's
// CPU seconds meanwhile, the refusals seen, and the latency of the first
// live push after it (one post per load conversation once all are back).
//
// Usage: im_storm [--clients 5000] [--convs 100] [--members 5] [--idle-convs 4]
//                 [--history 20] [--missed 5] [--rounds 1] [--jitter-ms 0]
//                 [--stop kill|term] [--before OTHER_IMSERVER] [--perf FILE]
//                 [--statements N] [--db URL] [--server-arg ARG]...
// See docs/benchmarks.md, "Reconnect storm". It prints figures, it asserts
// nothing (exit 1 only when the storm never completed).
#include "bench_support.hpp"
#include "store/database.hpp"
#include "exe_relative.hpp"
#include "harness.hpp"
#include "store/store.hpp"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/json.hpp>

#include <pqxx/pqxx>

#include <atomic>
#include <csignal>
#include <deque>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

namespace net = boost::asio;
namespace beast = boost::beast;
namespace websocket = beast::websocket;
namespace json = boost::json;
using tcp = net::ip::tcp;
using clk = std::chrono::steady_clock;
using namespace std::chrono_literals;
using namespace im::bench;

namespace {

struct Options {
    int clients = 5000, convs = 100, members = 5, idle_convs = 4, history = 20, missed = 5, rounds = 1;
    int jitter_ms = 0;        // first reconnect of each client uniformly in [0, jitter] after the release
    bool term = false;        // stop the server with SIGTERM (drain) instead of SIGKILL
    std::string before;       // another imserver binary, alternated with this build's round by round
    std::string perf;         // perf record -a -g over the storm of the first round, into this file
    int statements = 0;       // > 0: pg_stat_statements on; the top N statements of each storm
    std::optional<std::string> db;
    std::vector<std::string> server_args;
};

const char* install_id = "storm-install";

double ms_between(clk::time_point a, clk::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

// ---------------------------------------------------------------- shared state of a run

struct Counters {
    std::mutex mu;
    std::map<std::string, long> events; // refusals and errors seen by the clients, by name
    void count(const std::string& what) {
        std::lock_guard lk(mu);
        ++events[what];
    }
};

struct Storm {
    Storm(net::io_context& c, std::size_t convs) : ioc(c), post_at_ns(convs) {}
    net::io_context& ioc;
    std::atomic<unsigned short> port{0};
    std::atomic<int> back{0};   // clients done with every sync this round
    std::atomic<int> up{0};     // clients connected (any state)
    std::atomic<int> posted{0}; // pushes measured in the post phase
    std::atomic<bool> posting{false};
    std::atomic<bool> storming{false}; // failures reconnect with the SDK's backoff (else wait for release)
    clk::time_point released{};
    Counters counters;
    std::mutex mu;
    Samples back_ms, push_ms;
    std::vector<std::atomic<long long>> post_at_ns; // per load conversation: when its post was written
};

// The SDK's backoff (sdk/src/transport.cpp, connection.cpp): capped
// exponential with equal jitter, [d/2, d].
std::chrono::milliseconds sdk_backoff(int attempt, int initial_ms, std::mt19937& rng) {
    const int exp = std::min(std::max(attempt - 1, 0), 20);
    const long long d = std::min<long long>(30000, static_cast<long long>(initial_ms) << exp);
    return std::chrono::milliseconds(d / 2 + std::uniform_int_distribution<long long>(0, d / 2)(rng));
}

// ---------------------------------------------------------------- one client

// One device: connects, hello, sub, convs (all pages), then one sync per
// conversation (pipelined, as the SDK does), each followed to its last page.
// A lost connection waits for the generator's release (the server is
// down), then reconnects with the SDK's reconnect backoff; an UNAVAILABLE
// reply is retried with the SDK's request backoff.
class Client : public std::enable_shared_from_this<Client> {
public:
    Client(Storm& s, std::string token, net::ip::address bind_to, int load_conv, bool poster, unsigned seed)
        : s_(s), strand_(net::make_strand(s.ioc)), timer_(strand_), token_(std::move(token)), bind_to_(bind_to),
          load_conv_(load_conv), poster_(poster), rng_(seed) {}

    /// Connect after `delay` (the release of a round).
    void release(std::chrono::milliseconds delay) {
        net::post(strand_, [self = shared_from_this(), delay] {
            self->back_ = false;
            self->failures_ = 0;
            self->schedule(delay);
        });
    }

    /// The post phase: write one message to the load conversation.
    void post(const std::string& conv, int round) {
        net::post(strand_, [self = shared_from_this(), conv, round] {
            self->s_.post_at_ns[static_cast<std::size_t>(self->load_conv_)] =
                clk::now().time_since_epoch().count();
            self->write(json::serialize(json::object{{"t", "send"},
                                                     {"rid", "p"},
                                                     {"conv", conv},
                                                     {"cmid", "storm-" + std::to_string(round)},
                                                     {"body", "after the storm"}}));
        });
    }

    void close() {
        net::post(strand_, [self = shared_from_this()] {
            self->timer_.cancel();
            self->drop();
        });
    }

    /// Before a post phase: the next fresh push is measured.
    void expect_push() {
        net::post(strand_, [self = shared_from_this()] { self->measured_ = false; });
    }

private:
    using Ws = websocket::stream<beast::tcp_stream>;

    void schedule(std::chrono::milliseconds delay) {
        timer_.expires_after(delay);
        timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
            if (!ec) self->connect();
        });
    }

    void connect() {
        drop();
        const auto gen = ++gen_;
        ws_ = std::make_unique<Ws>(strand_);
        auto& sock = beast::get_lowest_layer(*ws_).socket();
        beast::error_code ec;
        sock.open(tcp::v4(), ec);
        if (!ec) sock.bind({bind_to_, 0}, ec);
        if (ec) return lost(gen, "socket");
        sock.set_option(tcp::no_delay(true), ec);
        beast::get_lowest_layer(*ws_).async_connect(
            tcp::endpoint(net::ip::make_address("127.0.0.1"), s_.port.load()),
            [self = shared_from_this(), gen](beast::error_code e) {
                if (gen != self->gen_) return;
                if (e) return self->lost(gen, "connect failed");
                self->ws_->async_handshake("127.0.0.1", "/v1/ws", [self, gen](beast::error_code e2) {
                    if (gen != self->gen_) return;
                    if (e2) return self->lost(gen, "upgrade failed (" + e2.message() + ")");
                    self->connected_ = true;
                    ++self->s_.up;
                    self->convs_.clear();
                    self->hello();
                    self->read(gen);
                });
            });
    }

    void drop() {
        if (connected_) --s_.up;
        connected_ = false;
        out_.clear();
        writing_ = false;
        if (ws_) {
            beast::error_code ignored;
            beast::get_lowest_layer(*ws_).socket().close(ignored);
        }
    }

    // The connection is gone: wait for the release while the server is
    // down, else reconnect after the SDK's backoff.
    void lost(std::uint64_t gen, const std::string& why) {
        if (gen != gen_) return;
        if (s_.storming) s_.counters.count(why);
        drop();
        ++gen_; // late callbacks of this connection are ignored
        back_ = false;
        if (!s_.storming) return;
        schedule(sdk_backoff(++failures_, 500, rng_));
    }

    void write(std::string frame) {
        if (!connected_) return;
        out_.push_back(std::move(frame));
        if (!writing_) do_write();
    }
    void do_write() {
        writing_ = true;
        ws_->text(true);
        ws_->async_write(net::buffer(out_.front()), [self = shared_from_this(), gen = gen_](beast::error_code ec, std::size_t) {
            if (gen != self->gen_) return;
            self->writing_ = false;
            if (ec) return self->lost(gen, "write failed");
            self->out_.pop_front();
            if (!self->out_.empty()) self->do_write();
        });
    }
    void read(std::uint64_t gen) {
        ws_->async_read(buf_, [self = shared_from_this(), gen](beast::error_code ec, std::size_t) {
            if (gen != self->gen_) return;
            if (ec) {
                if (ec == websocket::error::closed)
                    return self->lost(gen, "closed " + std::to_string(self->ws_->reason().code) + " (" +
                                               std::string(self->ws_->reason().reason.c_str()) + ")");
                return self->lost(gen, "connection lost");
            }
            const std::string text = beast::buffers_to_string(self->buf_.data());
            self->buf_.consume(self->buf_.size());
            self->on_frame(text);
            if (gen == self->gen_) self->read(gen);
        });
    }

    // ---- requests (rid: kind, then what a retry needs)
    void hello() { write(json::serialize(json::object{{"t", "hello"}, {"rid", "h"}, {"token", token_}, {"install", install_id}})); }
    void sub() { write(R"({"t":"sub","rid":"u"})"); }
    void convs(const std::string& after) {
        json::object o{{"t", "convs"}, {"rid", "c:" + after}, {"limit", 100}};
        if (!after.empty()) o["after"] = after;
        write(json::serialize(o));
    }
    void sync(const std::string& conv) {
        write(json::serialize(json::object{
            {"t", "sync"}, {"rid", "s:" + conv}, {"conv", conv}, {"after", cursor_[conv]}, {"limit", 100}}));
    }
    void retry(const std::string& rid) {
        auto timer = std::make_shared<net::steady_timer>(strand_, sdk_backoff(++retries_, 250, rng_));
        timer->async_wait([self = shared_from_this(), timer, rid, gen = gen_](beast::error_code ec) {
            if (ec || gen != self->gen_) return;
            if (rid == "h") self->hello();
            else if (rid == "u") self->sub();
            else if (rid.rfind("c:", 0) == 0) self->convs(rid.substr(2));
            else if (rid.rfind("s:", 0) == 0) self->sync(rid.substr(2));
        });
    }

    void on_frame(const std::string& text) {
        json::error_code jec;
        auto v = json::parse(text, jec);
        if (jec || !v.is_object()) return;
        const auto& o = v.as_object();
        const auto* t = o.if_contains("t");
        if (!t || !t->is_string()) return;
        const std::string type(t->as_string());
        const auto* r = o.if_contains("rid");
        const std::string rid = r && r->is_string() ? std::string(r->as_string()) : "";
        if (type == "error") {
            const std::string code(o.at("code").as_string());
            const std::string kind = rid.empty() ? "push" : rid.substr(0, 1);
            if (s_.storming) s_.counters.count(code + " (" + kind + ")");
            if (code == "UNAVAILABLE" && !rid.empty() && rid != "p") retry(rid);
            return;
        }
        if (type == "welcome") return sub();
        if (type == "subscribed") return convs("");
        if (type == "convs") return on_convs(o);
        if (type == "page") return on_page(o);
        if (type == "event") return on_event(o.at("ev").as_object());
        if (type == "sent" || type == "hint") return;
        if (type == "resync" || type == "goaway") s_.counters.count(type + " frame");
    }

    void on_convs(const json::object& o) {
        retries_ = 0;
        for (const auto& c : o.at("convs").as_array()) convs_.emplace_back(c.as_object().at("conv").as_string());
        if (o.at("has_more").as_bool()) return convs(std::string(o.at("next_after").as_string()));
        pending_ = static_cast<int>(convs_.size());
        for (const auto& c : convs_) sync(c);
        if (pending_ == 0) done();
    }

    void on_page(const json::object& o) {
        retries_ = 0;
        const std::string conv(o.at("conv").as_string());
        cursor_[conv] = std::max(cursor_[conv], o.at("next_after").as_int64());
        if (o.at("has_more").as_bool()) return sync(conv);
        if (--pending_ == 0) done();
    }

    void done() {
        if (back_) return;
        back_ = true;
        failures_ = 0;
        if (!s_.storming) return;
        const double ms = ms_between(s_.released, clk::now());
        {
            std::lock_guard lk(s_.mu);
            s_.back_ms.v.push_back(ms);
        }
        ++s_.back;
    }

    void on_event(const json::object& ev) {
        const std::string conv(ev.at("conv").as_string());
        const auto seq = ev.at("seq").as_int64();
        const bool fresh = seq > cursor_[conv];
        cursor_[conv] = std::max(cursor_[conv], seq);
        if (!fresh || poster_ || !s_.posting || load_conv_ < 0 || measured_) return;
        const long long at = s_.post_at_ns[static_cast<std::size_t>(load_conv_)];
        if (at == 0) return;
        measured_ = true;
        const double ms = std::chrono::duration<double, std::milli>(clk::now().time_since_epoch() - clk::duration(at)).count();
        {
            std::lock_guard lk(s_.mu);
            s_.push_ms.v.push_back(ms);
        }
        ++s_.posted;
    }

    Storm& s_;
    net::strand<net::io_context::executor_type> strand_;
    net::steady_timer timer_;
    std::unique_ptr<Ws> ws_;
    beast::flat_buffer buf_;
    std::deque<std::string> out_;
    bool writing_ = false, connected_ = false, back_ = false, measured_ = false;
    std::uint64_t gen_ = 0;
    std::string token_;
    net::ip::address bind_to_;
    int load_conv_;  // index of its load conversation, -1 for an idle user
    bool poster_;    // member 0 of a load conversation: writes the post
    std::mt19937 rng_;
    int failures_ = 0, retries_ = 0, pending_ = 0;
    std::vector<std::string> convs_;
    std::map<std::string, std::int64_t> cursor_;
};

// ---------------------------------------------------------------- provisioning

struct Member {
    std::string user, token;
    int load_conv = -1; // its load conversation, or -1 (idle)
    bool poster = false;
};

struct World {
    std::vector<Member> members;
    std::vector<std::string> load_convs;
    std::vector<std::vector<std::size_t>> load_members; // [c] -> member indexes
};

// The load's conversations (convs x members, as im_loadgen's) and the idle
// users: each in `idle_convs` conversations of `members` users (layer l
// groups users l + 5k .. l + 5k + 4, so the groups of each layer differ).
World provision(const std::string& url, const Options& o) {
    im::FaultRegistry faults(false);
    im::Store store(faults, {});
    pqxx::connection c(url);
    pqxx::nontransaction(c).exec("SET synchronous_commit = off"); // set-up only: no fsync per user
    World w;
    auto add = [&](const std::string& name) {
        store.add_user(c, name);
        Member m;
        m.user = name;
        m.token = store.add_device(c, name, name + "-d");
        w.members.push_back(m);
        return w.members.size() - 1;
    };
    for (int i = 0; i < o.convs; ++i) {
        std::vector<std::string> names;
        std::vector<std::size_t> idx;
        for (int k = 0; k < o.members; ++k) {
            auto m = add("su" + std::to_string(i) + "-" + std::to_string(k));
            w.members[m].load_conv = i;
            w.members[m].poster = k == 0;
            names.push_back(w.members[m].user);
            idx.push_back(m);
        }
        w.load_convs.push_back("sc" + std::to_string(i));
        store.create_conv(c, w.load_convs.back(), "group", names);
        w.load_members.push_back(idx);
    }
    const int idle = std::max(0, o.clients - o.convs * o.members);
    std::vector<std::string> idle_names;
    for (int i = 0; i < idle; ++i) idle_names.push_back(w.members[add("si" + std::to_string(i))].user);
    const int group = std::max(2, o.members);
    if (idle >= group)
        for (int l = 0; l < std::min(o.idle_convs, group); ++l)
            for (int k = 0; k + group <= idle; k += group) {
                std::vector<std::string> names;
                for (int m = 0; m < group; ++m) names.push_back(idle_names[static_cast<std::size_t>((l + k + m) % idle)]);
                store.create_conv(c, "si" + std::to_string(l) + "-" + std::to_string(k / group), "group", names);
            }
    return w;
}

// `n` messages in each load conversation, through the server's own send SQL
// (as another gateway would take them while this one is down).
void post_directly(const std::string& url, const World& w, int n, const std::string& tag) {
    if (n <= 0) return;
    im::FaultRegistry faults(false);
    im::Store store(faults, {});
    pqxx::connection c(url);
    for (std::size_t i = 0; i < w.load_convs.size(); ++i) {
        const auto& m = w.members[w.load_members[i][1 % w.load_members[i].size()]];
        auto who = store.hello(c, {m.token, install_id});
        if (!who) throw std::runtime_error("hello refused for " + m.user);
        for (int k = 0; k < n; ++k) {
            im::req::Send s;
            s.conv = w.load_convs[i];
            s.cmid = tag + "-" + std::to_string(k);
            s.body = std::string(100, 'x');
            if (!store.send(c, who.value(), s)) throw std::runtime_error("direct send refused");
        }
    }
}

// ---------------------------------------------------------------- perf

pid_t start_perf(const std::string& file) {
    pid_t p = ::fork();
    if (p == 0) {
        ::execlp("perf", "perf", "record", "-a", "-g", "-F", "499", "-q", "-o", file.c_str(), nullptr);
        ::_exit(127);
    }
    return p;
}

void stop_perf(pid_t p) {
    if (p <= 0) return;
    ::kill(p, SIGINT);
    int st = 0;
    ::waitpid(p, &st, 0);
}

std::string load_average() {
    std::ifstream f("/proc/loadavg");
    std::string a, b, c;
    f >> a >> b >> c;
    return a + " " + b + " " + c;
}

// The metrics a storm moves: requests by type and code, refusals.
std::map<std::string, long long> storm_metrics(const im::test::ServerProcess& srv) {
    std::map<std::string, long long> out;
    auto [status, body] = srv.http("GET", "/metrics");
    if (status != 200) return out;
    std::istringstream in(body);
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty() || line[0] == '#') continue;
        if (line.rfind("im_requests_total", 0) != 0 && line.rfind("im_connections_rejected_total", 0) != 0 &&
            line.rfind("im_http_connections_rejected_total", 0) != 0 && line.rfind("im_hello_rate_limited", 0) != 0)
            continue;
        auto sp = line.rfind(' ');
        out[line.substr(0, sp)] = std::atoll(line.c_str() + sp + 1);
    }
    return out;
}

// ---------------------------------------------------------------- pg_stat_statements

// Loads pg_stat_statements into the embedded cluster (a restart).
void enable_statements(im::Database& db) {
    if (!db.cluster) throw std::runtime_error("--statements needs the embedded cluster (not --db)");
    {
        pqxx::connection c(db.url);
        pqxx::nontransaction(c).exec("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'");
    }
    db.cluster->stop("fast");
    db.cluster->start();
    pqxx::connection c(db.url);
    pqxx::nontransaction(c).exec("CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
}

void reset_statements(const std::string& url) {
    pqxx::connection c(url);
    pqxx::nontransaction(c).exec("SELECT pg_stat_statements_reset()");
}

void print_statements(const std::string& url, int n) {
    pqxx::connection c(url);
    pqxx::nontransaction tx(c);
    auto r = tx.exec_params("SELECT calls, total_exec_time, rows, regexp_replace(left(query, 110), '\\s+', ' ', 'g') "
                            "FROM pg_stat_statements WHERE query NOT LIKE '%pg_stat_statements%' "
                            "ORDER BY total_exec_time DESC LIMIT $1",
                            n);
    auto sum = tx.exec("SELECT sum(calls), sum(total_exec_time) FROM pg_stat_statements");
    std::printf("  statements: %s calls, %.0f ms of execution in all; the top %d by time:\n", sum[0][0].c_str(),
                sum[0][1].as<double>(0), n);
    for (const auto& row : r)
        std::printf("  %8s calls %9.1f ms %8s rows  %s\n", row[0].c_str(), row[1].as<double>(), row[2].c_str(),
                    row[3].c_str());
}

// ---------------------------------------------------------------- the run

int run(const Options& o, const std::string& url) {
    std::printf("im_storm: %d clients (%d x %d load members, the rest idle users, each in %d conversations of %d), "
                "history %d msgs per load conversation, %d more posted while the server is down; stop with %s; "
                "reconnect %s\n",
                o.clients, o.convs, o.members, o.idle_convs, o.members, o.history, o.missed, o.term ? "SIGTERM" : "SIGKILL",
                o.jitter_ms > 0 ? ("spread over " + std::to_string(o.jitter_ms) + " ms").c_str() : "all at once");
    const auto t_prov = clk::now();
    const World w = provision(url, o);
    post_directly(url, w, o.history, "history");
    std::printf("provisioned %zu users in %.1f s\n", w.members.size(), ms_between(t_prov, clk::now()) / 1000);
    const pid_t pg = postmaster_pid(url);

    std::vector<std::string> flags = {"--quiet"};
    flags.insert(flags.end(), o.server_args.begin(), o.server_args.end());
    const std::string after_bin = im::test::imserver_bin();
    auto start_server = [&](const std::string& bin) {
        ::setenv("IMSERVER_BIN", bin.c_str(), 1);
        auto s = std::make_unique<im::test::ServerProcess>(url, flags, "gw-storm");
        ::setenv("IMSERVER_BIN", after_bin.c_str(), 1);
        return s;
    };

    net::io_context ioc;
    Storm s(ioc, w.load_convs.size());
    auto guard = net::make_work_guard(ioc);
    std::thread io([&] { ioc.run(); });
    std::vector<std::shared_ptr<Client>> clients;
    for (std::size_t i = 0; i < w.members.size(); ++i) {
        const auto& m = w.members[i];
        // Spread over 200 source addresses: 25 per address at 5,000 clients,
        // far under --max-connections-per-address (1,000).
        auto src = net::ip::make_address_v4("127.0.0." + std::to_string(2 + i % 200));
        clients.push_back(std::make_shared<Client>(s, m.token, net::ip::address(src), m.load_conv, m.poster,
                                                   static_cast<unsigned>(i * 7919 + 1)));
    }
    const int total = static_cast<int>(clients.size());

    // Everyone online and synced once, in batches (not measured).
    auto srv = start_server(after_bin);
    s.port = srv->port();
    s.storming = true; // retry as the SDK would while they come in
    s.released = clk::now();
    for (int i = 0; i < total; ++i) {
        clients[static_cast<std::size_t>(i)]->release(std::chrono::milliseconds(i / 10));
    }
    int rc = 0;
    if (!wait_until([&] { return s.back >= total; }, 600s)) {
        std::printf("only %d of %d clients came online\n", s.back.load(), total);
        rc = 1;
    } else {
        std::printf("all %d online and synced in %.1f s (staggered over %.1f s)\n", total,
                    ms_between(s.released, clk::now()) / 1000, total / 10000.0);
    }

    struct Row {
        std::string server;
        double back_s, p50, p90, cpu_srv, cpu_pg, cpu_gen, push_p50, push_p99;
        int push_n;
        std::string load;
        std::map<std::string, long> refusals;
        std::map<std::string, long long> metrics;
    };
    std::vector<Row> rows;
    for (int round = 0; rc == 0 && round < o.rounds; ++round) {
        const bool before = !o.before.empty() && round % 2 == 1;
        // The stop: every client notices and waits for the release.
        s.storming = false;
        if (o.term) srv->terminate();
        else srv->kill();
        wait_until([&] { return s.up.load() == 0; }, 60s);
        post_directly(url, w, o.missed, "missed" + std::to_string(round));
        srv = start_server(before ? o.before : after_bin);
        s.port = srv->port();
        {
            std::lock_guard lk(s.mu);
            s.back_ms.v.clear();
            s.push_ms.v.clear();
        }
        {
            std::lock_guard lk(s.counters.mu);
            s.counters.events.clear();
        }
        s.back = 0;
        s.posted = 0;
        Row row;
        row.server = before ? "before" : "after";
        row.load = load_average();
        const pid_t perf = (round == 0 && !o.perf.empty()) ? start_perf(o.perf) : 0;
        if (perf) std::this_thread::sleep_for(1s); // perf is set up
        if (o.statements > 0) reset_statements(url);
        const double srv0 = cpu_seconds(srv->pid()), pg0 = postgres_cpu(pg), gen0 = self_cpu();
        std::fprintf(stderr, "storm: imserver pid %d, postmaster pid %d\n", static_cast<int>(srv->pid()),
                     static_cast<int>(pg));
        s.released = clk::now();
        s.storming = true;
        std::mt19937 rng(static_cast<unsigned>(round + 1));
        for (auto& c : clients)
            c->release(std::chrono::milliseconds(
                o.jitter_ms > 0 ? std::uniform_int_distribution<int>(0, o.jitter_ms)(rng) : 0));
        const bool all = wait_until([&] { return s.back >= total; }, 600s);
        row.back_s = ms_between(s.released, clk::now()) / 1000;
        const double srv1 = cpu_seconds(srv->pid()), pg1 = postgres_cpu(pg), gen1 = self_cpu();
        stop_perf(perf);
        row.cpu_srv = srv1 - srv0;
        row.cpu_pg = pg1 - pg0;
        row.cpu_gen = gen1 - gen0;
        {
            std::lock_guard lk(s.mu);
            row.p50 = s.back_ms.pct(50) / 1000;
            row.p90 = s.back_ms.pct(90) / 1000;
        }
        if (!all) {
            std::printf("round %d: only %d of %d clients back after 600 s\n", round + 1, s.back.load(), total);
            rc = 1;
            break;
        }
        // The post phase: one message per load conversation, measured at
        // every other member as its first live push.
        for (auto& c : clients) c->expect_push();
        for (auto& v : s.post_at_ns) v = 0;
        std::this_thread::sleep_for(200ms);
        s.posting = true;
        int expected = 0;
        for (std::size_t i = 0; i < w.load_convs.size(); ++i) {
            expected += static_cast<int>(w.load_members[i].size()) - 1;
            for (auto m : w.load_members[i])
                if (w.members[m].poster) clients[m]->post(w.load_convs[i], round);
        }
        wait_until([&] { return s.posted >= expected; }, 30s);
        s.posting = false;
        {
            std::lock_guard lk(s.mu);
            row.push_n = static_cast<int>(s.push_ms.v.size());
            row.push_p50 = s.push_ms.pct(50);
            row.push_p99 = s.push_ms.pct(99);
        }
        {
            std::lock_guard lk(s.counters.mu);
            row.refusals = s.counters.events;
        }
        row.metrics = storm_metrics(*srv);
        std::printf("round %d (%s, load average %s): all %d back in %.2f s (per client p50 %.2f s, p90 %.2f s); "
                    "CPU s: imserver %.2f, postgres %.2f, generator %.2f; first push after it: p50 %.1f ms, p99 %.1f "
                    "ms (%d of %d)\n",
                    round + 1, row.server.c_str(), row.load.c_str(), total, row.back_s, row.p50, row.p90, row.cpu_srv,
                    row.cpu_pg, row.cpu_gen, row.push_p50, row.push_p99, row.push_n, expected);
        std::printf("  seen by the clients:");
        if (row.refusals.empty()) std::printf(" nothing but answers");
        for (const auto& [k, n] : row.refusals) std::printf(" [%s] %ld", k.c_str(), n);
        std::printf("\n  imserver /metrics:");
        for (const auto& [k, n] : row.metrics)
            if (n) std::printf(" %s %lld", k.c_str(), n);
        std::printf("\n");
        if (o.statements > 0) print_statements(url, o.statements);
        std::fflush(stdout);
        rows.push_back(row);
    }
    if (rows.size() > 1) {
        std::printf("\n%-7s %8s %8s %8s %10s %10s %10s %10s %10s  %s\n", "server", "back s", "p50 s", "p90 s",
                    "imserver s", "postgres s", "gen s", "push p50", "push p99", "load average");
        for (const auto& r : rows)
            std::printf("%-7s %8.2f %8.2f %8.2f %10.2f %10.2f %10.2f %10.1f %10.1f  %s\n", r.server.c_str(), r.back_s,
                        r.p50, r.p90, r.cpu_srv, r.cpu_pg, r.cpu_gen, r.push_p50, r.push_p99, r.load.c_str());
    }
    s.storming = false; // a closed client stays closed
    for (auto& c : clients) c->close();
    guard.reset();
    wait_until([&] { return s.up.load() == 0; }, 10s);
    ioc.stop();
    io.join();
    return rc;
}

} // namespace

int main(int argc, char** argv) {
    if (!std::getenv("IMSERVER_BIN")) ::setenv("IMSERVER_BIN", im::test::exe_relative(IMSERVER_BIN_DEFAULT).c_str(), 0);
    Options o;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto next = [&] { return flag_value(argc, argv, i); };
        if (a == "--clients") o.clients = std::stoi(next());
        else if (a == "--convs") o.convs = std::stoi(next());
        else if (a == "--members") o.members = std::stoi(next());
        else if (a == "--idle-convs") o.idle_convs = std::stoi(next());
        else if (a == "--history") o.history = std::stoi(next());
        else if (a == "--missed") o.missed = std::stoi(next());
        else if (a == "--rounds") o.rounds = std::max(1, std::stoi(next()));
        else if (a == "--jitter-ms") o.jitter_ms = std::stoi(next());
        else if (a == "--stop") o.term = next() == "term";
        else if (a == "--before") o.before = next();
        else if (a == "--perf") o.perf = next();
        else if (a == "--statements") o.statements = std::stoi(next());
        else if (a == "--db") o.db = next();
        else if (a == "--server-arg") o.server_args.push_back(next());
        else {
            std::fprintf(stderr, "usage: im_storm [--clients N] [--convs N] [--members M] [--idle-convs K] "
                                 "[--history N] [--missed N] [--rounds N] [--jitter-ms MS] [--stop kill|term] "
                                 "[--before IMSERVER] [--perf FILE] [--statements N] [--db URL] [--server-arg ARG]...\n");
            return 2;
        }
    }
    o.clients = std::max(o.clients, o.convs * o.members);
    raise_descriptor_limit(2 * static_cast<rlim_t>(o.clients) + 4096); // imserver inherits it
    BenchDatabase bench_db(o.db, "imstorm");
    if (o.statements > 0) enable_statements(bench_db.db());
    bench_db.prepare_schema();
    return run(o, bench_db.url());
}
