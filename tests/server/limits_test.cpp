// Real-world sizes against a real imserver and PostgreSQL: pages cut by
// encoded size (no server frame over 64 KiB), `history`, `convs` paging, and
// range scans that never visit what the caller cannot read. Then the
// per-address limits: the AddressLimiter, the PROXY v2 header and
// X-Forwarded-For readers, and a real server behind a (test-written)
// trusted proxy (server.md, "Scaling out").
#include "common.hpp"

#include "core/address_limiter.hpp"
#include "core/faults.hpp"
#include "core/protocol.hpp"
#include "net/client_address.hpp"
#include "store/store.hpp"

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <pqxx/pqxx>

#include <arpa/inet.h>

#include <cstdio>
#include <map>
#include <optional>
#include <sstream>
#include <set>
#include <thread>

using namespace im::test;

namespace {

constexpr std::size_t max_frame = 64 * 1024;

class Limits : public ServerSuite {};

// 4,000 code points that take the most room on the wire: 3-byte CJK,
// 4-byte emoji, or control characters that JSON escapes as \u00XX.
std::string big_body(int i) {
    std::string one;
    switch (i % 3) {
    case 0: one = "\xe4\xb8\xad"; break;      // U+4E2D
    case 1: one = "\xf0\x9f\x98\x80"; break;  // U+1F600
    default: one = "\x01"; break;             // escaped as \u0001 (6 bytes)
    }
    std::string b;
    for (int k = 0; k < 4000; ++k) b += one;
    return b;
}

std::int64_t seq_of(const json::value& ev) { return ev.as_object().at("seq").as_int64(); }

TEST_F(Limits, big_bodies_sync_and_history_pages_stay_under_max_frame_and_return_every_event_once) {
    auto w = make_world(db(), "big", 2);
    auto writer = login(port(), w.users[0]);
    for (int i = 0; i < 200; ++i) {
        auto r = send_msg(*writer, w.conv, "b" + std::to_string(i), big_body(i), 30s);
        ASSERT_EQ(str(r, "t"), "sent") << json::serialize(r);
    }
    const std::int64_t head = 202; // two joins, then 200 messages
    const std::int64_t first = 2;  // the reader's own join: seq 1 is before their period

    auto reader = login(port(), w.users[1]);
    std::vector<std::int64_t> seen;
    std::int64_t after = 0;
    int pages = 0;
    for (;;) {
        auto p = reader->request({{"t", "sync"}, {"conv", w.conv}, {"after", after}, {"limit", 200}}, 30s);
        ASSERT_EQ(str(p, "t"), "page") << str(p, "code");
        ++pages;
        const auto& evs = p.at("events").as_array();
        if (num(p, "next_after") > after) {
            ASSERT_FALSE(evs.empty()) << "a page with nothing readable skipped ahead";
        }
        for (const auto& ev : evs) {
            seen.push_back(seq_of(ev));
            if (seq_of(ev) > 2) {
                EXPECT_EQ(ev.as_object().at("body").as_string(), big_body(static_cast<int>(seq_of(ev)) - 3));
            }
        }
        after = num(p, "next_after");
        if (!p.at("has_more").as_bool()) break;
        ASSERT_LT(pages, 500);
    }
    EXPECT_GT(pages, 10); // the size rule did cut pages (200 events asked per page)
    EXPECT_LE(reader->largest_frame(), max_frame);
    ASSERT_EQ(seen.size(), static_cast<std::size_t>(head - first + 1));
    for (std::size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], first + static_cast<std::int64_t>(i));

    // The same downwards through history.
    auto hist = login(port(), w.users[1]);
    std::vector<std::int64_t> down;
    std::int64_t before = 0;
    pages = 0;
    for (;;) {
        auto p = hist->request({{"t", "history"}, {"conv", w.conv}, {"before", before}, {"limit", 200}}, 30s);
        ASSERT_EQ(str(p, "t"), "page") << json::serialize(p);
        ++pages;
        EXPECT_EQ(num(p, "head"), head);
        const auto& evs = p.at("events").as_array();
        for (std::size_t i = 1; i < evs.size(); ++i) EXPECT_LT(seq_of(evs[i - 1]), seq_of(evs[i])); // ascending
        for (auto it = evs.rbegin(); it != evs.rend(); ++it) down.push_back(seq_of(*it));
        if (!evs.empty()) {
            EXPECT_EQ(num(p, "oldest"), seq_of(evs.front()));
        }
        before = num(p, "oldest");
        if (!p.at("has_older").as_bool()) break;
        ASSERT_LT(pages, 500);
    }
    EXPECT_GT(pages, 10);
    EXPECT_LE(hist->largest_frame(), max_frame);
    ASSERT_EQ(down.size(), static_cast<std::size_t>(head - first + 1));
    for (std::size_t i = 0; i < down.size(); ++i) EXPECT_EQ(down[i], head - static_cast<std::int64_t>(i));
}

TEST_F(Limits, history_returns_the_newest_window_and_checks_its_arguments) {
    auto w = make_world(db(), "hist", 2);
    auto c = login(port(), w.users[0]);
    for (int i = 0; i < 10; ++i) ASSERT_EQ(str(send_msg(*c, w.conv, "h" + std::to_string(i), "m"), "t"), "sent");
    // seqs: 1-2 joins, 3-12 messages.
    auto p = c->request({{"t", "history"}, {"conv", w.conv}, {"before", 0}, {"limit", 4}});
    ASSERT_EQ(str(p, "t"), "page") << json::serialize(p);
    const auto& evs = p.at("events").as_array();
    ASSERT_EQ(evs.size(), 4u);
    EXPECT_EQ(seq_of(evs[0]), 9);
    EXPECT_EQ(seq_of(evs[3]), 12);
    EXPECT_EQ(num(p, "oldest"), 9);
    EXPECT_TRUE(p.at("has_older").as_bool());
    EXPECT_EQ(num(p, "head"), 12);
    EXPECT_FALSE(p.contains("next_after"));

    auto rest = c->request({{"t", "history"}, {"conv", w.conv}, {"before", 9}, {"limit", 50}});
    EXPECT_EQ(rest.at("events").as_array().size(), 8u);
    EXPECT_FALSE(rest.at("has_older").as_bool());
    EXPECT_EQ(num(rest, "oldest"), 1);

    auto code = [&](json::object r) { return str(c->request(std::move(r)), "code"); };
    EXPECT_EQ(code({{"t", "history"}, {"conv", w.conv}, {"before", -1}}), "INVALID_ARGUMENT");
    EXPECT_EQ(code({{"t", "history"}, {"conv", w.conv}, {"before", 0}, {"limit", 0}}), "INVALID_ARGUMENT");
    EXPECT_EQ(code({{"t", "history"}, {"conv", w.conv}}), "INVALID_ARGUMENT");
    EXPECT_EQ(code({{"t", "history"}, {"conv", w.conv}, {"before", 14}}), "CURSOR_AHEAD");
    EXPECT_EQ(code({{"t", "history"}, {"conv", w.conv}, {"before", 0}, {"epoch", 2}}), "EPOCH_CHANGED");
    auto stranger = make_user(db(), unique_name("histx"));
    auto s = login(port(), stranger);
    EXPECT_EQ(str(s->request({{"t", "history"}, {"conv", w.conv}, {"before", 0}}), "code"), "NOT_MEMBER");
}

TEST_F(Limits, a_user_in_1000_conversations_gets_every_one_through_convs_pages_under_max_frame) {
    auto u = make_user(db(), unique_name("many"));
    std::set<std::string> made;
    {
        // Long ids make the entries big, so the size rule cuts pages too.
        pqxx::connection conn(db());
        im::FaultRegistry faults(false);
        im::Store store(faults, {});
        const std::string prefix = unique_name("convs");
        for (int i = 0; i < 1000; ++i) {
            std::string id = prefix + "-" + std::string(40, 'x') + "-" + std::to_string(10000 + i);
            id = id.substr(id.size() > 64 ? id.size() - 64 : 0);
            store.create_conv(conn, id, "group", {u.user});
            made.insert(id);
        }
    }
    ASSERT_EQ(made.size(), 1000u);
    auto c = login(port(), u);
    for (std::int64_t limit : {100, 500}) {
        std::vector<std::string> got;
        std::string after;
        int pages = 0;
        for (;;) {
            json::object q{{"t", "convs"}, {"limit", limit}};
            if (!after.empty()) q["after"] = after;
            auto r = c->request(q, 30s);
            ASSERT_EQ(str(r, "t"), "convs") << json::serialize(r);
            ++pages;
            const auto& a = r.at("convs").as_array();
            EXPECT_LE(static_cast<std::int64_t>(a.size()), limit);
            for (const auto& ci : a) {
                got.push_back(std::string(ci.as_object().at("conv").as_string()));
                EXPECT_EQ(ci.as_object().at("head").as_int64(), 1);
            }
            if (!a.empty()) {
                EXPECT_EQ(str(r, "next_after"), got.back());
            }
            after = str(r, "next_after");
            if (!r.at("has_more").as_bool()) break;
            ASSERT_LT(pages, 100);
        }
        EXPECT_EQ(got.size(), 1000u) << "limit " << limit;
        EXPECT_TRUE(std::is_sorted(got.begin(), got.end()));
        EXPECT_EQ(std::set<std::string>(got.begin(), got.end()), made);
        if (limit == 500) {
            EXPECT_GT(pages, 2) << "500 long entries do not fit one frame; the size rule must cut";
        }
    }
    EXPECT_LE(c->largest_frame(), max_frame);
    EXPECT_EQ(str(c->request({{"t", "convs"}, {"limit", 0}}), "code"), "INVALID_ARGUMENT");
    EXPECT_EQ(str(c->request({{"t", "convs"}, {"after", "bad id!"}}), "code"), "INVALID_ARGUMENT");
}

// A member who left and came back: their gap holds many events; sync and
// history jump over it, and the statement they use is an index range scan
// that reads only rows inside the range (checked with EXPLAIN ANALYZE on a
// table of 300,000 events).
TEST_F(Limits, a_rejoined_members_gap_is_skipped_by_index_range_scans) {
    auto w = make_world(db(), "gap", 2); // joins at 1, 2
    auto a = login(port(), w.users[0]);
    ASSERT_EQ(str(send_msg(*a, w.conv, "g1", "before leaving"), "t"), "sent"); // 3
    const std::string leave = admin_ok(db(), {"member", "remove", w.conv, w.users[1].user}); // 4
    ASSERT_EQ(leave, "4");
    const std::int64_t gap = 300000;
    {
        pqxx::connection conn(db());
        pqxx::work tx(conn);
        tx.exec_params("INSERT INTO events (conv_id, seq, kind, sender_user, body, epoch, msg_ordinal, sender_ordinal) "
                       "SELECT $1, g, 'msg', $2, 'in the gap', 1, g, g FROM generate_series(5, $3::bigint) g",
                       w.conv, w.users[0].user, 4 + gap);
        tx.exec_params("UPDATE conversations SET next_seq = $2 WHERE conv_id = $1", w.conv, 5 + gap);
        tx.commit();
        pqxx::nontransaction(conn).exec("ANALYZE events");
    }
    const std::int64_t rejoin = std::stoll(admin_ok(db(), {"member", "add", w.conv, w.users[1].user}));
    ASSERT_EQ(rejoin, 5 + gap);
    ASSERT_EQ(str(send_msg(*a, w.conv, "g2", "after rejoining"), "t"), "sent");

    auto b = login(port(), w.users[1]);
    auto p = b->request({{"t", "sync"}, {"conv", w.conv}, {"after", 0}, {"limit", 10}}, 30s);
    ASSERT_EQ(str(p, "t"), "page") << json::serialize(p);
    std::vector<std::int64_t> seqs;
    for (const auto& ev : p.at("events").as_array()) seqs.push_back(seq_of(ev));
    // Their first period is [2, 4] (joined at 2, left at 4), the second from the rejoin.
    EXPECT_EQ(seqs, (std::vector<std::int64_t>{2, 3, 4, rejoin, rejoin + 1}));
    EXPECT_FALSE(p.at("has_more").as_bool());

    auto h = b->request({{"t", "history"}, {"conv", w.conv}, {"before", 0}, {"limit", 4}}, 30s);
    seqs.clear();
    for (const auto& ev : h.at("events").as_array()) seqs.push_back(seq_of(ev));
    EXPECT_EQ(seqs, (std::vector<std::int64_t>{3, 4, rejoin, rejoin + 1}));
    EXPECT_EQ(num(h, "oldest"), 3);
    EXPECT_TRUE(h.at("has_older").as_bool());

    // The statement itself, on the big table: a range scan of the primary
    // key that reads no row outside [lo, hi] and stops at the limit. The
    // server prepares it once per connection, so PostgreSQL may switch to
    // a generic plan after five executions: both kinds of plan are checked.
    pqxx::connection conn(db());
    pqxx::nontransaction tx(conn);
    for (const std::string mode : {"force_custom_plan", "force_generic_plan"})
    for (bool newest_first : {false, true}) {
        SCOPED_TRACE(mode);
        tx.exec("SET plan_cache_mode = " + mode);
        tx.exec("DEALLOCATE ALL");
        tx.exec("PREPARE q(text, bigint, bigint, bigint) AS " + im::Store::event_range_sql(newest_first));
        // A period inside the big range, from its middle, asking for 51 rows.
        auto r = tx.exec("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE q(" + tx.quote(w.conv) + ", 150000, 250000, 51)");
        auto plan = json::parse(r[0][0].c_str()).as_array()[0].as_object().at("Plan").as_object();
        ASSERT_EQ(plan.at("Node Type").as_string(), "Limit") << json::serialize(plan);
        const auto& scan = plan.at("Plans").as_array()[0].as_object();
        EXPECT_EQ(scan.at("Node Type").as_string(), "Index Scan") << json::serialize(scan);
        EXPECT_EQ(scan.at("Index Name").as_string(), "events_pkey") << json::serialize(scan);
        EXPECT_EQ(scan.at("Scan Direction").as_string(), newest_first ? "Backward" : "Forward");
        EXPECT_LE(scan.at("Actual Rows").to_number<double>(), 51.0) << json::serialize(scan);
        EXPECT_FALSE(scan.contains("Rows Removed by Filter")) << json::serialize(scan);
    }
}


// A fresh send (or recall) looks its request key up through the key's own index, however
// long the conversation and whatever the planner believes about the key's
// column. Here the statistics claim two distinct keys in 200,000 events (the
// worst a stale or misleading statistic can say): before migration 006 the
// generic plan of the lookup then served its ORDER BY seq from the primary
// key and read the whole conversation for every key that was not there, which
// made a long outbox flush quadratic. Own server with one database worker, so
// the one backend runs the lookup often enough to settle on its generic plan.
TEST(SendPlan, a_fresh_send_or_recall_reads_a_bounded_number_of_index_entries_in_a_long_conversation) {
    TestPostgres pg;
    ServerProcess srv{pg.url(), {"--quiet", "--db-pool", "1"}};
    auto w = make_world(pg.url(), "long", 2); // joins at 1, 2
    const std::int64_t n = 200000;
    {
        pqxx::connection conn(pg.url());
        pqxx::work tx(conn);
        tx.exec_params("INSERT INTO events (conv_id, seq, kind, sender_user, client_msg_id, body, epoch, msg_ordinal, "
                       "sender_ordinal) SELECT $1, g + 2, 'msg', $2, 'seed-' || g, 'old', 1, g, g "
                       "FROM generate_series(1, $3::bigint) g",
                       w.conv, w.users[0].user, n);
        tx.exec_params("UPDATE conversations SET next_seq = $2, msg_count = $3 WHERE conv_id = $1", w.conv, n + 3, n);
        tx.exec("ALTER TABLE events ALTER COLUMN client_msg_id SET (n_distinct = 2)");
        tx.commit();
        pqxx::nontransaction(conn).exec("ANALYZE events");
    }
    auto stat = [&](const std::string& view, const std::string& name, const char* column) {
        return std::stoll(pg.scalar(std::string("SELECT ") + column + " FROM " + view + " WHERE " +
                                    (view == "pg_stat_user_tables" ? "relname" : "indexrelname") + " = '" + name + "'"));
    };
    auto inserted = [&] { return stat("pg_stat_user_tables", "events", "n_tup_ins"); };
    auto pkey_reads = [&] { return stat("pg_stat_user_indexes", "events_pkey", "idx_tup_read"); };
    auto key_scans = [&] { return stat("pg_stat_user_indexes", "events_idempotency", "idx_scan"); };
    const long long inserted0 = inserted(), pkey_reads0 = pkey_reads(), key_scans0 = key_scans();
    auto a = login(srv.port(), w.users[0]);
    constexpr int sends = 20;
    for (int i = 0; i < sends; ++i) {
        auto r = send_msg(*a, w.conv, "fresh-" + std::to_string(i), "new", 30s);
        ASSERT_EQ(str(r, "t"), "sent") << json::serialize(r);
        EXPECT_EQ(num(r, "seq"), n + 3 + i);
    }
    // A recall's key takes the same kind of lookup.
    constexpr int recalls = 5;
    for (int i = 0; i < recalls; ++i) {
        auto r = a->request({{"t", "recall"}, {"conv", w.conv}, {"target", n + 3 + i}, {"cmid", "undo-" + std::to_string(i)}},
                            30s);
        ASSERT_EQ(str(r, "t"), "recalled") << json::serialize(r);
    }
    // Backends report their statistics when idle, within ~10 s: wait until
    // every send's insert is counted (the same report carries its reads).
    const auto until = std::chrono::steady_clock::now() + 30s;
    while (inserted() - inserted0 < sends + recalls && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(100ms);
    ASSERT_GE(inserted() - inserted0, sends + recalls) << "the statistics of the requests never came";
    EXPECT_LT(pkey_reads() - pkey_reads0, (sends + recalls) * 50)
        << "requests read the conversation through its primary key";
    EXPECT_GE(key_scans() - key_scans0, sends + recalls) << "requests did not look their key up through its index";
}

} // namespace

namespace {

// What one call sent to PostgreSQL, read from libpq's protocol trace: the
// statements it ran (simple Query messages such as BEGIN and COMMIT, and
// Bind messages of prepared ones) and the names of the prepared ones.
struct Sent {
    int queries = 0;
    std::vector<std::string> bound; // statement names of the Binds ("" = unnamed)
};

template <class F>
Sent traced(pqxx::connection& c, F&& call) {
    std::FILE* f = std::tmpfile();
    c.trace(f);
    call();
    c.trace(nullptr);
    std::rewind(f);
    std::string text;
    char buf[4096];
    while (std::size_t n = std::fread(buf, 1, sizeof buf, f)) text.append(buf, n);
    std::fclose(f);
    Sent s;
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
        // libpq 14+: "<time>\tF\t<len>\tBind\t \"<portal>\" \"<statement>\" ..."
        if (line.find("\tF\t") == std::string::npos) continue;
        if (line.find("\tQuery\t") != std::string::npos) ++s.queries;
        const auto b = line.find("\tBind\t");
        if (b == std::string::npos) continue;
        // The portal's name in quotes, then the statement's.
        const auto p2 = line.find('"', line.find('"', b) + 1), p3 = line.find('"', p2 + 1);
        s.bound.push_back(line.substr(p3 + 1, line.find('"', p3 + 1) - p3 - 1));
    }
    return s;
}

} // namespace

// Issue 28 item 5: ack, read and convs are ONE prepared statement each (no
// BEGIN/COMMIT, no statement planned per call), hello's are prepared too,
// with the same answers as before.
TEST_F(Limits, ack_read_and_convs_are_one_prepared_statement_each_and_hello_runs_only_prepared_ones) {
    auto w = make_world(db(), "onestmt", 2); // joins at 1, 2
    auto a = login(port(), w.users[0]);
    ASSERT_EQ(str(send_msg(*a, w.conv, "o1", "one"), "t"), "sent");   // 3
    ASSERT_EQ(str(send_msg(*a, w.conv, "o2", "two"), "t"), "sent");   // 4
    pqxx::connection conn(db());
    im::FaultRegistry faults(false);
    im::Store store(faults, {});
    const auto& ben = w.users[1];

    std::optional<im::Outcome<im::Identity>> hello;
    const Sent h = traced(conn, [&] { hello = store.hello(conn, im::req::Hello{ben.token, "inst-1"}); });
    ASSERT_TRUE(*hello) << hello->error().msg;
    EXPECT_EQ(h.queries, 2) << "BEGIN and COMMIT";
    ASSERT_FALSE(h.bound.empty());
    for (const auto& name : h.bound) EXPECT_EQ(name.rfind("im_", 0), 0u) << "unprepared statement in hello: " << name;
    const im::Identity who = hello->value();

    std::optional<im::Outcome<im::Acked>> acked;
    Sent s = traced(conn, [&] { acked = store.ack(conn, who, {w.conv, 3}); });
    ASSERT_TRUE(*acked) << acked->error().msg;
    EXPECT_EQ(acked->value().delivered, 3);
    EXPECT_EQ(s.queries, 0);
    EXPECT_EQ(s.bound, std::vector<std::string>{"im_ack"});

    im::Notes notes;
    std::optional<im::Outcome<im::ReadOk>> read;
    s = traced(conn, [&] { read = store.read(conn, who, {w.conv, 4}, notes); });
    ASSERT_TRUE(*read) << read->error().msg;
    EXPECT_EQ(read->value().read, 4);
    EXPECT_EQ(s.queries, 0);
    EXPECT_EQ(s.bound, std::vector<std::string>{"im_read"});
    EXPECT_EQ(notes.size(), 1u) << "the marker moved: the other devices hear of it";
    notes.clear();
    ASSERT_TRUE(store.read(conn, who, {w.conv, 3}, notes));
    EXPECT_TRUE(notes.empty()) << "a marker that did not move is not announced";

    std::optional<im::Outcome<im::ConvList>> list;
    s = traced(conn, [&] { list = store.convs(conn, who, {"", 50}); });
    ASSERT_TRUE(*list) << list->error().msg;
    ASSERT_EQ(list->value().convs.size(), 1u);
    EXPECT_EQ(list->value().convs[0].head, 4);
    EXPECT_EQ(list->value().convs[0].delivered, 3);
    EXPECT_EQ(list->value().convs[0].read, 4);
    EXPECT_EQ(s.queries, 0);
    EXPECT_EQ(s.bound, std::vector<std::string>{"im_convs"});

    // The refusals come from the same one statement and change nothing.
    s = traced(conn, [&] { acked = store.ack(conn, who, {w.conv, 9}); });
    ASSERT_FALSE(*acked);
    EXPECT_EQ(acked->error().code, im::Code::cursor_ahead);
    EXPECT_EQ(s.bound, std::vector<std::string>{"im_ack"});
    // A read the device could make (seq 5 exists, above its marker 4),
    // refused because the device was revoked: the marker stays.
    ASSERT_EQ(str(send_msg(*a, w.conv, "o3", "three"), "t"), "sent"); // 5
    admin_ok(db(), {"device", "revoke", ben.device});
    s = traced(conn, [&] { read = store.read(conn, who, {w.conv, 5}, notes); });
    ASSERT_FALSE(*read);
    EXPECT_EQ(read->error().code, im::Code::unauthenticated);
    EXPECT_EQ(s.bound, std::vector<std::string>{"im_read"});
    EXPECT_TRUE(notes.empty()) << "a refused read is not announced";
    EXPECT_EQ(pg->scalar("SELECT delivered FROM delivery_markers WHERE conv_id = " + q(w.conv) +
                         " AND device_id = " + q(ben.device)),
              "3");
    EXPECT_EQ(pg->scalar("SELECT read FROM read_markers WHERE conv_id = " + q(w.conv) + " AND user_id = " + q(ben.user)),
              "4");
}

// ------------------------------------------------------------ per-address limits

namespace {

using im::AddressLimiter;
using im::IpAddress;
using im::ProxyHeader;
namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using tcp = net::ip::tcp;

const AddressLimiter::Clock::time_point t0{};

TEST(AddressLimiterUnit, counts_failures_per_address_in_a_window) {
    AddressLimiter l(3, std::chrono::minutes(1));
    for (int i = 0; i < 2; ++i) l.failed("198.51.100.7", t0 + std::chrono::seconds(i));
    EXPECT_FALSE(l.limited("198.51.100.7", t0 + 2s));
    l.failed("198.51.100.7", t0 + 3s);
    EXPECT_TRUE(l.limited("198.51.100.7", t0 + 3s));
    EXPECT_FALSE(l.limited("198.51.100.8", t0 + 3s)) << "another address is not limited";
    EXPECT_TRUE(l.limited("198.51.100.7", t0 + 59s)) << "limited until the window opened by the first failure ends";
    EXPECT_FALSE(l.limited("198.51.100.7", t0 + 60s));
    EXPECT_EQ(l.size(), 0u) << "a window that is over is forgotten";
    l.failed("198.51.100.7", t0 + 61s);
    EXPECT_FALSE(l.limited("198.51.100.7", t0 + 61s)) << "a new window starts from one";
}

TEST(AddressLimiterUnit, keys_ipv6_by_its_64_and_ipv4_mapped_as_ipv4) {
    AddressLimiter l(2, std::chrono::minutes(1));
    l.failed("2001:db8:1:2::1", t0);
    l.failed("2001:db8:1:2:ffff:ffff:ffff:fffe", t0);
    EXPECT_TRUE(l.limited("2001:db8:1:2::99", t0)) << "one /64 is one client";
    EXPECT_FALSE(l.limited("2001:db8:1:3::1", t0)) << "the next /64 is another";
    l.failed("::ffff:192.0.2.7", t0);
    l.failed("192.0.2.7", t0);
    EXPECT_TRUE(l.limited("192.0.2.7", t0));
    EXPECT_TRUE(l.limited("::ffff:192.0.2.7", t0));
    EXPECT_FALSE(l.limited("192.0.2.8", t0)) << "IPv4 is keyed by the whole address";
}

// Bounded: at the capacity a new address pushes out the one whose window
// opened first; expiry drops only what is over, oldest first, as calls come.
TEST(AddressLimiterUnit, holds_at_most_its_capacity_and_forgets_the_oldest_window_first) {
    AddressLimiter l(2, std::chrono::minutes(1), 3);
    l.failed("10.0.0.1", t0);
    l.failed("10.0.0.1", t0);
    l.failed("10.0.0.2", t0 + 1s);
    l.failed("10.0.0.3", t0 + 2s);
    EXPECT_EQ(l.size(), 3u);
    EXPECT_TRUE(l.limited("10.0.0.1", t0 + 2s));
    l.failed("10.0.0.4", t0 + 3s);
    EXPECT_EQ(l.size(), 3u) << "never more than the capacity";
    EXPECT_EQ(l.evicted(), 1u);
    EXPECT_FALSE(l.limited("10.0.0.1", t0 + 3s)) << "the oldest window made room";
    l.failed("10.0.0.2", t0 + 4s);
    EXPECT_TRUE(l.limited("10.0.0.2", t0 + 4s)) << "the others kept their counts";
    // 10.0.0.2's window (opened at 1 s) is over at 61 s; 10.0.0.3's not yet.
    EXPECT_FALSE(l.limited("10.0.0.9", t0 + 61s));
    EXPECT_EQ(l.size(), 2u) << "one window expired, without a whole sweep being needed";
    EXPECT_FALSE(l.limited("10.0.0.2", t0 + 61s));
    EXPECT_FALSE(l.limited("10.0.0.9", t0 + 64s));
    EXPECT_EQ(l.size(), 0u);

    // Many addresses failing once: memory stays at the capacity.
    AddressLimiter big(30, std::chrono::minutes(1), 1000);
    for (int i = 0; i < 100000; ++i)
        big.failed("2001:db8:" + std::to_string(i / 65536) + ":" + std::to_string(i % 65536) + "::1",
                   t0 + std::chrono::milliseconds(i));
    EXPECT_EQ(big.size(), 1000u);
    EXPECT_EQ(big.evicted(), 99000u);
}

std::string bytes_of(const std::string& address) {
    unsigned char b[16];
    if (inet_pton(AF_INET, address.c_str(), b) == 1) return std::string(reinterpret_cast<char*>(b), 4);
    if (inet_pton(AF_INET6, address.c_str(), b) != 1) throw std::runtime_error("bad address " + address);
    return std::string(reinterpret_cast<char*>(b), 16);
}

std::string be16(std::size_t v) { return {static_cast<char>(v >> 8), static_cast<char>(v & 0xff)}; }

// A PROXY protocol v2 header as HAProxy's send-proxy-v2 writes it: PROXY
// command over TCP, source then destination address and port, then `tlvs`.
std::string proxy_v2(const std::string& src, const std::string& dst = "127.0.0.1", const std::string& tlvs = {}) {
    const std::string s = bytes_of(src);
    const bool v6 = s.size() == 16;
    const std::string d = bytes_of(v6 && dst == "127.0.0.1" ? std::string("::1") : dst);
    std::string h(im::proxy_v2_signature);
    h += '\x21';                     // version 2, PROXY
    h += v6 ? '\x21' : '\x11';       // INET6 or INET, STREAM
    const std::string block = s + d + be16(51000) + be16(8080);
    h += be16(block.size() + tlvs.size());
    return h + block + tlvs;
}

// LOCAL: the proxy's own connection (its health check).
std::string proxy_v2_local() {
    std::string h(im::proxy_v2_signature);
    h += '\x20';
    h += '\x00';
    return h + be16(0);
}

TEST(ProxyHeaderUnit, reads_what_haproxy_writes) {
    const std::string rest = "GET / HTTP/1.1\r\n\r\n";
    auto h = im::parse_proxy_v2(proxy_v2("198.51.100.7") + rest);
    ASSERT_EQ(h.status, ProxyHeader::Status::ok) << h.error;
    EXPECT_EQ(h.length, 28u);
    ASSERT_TRUE(h.source);
    EXPECT_EQ(im::to_string(*h.source), "198.51.100.7");

    h = im::parse_proxy_v2(proxy_v2("2001:db8::7", "2001:db8::1"));
    ASSERT_EQ(h.status, ProxyHeader::Status::ok) << h.error;
    EXPECT_EQ(h.length, 52u);
    EXPECT_EQ(im::to_string(*h.source), "2001:db8::7");

    // TLVs (here a PP2_TYPE_UNIQUE_ID) are skipped.
    const std::string tlv = std::string("\x05", 1) + be16(4) + "abcd";
    h = im::parse_proxy_v2(proxy_v2("198.51.100.7", "127.0.0.1", tlv) + rest);
    ASSERT_EQ(h.status, ProxyHeader::Status::ok) << h.error;
    EXPECT_EQ(h.length, 28u + tlv.size());

    h = im::parse_proxy_v2(proxy_v2_local());
    ASSERT_EQ(h.status, ProxyHeader::Status::ok) << h.error;
    EXPECT_EQ(h.length, 16u);
    EXPECT_FALSE(h.source) << "LOCAL: the peer is the client";
}

TEST(ProxyHeaderUnit, tells_absent_partial_and_malformed_headers_apart) {
    EXPECT_EQ(im::parse_proxy_v2("G").status, ProxyHeader::Status::absent) << "HTTP: one byte tells";
    EXPECT_EQ(im::parse_proxy_v2("\x16\x03\x01").status, ProxyHeader::Status::absent) << "a TLS ClientHello";
    EXPECT_EQ(im::parse_proxy_v2("PROXY TCP4 198.51.100.7 127.0.0.1 1 2\r\n").status, ProxyHeader::Status::absent)
        << "version 1 (text) is not read";
    const std::string whole = proxy_v2("198.51.100.7");
    for (std::size_t n = 0; n < whole.size(); ++n) {
        auto h = im::parse_proxy_v2(whole.substr(0, n));
        EXPECT_EQ(h.status, ProxyHeader::Status::need_more) << n;
        EXPECT_GT(h.length, n) << n;
    }
    auto with = [&](std::size_t at, char byte) {
        std::string b = whole;
        b[at] = byte;
        return im::parse_proxy_v2(b).status;
    };
    EXPECT_EQ(with(12, '\x11'), ProxyHeader::Status::malformed) << "version 1 in a v2 header";
    EXPECT_EQ(with(12, '\x22'), ProxyHeader::Status::malformed) << "unknown command";
    EXPECT_EQ(with(13, '\x41'), ProxyHeader::Status::malformed) << "unknown family";
    EXPECT_EQ(with(13, '\x12'), ProxyHeader::Status::malformed) << "a datagram";
    EXPECT_EQ(with(15, '\x04'), ProxyHeader::Status::malformed) << "too short for its addresses";
    EXPECT_EQ(with(14, '\x10'), ProxyHeader::Status::malformed) << "longer than the bound";
    EXPECT_EQ(with(14, '\x07'), ProxyHeader::Status::need_more) << "long, within the bound: read on";
}

TEST(ForwardedForUnit, the_client_is_the_right_most_address_that_is_no_trusted_proxy) {
    std::vector<im::IpNetwork> trusted;
    ASSERT_EQ(im::parse_cidr_list("10.0.0.0/8,2001:db8:ffff::/48", trusted), std::nullopt);
    const auto proxy = *im::parse_ip("10.0.0.5");
    auto client = [&](const IpAddress& hop, std::vector<std::string_view> xff) {
        auto c = im::forwarded_client(hop, xff, trusted);
        return c ? im::to_string(*c) : std::string("(refused)");
    };
    EXPECT_EQ(client(proxy, {}), "10.0.0.5") << "no header: the proxy itself (its health check)";
    EXPECT_EQ(client(proxy, {"198.51.100.7"}), "198.51.100.7");
    EXPECT_EQ(client(proxy, {"203.0.113.1, 198.51.100.7"}), "198.51.100.7") << "the client's own entry is left of it";
    EXPECT_EQ(client(proxy, {"198.51.100.7, 10.1.1.1"}), "198.51.100.7") << "a chain of trusted proxies";
    EXPECT_EQ(client(proxy, {"198.51.100.7", "10.1.1.1"}), "198.51.100.7") << "split over header lines";
    EXPECT_EQ(client(proxy, {"10.3.3.3, 10.1.1.1"}), "10.3.3.3") << "all trusted: the left-most";
    EXPECT_EQ(client(proxy, {"garbage, 198.51.100.7"}), "198.51.100.7") << "what the client wrote is not read";
    EXPECT_EQ(client(proxy, {"198.51.100.7:5678"}), "198.51.100.7");
    EXPECT_EQ(client(proxy, {"[2001:db8::7]:443"}), "2001:db8::7");
    EXPECT_EQ(client(proxy, {"2001:db8::7"}), "2001:db8::7");
    EXPECT_EQ(client(proxy, {"198.51.100.7, garbage"}), "(refused)") << "a trusted proxy wrote no address";
    EXPECT_EQ(client(proxy, {"[2001:db8::7"}), "(refused)");
    EXPECT_EQ(client(*im::parse_ip("198.51.100.9"), {"203.0.113.1"}), "198.51.100.9")
        << "behind an untrusted hop (a PROXY header's client) X-Forwarded-For is the client's own word";
}

// A hello on an open WebSocket stream (plain or TLS); the reply.
template <class Ws>
json::object hello_on(Ws& ws, const std::string& token) {
    ws.text(true);
    ws.write(net::buffer(
        json::serialize(json::object{{"t", "hello"}, {"rid", "h"}, {"token", token}, {"install", uuid4()}})));
    beast::flat_buffer buf;
    ws.read(buf);
    return json::parse(beast::buffers_to_string(buf.data())).as_object();
}

// A WebSocket client from a chosen loopback address, with what a proxy in
// front of the gateway would write: a PROXY v2 header before the first byte
// and/or an X-Forwarded-For on the upgrade request.
struct ProxiedWs {
    net::io_context ioc;
    websocket::stream<tcp::socket> ws{ioc};
    ProxiedWs(unsigned short port, const std::string& from, const std::string& preamble,
              const std::string& forwarded_for = {}) {
        auto& s = ws.next_layer();
        s.open(tcp::v4());
        s.bind(tcp::endpoint(net::ip::make_address(from), 0));
        s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
        if (!preamble.empty()) net::write(s, net::buffer(preamble));
        if (!forwarded_for.empty())
            ws.set_option(websocket::stream_base::decorator(
                [forwarded_for](websocket::request_type& req) { req.set("X-Forwarded-For", forwarded_for); }));
        ws.handshake("127.0.0.1", "/v1/ws");
    }
    json::object hello(const std::string& token) { return hello_on(ws, token); }
};

// A connection from the trusted proxy 127.0.0.2 whose PROXY v2 header names `client`.
std::unique_ptr<ProxiedWs> through_proxy(unsigned short port, const std::string& client) {
    return std::make_unique<ProxiedWs>(port, "127.0.0.2", proxy_v2(client));
}

// One HTTP exchange from `from` with bytes written first; the status, or
// -1 when the server closed without an answer.
int raw_http_status(unsigned short port, const std::string& from, const std::string& bytes) {
    net::io_context ioc;
    tcp::socket s(ioc);
    s.open(tcp::v4());
    s.bind(tcp::endpoint(net::ip::make_address(from), 0));
    s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
    net::write(s, net::buffer(bytes));
    beast::flat_buffer buf;
    http::response<http::string_body> res;
    beast::error_code ec;
    http::read(s, buf, res, ec);
    return ec ? -1 : static_cast<int>(res.result_int());
}

// 31 failed hellos from one client (with the default --hello-failures 30,
// the 31st is refused): `open(client)` opens a connection on its behalf.
template <class Open>
void fail_hellos_until_limited(Open open, const std::string& client) {
    for (int i = 0; i < 30; ++i) {
        auto c = open(client);
        ASSERT_EQ(str(c->hello("not-a-token"), "code"), "UNAUTHENTICATED") << client << " hello " << i;
    }
    auto c = open(client);
    ASSERT_EQ(str(c->hello("not-a-token"), "code"), "UNAVAILABLE") << client << ": the 31st is refused";
}

// Issue 47 section 2: behind a trusted proxy every client has the proxy's
// address; the PROXY v2 header names the client, and the failed-hello limit
// counts it, not the proxy.
TEST(TrustedProxy, proxy_v2_header_names_the_client_the_hello_limit_counts) {
    TestPostgres pg;
    auto u = make_user(pg.url(), unique_name("pp"));
    ServerProcess srv(pg.url(), {"--quiet", "--trusted-proxies", "127.0.0.2/32", "--hello-failures-exempt", "none"});
    auto via_proxy = [&](const std::string& client) { return through_proxy(srv.port(), client); };
    fail_hellos_until_limited(via_proxy, "198.51.100.7");
    EXPECT_EQ(str(via_proxy("198.51.100.8")->hello(u.token), "t"), "welcome") << "another client is not refused";
    EXPECT_EQ(str(via_proxy("198.51.100.7")->hello(u.token), "code"), "UNAVAILABLE") << "the limited client stays limited";
    // IPv6 clients are counted by their /64.
    fail_hellos_until_limited(via_proxy, "2001:db8:0:7::1");
    EXPECT_EQ(str(via_proxy("2001:db8:0:7::2")->hello(u.token), "code"), "UNAVAILABLE") << "same /64";
    EXPECT_EQ(str(via_proxy("2001:db8:0:8::1")->hello(u.token), "t"), "welcome") << "another /64";
    EXPECT_NE(srv.log().find(R"("address":"198.51.100.7","proxy":"127.0.0.2")"), std::string::npos)
        << "the log names the client and the proxy";

    // The proxy's health check (LOCAL) is served, and so is a trusted peer
    // that sends no header at all (the header is optional).
    const std::string get = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    EXPECT_EQ(raw_http_status(srv.port(), "127.0.0.2", proxy_v2_local() + get), 200);
    EXPECT_EQ(raw_http_status(srv.port(), "127.0.0.2", get), 200);
    // A header begun but malformed from a trusted peer closes the connection.
    std::string bad = proxy_v2("198.51.100.9") + get;
    bad[12] = '\x22';
    EXPECT_EQ(raw_http_status(srv.port(), "127.0.0.2", bad), -1);
    EXPECT_TRUE(wait_until([&] { return srv.log().find("proxy_header_refused") != std::string::npos; }, 10s));
}

// --max-connections-per-address counts the client too (IPv6 by its /64).
TEST(TrustedProxy, connections_per_address_count_the_client_behind_the_proxy) {
    TestPostgres pg;
    auto u = make_user(pg.url(), unique_name("ppc"));
    ServerProcess srv(pg.url(), {"--quiet", "--trusted-proxies", "127.0.0.2", "--max-connections-per-address", "1"});
    auto via_proxy = [&](const std::string& client) { return through_proxy(srv.port(), client); };
    auto close_code = [](ProxiedWs& c) {
        beast::flat_buffer b;
        beast::error_code ec;
        c.ws.read(b, ec);
        return ec == websocket::error::closed ? static_cast<int>(c.ws.reason().code) : -1;
    };
    auto first = via_proxy("198.51.100.7");
    ASSERT_EQ(str(first->hello(u.token), "t"), "welcome");
    auto second = via_proxy("198.51.100.7");
    EXPECT_EQ(close_code(*second), 1013) << "that client has its one connection";
    EXPECT_EQ(str(via_proxy("198.51.100.8")->hello(u.token), "t"), "welcome") << "another client behind the proxy";
    auto v6 = via_proxy("2001:db8:0:9::1");
    ASSERT_EQ(str(v6->hello(u.token), "t"), "welcome");
    auto same64 = via_proxy("2001:db8:0:9::2");
    EXPECT_EQ(close_code(*same64), 1013) << "one /64 is one client";
    EXPECT_EQ(str(via_proxy("2001:db8:0:a::1")->hello(u.token), "t"), "welcome");
    EXPECT_NE(srv.log().find(R"("msg":"connection_rejected")"), std::string::npos);
    EXPECT_NE(srv.log().find(R"("address":"2001:db8:0:9::2","proxy":"127.0.0.2")"), std::string::npos)
        << "the log names the client and the proxy";
}

// The same with X-Forwarded-For on the upgrade request (an HTTP proxy).
TEST(TrustedProxy, forwarded_for_names_the_client_the_hello_limit_counts) {
    TestPostgres pg;
    auto u = make_user(pg.url(), unique_name("xff"));
    ServerProcess srv(pg.url(), {"--quiet", "--trusted-proxies", "127.0.0.2", "--hello-failures-exempt", "none"});
    auto via_proxy = [&](const std::string& client) {
        // The client's own (forged) entry first, then what the proxy appended.
        return std::make_unique<ProxiedWs>(srv.port(), "127.0.0.2", "", "203.0.113.66, " + client);
    };
    fail_hellos_until_limited(via_proxy, "198.51.100.7");
    EXPECT_EQ(str(via_proxy("198.51.100.8")->hello(u.token), "t"), "welcome") << "another client is not refused";
    EXPECT_EQ(str(via_proxy("198.51.100.7")->hello(u.token), "code"), "UNAVAILABLE");
    // A trusted proxy's X-Forwarded-For without an address is refused.
    EXPECT_EQ(raw_http_status(srv.port(), "127.0.0.2",
                              "GET /v1/ws HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 198.51.100.7, junk\r\n"
                              "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                              "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"),
              400);
}

// HAProxy in `mode tcp` with send-proxy-v2 in front of a gateway that
// terminates TLS: the header comes before the TLS handshake.
TEST(TrustedProxy, proxy_v2_header_before_the_tls_handshake_names_the_client) {
    TestPostgres pg;
    TempDir dir("impptls");
    const std::string cert = dir.path() + "/server.crt", key = dir.path() + "/server.key";
    ASSERT_EQ(std::system(("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 "
                           "-subj /CN=localhost -addext subjectAltName=IP:127.0.0.1 -keyout " + key + " -out " + cert +
                           " >/dev/null 2>&1").c_str()),
              0);
    ServerProcess srv(pg.url(), {"--quiet", "--trusted-proxies", "127.0.0.2", "--hello-failures", "1",
                                 "--tls-cert", cert, "--tls-key", key});
    auto hello_via_proxy = [&](const std::string& client) {
        net::io_context ioc;
        net::ssl::context ctx(net::ssl::context::tls_client);
        ctx.set_verify_mode(net::ssl::verify_none); // the header's path is tested here, not the certificate
        websocket::stream<beast::ssl_stream<tcp::socket>> ws(ioc, ctx);
        auto& s = beast::get_lowest_layer(ws);
        s.open(tcp::v4());
        s.bind(tcp::endpoint(net::ip::make_address("127.0.0.2"), 0));
        s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), srv.port()));
        net::write(s, net::buffer(proxy_v2(client)));
        ws.next_layer().handshake(net::ssl::stream_base::client);
        ws.handshake("127.0.0.1", "/v1/ws");
        return str(hello_on(ws, "not-a-token"), "code");
    };
    EXPECT_EQ(hello_via_proxy("198.51.100.7"), "UNAUTHENTICATED");
    EXPECT_EQ(hello_via_proxy("198.51.100.7"), "UNAVAILABLE") << "--hello-failures 1: that client is limited";
    EXPECT_EQ(hello_via_proxy("198.51.100.8"), "UNAUTHENTICATED") << "another client is not";
}

// The backend API's failed keys count the client too (X-Forwarded-For on
// each request from a trusted proxy), and its log names client and proxy.
TEST(TrustedProxy, backend_api_auth_failures_count_the_forwarded_client) {
    TestPostgres pg;
    ServerProcess srv(pg.url(), {"--api-listen", "127.0.0.1:0", "--trusted-proxies", "127.0.0.2",
                                 "--api-auth-failures", "2", "--api-auth-failures-exempt", "none"});
    auto call = [&](const std::string& from, const std::string& client) {
        return raw_http_status(srv.api_port(), from,
                               "GET /v1/openapi.json HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n"
                               "X-Forwarded-For: " + client + "\r\nConnection: close\r\n\r\n");
    };
    EXPECT_EQ(call("127.0.0.2", "198.51.100.7"), 401);
    EXPECT_EQ(call("127.0.0.2", "198.51.100.7"), 401);
    EXPECT_EQ(call("127.0.0.2", "198.51.100.7"), 429) << "that client used up its failures";
    EXPECT_EQ(call("127.0.0.2", "198.51.100.8"), 401) << "another client behind the same proxy is not limited";
    EXPECT_TRUE(wait_until(
        [&] { return srv.log().find(R"("status":429,"address":"198.51.100.7","proxy":"127.0.0.2")") != std::string::npos; },
        10s))
        << "api_call names the client and the proxy";
    // From an untrusted peer the header is ignored: the peer is counted.
    EXPECT_EQ(call("127.0.0.3", "198.51.100.20"), 401);
    EXPECT_EQ(call("127.0.0.3", "198.51.100.21"), 401);
    EXPECT_EQ(call("127.0.0.3", "198.51.100.22"), 429);
}

// From a peer that is not a trusted proxy both headers are ignored: a forged
// X-Forwarded-For does not move the limit off the real peer, and a forged
// PROXY header is not read (it is a bad HTTP request).
TEST(TrustedProxy, forged_headers_from_an_untrusted_peer_are_ignored) {
    TestPostgres pg;
    auto u = make_user(pg.url(), unique_name("forged"));
    ServerProcess srv(pg.url(), {"--quiet", "--trusted-proxies", "127.0.0.2", "--hello-failures-exempt", "none"});
    int n = 0;
    auto forging = [&](const std::string& from) {
        // A new forged client address on every connection.
        return std::make_unique<ProxiedWs>(srv.port(), from, "", "198.51.100." + std::to_string(++n % 250));
    };
    fail_hellos_until_limited(forging, "127.0.0.3");
    EXPECT_EQ(str(forging("127.0.0.3")->hello(u.token), "code"), "UNAVAILABLE") << "the real peer is limited";
    EXPECT_EQ(str(forging("127.0.0.4")->hello(u.token), "t"), "welcome");

    const std::string get = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    EXPECT_EQ(raw_http_status(srv.port(), "127.0.0.3", proxy_v2("198.51.100.200") + get), -1)
        << "a PROXY header from an untrusted peer is not parsed: a bad request, closed unanswered";
    EXPECT_EQ(raw_http_status(srv.port(), "127.0.0.3", get), 200);
}

} // namespace
