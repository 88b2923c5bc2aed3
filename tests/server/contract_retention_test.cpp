// The contract against a real imserver and a real PostgreSQL (contract.hpp):
// retention: purges and their tombstones, the conversation list, the admin CLI.
#include "contract.hpp"

#include <algorithm>
#include <vector>

using namespace im::test;

namespace {

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

} // namespace
