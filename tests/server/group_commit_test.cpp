// Group commit: runs of sends that different connections queued while the
// database was busy share one transaction, each still judged as a lone send
// (contract section 6), and a request the database rejects fails alone.
#include "common.hpp"

#include "store/db_pool.hpp"
#include "core/digest.hpp"
#include "core/metrics.hpp"
#include "store/migrations.hpp"
#include "api/send_scheduler.hpp"

#include <pqxx/pqxx>

#include <algorithm>
#include <future>
#include <map>
#include <thread>

using namespace im::test;

namespace {

// The reply carrying `rid`, skipping pushes; nothing within 20 s: none.
std::optional<json::object> reply_to(WsClient& c, const std::string& rid) {
    while (auto f = c.next(20s))
        if (str(*f, "rid") == rid) return f;
    return std::nullopt;
}

// A send that waits inside the database: the test holds its sender's device
// row (im_send takes it FOR SHARE and waits for an UPDATE lock; a held
// conversation row, by contrast, is skipped and its run put back). With the
// round-trip limit far away, only the test ends the wait.
void hold_device_row(pqxx::work& lock, const TestUser& u) {
    ASSERT_EQ(lock.exec("SELECT 1 FROM devices WHERE device_id = " + q(u.device) + " FOR UPDATE").size(), 1u);
}

// One conversation per sender; the only database worker (--db-pool 1) is
// held on a device row lock by the test, so every other sender's run waits
// in the queue until the lock goes, and the worker then takes them all at once.
struct Queued {
    TestPostgres pg;
    ServerProcess srv;
    World blocker = make_world(pg.url(), "gcblock", 2);
    std::vector<World> worlds;
    std::vector<std::unique_ptr<WsClient>> clients, twins; // twins: a second connection of the same device

    static std::vector<std::string> args(std::vector<std::string> extra) {
        std::vector<std::string> a{"--quiet", "--db-pool", "1", "--db-timeout-ms", "30000"};
        a.insert(a.end(), extra.begin(), extra.end());
        return a;
    }
    explicit Queued(int senders, std::vector<std::string> extra = {}) : srv{pg.url(), args(std::move(extra))} {
        for (int i = 0; i < senders; ++i) {
            worlds.push_back(make_world(pg.url(), "gc" + std::to_string(i), 2));
            const std::string install = uuid4();
            clients.push_back(login(srv.port(), worlds.back().users[0], install));
            twins.push_back(login(srv.port(), worlds.back().users[0], install));
        }
    }

    // Holds the only worker: `first` sends to the blocker conversation while
    // the test holds its row lock; then `queue` sends the runs to be grouped,
    // and once `runs` of them wait for the send worker the lock goes.
    void hold_worker_while(WsClient& first, int runs, const std::function<void()>& queue) {
        pqxx::connection holder(pg.url());
        pqxx::work lock(holder);
        hold_device_row(lock, blocker.users[0]);
        first.send_json({{"t", "send"}, {"rid", "b"}, {"conv", blocker.conv}, {"cmid", "b"}, {"body", "blocked"}});
        ASSERT_TRUE(wait_until([&] {
            return pg.pool_workers_waiting_on_locks() == 1;
        }, 20s)) << "the first send never reached the row lock";
        queue();
        ASSERT_TRUE(wait_until([&] { return srv.metric("im_send_runs_queued") == runs; }, 20s))
            << "queued runs: " << srv.metric("im_send_runs_queued");
        lock.abort();
    }
};

} // namespace

TEST(GroupCommit, runs_queued_by_many_connections_share_one_transaction_each_judged_alone) {
    constexpr int senders = 12;
    Queued qd(senders);
    auto first = login(qd.srv.port(), qd.blocker.users[0]);
    const long long before = qd.srv.metric("im_send_group_commits_total");
    ASSERT_NO_FATAL_FAILURE(qd.hold_worker_while(*first, 2 * senders, [&] {
        // Every sender sends one message on two connections at once (the
        // same key: a resend racing the original inside one transaction).
        for (int i = 0; i < senders; ++i)
            for (auto* c : {qd.clients[i].get(), qd.twins[i].get()})
                c->send_json({{"t", "send"}, {"rid", "x"}, {"conv", qd.worlds[i].conv}, {"cmid", "k1"}, {"body", "one"}});
    }));
    auto b = first->next(20s);
    ASSERT_TRUE(b.has_value());
    EXPECT_EQ(str(*b, "t"), "sent");
    for (int i = 0; i < senders; ++i) {
        auto r1 = qd.clients[i]->next(20s), r2 = qd.twins[i]->next(20s);
        ASSERT_TRUE(r1.has_value() && r2.has_value()) << "sender " << i << ": missing replies";
        // Joins are seqs 1-2: one original at seq 3, the other its duplicate.
        EXPECT_EQ(str(*r1, "t"), "sent") << json::serialize(*r1);
        EXPECT_EQ(str(*r2, "t"), "sent") << json::serialize(*r2);
        EXPECT_EQ(num(*r1, "seq"), 3);
        EXPECT_EQ(num(*r2, "seq"), 3);
        EXPECT_NE(r1->at("dup").as_bool(), r2->at("dup").as_bool()) << json::serialize(*r1) << json::serialize(*r2);
        EXPECT_EQ(count_rows(qd.pg, "conv_id = " + q(qd.worlds[i].conv) + " AND kind = 'msg'"), "1");
    }
    // Everything queued behind the blocked send went in one group commit
    // (not one per connection): the rows share their transaction (xmin).
    EXPECT_EQ(qd.srv.metric("im_send_group_commits_total") - before, 1);
    std::string convs;
    for (const auto& w : qd.worlds) convs += (convs.empty() ? "" : ",") + q(w.conv);
    EXPECT_EQ(qd.pg.scalar("SELECT count(DISTINCT xmin::text) FROM events WHERE kind = 'msg' AND conv_id IN (" +
                           convs + ")"),
              "1");
}

// --send-linger-us: after a group of several runs the send worker waits
// for as many runs as that group had before its next statement, so senders
// that come back one after another share one group instead of the first
// going alone; after a lone run it never waits. (The linger here is long
// enough that only the runs' arrival ends it; without the linger the first
// of the three would find the worker idle and commit alone.)
TEST(GroupCommit, after_a_group_the_worker_lingers_for_as_many_runs_and_after_a_lone_run_never) {
    Queued qd(6, {"--send-linger-us", "1000000"});
    auto send = [&](int i, const std::string& cmid) {
        qd.clients[i]->send_json({{"t", "send"}, {"rid", cmid}, {"conv", qd.worlds[i].conv}, {"cmid", cmid}, {"body", "x"}});
    };
    auto expect_sent = [&](int i, const std::string& cmid) {
        auto r = reply_to(*qd.clients[i], cmid);
        ASSERT_TRUE(r.has_value()) << "sender " << i << ": no reply to " << cmid;
        EXPECT_EQ(str(*r, "t"), "sent") << json::serialize(*r);
    };
    // Two lone runs, one after the other: no linger after either.
    send(0, "lone1");
    ASSERT_NO_FATAL_FAILURE(expect_sent(0, "lone1"));
    send(1, "lone2");
    ASSERT_NO_FATAL_FAILURE(expect_sent(1, "lone2"));
    EXPECT_EQ(qd.srv.metric("im_send_lingers_total"), 0);
    // A group of three (queued behind the blocked send) ...
    auto first = login(qd.srv.port(), qd.blocker.users[0]);
    ASSERT_NO_FATAL_FAILURE(qd.hold_worker_while(*first, 3, [&] {
        for (int i = 0; i < 3; ++i) send(i, "g");
    }));
    for (int i = 0; i < 3; ++i) ASSERT_NO_FATAL_FAILURE(expect_sent(i, "g"));
    // ... and the worker waits for three runs: the next three senders' runs,
    // sent one by one, go in one statement.
    ASSERT_TRUE(wait_until([&] { return qd.srv.metric("im_send_lingers_total") == 1; }, 20s))
        << "lingers: " << qd.srv.metric("im_send_lingers_total");
    for (int i = 3; i < 6; ++i) send(i, "after");
    for (int i = 3; i < 6; ++i) ASSERT_NO_FATAL_FAILURE(expect_sent(i, "after"));
    std::string convs;
    for (int i = 3; i < 6; ++i) convs += (convs.empty() ? "" : ",") + q(qd.worlds[i].conv);
    EXPECT_EQ(qd.pg.scalar("SELECT count(DISTINCT xmin::text) FROM events WHERE kind = 'msg' AND conv_id IN (" +
                           convs + ")"),
              "1");
    EXPECT_EQ(count_rows(qd.pg, "kind = 'msg' AND conv_id IN (" + convs + ")"), "3");
}

TEST(GroupCommit, a_request_the_database_rejects_fails_alone_among_other_connections_runs) {
    constexpr int senders = 6;
    Queued qd(senders);
    auto first = login(qd.srv.port(), qd.blocker.users[0]);
    // An operator's constraint that one body breaks, every time it is sent.
    qd.pg.scalar("ALTER TABLE events ADD CONSTRAINT poison_check CHECK (body IS NULL OR body <> 'poison')");
    ASSERT_NO_FATAL_FAILURE(qd.hold_worker_while(*first, senders, [&] {
        for (int i = 0; i < senders; ++i)
            qd.clients[i]->send_json({{"t", "send"}, {"rid", "x"}, {"conv", qd.worlds[i].conv}, {"cmid", "k1"},
                                     {"body", i == 2 ? "poison" : "fine"}});
    }));
    ASSERT_TRUE(first->next(20s).has_value());
    for (int i = 0; i < senders; ++i) {
        auto r = qd.clients[i]->next(20s);
        ASSERT_TRUE(r.has_value()) << "sender " << i;
        if (i == 2) {
            EXPECT_EQ(str(*r, "code"), "INVALID_ARGUMENT") << json::serialize(*r);
            EXPECT_EQ(count_rows(qd.pg, "conv_id = " + q(qd.worlds[i].conv) + " AND kind = 'msg'"), "0");
        } else {
            EXPECT_EQ(str(*r, "t"), "sent") << json::serialize(*r);
            EXPECT_EQ(num(*r, "seq"), 3);
            EXPECT_EQ(count_rows(qd.pg, "conv_id = " + q(qd.worlds[i].conv) + " AND kind = 'msg'"), "1");
        }
    }
}

// `prev` inside a group statement: each run's check sees only its own
// sender's keys in its own conversation, whatever else the statement
// carries. Per world i (A and B members of conversation C, and both of a
// second conversation X), committed before the group: A's k0 in C, B's
// "theirs" in C, A's "mine-x" in X. In the group, first: A's k1 naming k0
// (sent), B's "shared-b" in C, A's "shared-x" in X; after them, four runs of
// A in C, each naming one of the keys that are not A's in C: all refused,
// nothing written.
TEST(GroupCommit, prev_is_judged_per_run_inside_a_group_commit) {
    constexpr int senders = 3;
    Queued qd(senders);
    const std::vector<std::string> not_mine = {"theirs", "mine-x", "shared-b", "shared-x"};
    std::vector<std::string> second; // X, per world
    std::vector<std::unique_ptr<WsClient>> bees, elsewhere;
    std::vector<std::vector<std::unique_ptr<WsClient>>> askers(senders);
    for (int i = 0; i < senders; ++i) {
        const auto& w = qd.worlds[i];
        second.push_back(unique_name("gcx"));
        admin_ok(qd.pg.url(), {"conv", "create", second[i], "--kind", "group", "--members",
                               w.users[0].user + "," + w.users[1].user});
        bees.push_back(login(qd.srv.port(), w.users[1]));
        elsewhere.push_back(login(qd.srv.port(), w.users[0]));
        for (std::size_t k = 0; k < not_mine.size(); ++k) askers[i].push_back(login(qd.srv.port(), w.users[0]));
        ASSERT_EQ(str(send_msg(*qd.clients[i], w.conv, "k0", "zero"), "t"), "sent");
        ASSERT_EQ(str(send_msg(*bees[i], w.conv, "theirs", "b's"), "t"), "sent");
        ASSERT_EQ(str(send_msg(*elsewhere[i], second[i], "mine-x", "a's in x"), "t"), "sent");
    }
    auto first = login(qd.srv.port(), qd.blocker.users[0]);
    const long long before = qd.srv.metric("im_send_group_commits_total");
    const int runs = senders * (3 + static_cast<int>(not_mine.size()));
    ASSERT_NO_FATAL_FAILURE(qd.hold_worker_while(*first, runs, [&] {
        for (int i = 0; i < senders; ++i) {
            const auto& w = qd.worlds[i];
            qd.clients[i]->send_json({{"t", "send"}, {"rid", "ok"}, {"conv", w.conv}, {"cmid", "k1"},
                                      {"body", "one"}, {"prev", "k0"}});
            bees[i]->send_json({{"t", "send"}, {"rid", "b"}, {"conv", w.conv}, {"cmid", "shared-b"}, {"body", "b"}});
            elsewhere[i]->send_json(
                {{"t", "send"}, {"rid", "x"}, {"conv", second[i]}, {"cmid", "shared-x"}, {"body", "x"}});
        }
        // The runs naming them come after them in the group.
        ASSERT_TRUE(wait_until([&] { return qd.srv.metric("im_send_runs_queued") == 3 * senders; }, 20s));
        for (int i = 0; i < senders; ++i)
            for (std::size_t k = 0; k < not_mine.size(); ++k)
                askers[i][k]->send_json({{"t", "send"}, {"rid", "no"}, {"conv", qd.worlds[i].conv},
                                         {"cmid", "ask" + std::to_string(k)}, {"body", "asks"},
                                         {"prev", not_mine[k]}});
    }));
    ASSERT_TRUE(first->next(20s).has_value());
    for (int i = 0; i < senders; ++i) {
        const auto& conv = qd.worlds[i].conv;
        auto ok = qd.clients[i]->next(20s), b = bees[i]->next(20s), x = elsewhere[i]->next(20s);
        ASSERT_TRUE(ok.has_value() && b.has_value() && x.has_value()) << "sender " << i << ": missing replies";
        EXPECT_EQ(str(*ok, "t"), "sent") << json::serialize(*ok);
        EXPECT_EQ(str(*b, "t"), "sent") << json::serialize(*b);
        EXPECT_EQ(str(*x, "t"), "sent") << json::serialize(*x);
        for (std::size_t k = 0; k < not_mine.size(); ++k) {
            auto no = askers[i][k]->next(20s);
            ASSERT_TRUE(no.has_value()) << "sender " << i << ", prev " << not_mine[k] << ": no reply";
            EXPECT_EQ(str(*no, "code"), "UNAVAILABLE") << "prev " << not_mine[k] << ": " << json::serialize(*no);
        }
        EXPECT_EQ(count_rows(qd.pg, "conv_id = " + q(conv) + " AND client_msg_id LIKE 'ask%'"), "0");
        EXPECT_EQ(count_rows(qd.pg, "conv_id = " + q(conv) + " AND kind = 'msg'"), "4"); // k0, theirs, k1, shared-b
    }
    EXPECT_EQ(qd.srv.metric("im_send_group_commits_total") - before, 1);
}

// im_send takes a conversation's counters once under its row lock and writes
// them back once per call (im_send): runs of several sends, and several
// runs of one conversation inside one group statement, must leave the same
// counters as one UPDATE per message did. Three connections per
// conversation (two of one device, one of the other member) each send a
// first message while the worker is held, so those runs share one group
// statement, then three more pipelined behind it (one run of three, `prev`
// naming the one before).
TEST(GroupCommit, counters_follow_the_events_when_runs_of_one_conversation_share_a_statement) {
    constexpr int convs = 3, per_conn = 4;
    Queued qd(convs);
    std::vector<std::unique_ptr<WsClient>> others;
    for (int i = 0; i < convs; ++i) others.push_back(login(qd.srv.port(), qd.worlds[i].users[1]));
    auto first = login(qd.srv.port(), qd.blocker.users[0]);
    auto send = [](WsClient& c, const std::string& conv, const std::string& tag, int k) {
        json::object f{{"t", "send"}, {"rid", tag + std::to_string(k)}, {"conv", conv},
                       {"cmid", tag + std::to_string(k)}, {"body", "message " + std::to_string(k) + " of " + tag}};
        if (k > 0) f["prev"] = tag + std::to_string(k - 1);
        c.send_json(f);
    };
    auto conns = [&](int i) {
        return std::vector<std::pair<WsClient*, std::string>>{
            {qd.clients[i].get(), "a"}, {qd.twins[i].get(), "b"}, {others[i].get(), "c"}};
    };
    const long long before = qd.srv.metric("im_send_group_commits_total");
    ASSERT_NO_FATAL_FAILURE(qd.hold_worker_while(*first, 3 * convs, [&] {
        for (int i = 0; i < convs; ++i)
            for (auto& [c, tag] : conns(i)) send(*c, qd.worlds[i].conv, tag, 0);
    }));
    // The first messages wait for the send worker; the rest wait behind them
    // in their sessions and go as one run each once the first is answered.
    for (int i = 0; i < convs; ++i)
        for (auto& [c, tag] : conns(i))
            for (int k = 1; k < per_conn; ++k) send(*c, qd.worlds[i].conv, tag, k);
    ASSERT_TRUE(first->next(20s).has_value());
    std::string in;
    for (int i = 0; i < convs; ++i) {
        in += (in.empty() ? "" : ",") + q(qd.worlds[i].conv);
        for (auto& [c, tag] : conns(i)) {
            long long last = 0;
            for (int k = 0; k < per_conn; ++k) {
                auto r = c->next(20s);
                ASSERT_TRUE(r.has_value()) << "conv " << i << " " << tag << k << ": no reply";
                ASSERT_EQ(str(*r, "t"), "sent") << json::serialize(*r);
                EXPECT_FALSE(r->at("dup").as_bool());
                EXPECT_GT(num(*r, "seq"), last) << tag << k; // each connection's run in its order
                last = num(*r, "seq");
            }
        }
    }
    EXPECT_GE(qd.srv.metric("im_send_group_commits_total") - before, 1);
    // 2 joins + 12 messages per conversation, gap-free, counters in step.
    EXPECT_EQ(qd.pg.scalar("SELECT count(*) FROM conversations c WHERE c.conv_id IN (" + in + ") AND "
                           "c.next_seq = 15 AND c.msg_count = 12 AND (SELECT count(*) FROM events e "
                           "WHERE e.conv_id = c.conv_id AND e.seq BETWEEN 1 AND 14) = 14"),
              std::to_string(convs));
    // Each message's running counts (what `unread` reads) match its position.
    EXPECT_EQ(qd.pg.scalar("SELECT count(*) FROM (SELECT kind, msg_ordinal, sender_ordinal, "
                           "count(*) FILTER (WHERE kind = 'msg') OVER (PARTITION BY conv_id ORDER BY seq) AS mo, "
                           "row_number() OVER (PARTITION BY conv_id, sender_user, kind ORDER BY seq) AS so "
                           "FROM events WHERE conv_id IN (" + in + ")) x "
                           "WHERE kind = 'msg' AND (msg_ordinal <> mo OR sender_ordinal <> so)"),
              "0");
    EXPECT_EQ(count_rows(qd.pg, "conv_id IN (" + in + ") AND kind = 'msg'"), std::to_string(convs * 3 * per_conn));
}

// --send-workers: at most that many database workers run sends at once.
// With one send worker held on a row lock, a send to another conversation
// waits for it (and goes in its next group) although two workers are idle,
// and those idle workers still answer reads at once.
TEST(SendWorkers, sends_take_at_most_their_workers_and_reads_pass_the_queued_sends) {
    TestPostgres pg;
    ServerProcess srv{pg.url(), {"--quiet", "--db-pool", "3", "--send-workers", "1", "--db-timeout-ms", "30000"}};
    EXPECT_EQ(srv.metric("im_send_workers"), 1);
    auto a = make_world(pg.url(), "swa", 2), b = make_world(pg.url(), "swb", 2);
    auto ca = login(srv.port(), a.users[0]), cb = login(srv.port(), b.users[0]);
    auto reader = login(srv.port(), b.users[1]);
    {
        pqxx::connection holder(pg.url());
        pqxx::work lock(holder);
        hold_device_row(lock, a.users[0]);
        ca->send_json({{"t", "send"}, {"rid", "a"}, {"conv", a.conv}, {"cmid", "a1"}, {"body", "blocked"}});
        ASSERT_TRUE(wait_until([&] {
            return pg.pool_workers_waiting_on_locks() == 1;
        }, 20s)) << "the first send never reached the row lock";
        cb->send_json({{"t", "send"}, {"rid", "b"}, {"conv", b.conv}, {"cmid", "b1"}, {"body", "queued"}});
        ASSERT_TRUE(wait_until([&] { return srv.metric("im_send_runs_queued") == 1; }, 20s))
            << "queued runs: " << srv.metric("im_send_runs_queued");
        // Another connection's read is answered by an idle worker (well
        // inside the 5 s database round-trip limit that ends the wait) ...
        const auto asked = std::chrono::steady_clock::now();
        reader->send_json({{"t", "sync"}, {"rid", "r"}, {"conv", b.conv}, {"after", 0}});
        auto r = reader->next(10s);
        EXPECT_LT(std::chrono::steady_clock::now() - asked, 3s);
        ASSERT_TRUE(r.has_value()) << "the read waited behind the queued send";
        ASSERT_EQ(str(*r, "rid"), "r") << json::serialize(*r);
        EXPECT_EQ(str(*r, "t"), "page") << json::serialize(*r);
        EXPECT_EQ(num(*r, "head"), 2) << json::serialize(*r); // the two joins only
        // ... while the send still waits, unwritten: it never took a second worker.
        EXPECT_EQ(srv.metric("im_send_runs_queued"), 1);
        EXPECT_EQ(count_rows(pg, "conv_id = " + q(b.conv) + " AND kind = 'msg'"), "0");
        EXPECT_EQ(pg.pool_workers_waiting_on_locks(), 1);
        lock.abort();
    }
    for (auto [c, rid] : {std::pair{ca.get(), "a"}, std::pair{cb.get(), "b"}}) {
        auto sent = reply_to(*c, rid);
        ASSERT_TRUE(sent.has_value()) << "missing reply";
        EXPECT_EQ(str(*sent, "t"), "sent") << json::serialize(*sent);
    }
    EXPECT_EQ(count_rows(pg, "conv_id = " + q(b.conv) + " AND kind = 'msg'"), "1");
    EXPECT_EQ(srv.metric("im_send_runs_queued"), 0);
}

// A send worker that stays busy takes one group after another without
// going back to the pool; the database watchdog (--db-timeout-ms) must time
// each group, not the whole busy spell, or a steady load would see its
// connection cut and its sends answered UNAVAILABLE. Four runs of one send
// each (--send-group-max 1), each held 600 ms before its commit, keep the
// one send worker busy 2.4 s against a 1.5 s limit.
TEST(SendWorkers, a_send_worker_busy_longer_than_the_round_trip_limit_keeps_its_connection) {
    TestPostgres pg;
    ServerProcess srv{pg.url(), {"--quiet", "--enable-faults", "--db-pool", "2", "--send-workers", "1",
                                 "--send-group-max", "1", "--db-timeout-ms", "1500"}};
    constexpr int senders = 4;
    std::vector<World> worlds;
    std::vector<std::unique_ptr<WsClient>> clients;
    for (int i = 0; i < senders; ++i) {
        worlds.push_back(make_world(pg.url(), "swbusy" + std::to_string(i), 2));
        clients.push_back(login(srv.port(), worlds.back().users[0]));
    }
    ASSERT_EQ(srv.http("POST", "/lab/fault", "store.before_commit=delay:600:" + std::to_string(senders)).first, 200);
    const long long before = srv.metric("im_send_transactions_total");
    for (int i = 0; i < senders; ++i)
        clients[i]->send_json({{"t", "send"}, {"rid", "x"}, {"conv", worlds[i].conv}, {"cmid", "k"}, {"body", "slow"}});
    for (int i = 0; i < senders; ++i) {
        auto r = clients[i]->next(20s);
        ASSERT_TRUE(r.has_value()) << "sender " << i;
        EXPECT_EQ(str(*r, "t"), "sent") << "sender " << i << ": " << json::serialize(*r);
        EXPECT_EQ(count_rows(pg, "conv_id = " + q(worlds[i].conv) + " AND kind = 'msg'"), "1");
    }
    EXPECT_EQ(srv.metric("im_db_timeouts_total"), 0);
    EXPECT_EQ(srv.metric("im_send_transactions_total") - before, senders); // one group each, as set up
}

// Issue 24, hole 2: rows of as many conversations as there are send
// workers, plus one, held by another session (an operator's transaction, a
// purge batch, a gateway frozen inside a send) until this test lets go.
// im_send skips a held row (SKIP LOCKED) and the run goes to a lock waiter,
// a database worker outside the send workers (issue 47: it waits for the
// row in its lock queue), so the send workers never wait: sends to ten other
// conversations are all answered while the rows are still held (the hold
// ends only after their replies are in; no time bound, so set-up time on a
// loaded machine cannot fail it). The held conversations' sends (two
// members of one of them) commit once the rows are free, once each,
// gap-free.
TEST(SendWorkers, conversations_held_by_another_session_never_stall_the_send_workers) {
    TestPostgres pg;
    constexpr int workers = 2;
    // The round-trip limit far away: a lock waiter waits up to half of it
    // (longer than reply_to's 20 s), so only the release ends the wait.
    ServerProcess srv{pg.url(), {"--quiet", "--db-pool", "4", "--send-workers", std::to_string(workers),
                                 "--db-timeout-ms", "60000"}};
    ASSERT_EQ(srv.metric("im_send_workers"), workers);
    std::vector<World> held, others;
    for (int i = 0; i < workers + 1; ++i) held.push_back(make_world(pg.url(), "held" + std::to_string(i), 2));
    for (int i = 0; i < 10; ++i) others.push_back(make_world(pg.url(), "other" + std::to_string(i), 2));
    std::vector<std::unique_ptr<WsClient>> hc, oc;
    for (auto& w : held) hc.push_back(login(srv.port(), w.users[0]));
    auto second = login(srv.port(), held[0].users[1]);
    for (auto& w : others) oc.push_back(login(srv.port(), w.users[0]));

    pqxx::connection holder(pg.url());
    pqxx::work lock(holder);
    std::string in;
    for (const auto& w : held) in += (in.empty() ? "" : ", ") + q(w.conv);
    ASSERT_EQ(lock.exec("SELECT 1 FROM conversations WHERE conv_id IN (" + in + ") FOR UPDATE").size(), held.size());
    for (std::size_t i = 0; i < held.size(); ++i)
        hc[i]->send_json({{"t", "send"}, {"rid", "h"}, {"conv", held[i].conv}, {"cmid", "h"}, {"body", "held"}});
    second->send_json({{"t", "send"}, {"rid", "h2"}, {"conv", held[0].conv}, {"cmid", "h2"}, {"body", "held too"}});
    // Every held conversation met its row: put back at least once (the
    // second run of held[0] may go to the lock waiter with the first
    // without being put back itself) and the lock waiter waits on one; or,
    // were the send workers to wait on held rows, all of them wait.
    ASSERT_TRUE(wait_until([&] {
        const long long waiting = pg.pool_workers_waiting_on_locks();
        return (srv.metric("im_send_runs_held_total") >= static_cast<long long>(held.size()) && waiting >= 1) ||
               waiting >= workers;
    }, 20s)) << "the held sends never reached the database: held runs " << srv.metric("im_send_runs_held_total")
             << ", database workers waiting " << pg.pool_workers_waiting_on_locks();

    long long slowest_ms = 0;
    for (std::size_t i = 0; i < others.size(); ++i) {
        const auto asked = std::chrono::steady_clock::now();
        oc[i]->send_json({{"t", "send"}, {"rid", "o"}, {"conv", others[i].conv}, {"cmid", "o"}, {"body", "elsewhere"}});
        auto r = reply_to(*oc[i], "o");
        ASSERT_TRUE(r.has_value()) << "no reply for other conversation " << i << " while the rows are held";
        EXPECT_EQ(str(*r, "t"), "sent") << json::serialize(*r);
        slowest_ms = std::max<long long>(slowest_ms, ms_since(asked));
    }
    // Only the lock waiters wait on the held rows (one here: --db-pool 4,
    // 2 send workers, 1 kept for reads), never a send worker.
    EXPECT_EQ(pg.pool_workers_waiting_on_locks(), 1) << "a send worker waits on a held row";
    for (std::size_t i = 0; i < held.size(); ++i)
        EXPECT_EQ(count_rows(pg, "conv_id = " + q(held[i].conv) + " AND kind = 'msg'"), "0");
    std::printf("%zu held conversations, %d send workers: 10 other sends answered while held, slowest %lld ms\n",
                held.size(), workers, slowest_ms);

    lock.abort();
    std::vector<long long> seqs;
    for (std::size_t i = 0; i < held.size(); ++i) {
        auto r = reply_to(*hc[i], "h");
        ASSERT_TRUE(r.has_value()) << "no reply for held conversation " << i;
        ASSERT_EQ(str(*r, "t"), "sent") << json::serialize(*r);
        if (i == 0) seqs.push_back(num(*r, "seq"));
    }
    auto r2 = reply_to(*second, "h2");
    ASSERT_TRUE(r2.has_value());
    ASSERT_EQ(str(*r2, "t"), "sent") << json::serialize(*r2);
    seqs.push_back(num(*r2, "seq"));
    // Counted once every reply is in: the two sends of held[0] may commit in
    // separate groups, so its second row can follow the first reply.
    for (std::size_t i = 0; i < held.size(); ++i)
        EXPECT_EQ(count_rows(pg, "conv_id = " + q(held[i].conv) + " AND kind = 'msg'"), i == 0 ? "2" : "1");
    std::sort(seqs.begin(), seqs.end());
    EXPECT_EQ(seqs, (std::vector<long long>{3, 4})); // after the two joins, gap-free
    EXPECT_EQ(srv.metric("im_send_runs_queued"), 0);
}

// One send worker (--send-workers 1) over a real pool and database, in
// this process: runs submitted straight to the scheduler, each answered
// through a future.
struct OneSendWorker {
    TestPostgres pg;
    World w;
    im::FaultRegistry faults;
    im::Store store{faults, {}};
    im::Metrics metrics;
    std::unique_ptr<im::DbPool> pool;
    im::ApiContext ctx{store, faults, "gw-one", nullptr, {}, nullptr};
    std::unique_ptr<im::SendScheduler> sends;
    im::Identity who;

    OneSendWorker(const std::string& prefix, bool lab, std::function<void(const std::vector<im::Event>&)> committed)
        : faults(lab) {
        {
            pqxx::connection c(pg.url());
            im::migrate(c);
        }
        w = make_world(pg.url(), prefix, 2);
        pool = std::make_unique<im::DbPool>(pg.url(), 2, 100);
        ctx.committed = std::move(committed);
        sends = std::make_unique<im::SendScheduler>(ctx, *pool, metrics, 16, 1, 100);
        who.user = w.users[0].user;
        who.device = w.users[0].device;
        who.token_sha256 = im::sha256_hex(w.users[0].token);
    }
    ~OneSendWorker() { pool->stop(); }

    std::future<std::vector<im::Handled>> run(const std::string& cmid) {
        auto p = std::make_shared<std::promise<std::vector<im::Handled>>>();
        auto f = p->get_future();
        im::req::Send s;
        s.conv = w.conv;
        s.cmid = cmid;
        s.body = "body " + cmid;
        EXPECT_TRUE(sends->submit(who, {s}, {std::optional<std::string>(cmid)},
                                  [p](std::vector<im::Handled> hs) { p->set_value(std::move(hs)); }));
        return f;
    }
    std::string msg_rows() { return count_rows(pg, "conv_id = " + q(w.conv) + " AND kind = 'msg'"); }
};

// Issue 24 item 7: a send worker's slot and the conversations of its group
// are given back however the worker ends. Here the first group's commit
// callback throws inside the worker (the only one): the next run of the
// same conversation must still be taken and answered.
TEST(SendWorkers, a_throw_inside_the_send_worker_strands_neither_its_slot_nor_its_conversation) {
    std::atomic<int> thrown{0};
    OneSendWorker one("gcthrow", false, [&](const std::vector<im::Event>&) {
        if (thrown++ == 0) throw std::runtime_error("test: the commit callback throws once");
    });
    auto first = one.run("t1");
    ASSERT_TRUE(wait_until([&] { return thrown.load() == 1; }, 20s)) << "the first group never committed";
    auto second = one.run("t2");
    ASSERT_EQ(second.wait_for(20s), std::future_status::ready)
        << "the run after a throw was never taken: the worker's slot or its conversation was kept";
    auto hs = second.get();
    ASSERT_EQ(hs.size(), 1u);
    EXPECT_NE(hs[0].frame.find("\"sent\""), std::string::npos) << hs[0].frame;
    EXPECT_EQ(one.msg_rows(), "2");
}

// The same, for an exception out of the worker's loop itself (the lab point
// send.after_take: the group's runs are answered UNAVAILABLE, then the worker
// throws, as an allocation failure would): only the slot's guard gives the
// slot and the conversation back. A resend and a later run of the same
// conversation are taken and written.
TEST(SendWorkers, a_worker_that_throws_out_of_its_loop_gives_back_its_slot_and_conversation) {
    OneSendWorker one("gcunwind", true, [](const std::vector<im::Event>&) {});
    ASSERT_FALSE(one.faults.arm("send.after_take=unavailable:1").has_value());
    auto first = one.run("u1");
    ASSERT_EQ(first.wait_for(20s), std::future_status::ready) << "the run taken before the throw was never answered";
    auto h1 = first.get();
    ASSERT_EQ(h1.size(), 1u);
    EXPECT_NE(h1[0].frame.find("\"UNAVAILABLE\""), std::string::npos) << h1[0].frame;
    EXPECT_EQ(one.msg_rows(), "0");
    for (const std::string cmid : {"u1", "u2"}) {
        auto next = one.run(cmid);
        ASSERT_EQ(next.wait_for(20s), std::future_status::ready)
            << cmid << " was never taken: the worker's slot or its conversation was kept";
        auto hs = next.get();
        ASSERT_EQ(hs.size(), 1u);
        EXPECT_NE(hs[0].frame.find("\"sent\""), std::string::npos) << hs[0].frame;
    }
    EXPECT_EQ(one.msg_rows(), "2");
}

// Issue 28 item 4: each stage of a send has its histogram in /metrics, and
// one send through the gateway is counted once in every stage.
TEST(SendWorkers, every_stage_of_a_send_is_counted_in_its_histogram) {
    TestPostgres pg;
    // Sends publish after COMMIT here, so every stage is there (with
    // --notify-in-commit on, the default, there is no publish stage:
    // Push.a_sends_notification_goes_out_with_its_commit).
    ServerProcess srv(pg.url(), {"--quiet", "--notify-in-commit", "off"});
    auto w = make_world(pg.url(), "gcstage", 2);
    auto c = login(srv.port(), w.users[0]);
    auto count = [&](const std::string& stage) {
        return srv.metric("im_send_stage_seconds_count{stage=\"" + stage + "\"}");
    };
    for (const char* stage : {"queue", "statement", "publish", "strand"}) EXPECT_EQ(count(stage), 0) << stage;
    ASSERT_EQ(str(send_msg(*c, w.conv, "s1", "staged"), "t"), "sent");
    for (const char* stage : {"queue", "statement", "publish", "strand"}) EXPECT_EQ(count(stage), 1) << stage;
    ASSERT_EQ(str(send_msg(*c, w.conv, "s2", "staged again"), "t"), "sent");
    for (const char* stage : {"queue", "statement", "publish", "strand"}) EXPECT_EQ(count(stage), 2) << stage;
    // A refused send publishes nothing: every stage but publish counts it.
    ASSERT_EQ(str(send_msg(*c, w.conv, "s1", "another body"), "code"), "IDEMPOTENCY_MISMATCH");
    for (const char* stage : {"queue", "statement", "strand"}) EXPECT_EQ(count(stage), 3) << stage;
    EXPECT_EQ(count("publish"), 2) << "a run with nothing to publish was counted in the publish stage";
}

// Contract section 12 on the send path (issue 49): edits and reacts ride the
// same runs and group commits as sends. Ten requests of one conversation,
// each on its own connection and queued in this order behind the held
// worker, go in ONE statement and ONE transaction, judged in their order:
// seqs gap-free in arrival order, an edit and a react of a message sent
// earlier in the same group see it, a react replayed from before the group
// and one replayed inside it are dups, a react already as asked appends
// nothing, and the checks answer as for a lone request (NOT_SENDER,
// NOT_FOUND).
TEST(GroupCommit, a_mixed_group_of_sends_edits_and_reacts_is_one_statement_judged_in_arrival_order) {
    Queued qd(1);
    const auto& w = qd.worlds[0];
    const auto& ana = w.users[0];
    const auto& ben = w.users[1];
    auto setup_ana = login(qd.srv.port(), ana), setup_ben = login(qd.srv.port(), ben);
    // Joins are seqs 1-2: ana's m1 at 3, ben's 👍 on it at 4.
    ASSERT_EQ(num(send_msg(*setup_ana, w.conv, "m1", "one"), "seq"), 3);
    auto r0 = setup_ben->request(
        {{"t", "react"}, {"conv", w.conv}, {"target", 3}, {"cmid", "r0"}, {"emoji", "👍"}, {"on", true}});
    ASSERT_EQ(str(r0, "t"), "reacted") << json::serialize(r0);
    ASSERT_EQ(num(r0, "seq"), 4);
    struct Step {
        const TestUser* who;
        json::object frame;
    };
    auto react = [&](std::int64_t target, const std::string& cmid, const std::string& emoji) {
        return json::object{{"t", "react"}, {"conv", w.conv}, {"target", target}, {"cmid", cmid}, {"emoji", emoji},
                            {"on", true}};
    };
    auto edit = [&](std::int64_t target, const std::string& cmid, const std::string& body) {
        return json::object{{"t", "edit"}, {"conv", w.conv}, {"target", target}, {"cmid", cmid}, {"body", body}};
    };
    const std::vector<Step> steps = {
        {&ana, {{"t", "send"}, {"conv", w.conv}, {"cmid", "m2"}, {"body", "two"}}}, // 5
        {&ana, edit(5, "e5", "two, fixed")},                                        // 6: edits a send of this group
        {&ben, react(5, "rb", "👍")},                                                // 7
        {&ben, react(3, "r0", "👍")},                                                // dup of 4 (before the group)
        {&ben, edit(3, "eb", "not mine")},                                          // NOT_SENDER
        {&ben, {{"t", "send"}, {"conv", w.conv}, {"cmid", "hi"}, {"body", "hi"}}},  // 8
        {&ana, react(8, "ra", "❤")},                                                // 9
        {&ben, react(5, "rb", "👍")},                                                // dup of 7 (inside the group)
        {&ana, edit(999, "e999", "nothing there")},                                 // NOT_FOUND
        {&ben, react(5, "rb2", "👍")},                                               // already on: no event
    };
    std::vector<std::unique_ptr<WsClient>> conns;
    for (const auto& s : steps) conns.push_back(login(qd.srv.port(), *s.who));
    auto first = login(qd.srv.port(), qd.blocker.users[0]);
    const long long before = qd.srv.metric("im_send_group_commits_total");
    ASSERT_NO_FATAL_FAILURE(qd.hold_worker_while(*first, static_cast<int>(steps.size()), [&] {
        for (std::size_t i = 0; i < steps.size(); ++i) {
            auto frame = steps[i].frame;
            frame["rid"] = "s" + std::to_string(i);
            conns[i]->send_json(frame);
            // One after the other: the queue's order is the arrival order.
            ASSERT_TRUE(wait_until([&] { return qd.srv.metric("im_send_runs_queued") == static_cast<long long>(i + 1); },
                                   20s))
                << "step " << i << " never queued";
        }
    }));
    ASSERT_TRUE(reply_to(*first, "b").has_value());
    std::vector<json::object> replies;
    for (std::size_t i = 0; i < steps.size(); ++i) {
        auto r = reply_to(*conns[i], "s" + std::to_string(i));
        ASSERT_TRUE(r.has_value()) << "step " << i << ": no reply";
        replies.push_back(*r);
    }
    auto ok = [&](std::size_t i, const std::string& t, std::int64_t seq, bool dup) {
        EXPECT_EQ(str(replies[i], "t"), t) << "step " << i << ": " << json::serialize(replies[i]);
        if (str(replies[i], "t") != t) return;
        EXPECT_EQ(num(replies[i], "seq"), seq) << "step " << i << ": " << json::serialize(replies[i]);
        EXPECT_EQ(replies[i].at("dup").as_bool(), dup) << "step " << i << ": " << json::serialize(replies[i]);
    };
    auto refused = [&](std::size_t i, const std::string& code) {
        EXPECT_EQ(str(replies[i], "code"), code) << "step " << i << ": " << json::serialize(replies[i]);
    };
    ok(0, "sent", 5, false);
    ok(1, "edited", 6, false);
    ok(2, "reacted", 7, false);
    ok(3, "reacted", 4, true);
    refused(4, "NOT_SENDER");
    ok(5, "sent", 8, false);
    ok(6, "reacted", 9, false);
    ok(7, "reacted", 7, true);
    refused(8, "NOT_FOUND");
    ok(9, "reacted", 7, false);
    EXPECT_FALSE(replies[9].at("changed").as_bool()) << json::serialize(replies[9]);
    // One statement, one transaction, gap-free seqs 5-9 in arrival order.
    EXPECT_EQ(qd.srv.metric("im_send_group_commits_total") - before, 1);
    const std::string group = "conv_id = " + q(w.conv) + " AND seq >= 5";
    EXPECT_EQ(qd.pg.scalar("SELECT count(DISTINCT xmin::text) FROM events WHERE " + group), "1");
    EXPECT_EQ(qd.pg.scalar("SELECT string_agg(seq || ':' || kind, ',' ORDER BY seq) FROM events WHERE " + group),
              "5:msg,6:edit,7:reaction,8:msg,9:reaction");
    EXPECT_EQ(qd.pg.scalar("SELECT next_seq FROM conversations WHERE conv_id = " + q(w.conv)), "10");
    // What a page shows of message 5: the edit, one 👍 (ben's, once).
    EXPECT_EQ(qd.pg.scalar("SELECT edit_seq || ':' || edit_body || ':' || reactions_top FROM msg_changes WHERE conv_id = " +
                           q(w.conv) + " AND seq = 5"),
              "6:two, fixed:[[\"👍\", 1]]");
}

// Function set 8: a group's edits and reacts are judged by im_change_items,
// a few set statements for a whole stretch, not one im_change per item; the
// answers must still be those of one request after the other. Twelve
// changes of one message, each on its own connection, queued in this order
// behind the held worker: the 20-emoji limit counts the group's own earlier
// items (a 20th fits, a 21st does not until one goes off), a reaction's state
// is the group's earlier item's (on, off, off again: the second off appends
// nothing), a key repeated inside the group is the dup of its event even
// after the state moved on, a target that is a reaction of this same group
// is no msg, and of two edits in the group the later wins. The counts the
// page shows equal the events' on-minus-off per emoji (counting under
// resends).
TEST(GroupCommit, a_group_of_changes_is_judged_set_based_as_one_request_after_the_other) {
    Queued qd(1);
    const auto& w = qd.worlds[0];
    const auto& ana = w.users[0];
    const auto& ben = w.users[1];
    auto setup_ana = login(qd.srv.port(), ana), setup_ben = login(qd.srv.port(), ben);
    // Joins are seqs 1-2: ana's m1 at 3, ben's 19 emoji on it at 4-22.
    ASSERT_EQ(num(send_msg(*setup_ana, w.conv, "m1", "one"), "seq"), 3);
    auto react = [&](std::int64_t target, const std::string& cmid, const std::string& emoji, bool on) {
        return json::object{{"t", "react"}, {"conv", w.conv}, {"target", target}, {"cmid", cmid}, {"emoji", emoji},
                            {"on", on}};
    };
    for (int i = 0; i < 19; ++i) {
        auto r = setup_ben->request(react(3, "pre" + std::to_string(i), "e" + std::to_string(i), true));
        ASSERT_EQ(num(r, "seq"), 4 + i) << json::serialize(r);
    }
    auto edit = [&](std::int64_t target, const std::string& cmid, const std::string& body) {
        return json::object{{"t", "edit"}, {"conv", w.conv}, {"target", target}, {"cmid", cmid}, {"body", body}};
    };
    struct Step {
        const TestUser* who;
        json::object frame;
    };
    const std::vector<Step> steps = {
        {&ben, react(3, "g1", "e19", true)},  // 0: 23, the 20th emoji
        {&ben, react(3, "g2", "e20", true)},  // 1: a 21st: INVALID_ARGUMENT
        {&ben, react(3, "g3", "e0", false)},  // 2: 24
        {&ben, react(3, "g4", "e20", true)},  // 3: 25, fits now
        {&ben, react(3, "g1", "e19", true)},  // 4: dup of 23
        {&ana, react(3, "a1", "e0", true)},   // 5: 26
        {&ana, react(3, "a2", "e0", false)},  // 6: 27
        {&ana, react(3, "a3", "e0", false)},  // 7: already off: no event, seq 27
        {&ana, edit(3, "x1", "first fix")},   // 8: 28
        {&ana, edit(3, "x2", "second fix")},  // 9: 29, wins
        {&ben, react(25, "g5", "x", true)},   // 10: a reaction of this group: INVALID_ARGUMENT
        {&ana, react(3, "a1", "e0", true)},   // 11: dup of 26 (the state is off by now)
    };
    std::vector<std::unique_ptr<WsClient>> conns;
    for (const auto& s : steps) conns.push_back(login(qd.srv.port(), *s.who));
    auto first = login(qd.srv.port(), qd.blocker.users[0]);
    const long long before = qd.srv.metric("im_send_group_commits_total");
    ASSERT_NO_FATAL_FAILURE(qd.hold_worker_while(*first, static_cast<int>(steps.size()), [&] {
        for (std::size_t i = 0; i < steps.size(); ++i) {
            auto frame = steps[i].frame;
            frame["rid"] = "s" + std::to_string(i);
            conns[i]->send_json(frame);
            ASSERT_TRUE(wait_until([&] { return qd.srv.metric("im_send_runs_queued") == static_cast<long long>(i + 1); },
                                   20s))
                << "step " << i << " never queued";
        }
    }));
    ASSERT_TRUE(reply_to(*first, "b").has_value());
    std::vector<json::object> replies;
    for (std::size_t i = 0; i < steps.size(); ++i) {
        auto r = reply_to(*conns[i], "s" + std::to_string(i));
        ASSERT_TRUE(r.has_value()) << "step " << i << ": no reply";
        replies.push_back(*r);
    }
    auto ok = [&](std::size_t i, const std::string& t, std::int64_t seq, bool dup, bool changed) {
        EXPECT_EQ(str(replies[i], "t"), t) << "step " << i << ": " << json::serialize(replies[i]);
        if (str(replies[i], "t") != t) return;
        EXPECT_EQ(num(replies[i], "seq"), seq) << "step " << i << ": " << json::serialize(replies[i]);
        EXPECT_EQ(replies[i].at("dup").as_bool(), dup) << "step " << i << ": " << json::serialize(replies[i]);
        if (t == "reacted") {
            EXPECT_EQ(replies[i].at("changed").as_bool(), changed) << "step " << i << ": " << json::serialize(replies[i]);
        }
    };
    auto refused = [&](std::size_t i, const std::string& code) {
        EXPECT_EQ(str(replies[i], "code"), code) << "step " << i << ": " << json::serialize(replies[i]);
    };
    ok(0, "reacted", 23, false, true);
    refused(1, "INVALID_ARGUMENT");
    ok(2, "reacted", 24, false, true);
    ok(3, "reacted", 25, false, true);
    ok(4, "reacted", 23, true, true);
    ok(5, "reacted", 26, false, true);
    ok(6, "reacted", 27, false, true);
    ok(7, "reacted", 27, false, false);
    ok(8, "edited", 28, false, true);
    ok(9, "edited", 29, false, true);
    refused(10, "INVALID_ARGUMENT");
    ok(11, "reacted", 26, true, true);
    EXPECT_EQ(qd.srv.metric("im_send_group_commits_total") - before, 1);
    const std::string group = "conv_id = " + q(w.conv) + " AND seq >= 23";
    EXPECT_EQ(qd.pg.scalar("SELECT count(DISTINCT xmin::text) FROM events WHERE " + group), "1");
    EXPECT_EQ(qd.pg.scalar("SELECT string_agg(seq || ':' || kind, ',' ORDER BY seq) FROM events WHERE " + group),
              "23:reaction,24:reaction,25:reaction,26:reaction,27:reaction,28:edit,29:edit");
    EXPECT_EQ(qd.pg.scalar("SELECT next_seq FROM conversations WHERE conv_id = " + q(w.conv)), "30");
    // The counts are the events' on minus off, per emoji (e0: ben off, ana on and off).
    const std::string c = q(w.conv);
    EXPECT_EQ(qd.pg.scalar("SELECT count(*) FROM (SELECT emoji, sum(CASE WHEN react_on THEN 1 ELSE -1 END) AS n "
                           "FROM events WHERE conv_id = " + c + " AND kind = 'reaction' AND target_seq = 3 GROUP BY emoji) e "
                           "FULL JOIN (SELECT emoji, count AS n FROM reaction_counts WHERE conv_id = " + c +
                           " AND target_seq = 3) r USING (emoji) WHERE e.n IS DISTINCT FROM r.n"),
              "0");
    EXPECT_EQ(qd.pg.scalar("SELECT count FROM reaction_counts WHERE conv_id = " + c + " AND target_seq = 3 AND emoji = 'e0'"),
              "0");
    EXPECT_EQ(qd.pg.scalar("SELECT count(*) FROM reaction_state WHERE conv_id = " + c + " AND target_seq = 3 AND is_on"),
              "20");
    // What a page shows: the later edit, the newest reaction's seq, 20 emoji.
    EXPECT_EQ(qd.pg.scalar("SELECT edit_seq || ':' || edit_body || ':' || reactions_seq || ':' || "
                           "json_array_length(reactions_top::json) FROM msg_changes WHERE conv_id = " + c + " AND seq = 3"),
              "29:second fix:27:20");
}

// The write path's lock order (im_lock_runs, shared by im_send and
// im_write_group): the device's gate first, then the rows. A send that
// meets its device's gate held exclusively (a revocation or a token change
// takes it before its UPDATE of the device row) waits there holding NO row:
// the revocation's own lock of the device row, and any writer of the
// conversation row, get them at once. Taken the other way round, the send
// would wait at the gate holding the device row FOR SHARE and the
// conversation row, and the revocation's UPDATE would deadlock with it.
TEST(GroupCommit, a_send_waiting_at_its_devices_gate_holds_neither_the_device_row_nor_the_conversation_row) {
    Queued qd(1);
    const auto& w = qd.worlds[0];
    const auto& u = w.users[0];
    pqxx::connection holder(qd.pg.url());
    pqxx::work gate(holder);
    gate.exec("SELECT pg_advisory_xact_lock(im_device_gate_key(" + q(u.device) + "))");
    qd.clients[0]->send_json({{"t", "send"}, {"rid", "g"}, {"conv", w.conv}, {"cmid", "g1"}, {"body", "gated"}});
    ASSERT_TRUE(wait_until([&] { return qd.pg.pool_workers_waiting_on_locks() == 1; }, 20s))
        << "the send never waited at its device's gate";
    // Both rows are free: NOWAIT answers at once either way (55P03 if held).
    EXPECT_NO_THROW(gate.exec("SELECT 1 FROM devices WHERE device_id = " + q(u.device) + " FOR UPDATE NOWAIT"))
        << "the waiting send holds its device's row";
    gate.abort();
    // The gate is free now; the send goes through and answers.
    auto r = reply_to(*qd.clients[0], "g");
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(str(*r, "t"), "sent") << json::serialize(*r);
    pqxx::connection other(qd.pg.url());
    // The conversation row, checked the same way on a second hold.
    pqxx::work gate2(holder);
    gate2.exec("SELECT pg_advisory_xact_lock(im_device_gate_key(" + q(u.device) + "))");
    qd.clients[0]->send_json({{"t", "send"}, {"rid", "g2"}, {"conv", w.conv}, {"cmid", "g2"}, {"body", "gated again"}});
    ASSERT_TRUE(wait_until([&] { return qd.pg.pool_workers_waiting_on_locks() == 1; }, 20s))
        << "the send never waited at its device's gate";
    pqxx::work rows(other);
    EXPECT_NO_THROW(rows.exec("SELECT 1 FROM conversations WHERE conv_id = " + q(w.conv) + " FOR NO KEY UPDATE NOWAIT"))
        << "the waiting send holds its conversation's row";
    rows.abort();
    gate2.abort();
    auto r2 = reply_to(*qd.clients[0], "g2");
    ASSERT_TRUE(r2.has_value());
    EXPECT_EQ(str(*r2, "t"), "sent") << json::serialize(*r2);
}

// The send path's functions stay index probes however large the tables and
// however many conversations the sender is in: their plans are generic
// (planned once, with guessed sizes for the request's arrays), and a guess
// of hundreds of rows made the UPDATE of the counters hash the whole
// conversations table and the lock query read every membership period of
// the sender. Counted inside the transaction (pg_stat_xact_*), for a
// sender in 3,000 conversations: no sequential scan of `conversations`,
// and a handful of membership index entries per call, not thousands.
TEST(GroupCommit, the_write_functions_probe_rows_and_never_scan_a_busy_senders_tables) {
    TestPostgres pg;
    ServerProcess srv{pg.url(), {"--quiet"}}; // installs the schema and the function set
    auto w = make_world(pg.url(), "scan", 2);
    const auto& u = w.users[0];
    pqxx::connection c(pg.url());
    {
        pqxx::work tx(c);
        tx.exec("INSERT INTO conversations (conv_id, kind, next_seq) SELECT 'scan-' || g, 'group', 2 "
                "FROM generate_series(1, 3000) g");
        tx.exec("INSERT INTO membership_periods (conv_id, user_id, from_seq) SELECT 'scan-' || g, " + q(u.user) +
                ", 1 FROM generate_series(1, 3000) g");
        // ... each with another member, so that a user is in about two
        // conversations on average (what a generic plan assumes of anyone).
        tx.exec("INSERT INTO users (user_id) SELECT 'scan-u' || g FROM generate_series(1, 3000) g");
        tx.exec("INSERT INTO membership_periods (conv_id, user_id, from_seq) SELECT 'scan-' || g, 'scan-u' || g, 1 "
                "FROM generate_series(1, 3000) g");
        tx.exec("INSERT INTO devices (device_id, user_id, token_sha256) SELECT 'scan-d' || g, 'scan-u' || g, "
                "sha256(convert_to('scan-t' || g, 'UTF8')) FROM generate_series(1, 3000) g");
        tx.exec("INSERT INTO events (conv_id, seq, mid, kind, subject_user, epoch, msg_ordinal) SELECT 'scan-' || g, 1, "
                "gen_random_uuid(), 'join', " + q(u.user) + ", 1, 0 FROM generate_series(1, 3000) g");
        tx.commit();
    }
    pqxx::nontransaction(c).exec("ANALYZE");
    const std::string tok =
        pqxx::work(c).exec1("SELECT encode(token_sha256, 'hex') FROM devices WHERE device_id = " + q(u.device))[0].c_str();
    const std::string one = "ARRAY[" + q(u.device) + "], ARRAY[" + q(tok) + "], ARRAY[" + q(w.conv) + "], ARRAY[" +
                            q(u.user) + "], ARRAY[1]";
    // Each function six times: PL/pgSQL plans a statement's generic plan by
    // the sixth call at the latest (the send functions force it at once).
    struct Call {
        const char* name;
        std::function<std::string(int)> sql;
    };
    const std::vector<Call> calls{
        {"im_send", [&](int i) {
             return "SELECT r_code FROM im_send(" + one + ", ARRAY['s" + std::to_string(i) +
                    "'], ARRAY['hi'], ARRAY[NULL::text], ARRAY[NULL::bigint], ARRAY[NULL::text], 'im_scan_test')";
         }},
        {"im_send_queued", [&](int i) {
             return "SELECT r_code FROM im_send_queued(5000, " + one + ", ARRAY['q" + std::to_string(i) +
                    "'], ARRAY['hi'], ARRAY[NULL::text], ARRAY[NULL::bigint], ARRAY[NULL::text], 'im_scan_test')";
         }},
        {"im_write_group", [&](int i) {
             return "SELECT r_code FROM im_write_group(5000, " + one + ", ARRAY['reaction'], ARRAY['r" +
                    std::to_string(i) + "'], ARRAY[NULL::text], ARRAY[NULL::text], ARRAY[NULL::bigint], " +
                    "ARRAY[NULL::text], ARRAY[3::bigint], ARRAY['x'], ARRAY[" + (i % 2 ? "false" : "true") +
                    "], 'im_scan_test')";
         }},
    };
    // The counters of this backend not yet flushed to the statistics (they
    // add up over transactions until a flush): read before and after each call.
    auto counts = [](pqxx::work& tx) {
        auto r = tx.exec1("SELECT (SELECT coalesce(sum(seq_scan), 0) FROM pg_stat_xact_user_tables "
                          "         WHERE relname = 'conversations'), "
                          "       (SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(indexrelid)), 0) FROM pg_index "
                          "         WHERE indrelid = 'membership_periods'::regclass)");
        return std::pair{r[0].as<long long>(), r[1].as<long long>()};
    };
    for (const auto& call : calls)
        for (int i = 0; i < 6; ++i) {
            pqxx::work tx(c);
            const auto [seq0, read0] = counts(tx);
            auto r = tx.exec1(call.sql(i));
            EXPECT_STREQ(r[0].c_str(), "OK") << call.name << " call " << i;
            const auto [seq1, read1] = counts(tx);
            EXPECT_EQ(seq1 - seq0, 0) << call.name << " call " << i << " scanned the conversations table";
            EXPECT_LT(read1 - read0, 20) << call.name << " call " << i << " read " << read1 - read0
                                         << " membership index entries for one run";
            tx.commit();
        }
}
