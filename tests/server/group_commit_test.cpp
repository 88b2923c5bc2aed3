// Group commit: runs of sends that different connections queued while the
// database was busy share one transaction, each still judged as a lone send
// (contract section 6), and a request the database rejects fails alone.
#include "common.hpp"

#include <pqxx/pqxx>

#include <map>
#include <thread>

using namespace im::test;

namespace {


bool wait_for(const std::function<bool()>& cond, std::chrono::milliseconds within) {
    const auto until = std::chrono::steady_clock::now() + within;
    while (!cond()) {
        if (std::chrono::steady_clock::now() > until) return false;
        std::this_thread::sleep_for(10ms);
    }
    return true;
}

// One conversation per sender; the only database worker (--db-pool 1) is
// held on a row lock by the test, so every other sender's run waits in the
// queue until the lock goes, and the worker then takes them all at once.
struct Queued {
    TestPostgres pg;
    ServerProcess srv{pg.url(), {"--quiet", "--db-pool", "1"}};
    World blocker = make_world(pg.url(), "gcblock", 2);
    std::vector<World> worlds;
    std::vector<std::unique_ptr<WsClient>> clients, twins; // twins: a second connection of the same device

    explicit Queued(int senders) {
        for (int i = 0; i < senders; ++i) {
            worlds.push_back(make_world(pg.url(), "gc" + std::to_string(i), 2));
            const std::string install = uuid4();
            clients.push_back(login(srv.port(), worlds.back().users[0], install));
            twins.push_back(login(srv.port(), worlds.back().users[0], install));
        }
    }

    // Holds the only worker: `first` sends to the blocker conversation while
    // the test holds its row lock; then `queue` sends the runs to be grouped,
    // and once `runs` of them wait in the pool's queue the lock goes.
    void hold_worker_while(WsClient& first, int runs, const std::function<void()>& queue) {
        pqxx::connection holder(pg.url());
        pqxx::work lock(holder);
        lock.exec("SELECT 1 FROM conversations WHERE conv_id = " + q(blocker.conv) + " FOR UPDATE");
        first.send_json({{"t", "send"}, {"rid", "b"}, {"conv", blocker.conv}, {"cmid", "b"}, {"body", "blocked"}});
        ASSERT_TRUE(wait_for([&] {
            return pg.scalar("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                             "AND application_name LIKE 'imserver-pool-%'") == "1";
        }, 20s)) << "the first send never reached the row lock";
        queue();
        ASSERT_TRUE(wait_for([&] { return srv.metric("im_db_pool_queued") == runs; }, 20s))
            << "queued runs: " << srv.metric("im_db_pool_queued");
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
// sender's committed keys, whatever else the statement carries.
TEST(GroupCommit, prev_is_judged_per_run_inside_a_group_commit) {
    constexpr int senders = 6;
    Queued qd(senders);
    for (int i = 0; i < senders; ++i)
        ASSERT_EQ(str(send_msg(*qd.clients[i], qd.worlds[i].conv, "k0", "zero"), "t"), "sent");
    auto first = login(qd.srv.port(), qd.blocker.users[0]);
    const long long before = qd.srv.metric("im_send_group_commits_total");
    ASSERT_NO_FATAL_FAILURE(qd.hold_worker_while(*first, 2 * senders, [&] {
        // One connection names the committed k0, the other a key never sent.
        for (int i = 0; i < senders; ++i) {
            qd.clients[i]->send_json({{"t", "send"}, {"rid", "ok"}, {"conv", qd.worlds[i].conv}, {"cmid", "k1"},
                                      {"body", "one"}, {"prev", "k0"}});
            qd.twins[i]->send_json({{"t", "send"}, {"rid", "no"}, {"conv", qd.worlds[i].conv}, {"cmid", "k2"},
                                    {"body", "two"}, {"prev", "never-sent"}});
        }
    }));
    ASSERT_TRUE(first->next(20s).has_value());
    for (int i = 0; i < senders; ++i) {
        auto ok = qd.clients[i]->next(20s), no = qd.twins[i]->next(20s);
        ASSERT_TRUE(ok.has_value() && no.has_value()) << "sender " << i << ": missing replies";
        EXPECT_EQ(str(*ok, "t"), "sent") << json::serialize(*ok);
        EXPECT_EQ(num(*ok, "seq"), 4); // joins 1-2, k0 3
        EXPECT_EQ(str(*no, "code"), "UNAVAILABLE") << json::serialize(*no);
        EXPECT_EQ(count_rows(qd.pg, "conv_id = " + q(qd.worlds[i].conv) + " AND client_msg_id = 'k2'"), "0");
    }
    EXPECT_EQ(qd.srv.metric("im_send_group_commits_total") - before, 1);
}

// im_send takes a conversation's counters once under its row lock and writes
// them back once per call (schema/006): runs of several sends, and several
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
    // The first messages wait in the pool's queue; the rest wait behind them
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
