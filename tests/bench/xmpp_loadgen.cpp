// xmpp_loadgen: the peer of issue 28 loaded the way im_loadgen loads imserver
// (docs/benchmarks.md, "The peer (ejabberd)"). ejabberd's MUC over XMPP over
// WebSocket (RFC 7395): every member of every room connects (stream open,
// SASL PLAIN, resource bind, session) and joins its room; S closed-loop
// senders each send a groupchat message and count it acknowledged when the
// room's reflection of it (the message sent back to the sender's own
// occupant JID) arrives, then send the next. The MUC has no other ack: the
// reflection is sent after the room ran its filters, mod_mam's store among
// them, so it stands where imserver's `sent` stands.
//
// Over the window it measures messages/s, ack p50/p90/p99, deliveries
// (every acknowledged message reaches every member, the sender's reflection
// included), order and gaps per sender at each receiver, the archived rows
// of the rooms (mod_mam's `archive` table, kind 'groupchat') against
// acknowledged messages, and the CPU of itself, the server process and the
// PostgreSQL cluster.
//
// It sets nothing up: tests/bench/peer/xmpp_peer.sh starts PostgreSQL and
// ejabberd, registers the users and creates the rooms, then runs it. Not a
// test and not in the `benchmarks` target.
//
// Usage: xmpp_loadgen --port PORT --db URL --server-pid PID [--host 127.0.0.1]
//                     [--path /ws] [--domain localhost] [--muc conference.localhost]
//                     [--password PW] [--rooms 100] [--members 5] [--senders 16]
//                     [--body 100] [--warmup 3] [--window 10]
// Users are u<room>-<member>, rooms r<room>, each member's nick its user name.
#include "bench_support.hpp"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>

#include <openssl/evp.h>
#include <pqxx/pqxx>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using tcp = net::ip::tcp;
using clk = std::chrono::steady_clock;
using namespace std::chrono_literals;
using namespace im::bench;

namespace {

struct Options {
    std::string host = "127.0.0.1", path = "/ws", domain = "localhost", muc = "conference.localhost";
    std::string password = "pw", db;
    unsigned short port = 0;
    pid_t server_pid = 0;
    int rooms = 100, members = 5, senders = 16, body = 100;
    double warmup = 3, window = 10;
};

long long wall_us() {
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

// SASL PLAIN's payload, base64 by OpenSSL.
std::string base64(std::string_view in) {
    std::string out(4 * ((in.size() + 2) / 3) + 1, '\0');
    const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                  reinterpret_cast<const unsigned char*>(in.data()), static_cast<int>(in.size()));
    out.resize(static_cast<std::size_t>(n));
    return out;
}

// ---------------------------------------------------------------- minimal XML
//
// RFC 7395 puts one complete element in each WebSocket message, so a frame is
// read as its root element's start tag (name and attributes) plus a search of
// the rest for the one child that matters (<body>, <mechanism>PLAIN, ...).
// Enough for the stanzas this load sees; not an XML parser.

struct Root {
    std::string name;                                 // as written, prefix included ("stream:features")
    std::vector<std::pair<std::string, std::string>> attrs; // entities in values decoded
    std::string attr(std::string_view n) const {
        for (const auto& [k, v] : attrs)
            if (k == n) return v;
        return {};
    }
    bool named(std::string_view local) const { // the name without its prefix
        const auto colon = name.rfind(':');
        return std::string_view(name).substr(colon == std::string::npos ? 0 : colon + 1) == local;
    }
};

std::string decode_entities(std::string_view v) {
    std::string out;
    for (std::size_t i = 0; i < v.size(); ++i) {
        if (v[i] != '&') {
            out += v[i];
            continue;
        }
        const auto semi = v.find(';', i);
        if (semi == std::string_view::npos) {
            out += v.substr(i);
            break;
        }
        const auto ent = v.substr(i + 1, semi - i - 1);
        if (ent == "amp") out += '&';
        else if (ent == "lt") out += '<';
        else if (ent == "gt") out += '>';
        else if (ent == "quot") out += '"';
        else if (ent == "apos") out += '\'';
        else out += v.substr(i, semi - i + 1); // numeric references: not in this load's values
        i = semi;
    }
    return out;
}

std::optional<Root> parse_root(std::string_view x) {
    std::size_t i = 0;
    auto skip_space = [&] {
        while (i < x.size() && (x[i] == ' ' || x[i] == '\t' || x[i] == '\r' || x[i] == '\n')) ++i;
    };
    skip_space();
    if (x.substr(i, 5) == "<?xml") { // a declaration, allowed before the element
        const auto end = x.find("?>", i);
        if (end == std::string_view::npos) return std::nullopt;
        i = end + 2;
        skip_space();
    }
    if (i >= x.size() || x[i] != '<') return std::nullopt;
    ++i;
    Root r;
    while (i < x.size() && x[i] != ' ' && x[i] != '\t' && x[i] != '\r' && x[i] != '\n' && x[i] != '/' && x[i] != '>')
        r.name += x[i++];
    for (;;) {
        skip_space();
        if (i >= x.size()) return std::nullopt;
        if (x[i] == '/' || x[i] == '>') return r;
        std::string key;
        while (i < x.size() && x[i] != '=' && x[i] != ' ' && x[i] != '>' && x[i] != '/') key += x[i++];
        skip_space();
        if (i >= x.size() || x[i] != '=') return std::nullopt;
        ++i;
        skip_space();
        if (i >= x.size() || (x[i] != '\'' && x[i] != '"')) return std::nullopt;
        const char q = x[i++];
        const auto end = x.find(q, i);
        if (end == std::string_view::npos) return std::nullopt;
        r.attrs.emplace_back(std::move(key), decode_entities(x.substr(i, end - i)));
        i = end + 1;
    }
}

// ---------------------------------------------------------------- the load

struct Stats {
    std::mutex mu;
    Samples ack, fanout;
    long acked_total = 0, acked_window = 0, pushes = 0, pushes_others = 0, errors = 0, order_violations = 0,
         gaps = 0;
    std::string first_failure;
};

struct Run {
    explicit Run(net::io_context& c, const Options& o) : ioc(c), opt(o) {}
    net::io_context& ioc;
    const Options& opt;
    Stats stats;
    std::atomic<int> ready{0}, failed{0};
    std::atomic<bool> sending{false};
    clk::time_point w0, w1;
    std::string body;
};

class Client : public std::enable_shared_from_this<Client> {
public:
    Client(Run& run, int room, int member, bool sender, int index)
        : run_(run), ws_(net::make_strand(run.ioc)), sender_(sender), index_(index) {
        user_ = "u" + std::to_string(room) + "-" + std::to_string(member);
        room_ = "r" + std::to_string(room) + "@" + run.opt.muc;
        occupant_ = room_ + "/" + user_; // the nick is the user name
    }

    void start() {
        auto& sock = beast::get_lowest_layer(ws_).socket();
        beast::error_code ec;
        sock.open(tcp::v4(), ec);
        if (ec) return fail("socket: " + ec.message());
        sock.set_option(tcp::no_delay(true), ec);
        ws_.set_option(websocket::stream_base::decorator(
            [](websocket::request_type& req) { req.set(http::field::sec_websocket_protocol, "xmpp"); }));
        beast::get_lowest_layer(ws_).async_connect(
            tcp::endpoint(net::ip::make_address(run_.opt.host), run_.opt.port),
            [self = shared_from_this()](beast::error_code e) {
                if (e) return self->fail("connect: " + e.message());
                self->ws_.async_handshake(self->run_.opt.host + ":" + std::to_string(self->run_.opt.port),
                                          self->run_.opt.path, [self](beast::error_code e2) {
                                              if (e2) return self->fail("WebSocket handshake: " + e2.message());
                                              self->open_stream();
                                              self->read();
                                          });
            });
    }

    void begin_sending() {
        net::post(ws_.get_executor(), [self = shared_from_this()] { self->send_next(); });
    }

    void close() {
        net::post(ws_.get_executor(), [self = shared_from_this()] {
            self->closing_ = true;
            beast::error_code ec;
            beast::get_lowest_layer(self->ws_).socket().close(ec);
        });
    }

private:
    enum class Stage { auth_features, sasl, bind_features, bind, session, join, joined };

    void fail(const std::string& why) {
        if (failed_ || closing_) return;
        failed_ = true;
        ++run_.failed;
        std::lock_guard lk(run_.stats.mu);
        if (run_.stats.first_failure.empty()) run_.stats.first_failure = user_ + ": " + why;
    }

    void write(std::string frame) {
        out_.push_back(std::move(frame));
        if (out_.size() == 1) do_write();
    }
    void do_write() {
        ws_.text(true);
        ws_.async_write(net::buffer(out_.front()), [self = shared_from_this()](beast::error_code ec, std::size_t) {
            if (ec) return self->fail("write: " + ec.message());
            self->out_.pop_front();
            if (!self->out_.empty()) self->do_write();
        });
    }
    void read() {
        ws_.async_read(buf_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
            if (ec) return self->fail("read: " + ec.message());
            self->on_frame(beast::buffers_to_string(self->buf_.data()));
            self->buf_.consume(self->buf_.size());
            self->read();
        });
    }

    void open_stream() {
        write("<open xmlns='urn:ietf:params:xml:ns:xmpp-framing' to='" + run_.opt.domain + "' version='1.0'/>");
    }

    void send_next() {
        if (!run_.sending || clk::now() >= run_.w1) return;
        sent_at_.push_back(clk::now()); // one in flight: replies come in order
        ++k_;
        // The id carries the sender, its count and the wall clock: receivers
        // check order and gaps and take the send -> delivery time from it.
        write("<message xmlns='jabber:client' to='" + room_ + "' type='groupchat' id='s" + std::to_string(index_) +
              "-" + std::to_string(k_) + "-" + std::to_string(wall_us()) + "'><body>" + run_.body +
              "</body></message>");
    }

    void on_frame(const std::string& text) {
        const auto root = parse_root(text);
        if (!root) return fail("unreadable frame: " + text.substr(0, 300));
        if (root->named("open")) return; // the stream's features follow
        if (root->named("features")) {
            if (stage_ == Stage::auth_features) {
                if (text.find(">PLAIN<") == std::string::npos) return fail("no SASL PLAIN offered: " + text);
                stage_ = Stage::sasl;
                write("<auth xmlns='urn:ietf:params:xml:ns:xmpp-sasl' mechanism='PLAIN'>" +
                      base64(std::string(1, '\0') + user_ + std::string(1, '\0') + run_.opt.password) + "</auth>");
            } else if (stage_ == Stage::bind_features) {
                stage_ = Stage::bind;
                write("<iq xmlns='jabber:client' type='set' id='bind'><bind "
                      "xmlns='urn:ietf:params:xml:ns:xmpp-bind'><resource>bench</resource></bind></iq>");
            }
            return;
        }
        if (root->named("success") && stage_ == Stage::sasl) {
            stage_ = Stage::bind_features;
            return open_stream(); // the stream restart after SASL
        }
        if (root->named("failure")) return fail("SASL: " + text.substr(0, 300));
        if (root->name == "iq") {
            const auto id = root->attr("id"), type = root->attr("type");
            if (id == "bind" && stage_ == Stage::bind) {
                if (type != "result") return fail("bind: " + text.substr(0, 300));
                stage_ = Stage::session;
                write("<iq xmlns='jabber:client' type='set' id='sess'><session "
                      "xmlns='urn:ietf:params:xml:ns:xmpp-session'/></iq>");
            } else if (id == "sess" && stage_ == Stage::session) {
                // Optional since RFC 6121; a server may answer either way.
                stage_ = Stage::join;
                write("<presence xmlns='jabber:client' to='" + occupant_ +
                      "'><x xmlns='http://jabber.org/protocol/muc'><history maxstanzas='0'/></x></presence>");
            }
            return;
        }
        if (root->name == "presence") {
            // The room sends the others' presences, then our own (status 110).
            if (root->attr("from") != occupant_) return;
            if (root->attr("type") == "error") return fail("join: " + text.substr(0, 300));
            if (stage_ == Stage::join) {
                stage_ = Stage::joined;
                ++run_.ready;
            }
            return;
        }
        if (root->name == "message") return on_message(*root, text);
        if (root->named("close") || root->named("error")) return fail("stream ended: " + text.substr(0, 300));
    }

    void on_message(const Root& m, const std::string& text) {
        const auto type = m.attr("type");
        if (type == "error") {
            std::lock_guard lk(run_.stats.mu);
            ++run_.stats.errors;
            if (run_.stats.first_failure.empty()) run_.stats.first_failure = user_ + ": " + text.substr(0, 300);
        } else if (type != "groupchat" || text.find("<body") == std::string::npos) {
            return; // the room's subject on joining, and the like
        }
        const auto now = clk::now();
        const bool own = m.attr("from") == occupant_;
        if (type == "groupchat") {
            // Order and gaps per sender, from the id written by send_next().
            const auto id = m.attr("id");
            int from_index = -1;
            long k = 0;
            long long sent_us = 0;
            if (std::sscanf(id.c_str(), "s%d-%ld-%lld", &from_index, &k, &sent_us) != 3) from_index = -1;
            const double delay_ms = static_cast<double>(wall_us() - sent_us) / 1000.0;
            std::lock_guard lk(run_.stats.mu);
            ++run_.stats.pushes;
            if (!own) ++run_.stats.pushes_others;
            if (from_index >= 0) {
                long& last = last_k_[from_index];
                if (k <= last) ++run_.stats.order_violations;
                else if (k > last + 1) ++run_.stats.gaps;
                last = std::max(last, k);
                if (!own && now >= run_.w0 && now < run_.w1) run_.stats.fanout.v.push_back(std::max(0.0, delay_ms));
            }
        }
        if (!own && type == "groupchat") return;
        // The reflection of our own message, or an error in its place: the
        // answer to the send in flight.
        if (!sender_ || sent_at_.empty()) return;
        const auto sent_at = sent_at_.front();
        sent_at_.pop_front();
        if (type == "groupchat") {
            std::lock_guard lk(run_.stats.mu);
            ++run_.stats.acked_total;
            if (sent_at >= run_.w0 && sent_at < run_.w1) {
                ++run_.stats.acked_window;
                run_.stats.ack.v.push_back(std::chrono::duration<double, std::milli>(now - sent_at).count());
            }
        }
        send_next();
    }

    Run& run_;
    websocket::stream<beast::tcp_stream> ws_;
    beast::flat_buffer buf_;
    std::deque<std::string> out_;
    std::string user_, room_, occupant_;
    bool sender_ = false, failed_ = false, closing_ = false;
    int index_ = 0;
    Stage stage_ = Stage::auth_features;
    std::deque<clk::time_point> sent_at_;
    long k_ = 0;
    std::map<int, long> last_k_; // per sender: the last count seen here
};

long archived_rows(const std::string& url) {
    pqxx::connection c(url);
    pqxx::nontransaction tx(c);
    return tx.exec("SELECT count(*) FROM archive WHERE kind = 'groupchat'")[0][0].as<long>();
}

int run_load(const Options& o) {
    std::printf("xmpp_loadgen: %d rooms x %d members, %d closed-loop senders, %d-byte bodies, warm-up %.0f s, "
                "window %.0f s\n",
                o.rooms, o.members, o.senders, o.body, o.warmup, o.window);
    std::printf("server: ws://%s:%u%s (XMPP over WebSocket, RFC 7395), domain %s, MUC %s, pid %d\n", o.host.c_str(),
                static_cast<unsigned>(o.port), o.path.c_str(), o.domain.c_str(), o.muc.c_str(), static_cast<int>(o.server_pid));
    {
        pqxx::connection c(o.db);
        pqxx::nontransaction tx(c);
        std::printf("database: %s, fsync=%s synchronous_commit=%s\n",
                    tx.exec("SELECT split_part(version(), ' on ', 1)")[0][0].c_str(),
                    tx.exec("SHOW fsync")[0][0].c_str(), tx.exec("SHOW synchronous_commit")[0][0].c_str());
    }
    const pid_t pg = postmaster_pid(o.db);
    const long rows0 = archived_rows(o.db);

    net::io_context ioc;
    Run run(ioc, o);
    run.body = std::string(static_cast<std::size_t>(o.body), 'x');
    auto guard = net::make_work_guard(ioc);
    std::thread io([&] { ioc.run(); });
    std::vector<std::shared_ptr<Client>> clients, senders;
    int index = 0;
    const auto t_connect = clk::now();
    for (int r = 0; r < o.rooms; ++r)
        for (int m = 0; m < o.members; ++m) {
            // As im_loadgen: one sender per room while senders <= rooms.
            const bool is_sender = m * o.rooms + r < o.senders;
            auto cl = std::make_shared<Client>(run, r, m, is_sender, index++);
            clients.push_back(cl);
            if (is_sender) senders.push_back(cl);
            // At most 64 set-ups under way at once, as clients arrive in practice.
            wait_until([&] { return index - (run.ready + run.failed) <= 64; }, 60s);
            cl->start();
        }
    const int total = static_cast<int>(clients.size());
    if (!wait_until([&] { return run.ready + run.failed >= total; }, 180s) || run.failed) {
        std::lock_guard lk(run.stats.mu);
        std::printf("only %d of %d members joined (%d failed); first failure: %s\n", run.ready.load(), total,
                    run.failed.load(), run.stats.first_failure.c_str());
        guard.reset();
        ioc.stop();
        io.join();
        return 1;
    }
    std::printf("%d members connected, authenticated, bound and joined in %.1f s\n", total,
                std::chrono::duration<double>(clk::now() - t_connect).count());
    std::this_thread::sleep_for(500ms); // the joins' last presences
    run.w0 = clk::now() + std::chrono::duration_cast<clk::duration>(std::chrono::duration<double>(o.warmup));
    run.w1 = run.w0 + std::chrono::duration_cast<clk::duration>(std::chrono::duration<double>(o.window));
    run.sending = true;
    for (auto& s : senders) s->begin_sending();
    std::this_thread::sleep_until(run.w0);
    const double cpu_self0 = self_cpu(), cpu_srv0 = cpu_seconds(o.server_pid), cpu_pg0 = postgres_cpu(pg);
    std::this_thread::sleep_until(run.w1);
    const double cpu_self1 = self_cpu(), cpu_srv1 = cpu_seconds(o.server_pid), cpu_pg1 = postgres_cpu(pg);
    // Senders stop by themselves at w1; wait for the last reflections and deliveries.
    long expected = 0;
    wait_until(
        [&] {
            std::lock_guard lk(run.stats.mu);
            expected = run.stats.acked_total * o.members;
            return run.stats.pushes >= expected;
        },
        15s);
    std::this_thread::sleep_for(500ms);
    for (auto& c : clients) c->close();
    guard.reset();
    io.join();
    const long rows = archived_rows(o.db) - rows0;

    auto& st = run.stats;
    expected = st.acked_total * o.members;
    const double rate = static_cast<double>(st.acked_window) / o.window;
    std::printf("\n%-36s %9s %8s %8s %8s\n", "", "msg/s", "p50 ms", "p90 ms", "p99 ms");
    std::printf("%-36s %9.0f %8.2f %8.2f %8.2f\n", "ejabberd MUC over WebSocket", rate, st.ack.pct(50), st.ack.pct(90),
                st.ack.pct(99));
    std::printf("(ack = the sender's own MUC reflection: the room sends it after mod_mam stored the message)\n");
    std::printf("\nfan-out, send -> received by another member: p50 %.1f ms, p99 %.1f ms (%zu samples)\n",
                st.fanout.pct(50), st.fanout.pct(99), st.fanout.v.size());
    std::printf("deliveries: %ld of %ld expected groupchat messages (acked %ld x %d members, the reflection "
                "included); to the other members %ld of %ld\n",
                st.pushes, expected, st.acked_total, o.members, st.pushes_others,
                st.acked_total * (o.members - 1));
    std::printf("error replies: %ld%s%s\n", st.errors, st.first_failure.empty() ? "" : "; first: ",
                st.first_failure.c_str());
    std::printf("order violations: %ld, gaps: %ld (per sender, at each receiver)\n", st.order_violations, st.gaps);
    std::printf("durability: %ld archived groupchat rows (mod_mam, table archive), %ld acknowledged sends: %s\n", rows,
                st.acked_total, rows == st.acked_total ? "equal" : "DIFFERENT");
    const double cores = static_cast<double>(std::thread::hardware_concurrency());
    auto share = [&](double a, double b) { return 100.0 * (b - a) / o.window; };
    const double g = share(cpu_self0, cpu_self1), s = share(cpu_srv0, cpu_srv1), p = share(cpu_pg0, cpu_pg1);
    std::printf("CPU during the window (%% of one core; machine has %.0f): generator %.0f%%, ejabberd (beam.smp) "
                "%.0f%%, postgres %.0f%%\n",
                cores, g, s, p);
    auto per_send = [&](double pct) { return rate > 0 ? pct / 100.0 / rate * 1000.0 : 0.0; };
    std::printf("CPU per send: generator %.3f ms, ejabberd %.3f ms, postgres %.3f ms, all three %.3f ms\n",
                per_send(g), per_send(s), per_send(p), per_send(g + s + p));
    return (st.pushes == expected && rows == st.acked_total && st.errors == 0) ? 0 : 3;
}

} // namespace

int main(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&] { return flag_value(argc, argv, i); };
        if (a == "--host") o.host = next();
        else if (a == "--port") o.port = static_cast<unsigned short>(std::stoi(next()));
        else if (a == "--path") o.path = next();
        else if (a == "--domain") o.domain = next();
        else if (a == "--muc") o.muc = next();
        else if (a == "--password") o.password = next();
        else if (a == "--db") o.db = next();
        else if (a == "--server-pid") o.server_pid = static_cast<pid_t>(std::stoi(next()));
        else if (a == "--rooms") o.rooms = std::stoi(next());
        else if (a == "--members") o.members = std::stoi(next());
        else if (a == "--senders") o.senders = std::stoi(next());
        else if (a == "--body") o.body = std::stoi(next());
        else if (a == "--warmup") o.warmup = std::stod(next());
        else if (a == "--window") o.window = std::stod(next());
        else {
            std::fprintf(stderr, "usage: xmpp_loadgen --port PORT --db URL --server-pid PID [--host H] [--path /ws] "
                                 "[--domain D] [--muc SERVICE] [--password PW] [--rooms N] [--members M] "
                                 "[--senders S] [--body BYTES] [--warmup S] [--window S]\n");
            return 2;
        }
    }
    if (o.port == 0 || o.db.empty() || o.server_pid <= 0) {
        std::fprintf(stderr, "xmpp_loadgen: --port, --db and --server-pid are required (tests/bench/peer/xmpp_peer.sh "
                             "passes them)\n");
        return 2;
    }
    if (o.senders > o.rooms * o.members) o.senders = o.rooms * o.members;
    raise_descriptor_limit(static_cast<rlim_t>(o.rooms * o.members) + 1024);
    try {
        return run_load(o);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "xmpp_loadgen: %s\n", e.what());
        return 1;
    }
}
