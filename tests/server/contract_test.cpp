// The contract against a real imserver and a real PostgreSQL: each test
// sends real frames over a real WebSocket and asserts replies and rows.
#include "common.hpp"

#include <algorithm>
#include <atomic>
#include <barrier>
#include <map>
#include <set>

#include <pqxx/pqxx>

using namespace im::test;

namespace {

class Contract : public ServerSuite {};

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

// ---------------------------------------------------------------- sync

TEST_F(Contract, paging_while_another_connection_writes_yields_every_seq_once_in_order) {
    auto w = make_world(db(), "paging", 2);
    auto writer = login(port(), w.users[0]);
    auto reader = login(port(), w.users[1]);
    std::atomic<bool> done{false};
    std::thread t([&] {
        for (int i = 0; i < 200; ++i) send_msg(*writer, w.conv, "w" + std::to_string(i), "m" + std::to_string(i));
        done = true;
    });
    std::vector<std::int64_t> seen;
    std::int64_t after = 0;
    for (;;) {
        bool finished = done.load();
        auto p = sync_conv(*reader, w.conv, after, 7);
        ASSERT_EQ(str(p, "t"), "page") << json::serialize(p);
        for (auto& e : p.at("events").as_array()) seen.push_back(e.as_object().at("seq").as_int64());
        ASSERT_LE(p.at("events").as_array().size(), 7u);
        after = num(p, "next_after");
        if (finished && !p.at("has_more").as_bool()) break;
    }
    t.join();
    std::int64_t head = std::stoll(pg->scalar("SELECT next_seq - 1 FROM conversations WHERE conv_id = " + q(w.conv)));
    ASSERT_EQ(head, 202);
    // The reader joined at seq 2: it may read 2..head, each exactly once, in order.
    ASSERT_EQ(static_cast<std::int64_t>(seen.size()), head - 1);
    for (std::int64_t i = 0; i < head - 1; ++i) ASSERT_EQ(seen[static_cast<std::size_t>(i)], i + 2);
}

TEST_F(Contract, sync_reports_head_min_seq_epoch_and_has_more) {
    auto w = make_world(db(), "page", 2);
    auto c = login(port(), w.users[0]);
    for (int i = 0; i < 5; ++i) send_msg(*c, w.conv, "k" + std::to_string(i), "x");
    auto p = sync_conv(*c, w.conv, 0, 3);
    EXPECT_EQ(num(p, "head"), 7);
    EXPECT_EQ(num(p, "next_after"), 3);
    EXPECT_TRUE(p.at("has_more").as_bool());
    EXPECT_EQ(num(p, "min_seq"), 1);
    EXPECT_FALSE(p.at("trimmed").as_bool());
    EXPECT_EQ(num(p, "epoch"), 1);
    auto last = sync_conv(*c, w.conv, 3, 50);
    EXPECT_EQ(last.at("events").as_array().size(), 4u);
    EXPECT_FALSE(last.at("has_more").as_bool());
    EXPECT_EQ(num(last, "next_after"), 7);
}

TEST_F(Contract, cursor_beyond_head_is_cursor_ahead) {
    auto w = make_world(db(), "ahead", 2);
    auto c = login(port(), w.users[0]);
    EXPECT_EQ(str(sync_conv(*c, w.conv, 3), "code"), "CURSOR_AHEAD");
    EXPECT_EQ(str(sync_conv(*c, w.conv, 2), "t"), "page");
}

// After a restore: one command bumps every conversation's epoch once.
TEST_F(Contract, epoch_bump_all_bumps_every_conversation_once) {
    auto a = make_world(db(), "epall", 2);
    auto b = make_world(db(), "epall", 2);
    EXPECT_GE(std::stoll(admin_ok(db(), {"epoch", "bump", "--all"})), 2);
    EXPECT_EQ(admin_ok(db(), {"epoch", "bump", a.conv}), "3");
    EXPECT_EQ(admin_ok(db(), {"epoch", "bump", b.conv}), "3");
    EXPECT_NE(admin(db(), {"epoch", "bump", "--all", a.conv}).first, 0);
}

TEST_F(Contract, epoch_bump_voids_old_cursors) {
    auto w = make_world(db(), "epoch", 2);
    auto c = login(port(), w.users[0]);
    EXPECT_EQ(admin_ok(db(), {"epoch", "bump", w.conv}), "2");
    auto old = c->request({{"t", "sync"}, {"conv", w.conv}, {"after", 1}, {"epoch", 1}});
    EXPECT_EQ(str(old, "code"), "EPOCH_CHANGED");
    // Any epoch that is not the current one, 0 and negative included (no
    // bound in contract section 9), for sync and history alike.
    for (std::int64_t ep : {0, -1, 3}) {
        EXPECT_EQ(str(c->request({{"t", "sync"}, {"conv", w.conv}, {"after", 0}, {"epoch", ep}}), "code"),
                  "EPOCH_CHANGED") << ep;
        EXPECT_EQ(str(c->request({{"t", "history"}, {"conv", w.conv}, {"before", 0}, {"epoch", ep}}), "code"),
                  "EPOCH_CHANGED") << ep;
    }
    auto fresh = c->request({{"t", "sync"}, {"conv", w.conv}, {"after", 0}, {"epoch", 2}});
    EXPECT_EQ(str(fresh, "t"), "page");
    EXPECT_EQ(num(fresh, "epoch"), 2);
    auto s = send_msg(*c, w.conv, "k", "after bump");
    EXPECT_EQ(num(s, "epoch"), 2);
}

TEST_F(Contract, a_former_member_reads_only_their_own_period_and_sees_a_capped_head) {
    auto w = make_world(db(), "leaver", 3);
    auto leaver = login(port(), w.users[2]);
    auto stay = login(port(), w.users[0]);
    send_msg(*stay, w.conv, "a", "before");                                              // seq 4
    auto leave_seq = std::stoll(admin_ok(db(), {"member", "remove", w.conv, w.users[2].user})); // seq 5
    ASSERT_EQ(leave_seq, 5);
    send_msg(*stay, w.conv, "b", "after 1");                                              // seq 6
    send_msg(*stay, w.conv, "c", "after 2");                                              // seq 7
    auto p = sync_conv(*leaver, w.conv, 0);
    ASSERT_EQ(str(p, "t"), "page");
    EXPECT_EQ(num(p, "head"), 5);
    std::vector<std::int64_t> seqs;
    for (auto& e : p.at("events").as_array()) seqs.push_back(e.as_object().at("seq").as_int64());
    EXPECT_EQ(seqs, (std::vector<std::int64_t>{3, 4, 5})); // own join .. own leave
    EXPECT_EQ(str(leaver->request({{"t", "fetch"}, {"conv", w.conv}, {"seq", 6}}), "code"), "NOT_FOUND");
    EXPECT_EQ(str(leaver->request({{"t", "fetch"}, {"conv", w.conv}, {"seq", 1}}), "code"), "NOT_MEMBER");
    EXPECT_EQ(str(sync_conv(*leaver, w.conv, 6), "code"), "CURSOR_AHEAD");
    auto convs = leaver->request({{"t", "convs"}});
    bool found = false;
    for (auto& v : convs.at("convs").as_array())
        if (str(v.as_object(), "conv") == w.conv) {
            found = true;
            EXPECT_EQ(num(v.as_object(), "head"), 5);
        }
    EXPECT_TRUE(found);
}

TEST_F(Contract, fetch_returns_one_event) {
    auto w = make_world(db(), "fetch", 2);
    auto c = login(port(), w.users[0]);
    auto s = send_msg(*c, w.conv, "k", "fetch me");
    auto f = c->request({{"t", "fetch"}, {"conv", w.conv}, {"seq", num(s, "seq")}});
    ASSERT_EQ(str(f, "t"), "fetched");
    auto ev = f.at("ev").as_object();
    EXPECT_EQ(str(ev, "body"), "fetch me");
    EXPECT_EQ(str(ev, "sender"), w.users[0].user);
    EXPECT_EQ(str(ev, "kind"), "msg");
    EXPECT_EQ(str(ev, "mid"), str(s, "mid"));
    EXPECT_EQ(str(ev, "cmid"), "k"); // lets the sender settle a send whose reply it lost
    EXPECT_EQ(str(c->request({{"t", "fetch"}, {"conv", w.conv}, {"seq", 99}}), "code"), "NOT_FOUND");
    // No event has a seq below 1: NOT_FOUND too (contract section 9 sets no
    // bound on fetch.seq), and still NOT_MEMBER for a stranger (C4 first).
    EXPECT_EQ(str(c->request({{"t", "fetch"}, {"conv", w.conv}, {"seq", 0}}), "code"), "NOT_FOUND");
    EXPECT_EQ(str(c->request({{"t", "fetch"}, {"conv", w.conv}, {"seq", -5}}), "code"), "NOT_FOUND");
    auto outsider = login(port(), make_user(db(), unique_name("fetchout")));
    EXPECT_EQ(str(outsider->request({{"t", "fetch"}, {"conv", w.conv}, {"seq", 0}}), "code"), "NOT_MEMBER");
}

// ---------------------------------------------------------------- sessions

TEST_F(Contract, requests_before_hello_are_unauthenticated_and_a_second_hello_is_invalid) {
    auto u = make_user(db(), unique_name("auth"));
    WsClient c(port());
    EXPECT_EQ(str(c.request({{"t", "convs"}}), "code"), "UNAUTHENTICATED");
    // A malformed request of a known type is still a request before hello
    // (contract 4); a frame naming no request type is not one.
    EXPECT_EQ(str(c.request({{"t", "sync"}, {"conv", "c"}}), "code"), "UNAUTHENTICATED");
    EXPECT_EQ(str(c.request({{"t", "send"}, {"conv", "c"}, {"cmid", "k"}, {"body", 5}}), "code"), "UNAUTHENTICATED");
    EXPECT_EQ(str(c.request({{"t", "explode"}}), "code"), "INVALID_ARGUMENT");
    EXPECT_EQ(str(c.hello(u.token), "t"), "welcome");
    EXPECT_EQ(str(c.hello(u.token), "code"), "INVALID_ARGUMENT");
}

TEST_F(Contract, a_bad_token_is_unauthenticated_and_the_connection_closes) {
    // Unknown, empty and over-long alike: bad credentials, not a malformed
    // request (contract 4 and 8).
    for (const std::string& token : {std::string("not-a-token"), std::string(), std::string(4097, 'a')}) {
        WsClient c(port());
        auto r = c.hello(token);
        EXPECT_EQ(str(r, "code"), "UNAUTHENTICATED") << token.size() << " chars: " << json::serialize(r);
        EXPECT_EQ(str(r, "msg"), "unknown or revoked device token") << token.size() << " chars";
        EXPECT_NE(c.wait_closed(), -1) << token.size() << " chars";
    }
}

TEST_F(Contract, a_revoked_device_cannot_say_hello) {
    auto u = make_user(db(), unique_name("revoked"));
    admin_ok(db(), {"device", "revoke", u.device});
    WsClient c(port());
    EXPECT_EQ(str(c.hello(u.token), "code"), "UNAUTHENTICATED");
}

TEST_F(Contract, welcome_names_user_device_and_gateway) {
    auto u = make_user(db(), unique_name("welcome"));
    WsClient c(port());
    auto w = c.hello(u.token);
    EXPECT_EQ(str(w, "user"), u.user);
    EXPECT_EQ(str(w, "device"), u.device);
    EXPECT_EQ(str(w, "gateway"), "gw-1");
    EXPECT_GT(num(w, "server_time"), 1700000000000);
}

TEST_F(Contract, bad_frames_get_invalid_argument_and_the_connection_stays_open) {
    auto u = make_user(db(), unique_name("garbage"));
    WsClient c(port());
    c.send_text("this is not json");
    auto e1 = c.next();
    ASSERT_TRUE(e1);
    EXPECT_EQ(str(*e1, "code"), "INVALID_ARGUMENT");
    c.send_text(R"({"rid":"r9","no":"type"})");
    auto e2 = c.next();
    ASSERT_TRUE(e2);
    EXPECT_EQ(str(*e2, "code"), "INVALID_ARGUMENT");
    EXPECT_EQ(str(*e2, "rid"), "r9");
    EXPECT_EQ(str(c.hello(u.token), "t"), "welcome");
}

TEST_F(Contract, a_malformed_frame_is_answered_in_its_turn_after_the_requests_before_it) {
    // docs/protocol.md: a connection's requests are answered in the order
    // they arrived; the error for a bad frame does not overtake a send that
    // is still in the database.
    // 100 pipelined sends keep the connection's queue busy for longer than
    // the bad frame takes to arrive, so an early answer would overtake some.
    auto w = make_world(db(), "order", 2);
    auto c = login(port(), w.users[0]);
    constexpr int sends = 100;
    for (int i = 0; i < sends; ++i) {
        const std::string n = std::to_string(i);
        c->send_text(R"({"t":"send","rid":"s)" + n + R"(","conv":")" + w.conv + R"(","cmid":"k)" + n +
                     R"(","body":"pipelined"})");
    }
    c->send_text(R"({"t":"sync","rid":"bad","conv":")" + w.conv + R"("})"); // no `after`
    for (int i = 0; i < sends; ++i) {
        auto r = c->next();
        ASSERT_TRUE(r) << i;
        ASSERT_EQ(str(*r, "rid"), "s" + std::to_string(i)) << json::serialize(*r);
        EXPECT_EQ(str(*r, "t"), "sent");
    }
    auto bad = c->next();
    ASSERT_TRUE(bad);
    EXPECT_EQ(str(*bad, "rid"), "bad");
    EXPECT_EQ(str(*bad, "code"), "INVALID_ARGUMENT");
}

TEST_F(Contract, a_frame_over_64_KiB_closes_with_1009) {
    WsClient c(port());
    c.send_text(R"({"t":"send","body":")" + std::string(65 * 1024, 'a') + R"("})");
    EXPECT_EQ(c.wait_closed(), 1009);
}

TEST_F(Contract, a_binary_frame_closes_with_1003) {
    WsClient c(port());
    c.send_binary("\x01\x02");
    EXPECT_EQ(c.wait_closed(), 1003);
}

// ---------------------------------------------------------------- pushes

TEST_F(Contract, small_conversations_get_event_pushes_and_large_ones_get_hints) {
    auto small = make_world(db(), "small", 2);
    auto big = make_world(db(), "big", 3);
    admin_ok(db(), {"conv", "set", big.conv, "--push-full-max", "2"});
    auto sender_small = login(port(), small.users[0]);
    auto watcher_small = login(port(), small.users[1]);
    auto sender_big = login(port(), big.users[0]);
    auto watcher_big = login(port(), big.users[1]);
    EXPECT_EQ(str(watcher_small->request({{"t", "sub"}}), "t"), "subscribed");
    EXPECT_EQ(str(watcher_big->request({{"t", "sub"}}), "t"), "subscribed");
    auto s1 = send_msg(*sender_small, small.conv, "k", "to the small one");
    auto s2 = send_msg(*sender_big, big.conv, "k", "to the big one");
    auto ev = watcher_small->wait_push([&](const json::object& f) { return str(f, "t") == "event"; });
    ASSERT_TRUE(ev);
    EXPECT_EQ(str(ev->at("ev").as_object(), "body"), "to the small one");
    EXPECT_EQ(num(ev->at("ev").as_object(), "seq"), num(s1, "seq"));
    auto hint = watcher_big->wait_push([&](const json::object& f) { return str(f, "t") == "hint" || str(f, "t") == "event"; });
    ASSERT_TRUE(hint);
    EXPECT_EQ(str(*hint, "t"), "hint");
    EXPECT_EQ(str(*hint, "conv"), big.conv);
    EXPECT_EQ(num(*hint, "head"), num(s2, "seq"));
    EXPECT_EQ(num(*hint, "epoch"), 1);
}

// Per connection, not per user: the same user's subscribed connection gets
// the push (so the gateway does fan out), the unsubscribed one does not.
TEST_F(Contract, without_sub_a_connection_gets_no_pushes) {
    auto w = make_world(db(), "nosub", 2);
    auto a = login(port(), w.users[0]);
    auto b = login(port(), w.users[1]);
    auto b2 = login(port(), w.users[1]);
    ASSERT_EQ(str(b2->request({{"t", "sub"}}), "t"), "subscribed");
    auto sent = send_msg(*a, w.conv, "k", "quiet");
    auto ev = b2->wait_push([](const json::object& f) { return str(f, "t") == "event"; });
    ASSERT_TRUE(ev) << "the subscribed connection got no push";
    EXPECT_EQ(num(ev->at("ev").as_object(), "seq"), num(sent, "seq"));
    EXPECT_FALSE(b->next_push(500ms)) << "a connection that never sent sub got a push";
}

// ---------------------------------------------------------------- recall

TEST_F(Contract, recall_appends_an_event_and_never_edits_the_original) {
    auto w = make_world(db(), "recall", 2);
    auto a = login(port(), w.users[0]);
    auto s = send_msg(*a, w.conv, "m1", "oops");
    auto r = a->request({{"t", "recall"}, {"conv", w.conv}, {"target", num(s, "seq")}, {"cmid", "r1"}});
    ASSERT_EQ(str(r, "t"), "recalled") << json::serialize(r);
    EXPECT_EQ(num(r, "seq"), num(s, "seq") + 1);
    EXPECT_FALSE(r.at("dup").as_bool());
    EXPECT_EQ(pg->scalar("SELECT body FROM events WHERE conv_id = " + q(w.conv) + " AND seq = " +
                         std::to_string(num(s, "seq"))),
              "oops");
    EXPECT_EQ(pg->scalar("SELECT target_seq FROM events WHERE conv_id = " + q(w.conv) + " AND kind = 'recall'"),
              std::to_string(num(s, "seq")));
    auto again = a->request({{"t", "recall"}, {"conv", w.conv}, {"target", num(s, "seq")}, {"cmid", "r1"}});
    EXPECT_EQ(str(again, "t"), "recalled");
    EXPECT_TRUE(again.at("dup").as_bool());
    EXPECT_EQ(num(again, "seq"), num(r, "seq"));
    auto other = a->request({{"t", "recall"}, {"conv", w.conv}, {"target", num(s, "seq")}, {"cmid", "r2"}});
    EXPECT_EQ(str(other, "code"), "ALREADY_RECALLED");
    EXPECT_EQ(count_rows(*pg, "conv_id = " + q(w.conv) + " AND kind = 'recall'"), "1");
}

// C3 across kinds: a send's fingerprint hashes its body and a recall's the
// text "recall:<target>", so a body of exactly that text has the same bytes.
// A cmid held by one kind of request is still other content for the other.
TEST_F(Contract, a_cmid_held_by_a_recall_is_a_mismatch_for_a_send_and_the_reverse) {
    auto w = make_world(db(), "kinds", 2);
    auto a = login(port(), w.users[0]);
    auto s1 = send_msg(*a, w.conv, "m1", "first");
    const auto t1 = std::to_string(num(s1, "seq"));
    auto r1 = a->request({{"t", "recall"}, {"conv", w.conv}, {"target", num(s1, "seq")}, {"cmid", "r1"}});
    ASSERT_EQ(str(r1, "t"), "recalled") << json::serialize(r1);
    // A send reusing the recall's cmid, with the body that hashes alike.
    auto send_as_recall = send_msg(*a, w.conv, "r1", "recall:" + t1);
    EXPECT_EQ(str(send_as_recall, "code"), "IDEMPOTENCY_MISMATCH") << json::serialize(send_as_recall);
    // A send whose body hashes like a recall of seq 3, then that recall under its cmid.
    auto s2 = send_msg(*a, w.conv, "m2", "second");
    const auto t2 = std::to_string(num(s2, "seq"));
    auto s3 = send_msg(*a, w.conv, "m3", "recall:" + t2);
    ASSERT_EQ(str(s3, "t"), "sent") << json::serialize(s3);
    auto recall_as_send = a->request({{"t", "recall"}, {"conv", w.conv}, {"target", num(s2, "seq")}, {"cmid", "m3"}});
    EXPECT_EQ(str(recall_as_send, "code"), "IDEMPOTENCY_MISMATCH") << json::serialize(recall_as_send);
    // Nothing written by either refusal: one recall (of s1), and s2 not recalled.
    EXPECT_EQ(count_rows(*pg, "conv_id = " + q(w.conv) + " AND kind = 'recall'"), "1");
    EXPECT_EQ(count_rows(*pg, "conv_id = " + q(w.conv) + " AND kind = 'recall' AND target_seq = " + t2), "0");
    EXPECT_EQ(count_rows(*pg, "conv_id = " + q(w.conv) + " AND kind = 'msg'"), "3");
}

TEST_F(Contract, recall_rejections_follow_the_contract) {
    auto w = make_world(db(), "recallno", 2);
    auto a = login(port(), w.users[0]);
    auto b = login(port(), w.users[1]);
    auto s = send_msg(*a, w.conv, "m1", "mine");
    auto recall = [&](WsClient& c, std::int64_t target, const std::string& cmid) {
        return str(c.request({{"t", "recall"}, {"conv", w.conv}, {"target", target}, {"cmid", cmid}}), "code");
    };
    EXPECT_EQ(recall(*b, num(s, "seq"), "x1"), "NOT_SENDER");
    EXPECT_EQ(recall(*a, 1, "x2"), "INVALID_ARGUMENT"); // a join event
    EXPECT_EQ(recall(*a, 99, "x3"), "NOT_FOUND");
    EXPECT_EQ(recall(*a, 0, "x3z"), "NOT_FOUND"); // no bound in section 9: no event has seq 0
    EXPECT_EQ(recall(*a, -1, "x3n"), "NOT_FOUND");
    // The window is judged against the stored created_at, in milliseconds:
    // a message written 61 s ago is out of a 60 s window, one of 50 s is in
    // (10 s left for the admin commands below; a window read in seconds
    // would let the first through).
    admin_ok(db(), {"conv", "set", w.conv, "--recall-window-ms", "60000"});
    auto late = send_msg(*a, w.conv, "m2", "too late");
    auto in_time = send_msg(*a, w.conv, "m3", "just in time");
    auto age = [&](const json::object& sent, int seconds) {
        pg->scalar("UPDATE events SET created_at = clock_timestamp() - interval '" + std::to_string(seconds) +
                 " seconds' WHERE conv_id = " + q(w.conv) + " AND seq = " + std::to_string(num(sent, "seq")));
    };
    age(late, 61);
    age(in_time, 50);
    EXPECT_EQ(recall(*a, num(late, "seq"), "x4"), "RECALL_WINDOW_EXPIRED");
    // Read access and an open period: a late joiner cannot recall (or read)
    // what came before their join, a removed sender cannot recall their own.
    auto cy = make_user(db(), unique_name("cy"));
    admin_ok(db(), {"member", "add", w.conv, cy.user});
    auto c = login(port(), cy);
    EXPECT_EQ(recall(*c, num(s, "seq"), "x5"), "NOT_MEMBER");
    EXPECT_EQ(count_rows(*pg, "conv_id = " + q(w.conv) + " AND kind = 'recall'"), "0");
    admin_ok(db(), {"member", "remove", w.conv, w.users[0].user});
    EXPECT_EQ(recall(*a, num(in_time, "seq"), "x6"), "NOT_MEMBER");
    EXPECT_EQ(count_rows(*pg, "conv_id = " + q(w.conv) + " AND kind = 'recall'"), "0");
    admin_ok(db(), {"member", "add", w.conv, w.users[0].user});
    auto ok = a->request({{"t", "recall"}, {"conv", w.conv}, {"target", num(in_time, "seq")}, {"cmid", "x7"}});
    EXPECT_EQ(str(ok, "t"), "recalled") << json::serialize(ok);
    EXPECT_EQ(count_rows(*pg, "conv_id = " + q(w.conv) + " AND kind = 'recall'"), "1");
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

// ---------------------------------------------------------------- markers

TEST_F(Contract, read_on_one_device_reaches_the_other_and_clears_unread_on_both) {
    auto w = make_world(db(), "read", 2);
    auto ana = w.users[0];
    TestUser ana2{ana.user, unique_name("d2"), ""};
    ana2.token = admin_ok(db(), {"device", "add", ana.user, ana2.device});
    auto d1 = login(port(), ana);
    auto d2 = login(port(), ana2);
    auto ben = login(port(), w.users[1]);
    send_msg(*ben, w.conv, "b1", "one");
    auto last = send_msg(*ben, w.conv, "b2", "two");
    send_msg(*d1, w.conv, "a1", "mine does not count");
    auto unread_of = [&](WsClient& c) {
        auto r = c.request({{"t", "convs"}});
        for (auto& v : r.at("convs").as_array())
            if (str(v.as_object(), "conv") == w.conv) return num(v.as_object(), "unread");
        return std::int64_t{-1};
    };
    EXPECT_EQ(unread_of(*d1), 2);
    EXPECT_EQ(unread_of(*d2), 2);
    EXPECT_EQ(str(d2->request({{"t", "sub"}}), "t"), "subscribed");
    EXPECT_EQ(str(d1->request({{"t", "sub"}}), "t"), "subscribed");
    EXPECT_EQ(str(ben->request({{"t", "sub"}}), "t"), "subscribed");
    auto r = d1->request({{"t", "read"}, {"conv", w.conv}, {"seq", num(last, "seq")}});
    EXPECT_EQ(str(r, "t"), "read_ok");
    EXPECT_EQ(num(r, "read"), num(last, "seq"));
    auto read_hint = [](const json::object& f) { return str(f, "t") == "hint" && f.contains("read"); };
    auto hint = d2->wait_push(read_hint);
    ASSERT_TRUE(hint);
    EXPECT_EQ(num(*hint, "read"), num(last, "seq"));
    // Only the user's other devices: not the reading device, never another
    // member (a read position is the reader's own business).
    EXPECT_FALSE(d1->wait_push(read_hint, 1s)) << "the reading device was told of its own read";
    EXPECT_FALSE(ben->wait_push(read_hint, 1s)) << "another member was told of ana's read position";
    EXPECT_EQ(unread_of(*d1), 0);
    EXPECT_EQ(unread_of(*d2), 0);
    // Markers never go down.
    auto back = d2->request({{"t", "read"}, {"conv", w.conv}, {"seq", 1}});
    EXPECT_EQ(num(back, "read"), num(last, "seq"));
    EXPECT_EQ(str(d1->request({{"t", "read"}, {"conv", w.conv}, {"seq", 999}}), "code"), "CURSOR_AHEAD");
}

TEST_F(Contract, unread_skips_recalled_messages_and_counts_only_readable_ones) {
    auto w = make_world(db(), "unread", 3);
    auto ana = login(port(), w.users[0]);
    auto ben = login(port(), w.users[1]);
    auto cy = login(port(), w.users[2]);
    auto m1 = send_msg(*ben, w.conv, "b1", "one");
    send_msg(*ben, w.conv, "b2", "two");
    send_msg(*cy, w.conv, "c1", "three");
    ben->request({{"t", "recall"}, {"conv", w.conv}, {"target", num(m1, "seq")}, {"cmid", "rb1"}});
    auto convs = ana->request({{"t", "convs"}});
    int listed = 0;
    for (auto& v : convs.at("convs").as_array())
        if (str(v.as_object(), "conv") == w.conv) {
            ++listed;
            EXPECT_EQ(num(v.as_object(), "unread"), 2);
        }
    EXPECT_EQ(listed, 1) << "the conversation is not (once) in ana's list: " << json::serialize(convs);
    auto ack = ana->request({{"t", "ack"}, {"conv", w.conv}, {"seq", 5}});
    EXPECT_EQ(num(ack, "delivered"), 5);
    auto ack_back = ana->request({{"t", "ack"}, {"conv", w.conv}, {"seq", 2}});
    EXPECT_EQ(num(ack_back, "delivered"), 5);
    // Readable only: a late joiner counts what came after the join, never
    // the messages before it (nor the join event itself).
    auto dan = make_user(db(), unique_name("dan"));
    admin_ok(db(), {"member", "add", w.conv, dan.user});
    send_msg(*cy, w.conv, "c2", "after dan joined");
    auto d = login(port(), dan);
    auto dconvs = d->request({{"t", "convs"}});
    int dlisted = 0;
    for (auto& v : dconvs.at("convs").as_array())
        if (str(v.as_object(), "conv") == w.conv) {
            ++dlisted;
            EXPECT_EQ(num(v.as_object(), "unread"), 1) << json::serialize(v);
        }
    EXPECT_EQ(dlisted, 1) << json::serialize(dconvs);
}

TEST_F(Contract, a_newer_install_makes_the_older_one_stale) {
    auto w = make_world(db(), "install", 2);
    std::string old_install = uuid4();
    auto old_conn = login(port(), w.users[0], old_install);
    auto fresh = login(port(), w.users[0], uuid4());
    auto r = old_conn->request({{"t", "ack"}, {"conv", w.conv}, {"seq", 1}});
    EXPECT_EQ(str(r, "code"), "STALE_INSTALL");
    EXPECT_NE(old_conn->wait_closed(), -1);
    WsClient again(port());
    EXPECT_EQ(str(again.hello(w.users[0].token, old_install), "code"), "STALE_INSTALL");
    EXPECT_EQ(str(fresh->request({{"t", "ack"}, {"conv", w.conv}, {"seq", 1}}), "t"), "acked");
}

// The same rule for read: a connection still open under the older install
// (it said hello before the newer one) is refused and closed, and the
// user's read marker does not move.
TEST_F(Contract, a_read_from_the_older_install_is_stale_and_moves_nothing) {
    auto w = make_world(db(), "installrd", 2);
    auto ben = login(port(), w.users[1]);
    auto m = send_msg(*ben, w.conv, "b1", "unread");
    auto old_conn = login(port(), w.users[0], uuid4());
    auto fresh = login(port(), w.users[0], uuid4());
    auto r = old_conn->request({{"t", "read"}, {"conv", w.conv}, {"seq", num(m, "seq")}});
    EXPECT_EQ(str(r, "code"), "STALE_INSTALL") << json::serialize(r);
    EXPECT_NE(old_conn->wait_closed(), -1);
    EXPECT_EQ(pg->scalar("SELECT coalesce(max(read), 0) FROM read_markers WHERE conv_id = " + q(w.conv) +
                         " AND user_id = " + q(w.users[0].user)),
              "0");
    auto ok = fresh->request({{"t", "read"}, {"conv", w.conv}, {"seq", num(m, "seq")}});
    EXPECT_EQ(num(ok, "read"), num(m, "seq")) << json::serialize(ok);
}

// ---------------------------------------------------------------- retention

TEST_F(Contract, purge_writes_tombstones_so_a_late_resend_creates_nothing) {
    auto w = make_world(db(), "purge", 2);
    auto a = login(port(), w.users[0]);
    auto s = send_msg(*a, w.conv, "old", "purged soon"); // seq 3
    send_msg(*a, w.conv, "keep", "stays");               // seq 4
    EXPECT_EQ(admin_ok(db(), {"purge", w.conv, "--before-seq", "4"}), "3");
    auto late = send_msg(*a, w.conv, "old", "purged soon");
    EXPECT_EQ(str(late, "code"), "ORIGINAL_EXPIRED");
    EXPECT_EQ(count_rows(*pg, "conv_id = " + q(w.conv) + " AND client_msg_id = 'old'"), "0");
    EXPECT_EQ(pg->scalar("SELECT count(*) FROM idem_tombstones WHERE conv_id = " + q(w.conv)), "1");
    auto p = sync_conv(*a, w.conv, 0);
    EXPECT_TRUE(p.at("trimmed").as_bool());
    EXPECT_EQ(num(p, "min_seq"), 4);
    EXPECT_EQ(p.at("events").as_array().size(), 1u);
    EXPECT_FALSE(sync_conv(*a, w.conv, 3).at("trimmed").as_bool());
    EXPECT_EQ(str(a->request({{"t", "fetch"}, {"conv", w.conv}, {"seq", num(s, "seq")}}), "code"), "NOT_FOUND");
    auto r = a->request({{"t", "recall"}, {"conv", w.conv}, {"target", num(s, "seq")}, {"cmid", "rr"}});
    EXPECT_EQ(str(r, "code"), "NOT_FOUND");
}

// An operator's database may sort text by a language's rules (ICU en-US puts
// "abc" before "Zed"); the convs page's conv_id order is byte order all the
// same, and paging by `after` neither skips nor repeats.
TEST_F(Contract, convs_pages_in_byte_order_whatever_the_database_collation) {
    pg->scalar("CREATE DATABASE im_icu TEMPLATE template0 ENCODING 'UTF8' LOCALE 'C.UTF-8' "
               "LOCALE_PROVIDER icu ICU_LOCALE 'en-US'", "postgres");
    ASSERT_EQ(pg->scalar("SELECT datlocprovider FROM pg_database WHERE datname = 'im_icu'", "postgres"), "i");
    // The database itself orders them otherwise: the test would prove nothing.
    ASSERT_EQ(pg->scalar("SELECT string_agg(x, ',' ORDER BY x) FROM (VALUES ('Zed'), ('abc')) v(x)", "im_icu"),
              "abc,Zed");
    const std::string url = pg->url("im_icu");
    ServerProcess icu(url, {"--quiet"});
    auto u = make_user(url, "icu-user");
    const std::vector<std::string> names = {"abc", "Zed", "b_1", "B2", "a-z", "a.z", "Z9", "_x"};
    for (const auto& n : names) admin_ok(url, {"conv", "create", n, "--kind", "group", "--members", u.user});
    auto c = login(icu.port(), u);
    std::vector<std::string> seen;
    std::string after;
    for (int page = 0; page < 10; ++page) {
        json::object req{{"t", "convs"}, {"limit", 3}};
        if (!after.empty()) req["after"] = after;
        auto r = c->request(req);
        ASSERT_EQ(str(r, "t"), "convs") << json::serialize(r);
        for (auto& v : r.at("convs").as_array()) seen.push_back(str(v.as_object(), "conv"));
        after = str(r, "next_after");
        if (!r.at("has_more").as_bool()) break;
    }
    std::vector<std::string> bytes = names;
    std::sort(bytes.begin(), bytes.end()); // std::string compares bytes
    EXPECT_EQ(seen, bytes);
}

TEST_F(Contract, purge_older_than_removes_only_old_events_and_all_covers_every_conversation) {
    auto w = make_world(db(), "aged", 2);
    auto a = login(port(), w.users[0]);
    send_msg(*a, w.conv, "old1", "two days old"); // seq 3
    send_msg(*a, w.conv, "new1", "fresh");        // seq 4
    // Age the first three events (test setup: the clock is the database's).
    pg->scalar("UPDATE events SET created_at = now() - interval '2 days' WHERE conv_id = " + q(w.conv) +
               " AND seq <= 3 RETURNING 1");
    auto [rc, out] = admin(db(), {"purge", "--all", "--older-than", "1d"});
    ASSERT_EQ(rc, 0);
    EXPECT_GE(std::stoll(out), 3);
    EXPECT_EQ(pg->scalar("SELECT min_seq FROM conversations WHERE conv_id = " + q(w.conv)), "4");
    EXPECT_EQ(count_rows(*pg, "conv_id = " + q(w.conv)), "1");
    EXPECT_EQ(str(send_msg(*a, w.conv, "old1", "two days old"), "code"), "ORIGINAL_EXPIRED");
    EXPECT_EQ(str(send_msg(*a, w.conv, "new1", "fresh"), "t"), "sent");
    EXPECT_EQ(admin(db(), {"purge", w.conv}).first, 2); // bad usage: exit 2
}

// Server.md: exit status 2 on bad usage, 1 on failure. A value the
// provisioning layer refuses is bad usage like a missing argument; a
// command that cannot be done is a failure.
TEST_F(Contract, the_admin_cli_exits_2_on_a_refused_value_and_1_on_a_failure) {
    auto u = make_user(db(), unique_name("exit"));
    auto [rc_kind, out_kind] = admin(db(), {"conv", "create", unique_name("exitconv"), "--kind", "bogus",
                                            "--members", u.user});
    EXPECT_EQ(rc_kind, 2) << out_kind;
    auto [rc_id, out_id] = admin(db(), {"user", "add", "no spaces allowed"});
    EXPECT_EQ(rc_id, 2) << out_id;
    EXPECT_EQ(pg->scalar("SELECT count(*) FROM users WHERE user_id = 'no spaces allowed'"), "0");
    auto [rc_missing, out_missing] = admin(db(), {"member", "add", unique_name("noconv"), u.user});
    EXPECT_EQ(rc_missing, 1) << out_missing;
}

// ---------------------------------------------------------------- http

TEST_F(Contract, health_readiness_and_metrics_answer_over_http) {
    EXPECT_EQ(srv->http("GET", "/healthz").first, 200);
    EXPECT_EQ(srv->http("GET", "/readyz").first, 200);
    auto m = srv->http("GET", "/metrics");
    EXPECT_EQ(m.first, 200);
    EXPECT_NE(m.second.find("im_requests_total"), std::string::npos);
    EXPECT_NE(m.second.find("im_send_seconds_bucket"), std::string::npos);
    EXPECT_NE(m.second.find("im_db_pool_in_use"), std::string::npos);
}

TEST_F(Contract, a_default_start_has_no_fault_endpoint) {
    EXPECT_EQ(srv->http("POST", "/lab/fault", "store.before_insert=crash").first, 404);
    auto w = make_world(db(), "nofault", 2);
    auto a = login(port(), w.users[0]);
    EXPECT_EQ(str(send_msg(*a, w.conv, "k", "still fine"), "t"), "sent");
}

} // namespace
