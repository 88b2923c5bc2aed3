// im_loadgen: closed-loop WebSocket load against a real imserver, measured
// against the two baselines that give its figures meaning, all in one run:
//   raw     one INSERT + COMMIT of a message row per message (libpqxx)
//   direct  the server's own send SQL (im::Store::send) driven through libpqxx
//   server  imserver over WebSocket: hello, sub, send -> wait `sent` -> next
//           (or, with --rate R, open loop: R sends/s offered in all, on a
//           fixed schedule, whatever the replies do)
// at the same concurrency, on the same database (the embedded PostgreSQL
// configuration, fsync on, unless --db says otherwise).
//
// Usage: im_loadgen [--convs N] [--members M] [--senders S] [--body BYTES]
//                   [--warmup S] [--window S] [--db-pool N] [--db URL]
//                   [--gateways N] [--bus postgres|nats://HOST:PORT] [--server-arg ARG]...
//                   [--rate SENDS_PER_S]
//                   [--second-gateway-senders K [--second-gateway-interval-ms MS]]
//                   [--skip-baselines] [--reply-to] [--webhook fast|down] [--quiet-convs N] [--react]
//                   [--idle CONNECTIONS [--idle-big]]   (idle-connection RSS mode instead)
// With --gateways N, N imservers share the database and the connections are
// spread round-robin, so most pushes cross gateways through the bus.
// With --second-gateway-senders K, a second imserver (gateway B) takes the
// last K senders and every other connection stays on gateway A; with
// --second-gateway-interval-ms, B's senders send every MS ms (open loop)
// while A's stay closed-loop. Both gateways' ack p50/p99 are printed: the
// hot-conversation workload of issue 47 is
//   --convs 1 --members 25 --senders 25 --second-gateway-senders 1 --second-gateway-interval-ms 50
// --skip-baselines leaves out the raw/direct/grouped SQL baselines.
// --reply-to: every send but a sender's first carries `reply_to`, the seq of
// that sender's previous acknowledged message (contract section 12), to
// compare with plain sends (issue 49: the same cost within the noise).
// --webhook fast|down: one webhook (all kinds) registered after provisioning
// to a receiver in this process (tests/support/webhook_receiver.hpp):
// `fast` answers 200 at once; `down` refuses connections until the window
// is over, then comes back, and the time until the backlog (events past the
// webhook's cursors) is drained is printed (issue 52's send-path cost;
// tests/bench/webhook_cost.sh alternates the pairs).
// --quiet-convs N: N more conversations (no members, no traffic) made
// before the webhook is registered: a deployment where few of many
// conversations are busy (issue 52: a webhook claim's reads against the
// number of conversations).
// --react: every request but a sender's first is a `react` on that first
// message, 👍 on and off in turn (each one changes the state: a new event,
// the counts and the summary rewritten, schema/018); "reacted" counts as
// acknowledged, so msg/s reads reactions/s (issue 49: the write-time cost of
// the reactions summary, against an imserver without it).
// Not run by ctest: it prints figures, it asserts nothing.
#include "bench_support.hpp"
#include "store/database.hpp"
#include "exe_relative.hpp"
#include "harness.hpp"
#include "store/store.hpp"
#include "webhook_receiver.hpp"

#include <array>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/json.hpp>

#include <pqxx/pqxx>

#include <algorithm>
#include <deque>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

#include <cstring>

#include <fcntl.h>
#include <sys/resource.h>
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
    int convs = 100, members = 5, senders = 16, body = 100, db_pool = 4; // db_pool: imserver's default
    double warmup = 3, window = 10;
    std::optional<std::string> db;
    int idle = 0;
    bool idle_big = false; // each idle connection first sends one ~60 KB frame
    int gateways = 1;      // connections spread round-robin over this many imservers
    std::string bus;       // imserver --bus (empty: its default, postgres)
    std::vector<std::string> server_args; // more imserver flags, e.g. --send-group-max 1
    double rate = 0;       // > 0: open loop, this many sends/s offered over all senders
    int b_senders = 0;     // > 0: a second gateway (B) with this many of the senders, the rest on A
    double b_interval_ms = 0; // > 0: B's senders send every this many ms (open loop)
    bool skip_baselines = false;
    bool reply_to = false; // sends reply to the sender's previous message
    int quiet_convs = 0;   // more conversations without members or traffic
    std::string webhook;   // "", "fast" or "down"
    bool react = false;    // reactions on the sender's first message instead of sends
};

double wall_ms() {
    return std::chrono::duration<double, std::milli>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// VmRSS of a process, read through a descriptor opened beforehand (the
// generator may have used up its descriptors on connections by then).
long rss_kb(int status_fd) {
    char buf[4096];
    ssize_t n = ::pread(status_fd, buf, sizeof buf - 1, 0);
    if (n <= 0) return 0;
    buf[n] = '\0';
    const char* at = std::strstr(buf, "VmRSS:");
    return at ? std::atol(at + 6) : 0;
}

std::string body_of(int bytes) { return std::string(static_cast<std::size_t>(bytes), 'x'); }

// ---------------------------------------------------------------- baselines

struct Figure {
    double rate = 0, p50 = 0, p90 = 0, p99 = 0;
    long errors = 0;
};

// S closed-loop workers; `op(worker, k)` does one message. Counts the ones
// that started inside the window.
template <class Setup, class Op>
Figure closed_loop(int workers, const Options& o, Setup setup, Op op, int messages_per_op = 1) {
    std::vector<Samples> lat(static_cast<std::size_t>(workers));
    std::vector<long> done(static_cast<std::size_t>(workers)), errors(static_cast<std::size_t>(workers));
    const auto t0 = clk::now();
    const auto w0 = t0 + std::chrono::duration_cast<clk::duration>(std::chrono::duration<double>(o.warmup));
    const auto w1 = w0 + std::chrono::duration_cast<clk::duration>(std::chrono::duration<double>(o.window));
    std::vector<std::thread> ts;
    for (int w = 0; w < workers; ++w)
        ts.emplace_back([&, w] {
            auto state = setup(w);
            for (long k = 0;; ++k) {
                auto a = clk::now();
                if (a >= w1) break;
                bool ok = op(*state, w, k);
                auto b = clk::now();
                if (a >= w0) {
                    ++done[static_cast<std::size_t>(w)];
                    if (!ok) ++errors[static_cast<std::size_t>(w)];
                    lat[static_cast<std::size_t>(w)].v.push_back(std::chrono::duration<double, std::milli>(b - a).count());
                }
            }
        });
    for (auto& t : ts) t.join();
    Samples all;
    Figure f;
    for (int w = 0; w < workers; ++w) {
        auto& l = lat[static_cast<std::size_t>(w)].v;
        all.v.insert(all.v.end(), l.begin(), l.end());
        f.rate += static_cast<double>(done[static_cast<std::size_t>(w)]);
        f.errors += errors[static_cast<std::size_t>(w)];
    }
    f.rate = f.rate * messages_per_op / o.window;
    f.p50 = all.pct(50);
    f.p90 = all.pct(90);
    f.p99 = all.pct(99);
    return f;
}

Figure raw_baseline(const std::string& url, const Options& o) {
    {
        pqxx::connection c(url);
        pqxx::nontransaction(c).exec("CREATE TABLE IF NOT EXISTS bench_raw (id bigserial PRIMARY KEY, conv text, "
                                     "cmid text, body text)");
    }
    const std::string body = body_of(o.body);
    return closed_loop(
        o.senders, o, [&](int) { return std::make_unique<pqxx::connection>(url); },
        [&](pqxx::connection& c, int w, long k) {
            pqxx::work tx(c);
            tx.exec_params("INSERT INTO bench_raw (conv, cmid, body) VALUES ($1, $2, $3)", "raw" + std::to_string(w),
                           std::to_string(k), body);
            tx.commit();
            return true;
        });
}

Figure direct_baseline(const std::string& url, const Options& o, const std::vector<std::string>& convs,
                       const std::vector<im::Identity>& users) {
    im::FaultRegistry faults(false);
    im::Store store(faults, {});
    const std::string body = body_of(o.body);
    return closed_loop(
        o.senders, o, [&](int) { return std::make_unique<pqxx::connection>(url); },
        [&](pqxx::connection& c, int w, long k) {
            auto i = static_cast<std::size_t>(w) % convs.size();
            const im::Identity& who = users[i];
            im::req::Send s;
            s.conv = convs[i];
            s.cmid = "d" + std::to_string(w) + "-" + std::to_string(k);
            s.body = body;
            return static_cast<bool>(store.send(c, who, s));
        });
}

// The server's SQL as the server runs it under load: the senders' sends
// grouped into one statement per database worker (Store::send_group, the
// group commit), as many workers as the server lets run sends at once
// (`im_send_workers`), each carrying senders / workers runs of one send to
// its own conversations. Latency is per statement.
Figure grouped_baseline(const std::string& url, const Options& o, int send_workers,
                        const std::vector<std::string>& convs, const std::vector<im::Identity>& users) {
    im::FaultRegistry faults(false);
    im::Store store(faults, {});
    const std::string body = body_of(o.body);
    const int workers = std::max(1, std::min(send_workers, o.senders));
    const int per = std::max(1, o.senders / workers);
    struct State {
        explicit State(const std::string& u) : c(u) {}
        pqxx::connection c;
        std::vector<im::Identity> who;
        std::vector<std::vector<im::req::Write>> sends;
    };
    return closed_loop(
        workers, o,
        [&](int w) {
            auto st = std::make_unique<State>(url);
            for (int r = 0; r < per; ++r) {
                const auto i = static_cast<std::size_t>(w * per + r) % convs.size();
                st->who.push_back(users[i]);
                im::req::Send s;
                s.conv = convs[i];
                s.body = body;
                st->sends.push_back({s});
            }
            return st;
        },
        [&](State& st, int w, long k) {
            std::vector<im::Store::SendRun> runs;
            for (std::size_t r = 0; r < st.sends.size(); ++r) {
                std::get<im::req::Send>(st.sends[r][0]).cmid =
                    "g" + std::to_string(w) + "-" + std::to_string(r) + "-" + std::to_string(k);
                runs.push_back({&st.who[r], &st.sends[r]});
            }
            bool ok = true;
            for (const auto& run : store.send_group(st.c, runs))
                for (const auto& one : run) ok = ok && static_cast<bool>(one);
            return ok;
        },
        per);
}

// ---------------------------------------------------------------- WebSocket client

struct Stats {
    std::mutex mu;
    Samples ack, fanout;
    std::array<Samples, 2> ack_by_gateway; // --second-gateway-senders: gateway A's and B's acks
    long acked_total = 0, acked_window = 0, other_replies = 0, pushes = 0, order_violations = 0, gaps = 0;
    std::map<std::string, long> other_codes;
};

struct Run {
    explicit Run(net::io_context& c) : ioc(c) {}
    net::io_context& ioc;
    std::string host = "127.0.0.1";
    unsigned short port = 0;
    std::vector<unsigned short> ports; // several gateways: client i uses ports[i % n]
    Stats stats;
    std::atomic<int> ready{0}, failed{0};
    std::atomic<bool> sending{false};
    clk::time_point w0, w1;
    std::string body;
    bool reply_to = false;
    std::atomic<long> reply_sends{0}; // sends that carried reply_to
    bool react = false;
    std::atomic<long> reacts{0}; // react requests sent
    clk::duration interval{}; // open loop: each sender's time between sends (zero: closed loop)
};

class Client : public std::enable_shared_from_this<Client> {
public:
    Client(Run& run, std::string token, std::string install, std::string conv, std::string user, bool sender,
           int index, std::optional<net::ip::address> bind_to = std::nullopt)
        : run_(run), ws_(net::make_strand(run.ioc)), token_(std::move(token)), install_(std::move(install)),
          conv_(std::move(conv)), user_(std::move(user)), sender_(sender), index_(index), bind_to_(bind_to),
          timer_(ws_.get_executor()), interval_(run.interval),
          gateway_(run.ports.empty() ? 0 : static_cast<std::size_t>(index) % run.ports.size()) {}

    /// Before start(): this client's gateway (an index into Run::ports) and
    /// its time between sends (zero: closed loop).
    void place(std::size_t gateway, clk::duration interval) {
        gateway_ = gateway;
        interval_ = interval;
    }

    void start(bool subscribe, bool big_first = false) {
        subscribe_ = subscribe;
        big_first_ = big_first;
        auto& sock = beast::get_lowest_layer(ws_).socket();
        beast::error_code ec;
        sock.open(tcp::v4(), ec);
        if (!ec && bind_to_) sock.bind({*bind_to_, 0}, ec);
        if (ec) return fail();
        sock.set_option(tcp::no_delay(true), ec);
        beast::get_lowest_layer(ws_).async_connect(
            tcp::endpoint(net::ip::make_address(run_.host), run_.ports.empty() ? run_.port : run_.ports[gateway_]),
            [self = shared_from_this()](beast::error_code e) {
                if (e) return self->fail();
                self->ws_.async_handshake(self->run_.host, "/v1/ws", [self](beast::error_code e2) {
                    if (e2) return self->fail();
                    self->write(json::serialize(json::object{
                        {"t", "hello"}, {"rid", "h"}, {"token", self->token_}, {"install", self->install_}}));
                    self->read();
                });
            });
    }

    void begin_sending() {
        net::post(ws_.get_executor(), [self = shared_from_this()] {
            if (self->interval_ == clk::duration::zero()) return self->send_next();
            // Open loop: sends on a fixed schedule from a staggered start; a
            // late tick sends at once (the schedule does not slip with the server).
            self->start_ = clk::now() + self->interval_ * (self->index_ % 97) / 97;
            self->tick();
        });
    }

    void close() {
        net::post(ws_.get_executor(), [self = shared_from_this()] {
            beast::error_code ec;
            beast::get_lowest_layer(self->ws_).socket().close(ec);
        });
    }

private:
    void fail() {
        if (!failed_) {
            failed_ = true;
            ++run_.failed;
        }
    }

    void write(std::string frame) {
        out_.push_back(std::move(frame));
        if (out_.size() == 1) do_write();
    }
    void do_write() {
        ws_.text(true);
        ws_.async_write(net::buffer(out_.front()), [self = shared_from_this()](beast::error_code ec, std::size_t) {
            if (ec) return self->fail();
            self->out_.pop_front();
            if (!self->out_.empty()) self->do_write();
        });
    }
    void read() {
        ws_.async_read(buf_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
            if (ec) return self->fail();
            self->on_frame(beast::buffers_to_string(self->buf_.data()));
            self->buf_.consume(self->buf_.size());
            self->read();
        });
    }

    void tick() {
        const auto at = start_ + interval_ * ticks_++;
        timer_.expires_at(at);
        timer_.async_wait([self = shared_from_this(), at](beast::error_code ec) {
            if (ec || !self->run_.sending || clk::now() >= self->run_.w1) return;
            self->send_next(at); // latency counts from the schedule, not from a late timer
            self->tick();
        });
    }

    void send_next(std::optional<clk::time_point> scheduled = std::nullopt) {
        if (!run_.sending || clk::now() >= run_.w1) return;
        sent_at_.push_back(scheduled.value_or(clk::now())); // replies come in request order
        ++k_;
        if (run_.react && first_ > 0) { // toggles: on, off, on, ...
            ++run_.reacts;
            write(json::serialize(json::object{{"t", "react"},
                                               {"rid", "s"},
                                               {"conv", conv_},
                                               {"cmid", "w" + std::to_string(index_) + "-" + std::to_string(k_)},
                                               {"target", first_},
                                               {"emoji", "👍"},
                                               {"on", k_ % 2 == 0}}));
            return;
        }
        json::object req{{"t", "send"},
                         {"rid", "s"},
                         {"conv", conv_},
                         {"cmid", "w" + std::to_string(index_) + "-" + std::to_string(k_)},
                         {"body", run_.body}};
        if (run_.reply_to && my_last_ > 0) {
            req["reply_to"] = my_last_;
            ++run_.reply_sends;
        }
        write(json::serialize(req));
    }

    void on_frame(const std::string& text) {
        json::error_code jec;
        auto v = json::parse(text, jec);
        if (jec || !v.is_object()) return;
        const auto& o = v.as_object();
        auto t = o.if_contains("t");
        if (!t || !t->is_string()) return;
        const std::string_view type = t->as_string();
        if (type == "welcome") {
            if (big_first_) {
                // A large (invalid) request: the server's read buffer grows for it.
                write(R"({"t":"sync","rid":"big","conv":")" + std::string(60000, 'x') + R"("})");
                return;
            }
            if (!subscribe_) {
                ++run_.ready;
                return;
            }
            write(R"({"t":"sub","rid":"u"})");
        } else if (type == "subscribed") {
            ++run_.ready;
        } else if (type == "event") {
            on_event(o.at("ev").as_object());
        } else if (o.contains("rid") && sender_ && o.at("rid").as_string() == "s" && !sent_at_.empty()) {
            auto now = clk::now();
            const auto sent_at = sent_at_.front();
            sent_at_.pop_front();
            {
                std::lock_guard lk(run_.stats.mu);
                if (type == "sent" || type == "reacted") {
                    if (auto seq = o.if_contains("seq"); type == "sent" && seq && seq->is_int64()) {
                        my_last_ = seq->as_int64();
                        if (first_ == 0) first_ = my_last_;
                    }
                    ++run_.stats.acked_total;
                    if (sent_at >= run_.w0 && sent_at < run_.w1) {
                        ++run_.stats.acked_window;
                        const double ms = std::chrono::duration<double, std::milli>(now - sent_at).count();
                        run_.stats.ack.v.push_back(ms);
                        if (gateway_ < run_.stats.ack_by_gateway.size()) run_.stats.ack_by_gateway[gateway_].v.push_back(ms);
                    }
                } else {
                    ++run_.stats.other_replies;
                    auto code = o.if_contains("code");
                    ++run_.stats.other_codes[code && code->is_string() ? std::string(code->as_string()) : std::string(type)];
                }
            }
            if (interval_ == clk::duration::zero()) send_next();
        } else if (big_first_ && o.contains("rid") && o.at("rid").as_string() == "big") {
            ++run_.ready;
        } else if (type == "error") {
            std::lock_guard lk(run_.stats.mu);
            ++run_.stats.other_replies;
            ++run_.stats.other_codes[std::string(o.at("code").as_string())];
        }
    }

    void on_event(const json::object& ev) {
        const auto seq = ev.at("seq").as_int64();
        const double ts = static_cast<double>(ev.at("ts").as_int64());
        const bool msg = ev.at("kind").as_string() == "msg";
        const double now = wall_ms();
        std::lock_guard lk(run_.stats.mu);
        if (last_seq_ != 0) {
            if (seq <= last_seq_) ++run_.stats.order_violations;
            else if (seq > last_seq_ + 1) ++run_.stats.gaps;
        }
        last_seq_ = std::max(last_seq_, seq);
        if (!msg) return;
        ++run_.stats.pushes;
        const bool own = ev.contains("sender") && ev.at("sender").as_string() == user_;
        auto c = clk::now();
        if (!own && c >= run_.w0 && c < run_.w1) run_.stats.fanout.v.push_back(std::max(0.0, now - ts));
    }

    Run& run_;
    websocket::stream<beast::tcp_stream> ws_;
    beast::flat_buffer buf_;
    std::deque<std::string> out_;
    std::string token_, install_, conv_, user_;
    bool sender_ = false, subscribe_ = true, failed_ = false, big_first_ = false;
    int index_ = 0;
    std::optional<net::ip::address> bind_to_;
    net::steady_timer timer_; // open loop: the next send
    clk::duration interval_;  // open loop: time between sends (zero: closed loop)
    std::size_t gateway_;     // index into Run::ports
    std::deque<clk::time_point> sent_at_; // sends not answered yet, oldest first
    std::int64_t my_last_ = 0;            // the seq of this sender's newest acknowledged message
    std::int64_t first_ = 0;              // --react: the seq of its first, the reactions' target
    long k_ = 0;
    clk::time_point start_{};
    long ticks_ = 0;
    std::int64_t last_seq_ = 0;
};

// ---------------------------------------------------------------- provisioning

struct World {
    std::vector<std::string> convs;                  // index c
    std::vector<std::vector<im::test::TestUser>> members; // [c][m]
};

World provision(const std::string& url, const std::string& prefix, int convs, int members) {
    im::FaultRegistry faults(false);
    im::Store store(faults, {});
    pqxx::connection c(url);
    World w;
    for (int i = 0; i < convs; ++i) {
        std::vector<std::string> names;
        std::vector<im::test::TestUser> users;
        for (int m = 0; m < members; ++m) {
            im::test::TestUser u;
            u.user = prefix + "u" + std::to_string(i) + "-" + std::to_string(m);
            u.device = u.user + "-d";
            store.add_user(c, u.user);
            u.token = store.add_device(c, u.user, u.device);
            names.push_back(u.user);
            users.push_back(u);
        }
        w.convs.push_back(prefix + "c" + std::to_string(i));
        store.create_conv(c, w.convs.back(), "group", names);
        w.members.push_back(std::move(users));
    }
    return w;
}

int run_load(const Options& o, const std::string& url, const std::vector<im::test::ServerProcess*>& gws) {
    long long send_workers = gws.front()->metric("im_send_workers");
    if (send_workers <= 0) send_workers = o.db_pool;
    std::printf("im_loadgen: %d conversations x %d members, %d %s senders, %d-byte bodies, "
                "warm-up %.0f s, window %.0f s, imserver --db-pool %d (send workers %lld)\n",
                o.convs, o.members, o.senders, o.rate > 0 ? "open-loop" : "closed-loop", o.body, o.warmup, o.window,
                o.db_pool, send_workers);
    if (o.rate > 0)
        std::printf("open loop: %.0f sends/s offered in all (%.1f per sender), on a fixed schedule; the server row "
                    "below is what was acknowledged, its latency from the scheduled send\n",
                    o.rate, o.rate / o.senders);
    std::printf("gateways: %zu (connections round-robin, so members of one conversation sit on different "
                "gateways), bus: %s\n",
                gws.size(), o.bus.empty() ? "postgres" : o.bus.c_str());
    {
        pqxx::connection c(url);
        pqxx::nontransaction tx(c);
        std::printf("database: fsync=%s synchronous_commit=%s (%s)\n", tx.exec("SHOW fsync")[0][0].c_str(),
                    tx.exec("SHOW synchronous_commit")[0][0].c_str(), o.db ? "--db" : "embedded cluster");
    }
    auto ws_world = provision(url, "ws", o.convs, o.members);
    auto sql_world = provision(url, "sq", std::min(o.convs, o.senders), 1);
    if (o.quiet_convs > 0) {
        pqxx::connection c(url);
        pqxx::nontransaction(c).exec_params("INSERT INTO conversations (conv_id, kind) SELECT 'qc' || g, 'group' "
                                            "FROM generate_series(1, $1) g",
                                            o.quiet_convs);
        std::printf("quiet conversations: %d more, no members, no traffic\n", o.quiet_convs);
    }
    std::unique_ptr<im::test::WebhookReceiver> rx;
    std::string hook;
    if (!o.webhook.empty()) {
        rx = std::make_unique<im::test::WebhookReceiver>("loadgen-webhook-secret-0123456789");
        if (o.webhook == "down") rx->down();
        hook = im::test::admin_ok(url, {"webhook", "add", rx->url(), "--secret", "loadgen-webhook-secret-0123456789"});
        std::printf("webhook %s: one, all kinds, receiver %s\n", hook.c_str(),
                    o.webhook == "down" ? "down (connections refused) until the window is over" : "answering 200 at once");
    }
    const pid_t pg = postmaster_pid(url);

    // Each SQL sender's identity as the server holds it after hello (the
    // send checks the device and the token hash it proved).
    std::vector<std::string> sql_convs;
    std::vector<im::Identity> sql_users;
    {
        im::FaultRegistry faults(false);
        im::Store store(faults, {});
        pqxx::connection c(url);
        for (std::size_t i = 0; i < sql_world.convs.size(); ++i) {
            sql_convs.push_back(sql_world.convs[i]);
            auto who = store.hello(c, {sql_world.members[i][0].token, "bench-install"});
            if (!who) throw std::runtime_error("hello refused for " + sql_world.members[i][0].user);
            sql_users.push_back(who.value());
        }
    }
    Figure raw, direct, grouped;
    if (!o.skip_baselines) {
        raw = raw_baseline(url, o);
        direct = direct_baseline(url, o, sql_convs, sql_users);
        grouped = grouped_baseline(url, o, static_cast<int>(send_workers), sql_convs, sql_users);
    }

    // The server run.
    net::io_context ioc;
    Run run(ioc);
    for (auto* g : gws) run.ports.push_back(g->port());
    run.body = body_of(o.body);
    run.reply_to = o.reply_to;
    run.react = o.react;
    if (o.rate > 0)
        run.interval = std::chrono::duration_cast<clk::duration>(std::chrono::duration<double>(o.senders / o.rate));
    auto guard = net::make_work_guard(ioc);
    std::thread io([&] { ioc.run(); });
    std::vector<std::shared_ptr<Client>> clients, senders;
    int index = 0;
    for (int c = 0; c < o.convs; ++c)
        for (int m = 0; m < o.members; ++m) {
            const auto& u = ws_world.members[static_cast<std::size_t>(c)][static_cast<std::size_t>(m)];
            // Senders fill the conversations' first members first: one per
            // conversation while senders <= convs (the issue's workload),
            // several members of each (a busy group) beyond that.
            const int order = m * o.convs + c;
            bool is_sender = order < o.senders;
            auto cl = std::make_shared<Client>(run, u.token, "bench-install", ws_world.convs[static_cast<std::size_t>(c)],
                                               u.user, is_sender, index++);
            if (o.b_senders > 0) { // the last b_senders senders on gateway B, every other connection on A
                const bool on_b = is_sender && order >= o.senders - o.b_senders;
                cl->place(on_b ? 1 : 0,
                          on_b && o.b_interval_ms > 0
                              ? std::chrono::duration_cast<clk::duration>(std::chrono::duration<double, std::milli>(o.b_interval_ms))
                              : run.interval);
            }
            clients.push_back(cl);
            if (is_sender) senders.push_back(cl);
            cl->start(true);
        }
    const int total = static_cast<int>(clients.size());
    if (!wait_until([&] { return run.ready + run.failed >= total; }, 120s) || run.failed) {
        std::printf("only %d of %d connections ready (%d failed)\n", run.ready.load(), total, run.failed.load());
        guard.reset();
        ioc.stop();
        io.join();
        return 1;
    }
    run.w0 = clk::now() + std::chrono::duration_cast<clk::duration>(std::chrono::duration<double>(o.warmup));
    run.w1 = run.w0 + std::chrono::duration_cast<clk::duration>(std::chrono::duration<double>(o.window));
    run.sending = true;
    for (auto& s : senders) s->begin_sending();
    std::this_thread::sleep_until(run.w0);
    auto gateways_cpu = [&] {
        double t = 0;
        for (auto* g : gws) t += cpu_seconds(g->pid());
        return t;
    };
    // How the sends reached the database: runs (one connection's pipelined
    // sends), and group statements that carried several runs in one commit.
    auto send_counters = [&] {
        std::array<double, 3> t{}; // runs, group statements, runs inside them
        const char* names[] = {"im_send_transactions_total", "im_send_group_commits_total", "im_send_runs_grouped_total"};
        for (auto* g : gws)
            for (std::size_t i = 0; i < t.size(); ++i) t[i] += static_cast<double>(std::max(0LL, g->metric(names[i])));
        return t;
    };
    // Transactions and rows read in the database during the window (every
    // session's: the sends' and the webhook deliverer's), a coarse profile.
    auto db_counters = [&] {
        pqxx::connection c(url);
        pqxx::nontransaction tx(c);
        auto r = tx.exec("SELECT xact_commit + xact_rollback, tup_returned + tup_fetched FROM pg_stat_database "
                         "WHERE datname = current_database()")[0];
        return std::array<double, 2>{r[0].as<double>(), r[1].as<double>()};
    };
    const auto db0 = db_counters();
    const auto sends0 = send_counters();
    const double cpu_self0 = self_cpu(), cpu_srv0 = gateways_cpu(), cpu_pg0 = postgres_cpu(pg);
    // A marker for profiling the server window (e.g. a script that starts `perf record -a` on it).
    std::fprintf(stderr, "server window: %.0f s from now, imserver pid %d, postmaster pid %d\n", o.window,
                 static_cast<int>(gws.front()->pid()), static_cast<int>(pg));
    std::this_thread::sleep_until(run.w1);
    const double cpu_self1 = self_cpu(), cpu_srv1 = gateways_cpu(), cpu_pg1 = postgres_cpu(pg);
    const auto sends1 = send_counters();
    const auto db1 = db_counters();
    // Senders stop by themselves at w1; wait for the last replies and pushes.
    long expected = 0;
    wait_until(
        [&] {
            std::lock_guard lk(run.stats.mu);
            expected = run.stats.acked_total * o.members;
            return run.stats.pushes >= expected;
        },
        15s);
    std::this_thread::sleep_for(500ms);
    {
        std::lock_guard lk(run.stats.mu); // the final count, after the last replies
        expected = run.stats.acked_total * o.members;
    }
    for (auto& c : clients) c->close();
    guard.reset();
    io.join();

    long rows = 0;
    {
        pqxx::connection c(url);
        pqxx::nontransaction tx(c);
        // --react: every acknowledged react toggled the state, so appended an event.
        rows = tx.exec("SELECT count(*) FROM events WHERE kind IN ('msg', 'reaction') AND conv_id LIKE 'wsc%'")[0][0]
                   .as<long>();
    }
    auto& st = run.stats;
    Figure srvf;
    srvf.rate = static_cast<double>(st.acked_window) / o.window;
    srvf.p50 = st.ack.pct(50);
    srvf.p90 = st.ack.pct(90);
    srvf.p99 = st.ack.pct(99);

    auto row = [&](const char* name, const Figure& f) {
        std::printf("%-36s %9.0f %8.2f %8.2f %8.2f %8.2f %9.2f\n", name, f.rate, f.p50, f.p90, f.p99,
                    raw.rate > 0 ? f.rate / raw.rate : 0.0, direct.rate > 0 ? f.rate / direct.rate : 0.0);
    };
    std::printf("\n%-36s %9s %8s %8s %8s %8s %9s\n", "", "msg/s", "p50 ms", "p90 ms", "p99 ms", "x raw", "x direct");
    if (!o.skip_baselines) {
        row("raw INSERT+COMMIT (libpqxx)", raw);
        row("server send SQL direct (libpqxx)", direct);
        row("same, grouped per db worker", grouped);
    }
    row("imserver over WebSocket", srvf);
    if (o.reply_to) std::printf("sends with reply_to: %ld of %ld acknowledged\n", run.reply_sends.load(), st.acked_total);
    if (o.react) std::printf("react requests: %ld, of %ld acknowledged\n", run.reacts.load(), st.acked_total);
    if (o.b_senders > 0) {
        auto& a = st.ack_by_gateway[0];
        auto& b = st.ack_by_gateway[1];
        std::printf("gateway A (%d closed-loop senders): %zu acks, p50 %.2f ms, p99 %.2f ms\n", o.senders - o.b_senders,
                    a.v.size(), a.pct(50), a.pct(99));
        std::printf("gateway B (%d senders, %s): %zu acks, p50 %.2f ms, p99 %.2f ms; B/A p99 %.2f\n", o.b_senders,
                    o.b_interval_ms > 0 ? ("one send every " + std::to_string(static_cast<int>(o.b_interval_ms)) + " ms").c_str()
                                        : "closed-loop",
                    b.v.size(), b.pct(50), b.pct(99), a.pct(99) > 0 ? b.pct(99) / a.pct(99) : 0.0);
    }
    // Runs that met another transaction's conversation row (put back for a
    // lock waiter), per gateway.
    std::printf("held runs put back:");
    for (std::size_t g = 0; g < gws.size(); ++g)
        std::printf(" %s%lld", g ? ", " : "", gws[g]->metric("im_send_runs_held_total"));
    std::printf("\n");
    std::printf("\nfan-out, commit (event ts) -> pushed to another member: p50 %.1f ms, p99 %.1f ms (%zu samples)\n",
                st.fanout.pct(50), st.fanout.pct(99), st.fanout.v.size());
    std::printf("deliveries: %ld of %ld expected event pushes (acked %ld x %d members)%s\n", st.pushes, expected,
                st.acked_total, o.members, o.react ? " (--react: reaction pushes are not counted)" : "");
    std::printf("replies other than sent: %ld", st.other_replies);
    for (const auto& [code, n] : st.other_codes) std::printf(" %s=%ld", code.c_str(), n);
    std::printf("\npush order violations: %ld, seq gaps: %ld\n", st.order_violations, st.gaps);
    std::printf("durability: %ld committed msg rows, %ld acknowledged sends: %s\n", rows, st.acked_total,
                rows == st.acked_total ? "equal" : "DIFFERENT");
    std::printf("baseline errors: raw %ld, direct %ld, grouped %ld\n", raw.errors, direct.errors, grouped.errors);
    const double cores = static_cast<double>(std::thread::hardware_concurrency());
    auto share = [&](double a, double b) { return 100.0 * (b - a) / o.window; };
    {
        const double runs = sends1[0] - sends0[0], groups = sends1[1] - sends0[1], grouped = sends1[2] - sends0[2];
        const double statements = runs - grouped + groups;
        std::printf("database statements for sends in the window: %.0f (%.0f runs, %.0f of them in %.0f group "
                    "statements): %.2f sends per statement\n",
                    statements, runs, grouped, groups, statements > 0 ? double(st.acked_window) / statements : 0.0);
    }
    std::printf("CPU during the server window (%% of one core; machine has %.0f): generator %.0f%%, imserver %.0f%%, "
                "postgres %.0f%%\n",
                cores, share(cpu_self0, cpu_self1), share(cpu_srv0, cpu_srv1), share(cpu_pg0, cpu_pg1));
    std::printf("database during the window (pg_stat_database, every session): %.0f transactions, %.0f rows read; "
                "per acknowledged send: %.2f transactions, %.1f rows read\n",
                db1[0] - db0[0], db1[1] - db0[1], st.acked_window ? (db1[0] - db0[0]) / double(st.acked_window) : 0.0,
                st.acked_window ? (db1[1] - db0[1]) / double(st.acked_window) : 0.0);
    if (rx) {
        // The events past the webhook's cursors (the metric's backlog, all
        // conversations), read now and until none is left.
        auto backlog = [&] {
            pqxx::connection c(url);
            pqxx::nontransaction tx(c);
            return tx.exec_params("SELECT coalesce(sum(c.next_seq - 1 - wc.done_seq), 0) FROM webhook_cursors wc "
                                  "JOIN conversations c USING (conv_id) WHERE wc.webhook_id = $1",
                                  hook)[0][0]
                .as<long long>();
        };
        const long long at_end = backlog();
        const int requests0 = rx->requests();
        const auto t0 = clk::now();
        if (o.webhook == "down") rx->up();
        long long left = at_end;
        const bool drained = wait_until([&] { return (left = backlog()) == 0; }, 900s);
        const double ms = std::chrono::duration<double, std::milli>(clk::now() - t0).count();
        std::printf("webhook (%s receiver): backlog %lld events at the window's end; %s after %.0f ms (%.0f events/s); "
                    "%zu events accepted in all, %d POSTs (%d since the window's end), order %s, bad signatures %d\n",
                    o.webhook.c_str(), at_end, drained ? "drained" : "NOT drained", ms,
                    ms > 0 ? static_cast<double>(at_end) * 1000.0 / ms : 0.0, rx->ids().size(), rx->requests(),
                    rx->requests() - requests0, rx->order_violation().empty() ? "ok" : "VIOLATED", rx->bad_signatures());
        if (!drained) std::printf("webhook backlog left: %lld events\n", left);
    }
    return 0;
}

// ---------------------------------------------------------------- idle RSS

int run_idle(const Options& o, const std::string& url, im::test::ServerProcess& srv) {
    // Connections spread over 127.0.0.x source addresses (ports per source).
    const int users = 200;
    auto world = provision(url, "idle", users, 1);
    net::io_context ioc;
    Run run(ioc);
    run.port = srv.port();
    auto guard = net::make_work_guard(ioc);
    std::thread io([&] { ioc.run(); });
    std::this_thread::sleep_for(500ms);
    const int status_fd = ::open(("/proc/" + std::to_string(srv.pid()) + "/status").c_str(), O_RDONLY | O_CLOEXEC);
    const long before = rss_kb(status_fd);
    std::vector<std::shared_ptr<Client>> clients;
    for (int i = 0; i < o.idle; ++i) {
        const auto& u = world.members[static_cast<std::size_t>(i % users)][0];
        auto src = net::ip::make_address_v4("127.0.0." + std::to_string(2 + i % 200));
        auto cl = std::make_shared<Client>(run, u.token, "idle-install", world.convs[static_cast<std::size_t>(i % users)],
                                           u.user, false, i, net::ip::address(src));
        clients.push_back(cl);
        cl->start(false, o.idle_big);
        if (i % 500 == 499)
            wait_until([&] { return run.ready + run.failed >= i + 1 - 200; }, 60s);
    }
    wait_until([&] { return run.ready + run.failed >= o.idle; }, 300s);
    std::this_thread::sleep_for(2s);
    const long after = rss_kb(status_fd);
    ::close(status_fd);
    if (after == 0) {
        const std::string log = srv.log();
        std::printf("imserver is gone; the end of its log:\n%s\n", log.substr(log.size() > 2000 ? log.size() - 2000 : 0).c_str());
    }
    std::printf("idle authenticated connections%s: %d ready, %d failed\n",
                o.idle_big ? " (each sent one 60 KB frame first)" : "", run.ready.load(), run.failed.load());
    std::printf("imserver RSS: %ld KB before, %ld KB after: %.1f KB per connection\n", before, after,
                run.ready ? static_cast<double>(after - before) / run.ready.load() : 0.0);
    for (auto& c : clients) c->close();
    guard.reset();
    io.join();
    return run.failed ? 1 : 0;
}

} // namespace

int main(int argc, char** argv) {
    if (!std::getenv("IMSERVER_BIN")) ::setenv("IMSERVER_BIN", im::test::exe_relative(IMSERVER_BIN_DEFAULT).c_str(), 0);
    Options o;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto next = [&] { return flag_value(argc, argv, i); };
        if (a == "--convs") o.convs = std::stoi(next());
        else if (a == "--members") o.members = std::stoi(next());
        else if (a == "--senders") o.senders = std::stoi(next());
        else if (a == "--body") o.body = std::stoi(next());
        else if (a == "--warmup") o.warmup = std::stod(next());
        else if (a == "--window") o.window = std::stod(next());
        else if (a == "--db-pool") o.db_pool = std::stoi(next());
        else if (a == "--db") o.db = next();
        else if (a == "--idle") o.idle = std::stoi(next());
        else if (a == "--idle-big") o.idle_big = true;
        else if (a == "--gateways") o.gateways = std::max(1, std::stoi(next()));
        else if (a == "--bus") o.bus = next();
        else if (a == "--server-arg") o.server_args.push_back(next());
        else if (a == "--rate") o.rate = std::stod(next());
        else if (a == "--second-gateway-senders") o.b_senders = std::max(0, std::stoi(next()));
        else if (a == "--second-gateway-interval-ms") o.b_interval_ms = std::stod(next());
        else if (a == "--skip-baselines") o.skip_baselines = true;
        else if (a == "--webhook") {
            o.webhook = next();
            if (o.webhook != "fast" && o.webhook != "down") {
                std::fprintf(stderr, "--webhook: fast or down\n");
                return 2;
            }
        }
        else if (a == "--reply-to") o.reply_to = true;
        else if (a == "--quiet-convs") o.quiet_convs = std::stoi(next());
        else if (a == "--react") o.react = true;
        else {
            std::fprintf(stderr, "usage: im_loadgen [--convs N] [--members M] [--senders S] [--body BYTES] "
                                 "[--warmup S] [--window S] [--db-pool N] [--db URL] [--gateways N] [--bus postgres|nats://HOST:PORT] "
                                 "[--server-arg ARG]... [--rate SENDS_PER_S] [--second-gateway-senders K "
                                 "[--second-gateway-interval-ms MS]] [--skip-baselines] [--reply-to] [--webhook fast|down] [--react] [--idle CONNECTIONS [--idle-big]]\n");
            return 2;
        }
    }
    if (o.senders > o.convs * o.members) o.senders = o.convs * o.members;
    if (o.b_senders > 0) {
        o.b_senders = std::min(o.b_senders, o.senders);
        o.gateways = 2; // A and B
    }
    // Many sockets: raise the descriptor limit (imserver inherits it).
    raise_descriptor_limit(4 * static_cast<rlim_t>(o.idle) + 4096);

    // The embedded cluster, configured exactly as imserver configures its own.
    BenchDatabase bench_db(o.db, "imbench");
    bench_db.prepare_schema();
    const im::Database& db = bench_db.db();
    int rc = 0;
    {
        std::vector<std::string> flags = {"--quiet", "--db-pool", std::to_string(o.db_pool)};
        if (!o.bus.empty()) flags.insert(flags.end(), {"--bus", o.bus});
        flags.insert(flags.end(), o.server_args.begin(), o.server_args.end());
        std::vector<std::unique_ptr<im::test::ServerProcess>> gws;
        std::vector<im::test::ServerProcess*> ptrs;
        for (int g = 0; g < (o.idle > 0 ? 1 : o.gateways); ++g) {
            gws.push_back(std::make_unique<im::test::ServerProcess>(db.url, flags, "gw-bench-" + std::to_string(g + 1)));
            ptrs.push_back(gws.back().get());
        }
        rc = o.idle > 0 ? run_idle(o, db.url, *gws[0]) : run_load(o, db.url, ptrs);
        for (auto& g : gws) g->terminate();
    }
    return rc;
}
