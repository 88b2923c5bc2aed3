// The contract against a real imserver and a real PostgreSQL (contract.hpp):
// sync: paging, heads, epochs, cursors, membership periods, fetch.
#include "contract.hpp"

#include <atomic>
#include <thread>
#include <vector>

using namespace im::test;

namespace {

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

} // namespace
