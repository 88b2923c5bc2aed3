// Real-world sizes against a real imserver and PostgreSQL: pages cut by
// encoded size (no server frame over 64 KiB), `history`, `convs` paging, and
// range scans that never visit what the caller cannot read.
#include "common.hpp"

#include "core/faults.hpp"
#include "core/protocol.hpp"
#include "store/store.hpp"

#include <pqxx/pqxx>

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
