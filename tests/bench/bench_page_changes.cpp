// bench_page_changes: a `history` page of 200 events whose messages carry
// heavy later changes (contract section 12) against a plain page of 200
// messages, on one real imserver and PostgreSQL, alternated in the same run
// (docs/benchmarks.md, "Pages with edits and reactions"). Prints figures and
// the ratio; not a test.
//   bench_page_changes [--rounds R] [--requests K] [--before IMSERVER]
// --before: another imserver binary (e.g. the one before a change to the
// page statement) on the same database, a second gateway; its plain and
// heavy pages are timed in the same rounds, alternated with this one's.
// The heavy window: one message with 1,000 reactions from 1,000 users on 25
// emoji and 50 edits (its 50 edit events are in the window), and 149 more
// messages with 2 emoji from 5 users each, the reader's among them. Written
// with SQL into the tables im_change maintains (the reads use those rows,
// not the reaction events, which would lie below the window).
#include "exe_relative.hpp"
#include "harness.hpp"
#include "store/store.hpp"
#include "store/store_internal.hpp"

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>
#include <pqxx/pqxx>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

using namespace im::test;
using clock_type = std::chrono::steady_clock;

namespace {

void seed(const TestPostgres& pg) {
    pqxx::connection c(pg.url());
    pqxx::work tx(c);
    for (const char* conv : {"pc-plain", "pc-heavy"}) {
        tx.exec_params("INSERT INTO conversations (conv_id, kind, next_seq, msg_count) VALUES ($1, 'group', 203, "
                       "CASE WHEN $1 = 'pc-plain' THEN 200 ELSE 150 END)",
                       conv);
        tx.exec_params("INSERT INTO membership_periods (conv_id, user_id, from_seq) VALUES ($1, 'ana', 1), ($1, 'ben', 2)",
                       conv);
        tx.exec_params("INSERT INTO events (conv_id, seq, kind, subject_user, epoch, msg_ordinal) "
                       "VALUES ($1, 1, 'join', 'ana', 1, 0), ($1, 2, 'join', 'ben', 1, 0)",
                       conv);
    }
    // plain: 200 msgs (3..202), alternating senders
    tx.exec("INSERT INTO events (conv_id, seq, kind, sender_user, client_msg_id, body, epoch, msg_ordinal, "
            "sender_ordinal) SELECT 'pc-plain', s, 'msg', CASE WHEN s % 2 = 0 THEN 'ana' ELSE 'ben' END, 'm' || s, "
            "'a message of about this length, number ' || s, 1, s - 2, (s - 1) / 2 FROM generate_series(3, 202) s");
    // heavy: msgs 3..152 (3 is the heavy one), 50 edits of 3 at 153..202
    tx.exec("INSERT INTO events (conv_id, seq, kind, sender_user, client_msg_id, body, epoch, msg_ordinal, "
            "sender_ordinal) SELECT 'pc-heavy', s, 'msg', CASE WHEN s % 2 = 0 THEN 'ana' ELSE 'ben' END, 'm' || s, "
            "'a message of about this length, number ' || s, 1, s - 2, (s - 1) / 2 FROM generate_series(3, 152) s");
    tx.exec("INSERT INTO events (conv_id, seq, kind, sender_user, client_msg_id, body, target_seq, epoch, "
            "msg_ordinal) SELECT 'pc-heavy', s, 'edit', 'ben', 'e' || s, 'the edited text, take ' || s, 3, 1, 150 "
            "FROM generate_series(153, 202) s");
    tx.exec("INSERT INTO reaction_state (conv_id, target_seq, user_id, emoji, is_on, seq) "
            "SELECT 'pc-heavy', 3, 'u' || u, 'emoji-' || (u % 25), true, 1 FROM generate_series(1, 1000) u");
    tx.exec("INSERT INTO reaction_state (conv_id, target_seq, user_id, emoji, is_on, seq) "
            "SELECT 'pc-heavy', m, CASE WHEN u = 0 THEN 'ana' ELSE 'u' || u END, e, true, 1 "
            "FROM generate_series(4, 152) m, generate_series(0, 4) u, unnest(ARRAY['👍', '❤']) e");
    tx.exec("INSERT INTO reaction_counts (conv_id, target_seq, emoji, count) "
            "SELECT conv_id, target_seq, emoji, count(*) FROM reaction_state WHERE conv_id = 'pc-heavy' "
            "GROUP BY 1, 2, 3");
    tx.exec("INSERT INTO msg_changes (conv_id, seq, edit_seq, edit_body, edit_at, reactions_seq) "
            "SELECT 'pc-heavy', m, CASE WHEN m = 3 THEN 202 END, CASE WHEN m = 3 THEN 'the edited text, take 202' END, "
            "CASE WHEN m = 3 THEN now() END, 1 FROM generate_series(3, 152) m");
    // The summary im_change keeps beside the counts (schema/018).
    tx.exec("UPDATE msg_changes x SET reactions_top = (SELECT json_agg(json_build_array(t.emoji, t.count) "
            "ORDER BY t.count DESC, t.emoji COLLATE \"C\")::text FROM (SELECT n.emoji, n.count FROM reaction_counts n "
            "WHERE n.conv_id = x.conv_id AND n.target_seq = x.seq AND n.count > 0 "
            "ORDER BY n.count DESC, n.emoji COLLATE \"C\" LIMIT 20) t) "
            "WHERE x.conv_id = 'pc-heavy'");
    tx.commit();
    pqxx::nontransaction(c).exec("ANALYZE");
}

// The page statement of the releases before schema/018 (e7bf93e's
// with_changes for history, $5 the reader): every read ranked the counts of
// its messages and built their lists. Kept here only to time it against
// the summary's form in the same database and the same run.
std::string ranked_per_read_sql() {
    const std::string events_sql = im::Store::event_range_sql(true);
    const std::string range = " BETWEEN GREATEST($2::bigint, $3::bigint - $4::bigint + 1) AND $3::bigint";
    return "WITH has AS (SELECT EXISTS (SELECT 1 FROM msg_changes x WHERE x.conv_id = $1 AND x.seq" + range +
           ") OR EXISTS (SELECT 1 FROM events r WHERE r.conv_id = $1 AND r.kind = 'recall' AND r.target_seq" + range +
           ") AS any_change), "
           "ev AS MATERIALIZED (" + events_sql + "), b AS (SELECT min(seq) AS lo, max(seq) AS hi FROM ev), "
           "rc AS (SELECT n.target_seq, n.emoji, n.count, row_number() OVER (PARTITION BY n.target_seq "
           "ORDER BY n.count DESC, n.emoji COLLATE \"C\") AS rn FROM b, reaction_counts n "
           "WHERE n.conv_id = $1 AND n.target_seq BETWEEN b.lo AND b.hi AND n.count > 0), "
           "mine AS (SELECT s.target_seq, s.emoji FROM b, reaction_state s WHERE s.conv_id = $1 AND s.user_id = "
           "$5::text AND s.target_seq BETWEEN b.lo AND b.hi AND s.is_on), "
           "rx AS MATERIALIZED (SELECT rc.target_seq, json_agg(json_build_array(rc.emoji, rc.count, mine.emoji IS NOT NULL) "
           "ORDER BY rc.count DESC, rc.emoji COLLATE \"C\") AS list FROM rc LEFT JOIN mine "
           "ON mine.target_seq = rc.target_seq AND mine.emoji = rc.emoji WHERE rc.rn <= 20 GROUP BY rc.target_seq) "
           "SELECT e.*, NULL::bigint, NULL::text, NULL::bigint, NULL::bigint, false, NULL::json FROM (" + events_sql +
           ") e WHERE NOT (SELECT any_change FROM has) "
           "UNION ALL "
           "SELECT ev.*, x.edit_seq, x.edit_body, floor(extract(epoch from x.edit_at) * 1000)::bigint, "
           "x.reactions_seq, "
           "ev.kind = 'msg' AND EXISTS (SELECT 1 FROM events r WHERE r.conv_id = ev.conv_id AND r.kind = 'recall' "
           "AND r.target_seq = ev.seq), rx.list "
           "FROM ev LEFT JOIN msg_changes x ON ev.kind = 'msg' AND x.conv_id = ev.conv_id AND x.seq = ev.seq "
           "LEFT JOIN rx ON ev.kind = 'msg' AND rx.target_seq = ev.seq "
           "WHERE (SELECT any_change FROM has)";
}

// The page statement of 237cf70 (history, $5 the reader): the events
// materialized and hash-joined to msg_changes, a recall probe and, for a
// msg with a summary, a probe of the reader's emoji per msg. Kept here
// only to time it against the independent range scans that replaced it
// (store_common.cpp, with_changes) in the same database and the same run.
std::string joined_summary_sql() {
    const std::string events_sql = im::Store::event_range_sql(true);
    const std::string range = " BETWEEN GREATEST($2::bigint, $3::bigint - $4::bigint + 1) AND $3::bigint";
    return "WITH has AS (SELECT EXISTS (SELECT 1 FROM msg_changes x WHERE x.conv_id = $1 AND x.seq" + range +
           ") OR EXISTS (SELECT 1 FROM events r WHERE r.conv_id = $1 AND r.kind = 'recall' AND r.target_seq" + range +
           ") AS any_change), "
           "ev AS MATERIALIZED (" + events_sql + ") "
           "SELECT e.*, NULL::bigint, NULL::text, NULL::bigint, NULL::bigint, false, NULL::text, NULL::text FROM (" +
           events_sql + ") e WHERE NOT (SELECT any_change FROM has) "
           "UNION ALL "
           "SELECT ev.*, x.edit_seq, x.edit_body, floor(extract(epoch from x.edit_at) * 1000)::bigint, "
           "x.reactions_seq, "
           "ev.kind = 'msg' AND EXISTS (SELECT 1 FROM events r WHERE r.conv_id = ev.conv_id AND r.kind = 'recall' "
           "AND r.target_seq = ev.seq), x.reactions_top, "
           "CASE WHEN x.reactions_top IS NOT NULL THEN (SELECT json_agg(s.emoji)::text FROM reaction_state s "
           "WHERE s.conv_id = ev.conv_id AND s.user_id = $5::text AND s.target_seq = ev.seq AND s.is_on) END "
           "FROM ev LEFT JOIN msg_changes x ON ev.kind = 'msg' AND x.conv_id = ev.conv_id AND x.seq = ev.seq "
           "WHERE (SELECT any_change FROM has)";
}

// CPU time (user + system, every thread) a process has used, ms; 0 when
// it is gone. From /proc/PID/stat (clock ticks).
double cpu_ms(pid_t pid) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(stat, line)) return 0;
    const auto close = line.rfind(')');
    if (close == std::string::npos) return 0;
    std::istringstream rest(line.substr(close + 2));
    std::string field;
    double ticks = 0;
    for (int i = 3; i <= 15 && rest >> field; ++i)
        if (i == 14 || i == 15) ticks += std::stod(field); // utime, stime
    return ticks * 1000.0 / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

double cpu_ms(const std::vector<pid_t>& pids) {
    double sum = 0;
    for (pid_t p : pids) sum += cpu_ms(p);
    return sum;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

// The client a page is timed with. Both receive every byte of the frame
// and parse all of it into a JSON tree (Boost.JSON), then check it.
//  - lean (the default): what an SDK client can do: one thread, the
//    frame read into a buffer kept across frames, parsed from there (no
//    copy) by a parser kept across frames into a monotonic resource over a
//    block kept across frames (no malloc per node once it has grown).
//  - harness (`--client harness`): the tests' WsClient: a reader thread,
//    the frame copied into a string, parsed with the default allocator
//    (a malloc per object, array and long string), handed over under a
//    mutex.
class PageClient {
public:
    virtual ~PageClient() = default;
    /// Sends `history` and returns the reply's tree, valid until the next call.
    virtual const json::object& history(const std::string& conv) = 0;
    virtual std::size_t last_bytes() const = 0;
};

class HarnessClient : public PageClient {
public:
    HarnessClient(unsigned short port, const std::string& token) : ws_(login(port, token)) {}
    const json::object& history(const std::string& conv) override {
        last_ = ws_->request({{"t", "history"}, {"conv", conv}, {"before", 0}, {"limit", 200}}, 60s);
        return last_;
    }
    std::size_t last_bytes() const override { return json::serialize(last_).size(); }

private:
    std::unique_ptr<WsClient> ws_;
    json::object last_;
};

class LeanClient : public PageClient {
public:
    LeanClient(unsigned short port, const std::string& token) : ws_(ioc_), mr_(block_.data(), block_.size()) {
        namespace net = boost::asio;
        boost::beast::get_lowest_layer(ws_).connect(net::ip::tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
        ws_.read_message_max(1 << 20);
        ws_.handshake("127.0.0.1:" + std::to_string(port), "/v1/ws");
        const auto& w = request(json::serialize(json::object{{"t", "hello"}, {"token", token},
                                                             {"install", "bench-lean-" + std::to_string(port)},
                                                             {"rid", "h"}}),
                                "h");
        if (str(w, "t") != "welcome") throw std::runtime_error("hello failed: " + json::serialize(w));
    }
    const json::object& history(const std::string& conv) override {
        const std::string rid = "r" + std::to_string(++n_);
        std::string frame = R"({"t":"history","conv":)" + json::serialize(json::string(conv)) +
                            R"(,"before":0,"limit":200,"rid":")" + rid + "\"}";
        return request(frame, rid);
    }
    std::size_t last_bytes() const override { return bytes_; }

private:
    const json::object& request(const std::string& frame, const std::string& rid) {
        ws_.text(true);
        ws_.write(boost::asio::buffer(frame));
        for (;;) {
            buf_.clear();
            ws_.read(buf_);
            bytes_ = buf_.size();
            tree_.reset(); // the last tree goes before its resource is reset
            mr_.release();
            parser_.reset(json::storage_ptr(&mr_)); // not owned
            const auto data = buf_.cdata();
            parser_.write(static_cast<const char*>(data.data()), data.size());
            tree_.emplace(parser_.release()); // moved: it keeps its resource
            if (!tree_->is_object()) throw std::runtime_error("a frame that is not an object");
            const auto* r = tree_->as_object().if_contains("rid");
            if (r && r->is_string() && r->get_string() == rid) return tree_->as_object();
        }
    }

    boost::asio::io_context ioc_;
    boost::beast::websocket::stream<boost::beast::tcp_stream> ws_;
    boost::beast::flat_buffer buf_;
    std::vector<unsigned char> block_ = std::vector<unsigned char>(1 << 20);
    json::monotonic_resource mr_;
    json::parser parser_;
    std::optional<json::value> tree_;
    std::size_t bytes_ = 0;
    int n_ = 0;
};

std::unique_ptr<PageClient> make_client(bool lean, unsigned short port, const std::string& token) {
    if (lean) return std::make_unique<LeanClient>(port, token);
    return std::make_unique<HarnessClient>(port, token);
}

// K timed `history` pages of 200 (before 0) of `conv`; the frame's bytes.
// Timed: the request written, the reply read and parsed into a tree, its
// type and its 200 events (each an object, their seqs consecutive) checked.
std::vector<double> pages(PageClient& c, const std::string& conv, int requests, std::size_t& bytes) {
    std::vector<double> ms;
    ms.reserve(static_cast<std::size_t>(requests));
    for (int k = 0; k < requests; ++k) {
        auto t0 = clock_type::now();
        const json::object& r = c.history(conv);
        bool ok = str(r, "t") == "page" && r.contains("events") && r.at("events").is_array() &&
                  r.at("events").get_array().size() == 200;
        if (ok) {
            std::int64_t seq = 3;
            for (const auto& e : r.at("events").get_array()) {
                const auto* s = e.is_object() ? e.get_object().if_contains("seq") : nullptr;
                ok = ok && s && s->is_int64() && s->get_int64() == seq++;
            }
        }
        ms.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - t0).count());
        if (!ok) throw std::runtime_error("history failed: " + json::serialize(r).substr(0, 500));
        if (k == 0) bytes = c.last_bytes();
    }
    return ms;
}

} // namespace

int main(int argc, char** argv) {
    int rounds = 5, requests = 50;
    std::string before;
    bool lean = true;
    for (int i = 1; i < argc; ++i) {
        auto next = [&]() -> const char* {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "%s needs a value\n", argv[i]);
                std::exit(2);
            }
            return argv[++i];
        };
        if (!std::strcmp(argv[i], "--rounds")) rounds = std::atoi(next());
        else if (!std::strcmp(argv[i], "--requests")) requests = std::atoi(next());
        else if (!std::strcmp(argv[i], "--before")) before = next();
        else if (!std::strcmp(argv[i], "--client")) {
            const std::string c = next();
            if (c != "lean" && c != "harness") {
                std::fprintf(stderr, "--client lean|harness\n");
                return 2;
            }
            lean = c == "lean";
        } else {
            std::fprintf(stderr, "usage: bench_page_changes [--rounds R] [--requests K] [--before IMSERVER] "
                                 "[--client lean|harness]\n");
            return 2;
        }
    }
    const char* env = std::getenv("IMSERVER_BIN");
    ::setenv("IMSERVER_BIN", env && *env ? env : im::test::exe_relative(IMSERVER_BIN_DEFAULT).c_str(), 1);
    TestPostgres pg;
    ServerProcess srv(pg.url(), {"--quiet"});
    admin_ok(pg.url(), {"user", "add", "ana"});
    admin_ok(pg.url(), {"user", "add", "ben"});
    const auto token = admin_ok(pg.url(), {"device", "add", "ana", "ana-phone"});
    seed(pg);
    auto ws = make_client(lean, srv.port(), token);
    // The other binary: a second gateway on the same database, started
    // after the schema is in place (it applies nothing new).
    std::unique_ptr<ServerProcess> then_srv;
    std::unique_ptr<PageClient> then_ws;
    if (!before.empty()) {
        ::setenv("IMSERVER_BIN", before.c_str(), 1);
        then_srv = std::make_unique<ServerProcess>(pg.url(), std::vector<std::string>{"--quiet"}, "gw-2");
        then_ws = make_client(lean, then_srv->port(), token);
    }
    std::size_t plain_bytes = 0, heavy_bytes = 0;
    pages(*ws, "pc-plain", 5, plain_bytes); // warm-up: plans, caches
    pages(*ws, "pc-heavy", 5, heavy_bytes);
    if (then_ws) {
        pages(*then_ws, "pc-plain", 5, plain_bytes);
        pages(*then_ws, "pc-heavy", 5, heavy_bytes);
    }
    std::vector<double> plain, heavy, plain_then, heavy_then;
    for (int r = 0; r < rounds; ++r) {
        // Which binary goes first alternates too: with the same binary on
        // both sides, the first of each pair measured 1.26x the second.
        const bool then_first = then_ws && r % 2 == 1;
        std::vector<double> p, pt, h, ht;
        if (then_first) pt = pages(*then_ws, "pc-plain", requests, plain_bytes);
        p = pages(*ws, "pc-plain", requests, plain_bytes);
        if (then_ws && !then_first) pt = pages(*then_ws, "pc-plain", requests, plain_bytes);
        if (then_first) ht = pages(*then_ws, "pc-heavy", requests, heavy_bytes);
        h = pages(*ws, "pc-heavy", requests, heavy_bytes);
        if (then_ws && !then_first) ht = pages(*then_ws, "pc-heavy", requests, heavy_bytes);
        std::printf("round %d  plain median %6.2f ms  heavy median %6.2f ms  ratio %.2f", r + 1, median(p), median(h),
                    median(h) / median(p));
        if (then_ws)
            std::printf("  | before: plain %6.2f ms  heavy %6.2f ms", median(pt), median(ht));
        std::printf("\n");
        plain.insert(plain.end(), p.begin(), p.end());
        heavy.insert(heavy.end(), h.begin(), h.end());
        plain_then.insert(plain_then.end(), pt.begin(), pt.end());
        heavy_then.insert(heavy_then.end(), ht.begin(), ht.end());
    }
    std::printf("\nhistory, 200 events per page, %d rounds x %d pages each, alternated, %s client\n", rounds, requests,
                lean ? "lean" : "harness");
    std::printf("plain  median %6.2f ms  (frame %zu bytes)\n", median(plain), plain_bytes);
    std::printf("heavy  median %6.2f ms  (frame %zu bytes)\n", median(heavy), heavy_bytes);
    std::printf("heavy/plain: %.2fx (the goal: at most 1.5x)\n", median(heavy) / median(plain));
    if (then_ws) {
        std::printf("before (%s): plain median %6.2f ms, heavy median %6.2f ms, heavy/plain %.2fx\n", before.c_str(),
                    median(plain_then), median(heavy_then), median(heavy_then) / median(plain_then));
        std::printf("plain page this/before: %.2fx; heavy page this/before: %.2fx\n",
                    median(plain) / median(plain_then), median(heavy) / median(heavy_then));
    }
    // Where the CPU goes: K pages of one kind in a row, the CPU time each
    // party used over them (imserver, the PostgreSQL cluster's processes,
    // this client), per page. The clock ticks are 10 ms, so K is large.
    {
        // With --before, its pages too (it is idle meanwhile, as this
        // one is during its pages), alternated with this build's.
        const int k = std::max(200, requests * 4);
        for (int rep = 0; rep < 2; ++rep)
            for (const char* conv : {"pc-plain", "pc-heavy"})
                for (int side = 0; side < (then_ws ? 2 : 1); ++side) {
                    const bool then_side = (side == 1) != (rep == 1);
                    if (then_side && !then_ws) continue;
                    PageClient& cl = then_side ? *then_ws : *ws;
                    const pid_t server = then_side ? then_srv->pid() : srv.pid();
                    const auto db = pg.pids();
                    const double s0 = cpu_ms(server), d0 = cpu_ms(db), c0 = cpu_ms(::getpid());
                    const auto t0 = clock_type::now();
                    std::size_t bytes = 0;
                    pages(cl, conv, k, bytes);
                    const double wall = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
                    std::printf("CPU per page, %s%s: imserver %.2f ms, PostgreSQL %.2f ms, client %.2f ms (wall %.2f "
                                "ms)\n",
                                conv, then_side ? " (before)" : "", (cpu_ms(server) - s0) / k, (cpu_ms(db) - d0) / k,
                                (cpu_ms(::getpid()) - c0) / k, wall / k);
                }
    }
    // Where it goes: the reading statement alone (its execution in the
    // database), then the rest (encoding, the page's size accounting, the
    // socket) is the difference to the page times above.
    pqxx::connection c(pg.url());
    pqxx::nontransaction tx(c);
    tx.exec("PREPARE q(text, bigint, bigint, bigint, text) AS " +
            im::store_detail::event_page_sql(true));
    // The events alone (the statement before contract v3), for the plain page's own cost.
    tx.exec("PREPARE q0(text, bigint, bigint, bigint) AS " + im::Store::event_range_sql(true));
    // The form before the reactions summary (schema/018), for the heavy page's.
    tx.exec("PREPARE q1(text, bigint, bigint, bigint, text) AS " + ranked_per_read_sql());
    // The form before the independent range scans (237cf70's): joined in SQL.
    tx.exec("PREPARE q2(text, bigint, bigint, bigint, text) AS " + joined_summary_sql());
    // Execution times as the server runs them: generic plans (six
    // executions first), no per-node timing (it inflates a many-node plan),
    // the three statements interleaved, 30 of each.
    auto exec_ms = [&](const std::string& call) {
        auto r = tx.exec("EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) EXECUTE " + call);
        return json::parse(r[0][0].c_str()).as_array()[0].as_object().at("Execution Time").to_number<double>();
    };
    // BENCH_PLAN: the plans as the server runs them, the generic plan from
    // the sixth execution on (the first five are custom plans).
    if (std::getenv("BENCH_PLAN"))
        for (const char* conv : {"pc-plain", "pc-heavy"}) {
            for (int k = 0; k < 6; ++k) tx.exec("EXECUTE q(" + tx.quote(conv) + ", 1, 202, 201, 'ana')");
            for (const auto& row : tx.exec("EXPLAIN (ANALYZE) EXECUTE q(" + tx.quote(conv) + ", 1, 202, 201, 'ana')"))
                std::printf("%s\n", row[0].c_str());
        }
    for (const char* conv : {"pc-plain", "pc-heavy"}) {
        const std::string args = "(" + tx.quote(conv) + ", 1, 202, 201";
        std::vector<double> now, then, joined, alone;
        for (int k = 0; k < 36; ++k) {
            const double a = exec_ms("q" + args + ", 'ana')"), b = exec_ms("q1" + args + ", 'ana')"),
                         d = exec_ms("q2" + args + ", 'ana')"), c = exec_ms("q0" + args + ")");
            if (k < 6) continue; // custom plans
            now.push_back(a), then.push_back(b), joined.push_back(d), alone.push_back(c);
        }
        std::printf("statement alone, %s: median %.2f ms (joined in SQL, 237cf70: %.2f ms; the form before the "
                    "reactions summary: %.2f ms; the events without their changes: %.2f ms)\n",
                    conv, median(now), median(joined), median(then), median(alone));
    }
    return 0;
}
