// The contract against a real imserver and a real PostgreSQL (contract.hpp):
// sends: sequence numbers, request keys and duplicates, membership, concurrent and pipelined sends,
// `prev`, row locks, rejected requests, commits of unknown outcome.
#include "contract.hpp"

#include <algorithm>
#include <atomic>
#include <barrier>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include <pqxx/pqxx>

using namespace im::test;

namespace {

// ---------------------------------------------------------------- send

TEST_F(Contract, member_send_after_two_joins_gets_seq_3_and_one_row) {
    auto w = make_world(db(), "normal", 2);
    auto c = login(port(), w.users[0]);
    auto r = send_msg(*c, w.conv, "k1", "hello");
    EXPECT_EQ(str(r, "t"), "sent") << json::serialize(r);
    EXPECT_EQ(num(r, "seq"), 3);
    EXPECT_FALSE(r.at("dup").as_bool());
    EXPECT_EQ(num(r, "epoch"), 1);
    EXPECT_EQ(count_rows(*pg, "conv_id = " + q(w.conv) + " AND kind = 'msg'"), "1");
    EXPECT_EQ(pg->scalar("SELECT mid::text FROM events WHERE conv_id = " + q(w.conv) + " AND seq = 3"), str(r, "mid"));
}

TEST_F(Contract, resend_of_the_same_key_returns_the_original_seq_and_mid_with_dup_true) {
    auto w = make_world(db(), "dup", 2);
    auto c = login(port(), w.users[0]);
    auto first = send_msg(*c, w.conv, "k1", "hello");
    auto again = send_msg(*c, w.conv, "k1", "hello");
    EXPECT_EQ(str(again, "t"), "sent");
    EXPECT_EQ(num(again, "seq"), num(first, "seq"));
    EXPECT_EQ(str(again, "mid"), str(first, "mid"));
    EXPECT_TRUE(again.at("dup").as_bool());
    EXPECT_EQ(count_rows(*pg, "conv_id = " + q(w.conv) + " AND client_msg_id = 'k1'"), "1");
}

// Section 6, step 5: a send answered dup:true publishes its notification
// again, so a gateway that died between COMMIT and its publish heals on the
// sender's resend.
// Heard on the bus itself (a LISTEN session of the test's own), whichever
// way the gateway publishes: with the send's COMMIT (--notify-in-commit on,
// the default) or after it.
// One gateway's check (the shared one publishes in the commit; the test runs
// it again on a gateway that publishes after COMMIT, the path NATS takes).
void expect_dup_published_again(const std::string& db, unsigned short port, const std::string& prefix) {
    auto w = make_world(db, prefix, 2);
    pqxx::connection lc(db);
    struct Heard : pqxx::notification_receiver {
        std::vector<std::string> payloads;
        explicit Heard(pqxx::connection& c) : pqxx::notification_receiver(c, "im_events") {}
        void operator()(const std::string& payload, int) override { payloads.push_back(payload); }
    } heard(lc);
    auto c = login(port, w.users[0]);
    auto first = send_msg(*c, w.conv, "k1", "hello");
    ASSERT_EQ(str(first, "t"), "sent") << json::serialize(first);
    const std::string note = "e " + w.conv + " " + std::to_string(num(first, "seq"));
    auto announced = [&] {
        return wait_until(
            [&] {
                lc.await_notification(0, 100000);
                for (const auto& p : heard.payloads)
                    if (p == note || p.rfind(note + " ", 0) == 0) return true;
                return false;
            },
            5s);
    };
    ASSERT_TRUE(announced()) << "the first send was never published (" << note << ")";
    heard.payloads.clear();
    auto again = send_msg(*c, w.conv, "k1", "hello");
    ASSERT_TRUE(again.at("dup").as_bool()) << json::serialize(again);
    EXPECT_TRUE(announced()) << "the duplicate was answered without publishing its notification again (" << prefix
                             << ")";
}

TEST_F(Contract, a_resend_answered_dup_publishes_the_notification_again) {
    expect_dup_published_again(db(), port(), "duppub");
    ServerProcess after(db(), {"--quiet", "--notify-in-commit", "off"}, "gw-after");
    expect_dup_published_again(db(), after.port(), "duppubafter");
}

TEST_F(Contract, same_key_other_body_is_refused_and_the_stored_body_is_untouched) {
    auto w = make_world(db(), "mismatch", 2);
    auto c = login(port(), w.users[0]);
    send_msg(*c, w.conv, "k1", "original");
    auto r = send_msg(*c, w.conv, "k1", "changed");
    EXPECT_EQ(str(r, "code"), "IDEMPOTENCY_MISMATCH");
    EXPECT_EQ(pg->scalar("SELECT body FROM events WHERE conv_id = " + q(w.conv) + " AND client_msg_id = 'k1'"),
              "original");
    EXPECT_EQ(count_rows(*pg, "conv_id = " + q(w.conv) + " AND kind = 'msg'"), "1");
}

TEST_F(Contract, the_same_cmid_from_two_senders_is_two_keys) {
    auto w = make_world(db(), "twokeys", 2);
    auto a = login(port(), w.users[0]);
    auto b = login(port(), w.users[1]);
    auto ra = send_msg(*a, w.conv, "same", "x");
    auto rb = send_msg(*b, w.conv, "same", "x");
    EXPECT_FALSE(ra.at("dup").as_bool());
    EXPECT_FALSE(rb.at("dup").as_bool());
    EXPECT_NE(num(ra, "seq"), num(rb, "seq"));
}

TEST_F(Contract, non_member_and_unknown_conversation_get_the_same_not_member) {
    auto w = make_world(db(), "c4", 2);
    auto outsider = make_user(db(), unique_name("outsider"));
    auto c = login(port(), outsider);
    std::string head_before = pg->scalar("SELECT next_seq FROM conversations WHERE conv_id = " + q(w.conv));
    auto r1 = send_msg(*c, w.conv, "k1", "let me in");
    auto r2 = send_msg(*c, unique_name("never-existed"), "k1", "let me in");
    EXPECT_EQ(str(r1, "code"), "NOT_MEMBER");
    EXPECT_EQ(str(r2, "code"), "NOT_MEMBER");
    EXPECT_EQ(str(r1, "msg"), str(r2, "msg"));
    EXPECT_EQ(pg->scalar("SELECT next_seq FROM conversations WHERE conv_id = " + q(w.conv)), head_before);
    // Every other request type answers the same way.
    for (const char* t : {"sync", "history", "fetch", "ack", "read", "recall"}) {
        json::object known{{"t", t},      {"conv", w.conv}, {"after", 0}, {"before", 0},
                           {"seq", 1},    {"target", 1},    {"cmid", "z"}};
        json::object unknown = known;
        unknown["conv"] = unique_name("nope");
        auto a = c->request(known);
        auto b = c->request(unknown);
        EXPECT_EQ(str(a, "code"), "NOT_MEMBER") << t;
        EXPECT_EQ(str(b, "code"), "NOT_MEMBER") << t;
        EXPECT_EQ(str(a, "msg"), str(b, "msg")) << t;
    }
}

// Across two gateways: one gateway queues a conversation's sends in its own
// process, which alone would keep this test green without the unique index
// and the row lock; two processes can only meet in the database.
TEST_F(Contract, thirty_two_concurrent_identical_sends_make_one_row_and_one_dup_false) {
    auto w = make_world(db(), "conc", 2);
    ServerProcess second(db(), {"--quiet"}, "gw-2");
    constexpr int n = 32;
    std::vector<std::unique_ptr<WsClient>> clients;
    for (int i = 0; i < n; ++i) clients.push_back(login(i % 2 ? second.port() : port(), w.users[0]));
    std::vector<json::object> replies(n);
    std::barrier sync_point(n);
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i)
        threads.emplace_back([&, i] {
            sync_point.arrive_and_wait();
            replies[i] = send_msg(*clients[i], w.conv, "same-key", "same body", 30s);
        });
    for (auto& t : threads) t.join();
    std::set<std::string> mids;
    std::set<std::int64_t> seqs;
    int fresh = 0;
    for (auto& r : replies) {
        ASSERT_EQ(str(r, "t"), "sent") << json::serialize(r);
        mids.insert(str(r, "mid"));
        seqs.insert(num(r, "seq"));
        if (!r.at("dup").as_bool()) ++fresh;
    }
    EXPECT_EQ(fresh, 1);
    EXPECT_EQ(mids.size(), 1u);
    EXPECT_EQ(seqs.size(), 1u);
    EXPECT_EQ(count_rows(*pg, "conv_id = " + q(w.conv) + " AND client_msg_id = 'same-key'"), "1");
}

TEST_F(Contract, pipelined_sends_are_each_judged_alone_and_keep_their_order) {
    auto w = make_world(db(), "pipeline", 2);
    auto c = login(port(), w.users[0]);
    // Ten sends on the wire before any reply: a repeat of key p3 and a
    // mismatch on key p5 sit among them.
    std::vector<std::pair<std::string, std::string>> frames;
    for (int i = 0; i < 8; ++i) frames.emplace_back("p" + std::to_string(i), "body " + std::to_string(i));
    frames.insert(frames.begin() + 5, {"p3", "body 3"});      // duplicate
    frames.insert(frames.begin() + 7, {"p5", "other body"});  // mismatch
    for (std::size_t i = 0; i < frames.size(); ++i)
        c->send_json({{"t", "send"}, {"rid", "q" + std::to_string(i)}, {"conv", w.conv},
                      {"cmid", frames[i].first}, {"body", frames[i].second}});
    std::map<std::string, json::object> replies;
    while (replies.size() < frames.size()) {
        auto f = c->next(10s);
        ASSERT_TRUE(f.has_value()) << "missing replies";
        replies[str(*f, "rid")] = *f;
    }
    std::int64_t last = 2;
    for (std::size_t i = 0; i < frames.size(); ++i) {
        const auto& r = replies["q" + std::to_string(i)];
        if (i == 5) { // the repeat of p3
            EXPECT_TRUE(r.at("dup").as_bool());
            EXPECT_EQ(num(r, "seq"), num(replies["q3"], "seq"));
        } else if (i == 7) {
            EXPECT_EQ(str(r, "code"), "IDEMPOTENCY_MISMATCH");
        } else {
            ASSERT_EQ(str(r, "t"), "sent") << json::serialize(r);
            EXPECT_FALSE(r.at("dup").as_bool());
            EXPECT_EQ(num(r, "seq"), last + 1) << "seqs follow the order sent";
            last = num(r, "seq");
        }
    }
    EXPECT_EQ(count_rows(*pg, "conv_id = " + q(w.conv) + " AND kind = 'msg'"), "8");
    EXPECT_EQ(pg->scalar("SELECT body FROM events WHERE conv_id = " + q(w.conv) + " AND client_msg_id = 'p5'"),
              "body 5");
    // They shared transactions (the first may go alone before the rest
    // arrive): the rows' xmin, not a counter of the gateway's.
    const long long transactions = std::stoll(pg->scalar(
        "SELECT count(DISTINCT xmin::text) FROM events WHERE kind = 'msg' AND conv_id = " + q(w.conv)));
    EXPECT_GE(transactions, 1);
    EXPECT_LT(transactions, 8) << "each of the 8 messages went in a transaction of its own";
}

// `prev` (docs/protocol.md, "Send"): a send naming the caller's previous
// message of the conversation is appended only once that one is committed.
TEST_F(Contract, a_send_is_appended_only_after_the_message_its_prev_names) {
    auto w = make_world(db(), "prev", 2);
    auto c = login(port(), w.users[0]);
    auto other = login(port(), w.users[1]);
    auto send_prev = [](WsClient& cl, const std::string& conv, const std::string& cmid, const std::string& prev) {
        return cl.request({{"t", "send"}, {"conv", conv}, {"cmid", cmid}, {"body", "after p1"}, {"prev", prev}});
    };
    // Never sent: refused as retryable, nothing written.
    auto r = send_prev(*c, w.conv, "n1", "never-sent");
    EXPECT_EQ(str(r, "code"), "UNAVAILABLE") << json::serialize(r);
    EXPECT_EQ(count_rows(*pg, "conv_id = " + q(w.conv) + " AND client_msg_id = 'n1'"), "0");
    // Another sender's key of the same name does not count: keys are per sender.
    ASSERT_EQ(str(send_msg(*other, w.conv, "theirs", "ben's"), "t"), "sent");
    r = send_prev(*c, w.conv, "n1", "theirs");
    EXPECT_EQ(str(r, "code"), "UNAVAILABLE") << json::serialize(r);
    EXPECT_EQ(count_rows(*pg, "conv_id = " + q(w.conv) + " AND client_msg_id = 'n1'"), "0");
    // Committed: appended.
    const auto p = send_msg(*c, w.conv, "p1", "first");
    ASSERT_EQ(str(p, "t"), "sent");
    r = send_prev(*c, w.conv, "n1", "p1");
    ASSERT_EQ(str(r, "t"), "sent") << json::serialize(r);
    EXPECT_EQ(num(r, "seq"), num(p, "seq") + 1);
    // A resend of a committed message is its duplicate whatever it names.
    r = send_prev(*c, w.conv, "n1", "never-sent");
    ASSERT_EQ(str(r, "t"), "sent") << json::serialize(r);
    EXPECT_TRUE(r.at("dup").as_bool());
    // A chain on the wire at once (one transaction or several): each link
    // sees the one before it, so all are appended, in order.
    std::string prev = "n1";
    for (int i = 0; i < 20; ++i) {
        const std::string cmid = "chain" + std::to_string(i);
        c->send_json({{"t", "send"}, {"rid", cmid}, {"conv", w.conv}, {"cmid", cmid}, {"body", "link"}, {"prev", prev}});
        prev = cmid;
    }
    std::map<std::string, json::object> replies;
    while (replies.size() < 20) {
        auto f = c->next(10s);
        ASSERT_TRUE(f.has_value()) << "missing replies";
        replies[str(*f, "rid")] = *f;
    }
    for (int i = 0; i < 20; ++i) {
        const auto& link = replies["chain" + std::to_string(i)];
        ASSERT_EQ(str(link, "t"), "sent") << json::serialize(link);
        EXPECT_EQ(num(link, "seq"), num(p, "seq") + 2 + i);
    }
    // Malformed: INVALID_ARGUMENT, nothing written.
    for (const json::value& bad : {json::value(5), json::value(""), json::value(std::string(65, 'x')), json::value("self")}) {
        r = c->request({{"t", "send"}, {"conv", w.conv}, {"cmid", "self"}, {"body", "x"}, {"prev", bad}});
        EXPECT_EQ(str(r, "code"), "INVALID_ARGUMENT") << json::serialize(bad);
    }
    EXPECT_EQ(count_rows(*pg, "conv_id = " + q(w.conv) + " AND client_msg_id = 'self'"), "0");
}

TEST_F(Contract, a_stranger_gets_not_member_without_waiting_on_a_held_row_lock) {
    auto w = make_world(db(), "lockprobe", 2);
    auto stranger = make_user(db(), unique_name("stranger"));
    auto member = login(port(), w.users[0]);
    auto first = send_msg(*member, w.conv, "m1", "to be recalled");
    ASSERT_EQ(str(first, "t"), "sent");
    // Another session holds the conversation's row lock for the whole check.
    pqxx::connection holder(db());
    pqxx::work lock(holder);
    ASSERT_EQ(lock.exec("SELECT 1 FROM conversations WHERE conv_id = " + q(w.conv) + " FOR UPDATE").size(), 1u);
    auto c = login(port(), stranger);
    // Step 0 (C4): no lock is taken for a caller without any period, so the
    // answer comes while the lock is still held, at once: waiting would take
    // the server's round-trip limit (--db-timeout-ms, 5 s) or its lock
    // timeout (10 s) and end in UNAVAILABLE. 2 s is far from both.
    auto timed = [&](const json::object& req) {
        const auto asked = std::chrono::steady_clock::now();
        auto reply = c->request(req, 30s);
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - asked);
        EXPECT_LT(ms.count(), 2000) << json::serialize(req) << " waited on the held row lock";
        return reply;
    };
    auto s = timed({{"t", "send"}, {"conv", w.conv}, {"cmid", "probe"}, {"body", "hello?"}});
    EXPECT_EQ(str(s, "code"), "NOT_MEMBER") << json::serialize(s);
    auto r = timed({{"t", "recall"}, {"conv", w.conv}, {"target", num(first, "seq")}, {"cmid", "r1"}});
    EXPECT_EQ(str(r, "code"), "NOT_MEMBER") << json::serialize(r);
    auto u = timed({{"t", "send"}, {"conv", unique_name("nosuchconv")}, {"cmid", "probe"}, {"body", "hello?"}});
    EXPECT_EQ(str(u, "code"), "NOT_MEMBER") << json::serialize(u);
    // Still held: the answers came while it was.
    EXPECT_EQ(lock.exec("SELECT 1 FROM conversations WHERE conv_id = " + q(w.conv) + " FOR UPDATE NOWAIT").size(), 1u);
    lock.abort();
    EXPECT_EQ(count_rows(*pg, "conv_id = " + q(w.conv)), "3");
}

// The other side of step 0: a stranger's send never takes the conversation's
// row lock, even for a moment (taken, it would make members' sends skip the
// row and come back LOCKED, at a stranger's will). The stranger's own device
// row is held elsewhere, so a send that got as far as locking would stay
// there, inside its transaction, holding what it had taken.
TEST_F(Contract, a_strangers_send_never_holds_the_conversation_row) {
    auto w = make_world(db(), "lockheld", 2);
    auto stranger = make_user(db(), unique_name("stranger"));
    auto c = login(port(), stranger); // hello writes the device row: before it is held
    pqxx::connection holder(db());
    pqxx::work hold(holder);
    ASSERT_EQ(hold.exec("SELECT 1 FROM devices WHERE device_id = " + q(stranger.device) + " FOR UPDATE").size(), 1u);
    c->send_json({{"t", "send"}, {"rid", "s1"}, {"conv", w.conv}, {"cmid", "probe"}, {"body", "hello?"}});
    // Answered at once, or waiting on the held device row: either way the
    // send has gone as far as it will while the device row is held.
    std::optional<json::object> reply;
    ASSERT_TRUE(wait_until(
        [&] {
            if (pg->pool_workers_waiting_on_locks() > 0) return true;
            reply = c->next(50ms);
            return reply.has_value();
        },
        10s))
        << "the send neither answered nor waited";
    pqxx::connection other(db());
    pqxx::work probe(other);
    try {
        EXPECT_EQ(probe.exec("SELECT 1 FROM conversations WHERE conv_id = " + q(w.conv) + " FOR UPDATE NOWAIT").size(), 1u);
    } catch (const pqxx::sql_error& e) {
        ADD_FAILURE() << "a stranger's send holds the conversation's row: " << e.what();
    }
    probe.abort();
    hold.abort();
    if (!reply) reply = c->next(20s);
    ASSERT_TRUE(reply.has_value());
    EXPECT_EQ(str(*reply, "rid"), "s1");
    EXPECT_EQ(str(*reply, "code"), "NOT_MEMBER") << json::serialize(*reply);
    EXPECT_EQ(count_rows(*pg, "conv_id = " + q(w.conv)), "2");
}

// Four pipelined sends that go as one batch, the third of which the
// database rejects on every try because of `check`, an operator's CHECK
// expression on events that only the body "poison" fails (for a CHECK
// violation) or cannot evaluate (for a data exception). `sqlstate_class`:
// the two digits the rejection must carry ("23", "22").
void expect_rejected_alone_in_its_batch(TestPostgres& pg, ServerProcess& srv, const World& w,
                                        const std::string& check, const std::string& sqlstate_class) {
    const std::string name = unique_name("poison_check");
    pg.scalar("ALTER TABLE events ADD CONSTRAINT \"" + name + "\" CHECK (conv_id <> " + q(w.conv) +
              " OR body IS NULL OR (" + check + "))");
    struct Drop {
        TestPostgres& pg;
        std::string name;
        ~Drop() { pg.scalar("ALTER TABLE events DROP CONSTRAINT \"" + name + "\""); }
    } drop{pg, name};
    auto c = login(srv.port(), w.users[0]);
    auto send_transactions = [&] { return srv.metric("im_send_transactions_total"); };
    const long long before = send_transactions();
    // The sender's device row held elsewhere makes the first send wait
    // inside the database (a held conversation row would be skipped), so the
    // next three queue up and go as one batch.
    {
        pqxx::connection holder(pg.url());
        pqxx::work lock(holder);
        lock.exec("SELECT 1 FROM devices WHERE device_id = " + q(w.users[0].device) + " FOR UPDATE");
        const std::vector<std::pair<std::string, std::string>> frames = {
            {"a", "first"}, {"b", "second"}, {"p", "poison"}, {"d", "after"}};
        auto frame = [&](std::size_t i) {
            c->send_json({{"t", "send"}, {"rid", frames[i].first}, {"conv", w.conv}, {"cmid", frames[i].first},
                          {"body", frames[i].second}});
        };
        frame(0);
        bool waiting = false;
        for (int i = 0; i < 400 && !waiting; ++i) {
            waiting = pg.pool_workers_waiting_on_locks() == 1;
            if (!waiting) std::this_thread::sleep_for(25ms);
        }
        ASSERT_TRUE(waiting) << "the first send never reached the row lock";
        for (std::size_t i = 1; i < frames.size(); ++i) frame(i);
        // The three frames are read (queued behind the waiting first) once
        // the server answers a ping sent after them; the transaction count
        // below shows whether they shared one.
        ASSERT_TRUE(c->ping(20s)) << "the server did not answer a ping sent after the frames";
        lock.abort();
    }
    std::map<std::string, json::object> replies;
    while (replies.size() < 4) {
        auto f = c->next(20s);
        ASSERT_TRUE(f.has_value()) << "missing replies";
        replies[str(*f, "rid")] = *f;
    }
    const long long used = send_transactions() - before;
    EXPECT_LT(used, 4) << "the four sends did not go as one run";
    EXPECT_EQ(str(replies["a"], "t"), "sent") << json::serialize(replies["a"]);
    EXPECT_EQ(str(replies["b"], "t"), "sent") << json::serialize(replies["b"]);
    EXPECT_EQ(str(replies["p"], "code"), "INVALID_ARGUMENT") << json::serialize(replies["p"]);
    EXPECT_NE(str(replies["p"], "msg").find("(" + sqlstate_class), std::string::npos)
        << "not the database's class " << sqlstate_class << " rejection: " << json::serialize(replies["p"]);
    EXPECT_EQ(str(replies["d"], "t"), "sent") << json::serialize(replies["d"]);
    EXPECT_EQ(num(replies["b"], "seq"), num(replies["a"], "seq") + 1);
    EXPECT_EQ(num(replies["d"], "seq"), num(replies["b"], "seq") + 1) << "the rejected one takes no seq";
    // Terminal: the resend meets the same answer, never UNAVAILABLE.
    auto again = send_msg(*c, w.conv, "p", "poison");
    EXPECT_EQ(str(again, "code"), "INVALID_ARGUMENT") << json::serialize(again);
    EXPECT_EQ(count_rows(pg, "conv_id = " + q(w.conv) + " AND kind = 'msg'"), "3");
    EXPECT_EQ(count_rows(pg, "conv_id = " + q(w.conv) + " AND client_msg_id = 'p'"), "0");
}

TEST_F(Contract, a_request_the_database_rejects_is_terminal_and_fails_alone_in_its_batch) {
    // A constraint violation (class 23).
    expect_rejected_alone_in_its_batch(*pg, *srv, make_world(db(), "poison", 2), "body <> 'poison'", "23");
}

TEST_F(Contract, a_data_exception_is_terminal_and_fails_alone_in_its_batch) {
    // A data exception (class 22: 22P02, invalid input syntax for type
    // integer) that the body "poison" raises, as an operator's check or
    // trigger that casts message text would.
    expect_rejected_alone_in_its_batch(*pg, *srv, make_world(db(), "dataexc", 2),
                                       "(CASE WHEN body = 'poison' THEN body ELSE '0' END)::int >= 0", "22");
}

TEST_F(Contract, a_removed_member_resending_an_old_key_gets_dup_not_not_member) {
    auto w = make_world(db(), "removed", 3);
    auto c = login(port(), w.users[2]);
    auto first = send_msg(*c, w.conv, "k1", "before leaving");
    admin_ok(db(), {"member", "remove", w.conv, w.users[2].user});
    auto again = send_msg(*c, w.conv, "k1", "before leaving");
    EXPECT_EQ(str(again, "t"), "sent");
    EXPECT_TRUE(again.at("dup").as_bool());
    EXPECT_EQ(num(again, "seq"), num(first, "seq"));
    auto fresh = send_msg(*c, w.conv, "k2", "after leaving");
    EXPECT_EQ(str(fresh, "code"), "NOT_MEMBER");
}

// Contract section 8: a COMMIT whose outcome is unknown (the connection is
// lost while COMMIT runs: libpqxx's in_doubt_error, or a broken connection
// under the autocommit statement) answers UNAVAILABLE, never a terminal code
// and never a success: the resend with the same key settles it.
// The COMMIT is held for real: synchronous_standby_names names a standby
// that never comes, so the commit is flushed locally and waits (SyncRep);
// the test then terminates that backend, which ends the wait with the
// commit done locally and the client's connection lost mid-COMMIT.
// A session's SHOW sees synchronous_standby_names at once, but commits wait
// for the standby only once the checkpointer has reloaded the setting too
// (it publishes sync_standbys_defined), which a checkpoint under way delays.
// So the test asks a commit: true when a probe commit of its own (a row in
// a database of the probe's) waited in SyncRep (its backend is then
// terminated), false when it committed.
bool a_commit_waits_for_the_standby(TestPostgres& pg) {
    std::atomic<bool> done{false};
    std::thread probe([&] {
        try {
            pqxx::connection c(pg.url("syncrep_probe"));
            pqxx::nontransaction tx(c);
            tx.exec("SET application_name = 'im-syncrep-probe'");
            tx.exec("INSERT INTO probe VALUES (1)"); // only a commit that wrote WAL waits
        } catch (const std::exception&) {
            // terminated while it waited
        }
        done = true;
    });
    std::string waiting;
    wait_until(
        [&] {
            waiting = pg.scalar("SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep' "
                                "AND application_name = 'im-syncrep-probe' LIMIT 1");
            return !waiting.empty() || done;
        },
        10s);
    if (!waiting.empty()) pg.scalar("SELECT pg_terminate_backend(" + waiting + ")");
    probe.join();
    return !waiting.empty();
}

void expect_unknown_commit_answers_unavailable(TestPostgres& pg, unsigned short port, const World& w,
                                               bool in_doubt_message) {
    auto c = login(port, w.users[0]); // hello writes: before the commits are held
    struct Reset {
        TestPostgres& pg;
        ~Reset() {
            pg.scalar("ALTER SYSTEM RESET synchronous_standby_names");
            pg.scalar("SELECT pg_reload_conf()");
        }
    } reset{pg};
    pg.create_database("syncrep_probe");
    pg.scalar("CREATE TABLE IF NOT EXISTS probe (x integer)", "syncrep_probe");
    pg.scalar("ALTER SYSTEM SET synchronous_standby_names = 'im_no_such_standby'");
    pg.scalar("SELECT pg_reload_conf()");
    ASSERT_TRUE(wait_until([&] { return a_commit_waits_for_the_standby(pg); }, 60s))
        << "commits never began to wait for the standby";
    c->send_json({{"t", "send"}, {"rid", "d"}, {"conv", w.conv}, {"cmid", "doubt"}, {"body", "in doubt"}});
    std::string backend;
    ASSERT_TRUE(wait_until(
        [&] {
            backend = pg.scalar("SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep' "
                                "AND application_name LIKE 'imserver-pool-%' LIMIT 1");
            return !backend.empty();
        },
        20s))
        << "the send's COMMIT never waited for the standby";
    ASSERT_EQ(pg.scalar("SELECT pg_terminate_backend(" + backend + ")"), "t");
    auto r = c->next(20s);
    ASSERT_TRUE(r.has_value()) << "no answer after the connection was lost during COMMIT";
    EXPECT_EQ(str(*r, "rid"), "d");
    EXPECT_EQ(str(*r, "code"), "UNAVAILABLE") << json::serialize(*r);
    if (in_doubt_message) {
        EXPECT_NE(str(*r, "msg").find("commit outcome unknown"), std::string::npos) << json::serialize(*r);
    }
    // The commit was done locally: the outcome was a success nobody heard of.
    EXPECT_TRUE(wait_until([&] { return count_rows(pg, "conv_id = " + q(w.conv) + " AND client_msg_id = 'doubt'") == "1"; },
                           10s));
    pg.scalar("ALTER SYSTEM RESET synchronous_standby_names");
    pg.scalar("SELECT pg_reload_conf()");
    ASSERT_TRUE(wait_until([&] { return !a_commit_waits_for_the_standby(pg); }, 60s))
        << "commits still wait for the standby after the reset";
    json::object again;
    ASSERT_TRUE(wait_until(
        [&] {
            again = send_msg(*c, w.conv, "doubt", "in doubt");
            return str(again, "t") != "error" || str(again, "code") != "UNAVAILABLE";
        },
        20s))
        << json::serialize(again);
    EXPECT_EQ(str(again, "t"), "sent") << json::serialize(again);
    EXPECT_TRUE(again.at("dup").as_bool()) << json::serialize(again);
    EXPECT_EQ(count_rows(pg, "conv_id = " + q(w.conv) + " AND client_msg_id = 'doubt'"), "1");
}

TEST_F(Contract, a_commit_with_unknown_outcome_answers_unavailable_and_the_resend_is_a_duplicate) {
    // A default server: the send is one autocommit statement (the connection
    // breaks under it).
    expect_unknown_commit_answers_unavailable(*pg, port(), make_world(db(), "doubt", 2), false);
}

TEST_F(Contract, a_commit_in_doubt_answers_unavailable) {
    // With --enable-faults the send runs in a transaction ended by COMMIT:
    // the connection lost during COMMIT is libpqxx's in_doubt_error.
    ServerProcess lab(db(), {"--quiet", "--enable-faults"});
    expect_unknown_commit_answers_unavailable(*pg, lab.port(), make_world(db(), "indoubt", 2), true);
}

} // namespace
