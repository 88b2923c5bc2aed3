// The contract against a real imserver and a real PostgreSQL (contract.hpp):
// section 12, replies, edits and reactions, and what pages, fetches and
// pushes show of a message's later changes.
#include "contract.hpp"

#include "core/faults.hpp"
#include "core/protocol.hpp"
#include "store/store.hpp"

#include <pqxx/pqxx>

using namespace im::test;

namespace {

json::object reply_msg(WsClient& c, const std::string& conv, const std::string& cmid, const std::string& body,
                       std::int64_t reply_to) {
    return c.request({{"t", "send"}, {"conv", conv}, {"cmid", cmid}, {"body", body}, {"reply_to", reply_to}});
}

json::object edit_msg(WsClient& c, const std::string& conv, std::int64_t target, const std::string& cmid,
                      const std::string& body) {
    return c.request({{"t", "edit"}, {"conv", conv}, {"target", target}, {"cmid", cmid}, {"body", body}});
}

json::object react(WsClient& c, const std::string& conv, std::int64_t target, const std::string& cmid,
                   const std::string& emoji, bool on) {
    return c.request({{"t", "react"}, {"conv", conv}, {"target", target}, {"cmid", cmid}, {"emoji", emoji}, {"on", on}});
}

json::object fetch_ev(WsClient& c, const std::string& conv, std::int64_t seq) {
    auto f = c.request({{"t", "fetch"}, {"conv", conv}, {"seq", seq}});
    EXPECT_EQ(str(f, "t"), "fetched") << json::serialize(f);
    return f.contains("ev") ? f.at("ev").as_object() : json::object{};
}

// The event with `seq` in a page, or an empty object.
json::object in_page(const json::object& page, std::int64_t seq) {
    for (const auto& e : page.at("events").as_array())
        if (num(e.as_object(), "seq") == seq) return e.as_object();
    return {};
}

json::object history_ev(WsClient& c, const std::string& conv, std::int64_t seq) {
    auto h = c.request({{"t", "history"}, {"conv", conv}, {"before", 0}, {"limit", 200}});
    EXPECT_EQ(str(h, "t"), "page") << json::serialize(h);
    return in_page(h, seq);
}

// emoji -> [count, me] of a msg event.
std::map<std::string, std::pair<std::int64_t, bool>> reactions_of(const json::object& ev) {
    std::map<std::string, std::pair<std::int64_t, bool>> out;
    if (!ev.contains("reactions")) return out;
    for (const auto& r : ev.at("reactions").as_array())
        out[std::string(r.at("emoji").as_string())] = {r.at("count").as_int64(), r.at("me").as_bool()};
    return out;
}

// ---------------------------------------------------------------- replies

TEST_F(Contract, a_reply_carries_reply_to_and_its_fingerprint_covers_it) {
    auto w = make_world(db(), "reply", 2);
    auto a = login(port(), w.users[0]);
    auto b = login(port(), w.users[1]);
    auto s1 = send_msg(*b, w.conv, "m1", "question?");
    auto s2 = send_msg(*b, w.conv, "m2", "another");
    auto r = reply_msg(*a, w.conv, "r1", "answer", num(s1, "seq"));
    ASSERT_EQ(str(r, "t"), "sent") << json::serialize(r);
    EXPECT_EQ(num(fetch_ev(*b, w.conv, num(r, "seq")), "reply_to"), num(s1, "seq"));
    EXPECT_EQ(num(in_page(sync_conv(*b, w.conv, 0), num(r, "seq")), "reply_to"), num(s1, "seq"));
    EXPECT_FALSE(fetch_ev(*b, w.conv, num(s1, "seq")).contains("reply_to"));
    // The same key with the same reply_to: the original; another reply_to,
    // or none: other content.
    auto again = reply_msg(*a, w.conv, "r1", "answer", num(s1, "seq"));
    EXPECT_TRUE(again.at("dup").as_bool()) << json::serialize(again);
    EXPECT_EQ(num(again, "seq"), num(r, "seq"));
    EXPECT_EQ(str(reply_msg(*a, w.conv, "r1", "answer", num(s2, "seq")), "code"), "IDEMPOTENCY_MISMATCH");
    EXPECT_EQ(str(send_msg(*a, w.conv, "r1", "answer"), "code"), "IDEMPOTENCY_MISMATCH");
    // ... and the reverse: a plain send's key resent as a reply.
    auto plain = send_msg(*a, w.conv, "p1", "plain");
    EXPECT_EQ(str(reply_msg(*a, w.conv, "p1", "plain", num(s1, "seq")), "code"), "IDEMPOTENCY_MISMATCH");
    EXPECT_EQ(count_rows(*pg, "conv_id = " + q(w.conv) + " AND client_msg_id IN ('r1', 'p1')"), "2");
    // Old keys keep their meaning: a send without reply_to hashes as in section 6.
    EXPECT_EQ(pg->scalar("SELECT request_hash = sha256(convert_to(" + q(w.conv) +
                         ", 'UTF8') || '\\x00'::bytea || convert_to('plain', 'UTF8')) FROM events WHERE conv_id = " +
                         q(w.conv) + " AND seq = " + std::to_string(num(plain, "seq"))),
              "t");
    // A reply's: the contract's extended text with an empty attachments part.
    EXPECT_EQ(pg->scalar("SELECT request_hash = sha256(convert_to(" + q(w.conv) +
                         ", 'UTF8') || '\\x00'::bytea || 'answer'::bytea || '\\x00'::bytea || 'reply:" +
                         std::to_string(num(s1, "seq")) + "'::bytea || '\\x00'::bytea || 'att:'::bytea) "
                         "FROM events WHERE conv_id = " + q(w.conv) + " AND client_msg_id = 'r1'"),
              "t");
}

TEST_F(Contract, reply_to_must_name_a_readable_unpurged_msg) {
    auto w = make_world(db(), "replyno", 2); // joins at 1, 2
    auto a = login(port(), w.users[0]);
    auto s1 = send_msg(*a, w.conv, "m1", "early"); // 3
    auto s2 = send_msg(*a, w.conv, "m2", "recalled later");
    ASSERT_EQ(str(a->request({{"t", "recall"}, {"conv", w.conv}, {"target", num(s2, "seq")}, {"cmid", "rc"}}), "t"),
              "recalled");
    const auto head = std::stoll(pg->scalar("SELECT next_seq - 1 FROM conversations WHERE conv_id = " + q(w.conv)));
    EXPECT_EQ(str(reply_msg(*a, w.conv, "x1", "to nothing", head + 5), "code"), "NOT_FOUND");
    EXPECT_EQ(str(reply_msg(*a, w.conv, "x2", "to a join", 1), "code"), "NOT_FOUND");
    EXPECT_EQ(str(reply_msg(*a, w.conv, "x3", "to the recall", head), "code"), "NOT_FOUND");
    EXPECT_EQ(str(reply_msg(*a, w.conv, "x4", "to zero", 0), "code"), "NOT_FOUND");
    // Replying to a recalled message is allowed.
    EXPECT_EQ(str(reply_msg(*a, w.conv, "x5", "to the recalled", num(s2, "seq")), "t"), "sent");
    // A late joiner may not reply to what came before their join.
    auto cy = make_user(db(), unique_name("cy"));
    admin_ok(db(), {"member", "add", w.conv, cy.user});
    auto c = login(port(), cy);
    EXPECT_EQ(str(reply_msg(*c, w.conv, "x6", "to before my time", num(s1, "seq")), "code"), "NOT_FOUND");
    // Purged: gone.
    admin_ok(db(), {"purge", w.conv, "--before-seq", std::to_string(num(s1, "seq") + 1)});
    EXPECT_EQ(str(reply_msg(*a, w.conv, "x7", "to the purged", num(s1, "seq")), "code"), "NOT_FOUND");
    EXPECT_EQ(count_rows(*pg, "conv_id = " + q(w.conv) + " AND client_msg_id LIKE 'x%'"), "1");
    EXPECT_EQ(str(a->request({{"t", "send"}, {"conv", w.conv}, {"cmid", "x8"}, {"body", "b"}, {"reply_to", "3"}}), "code"),
              "INVALID_ARGUMENT");
}

// ---------------------------------------------------------------- edits

TEST_F(Contract, edits_follow_the_rules_in_order_and_the_highest_seq_wins) {
    auto w = make_world(db(), "edit", 2);
    auto a = login(port(), w.users[0]);
    auto b = login(port(), w.users[1]);
    auto s = send_msg(*a, w.conv, "m1", "teh typo");
    const auto t = num(s, "seq");
    auto e1 = edit_msg(*a, w.conv, t, "e1", "the typo");
    ASSERT_EQ(str(e1, "t"), "edited") << json::serialize(e1);
    EXPECT_EQ(num(e1, "seq"), t + 1);
    EXPECT_FALSE(e1.at("dup").as_bool());
    EXPECT_EQ(num(e1, "epoch"), 1);
    auto e2 = edit_msg(*a, w.conv, t, "e2", "the fixed typo");
    ASSERT_EQ(str(e2, "t"), "edited");
    // Resend: the original, dup; another body under the key: a mismatch.
    auto again = edit_msg(*a, w.conv, t, "e1", "the typo");
    EXPECT_TRUE(again.at("dup").as_bool());
    EXPECT_EQ(num(again, "seq"), num(e1, "seq"));
    EXPECT_EQ(str(edit_msg(*a, w.conv, t, "e1", "other"), "code"), "IDEMPOTENCY_MISMATCH");
    EXPECT_EQ(str(edit_msg(*a, w.conv, t, "m1", "the typo"), "code"), "IDEMPOTENCY_MISMATCH"); // a send's key
    // The winning edit in fetch, history and sync; the original row untouched.
    for (const auto& ev : {fetch_ev(*b, w.conv, t), history_ev(*b, w.conv, t), in_page(sync_conv(*b, w.conv, 0), t)}) {
        ASSERT_TRUE(ev.contains("edit")) << json::serialize(ev);
        EXPECT_EQ(str(ev, "body"), "teh typo");
        EXPECT_EQ(num(ev.at("edit").as_object(), "seq"), num(e2, "seq"));
        EXPECT_EQ(str(ev.at("edit").as_object(), "body"), "the fixed typo");
        EXPECT_GT(num(ev.at("edit").as_object(), "ts"), 0);
    }
    // The edit events themselves.
    auto ev1 = fetch_ev(*b, w.conv, num(e1, "seq"));
    EXPECT_EQ(str(ev1, "kind"), "edit");
    EXPECT_EQ(num(ev1, "target"), t);
    EXPECT_EQ(str(ev1, "body"), "the typo");
    EXPECT_EQ(str(ev1, "sender"), w.users[0].user);
    // Rejections, each writing nothing.
    const auto edits = [&] { return count_rows(*pg, "conv_id = " + q(w.conv) + " AND kind = 'edit'"); };
    EXPECT_EQ(str(edit_msg(*b, w.conv, t, "x1", "not yours"), "code"), "NOT_SENDER");
    EXPECT_EQ(str(edit_msg(*a, w.conv, 1, "x2", "a join"), "code"), "INVALID_ARGUMENT");
    EXPECT_EQ(str(edit_msg(*a, w.conv, num(e1, "seq"), "x2e", "an edit"), "code"), "INVALID_ARGUMENT");
    EXPECT_EQ(str(edit_msg(*a, w.conv, 999, "x3", "nothing"), "code"), "NOT_FOUND");
    EXPECT_EQ(str(edit_msg(*a, w.conv, 0, "x3z", "nothing"), "code"), "NOT_FOUND");
    auto r = send_msg(*a, w.conv, "m2", "to recall");
    ASSERT_EQ(str(a->request({{"t", "recall"}, {"conv", w.conv}, {"target", num(r, "seq")}, {"cmid", "rc"}}), "t"),
              "recalled");
    EXPECT_EQ(str(edit_msg(*a, w.conv, num(r, "seq"), "x4", "too late"), "code"), "ALREADY_RECALLED");
    EXPECT_TRUE(fetch_ev(*b, w.conv, num(r, "seq")).at("recalled").as_bool());
    // Not sender comes before recalled (the order of section 12).
    EXPECT_EQ(str(edit_msg(*b, w.conv, num(r, "seq"), "x5", "both"), "code"), "NOT_SENDER");
    EXPECT_EQ(edits(), "2");
    EXPECT_EQ(str(edit_msg(*a, w.conv, t, "x6", ""), "code"), "INVALID_ARGUMENT");
    EXPECT_EQ(str(a->request({{"t", "edit"}, {"conv", w.conv}, {"target", t}, {"cmid", "x7"}}), "code"),
              "INVALID_ARGUMENT");
    // A late joiner may not edit (or read) what came before; a removed sender edits nothing.
    auto cy = make_user(db(), unique_name("cy"));
    admin_ok(db(), {"member", "add", w.conv, cy.user});
    auto c = login(port(), cy);
    EXPECT_EQ(str(edit_msg(*c, w.conv, t, "x8", "mine now"), "code"), "NOT_MEMBER");
    auto stranger = login(port(), make_user(db(), unique_name("eve")));
    EXPECT_EQ(str(edit_msg(*stranger, w.conv, t, "x9", "hi"), "code"), "NOT_MEMBER");
    EXPECT_EQ(str(edit_msg(*stranger, "no-such-conv", t, "x9", "hi"), "code"), "NOT_MEMBER");
    admin_ok(db(), {"member", "remove", w.conv, w.users[0].user});
    EXPECT_EQ(str(edit_msg(*a, w.conv, t, "x10", "gone"), "code"), "NOT_MEMBER");
    EXPECT_EQ(edits(), "2");
    // Edits are no msg: unread counts the msgs only (m1; m2 is recalled).
    auto convs = b->request({{"t", "convs"}});
    for (const auto& ci : convs.at("convs").as_array())
        if (str(ci.as_object(), "conv") == w.conv) {
            EXPECT_EQ(num(ci.as_object(), "unread"), 1);
        }
}

TEST_F(Contract, the_edit_window_is_judged_by_the_database_clock_and_0_allows_none) {
    auto w = make_world(db(), "editwin", 2);
    auto a = login(port(), w.users[0]);
    EXPECT_EQ(pg->scalar("SELECT edit_window_ms FROM conversations WHERE conv_id = " + q(w.conv)), "172800000");
    admin_ok(db(), {"conv", "set", w.conv, "--edit-window-ms", "60000"});
    auto late = send_msg(*a, w.conv, "m1", "late");
    auto in_time = send_msg(*a, w.conv, "m2", "in time");
    auto age = [&](const json::object& sent, int seconds) {
        pg->scalar("UPDATE events SET created_at = clock_timestamp() - interval '" + std::to_string(seconds) +
                   " seconds' WHERE conv_id = " + q(w.conv) + " AND seq = " + std::to_string(num(sent, "seq")));
    };
    age(late, 61);
    age(in_time, 50);
    EXPECT_EQ(str(edit_msg(*a, w.conv, num(late, "seq"), "x1", "fix"), "code"), "EDIT_WINDOW_EXPIRED");
    EXPECT_EQ(str(edit_msg(*a, w.conv, num(in_time, "seq"), "x2", "fix"), "t"), "edited");
    admin_ok(db(), {"conv", "set", w.conv, "--edit-window-ms", "0"});
    auto fresh = send_msg(*a, w.conv, "m3", "fresh");
    EXPECT_EQ(str(edit_msg(*a, w.conv, num(fresh, "seq"), "x3", "fix"), "code"), "EDIT_WINDOW_EXPIRED");
    EXPECT_EQ(count_rows(*pg, "conv_id = " + q(w.conv) + " AND kind = 'edit'"), "1");
    EXPECT_NE(admin(db(), {"conv", "set", w.conv, "--edit-window-ms", "-1"}).first, 0);
}

// ---------------------------------------------------------------- reactions

TEST_F(Contract, reactions_count_once_per_user_and_state_and_resends_are_dups) {
    auto w = make_world(db(), "react", 3);
    auto a = login(port(), w.users[0]);
    auto b = login(port(), w.users[1]);
    auto c = login(port(), w.users[2]);
    auto s = send_msg(*a, w.conv, "m1", "vote");
    const auto t = num(s, "seq");
    auto ra = react(*a, w.conv, t, "ra", "👍", true);
    ASSERT_EQ(str(ra, "t"), "reacted") << json::serialize(ra);
    EXPECT_TRUE(ra.at("changed").as_bool());
    EXPECT_FALSE(ra.at("dup").as_bool());
    EXPECT_EQ(num(ra, "seq"), t + 1);
    auto rb = react(*b, w.conv, t, "rb", "👍", true);
    auto rb2 = react(*b, w.conv, t, "rb2", "👍", true); // already on: nothing appended
    EXPECT_FALSE(rb2.at("changed").as_bool());
    EXPECT_FALSE(rb2.at("dup").as_bool());
    EXPECT_EQ(num(rb2, "seq"), num(rb, "seq"));
    auto rc = react(*c, w.conv, t, "rc", "👍", true);
    auto rc_off = react(*c, w.conv, t, "rc-off", "👍", false);
    EXPECT_TRUE(rc_off.at("changed").as_bool());
    auto nothing = react(*c, w.conv, t, "rc-none", "🎉", false); // off, never on
    EXPECT_FALSE(nothing.at("changed").as_bool());
    EXPECT_TRUE(nothing.at("seq").is_null()) << json::serialize(nothing);
    auto heart = react(*b, w.conv, t, "rb-heart", "❤", true);
    // Resends of every key: the appended ones are dups of their events.
    for (auto [cl, key, emoji, on, orig] :
         std::vector<std::tuple<WsClient*, std::string, std::string, bool, json::object>>{
             {a.get(), "ra", "👍", true, ra}, {b.get(), "rb", "👍", true, rb}, {c.get(), "rc", "👍", true, rc},
             {c.get(), "rc-off", "👍", false, rc_off}, {b.get(), "rb-heart", "❤", true, heart}}) {
        auto again = react(*cl, w.conv, t, key, emoji, on);
        EXPECT_TRUE(again.at("dup").as_bool()) << key << ": " << json::serialize(again);
        EXPECT_EQ(num(again, "seq"), num(orig, "seq")) << key;
    }
    EXPECT_EQ(str(react(*a, w.conv, t, "ra", "👍", false), "code"), "IDEMPOTENCY_MISMATCH");
    EXPECT_EQ(str(react(*a, w.conv, t, "ra", "🎉", true), "code"), "IDEMPOTENCY_MISMATCH");
    // Events: 5 appended (a, b, c on; c off; b heart), none for the no-ops.
    EXPECT_EQ(count_rows(*pg, "conv_id = " + q(w.conv) + " AND kind = 'reaction'"), "5");
    auto ev = fetch_ev(*b, w.conv, num(rc_off, "seq"));
    EXPECT_EQ(str(ev, "kind"), "reaction");
    EXPECT_EQ(str(ev, "emoji"), "👍");
    EXPECT_FALSE(ev.at("on").as_bool());
    EXPECT_EQ(num(ev, "target"), t);
    // Counts in pages, most counted first, `me` per caller.
    for (const auto& msg : {history_ev(*b, w.conv, t), fetch_ev(*b, w.conv, t), in_page(sync_conv(*b, w.conv, 0), t)}) {
        auto rs = reactions_of(msg);
        EXPECT_EQ(rs["👍"], std::make_pair(std::int64_t{2}, true)) << json::serialize(msg);
        EXPECT_EQ(rs["❤"], std::make_pair(std::int64_t{1}, true));
        EXPECT_EQ(rs.size(), 2u);
        EXPECT_EQ(str(msg.at("reactions").as_array()[0].as_object(), "emoji"), "👍");
        EXPECT_EQ(num(msg, "reactions_seq"), num(heart, "seq"));
    }
    auto rs_c = reactions_of(history_ev(*c, w.conv, t));
    EXPECT_EQ(rs_c["👍"], std::make_pair(std::int64_t{2}, false));
    // A message nobody reacted to carries neither field.
    auto plain = send_msg(*a, w.conv, "m2", "quiet");
    auto pev = fetch_ev(*a, w.conv, num(plain, "seq"));
    EXPECT_FALSE(pev.contains("reactions"));
    EXPECT_FALSE(pev.contains("reactions_seq"));
    EXPECT_FALSE(pev.contains("edit"));
    // Reactions are no msg for unread.
    auto convs = c->request({{"t", "convs"}});
    for (const auto& ci : convs.at("convs").as_array())
        if (str(ci.as_object(), "conv") == w.conv) {
            EXPECT_EQ(num(ci.as_object(), "unread"), 2);
        }
}

TEST_F(Contract, react_checks_and_the_20_emoji_limit) {
    auto w = make_world(db(), "reactno", 2);
    auto a = login(port(), w.users[0]);
    auto b = login(port(), w.users[1]);
    auto s = send_msg(*a, w.conv, "m1", "popular");
    const auto t = num(s, "seq");
    for (int i = 0; i < 20; ++i)
        ASSERT_TRUE(react(*b, w.conv, t, "k" + std::to_string(i), "e" + std::to_string(i), true).at("changed").as_bool());
    EXPECT_EQ(str(react(*b, w.conv, t, "k20", "e20", true), "code"), "INVALID_ARGUMENT");
    // Off one, then another fits; the sender may react to their own.
    EXPECT_TRUE(react(*b, w.conv, t, "k21", "e0", false).at("changed").as_bool());
    EXPECT_TRUE(react(*b, w.conv, t, "k22", "e20", true).at("changed").as_bool());
    EXPECT_TRUE(react(*a, w.conv, t, "k23", "e0", true).at("changed").as_bool());
    // At most 20 entries in a page, most counted first.
    auto ev = history_ev(*a, w.conv, t);
    ASSERT_TRUE(ev.contains("reactions"));
    EXPECT_EQ(ev.at("reactions").as_array().size(), 20u);
    EXPECT_EQ(num(ev.at("reactions").as_array()[0].as_object(), "count"), 1);
    // Checks as for edit, up to "not recalled".
    EXPECT_EQ(str(react(*b, w.conv, 2, "x1", "x", true), "code"), "INVALID_ARGUMENT"); // b's join
    EXPECT_EQ(str(react(*b, w.conv, 9999, "x2", "x", true), "code"), "NOT_FOUND");
    ASSERT_EQ(str(a->request({{"t", "recall"}, {"conv", w.conv}, {"target", t}, {"cmid", "rc"}}), "t"), "recalled");
    EXPECT_EQ(str(react(*b, w.conv, t, "x3", "x", true), "code"), "ALREADY_RECALLED");
    auto stranger = login(port(), make_user(db(), unique_name("eve")));
    EXPECT_EQ(str(react(*stranger, w.conv, t, "x4", "x", true), "code"), "NOT_MEMBER");
    // The codec's emoji rules.
    EXPECT_EQ(str(react(*b, w.conv, t, "x5", "", true), "code"), "INVALID_ARGUMENT");
    EXPECT_EQ(str(react(*b, w.conv, t, "x6", std::string(65, 'x'), true), "code"), "INVALID_ARGUMENT");
    EXPECT_EQ(str(react(*b, w.conv, t, "x7", "a\nb", true), "code"), "INVALID_ARGUMENT");
    EXPECT_EQ(str(b->request({{"t", "react"}, {"conv", w.conv}, {"target", t}, {"cmid", "x8"}, {"emoji", "x"}}), "code"),
              "INVALID_ARGUMENT");
    EXPECT_EQ(str(b->request({{"t", "react"}, {"conv", w.conv}, {"target", t}, {"cmid", "x9"}, {"emoji", "x"},
                              {"on", 1}}),
                  "code"),
              "INVALID_ARGUMENT");
    EXPECT_EQ(count_rows(*pg, "conv_id = " + q(w.conv) + " AND client_msg_id LIKE 'x%'"), "0");
}

// Edits and reactions are pushed like any event.
TEST_F(Contract, edits_and_reactions_are_pushed) {
    auto w = make_world(db(), "changepush", 2);
    auto a = login(port(), w.users[0]);
    auto b = login(port(), w.users[1]);
    ASSERT_EQ(str(b->request({{"t", "sub"}}), "t"), "subscribed");
    auto s = send_msg(*a, w.conv, "m1", "hi");
    ASSERT_TRUE(b->wait_push([&](const json::object& f) { return str(f, "t") == "event"; }));
    auto e = edit_msg(*a, w.conv, num(s, "seq"), "e1", "hello");
    auto pe = b->wait_push([&](const json::object& f) { return str(f, "t") == "event"; });
    ASSERT_TRUE(pe);
    EXPECT_EQ(str(pe->at("ev").as_object(), "kind"), "edit");
    EXPECT_EQ(num(pe->at("ev").as_object(), "seq"), num(e, "seq"));
    auto r = react(*a, w.conv, num(s, "seq"), "r1", "👍", true);
    auto pr = b->wait_push([&](const json::object& f) { return str(f, "t") == "event"; });
    ASSERT_TRUE(pr);
    EXPECT_EQ(str(pr->at("ev").as_object(), "kind"), "reaction");
    EXPECT_EQ(num(pr->at("ev").as_object(), "seq"), num(r, "seq"));
    EXPECT_TRUE(pr->at("ev").as_object().at("on").as_bool());
}

// A page reads a msg's changes only when its seq range holds one (a changed
// msg or a recall: server/src/store/store_common.cpp, with_changes); the
// range comes from the request, so each end of it is checked: the changed
// msg as a page's first and last event, a page beside it without changes,
// and a page whose only change is a recall.
TEST_F(Contract, pages_show_changes_at_either_end_of_their_range) {
    auto w = make_world(db(), "edges", 2);
    auto a = login(port(), w.users[0]);
    auto b = login(port(), w.users[1]);
    std::vector<std::int64_t> m;
    for (int i = 0; i < 6; ++i) m.push_back(num(send_msg(*a, w.conv, "m" + std::to_string(i), "text " + std::to_string(i)), "seq"));
    ASSERT_EQ(str(edit_msg(*a, w.conv, m[1], "e1", "edited 1"), "t"), "edited");
    ASSERT_EQ(str(react(*b, w.conv, m[3], "r1", "👍", true), "t"), "reacted");
    ASSERT_EQ(str(a->request({{"t", "recall"}, {"conv", w.conv}, {"target", m[5]}, {"cmid", "rc"}}), "t"), "recalled");
    const auto history = [&](std::int64_t before, std::int64_t limit) {
        auto h = b->request({{"t", "history"}, {"conv", w.conv}, {"before", before}, {"limit", limit}});
        EXPECT_EQ(str(h, "t"), "page") << json::serialize(h);
        return h;
    };
    const auto sync = [&](std::int64_t after, std::int64_t limit) {
        auto p = b->request({{"t", "sync"}, {"conv", w.conv}, {"after", after}, {"limit", limit}});
        EXPECT_EQ(str(p, "t"), "page") << json::serialize(p);
        return p;
    };
    const auto edited = [](const json::object& ev) {
        return ev.contains("edit") && str(ev.at("edit").as_object(), "body") == "edited 1";
    };
    const auto recalled = [](const json::object& ev) { return ev.contains("recalled") && ev.at("recalled").as_bool(); };
    // m1 edited: the oldest event of a history page, the newest of another,
    // the first and the last of sync pages.
    EXPECT_TRUE(edited(in_page(history(m[1] + 3, 3), m[1])));
    EXPECT_TRUE(edited(in_page(history(m[1] + 1, 3), m[1])));
    EXPECT_TRUE(edited(in_page(sync(m[1] - 1, 3), m[1])));
    EXPECT_TRUE(edited(in_page(sync(m[1] - 3, 3), m[1])));
    // m2 alone: nothing changed in its range, though its neighbours changed.
    auto plain = in_page(history(m[2] + 1, 1), m[2]);
    ASSERT_FALSE(plain.empty());
    EXPECT_FALSE(plain.contains("edit"));
    EXPECT_TRUE(reactions_of(plain).empty());
    EXPECT_FALSE(recalled(plain));
    // m3 reacted, alone and at the end of a page.
    EXPECT_EQ(reactions_of(in_page(history(m[3] + 1, 1), m[3]))["👍"], (std::pair<std::int64_t, bool>{1, true}));
    EXPECT_EQ(reactions_of(in_page(sync(m[3] - 1, 1), m[3]))["👍"], (std::pair<std::int64_t, bool>{1, true}));
    // m5: a recall is its range's only change.
    EXPECT_TRUE(recalled(in_page(history(m[5] + 1, 1), m[5])));
    EXPECT_TRUE(recalled(in_page(sync(m[5] - 1, 1), m[5])));
    EXPECT_FALSE(recalled(in_page(history(m[5], 1), m[4])));
}

// A reply's push carries reply_to as its page and fetch do (the sender's own
// gateway built the pushed event from the request and left it out).
TEST_F(Contract, a_pushed_reply_carries_reply_to) {
    auto w = make_world(db(), "replypush", 2);
    auto a = login(port(), w.users[0]);
    auto b = login(port(), w.users[1]);
    ASSERT_EQ(str(b->request({{"t", "sub"}}), "t"), "subscribed");
    auto s = send_msg(*a, w.conv, "m1", "question?");
    ASSERT_TRUE(b->wait_push([&](const json::object& f) { return str(f, "t") == "event"; }));
    auto r = reply_msg(*a, w.conv, "r1", "answer", num(s, "seq"));
    ASSERT_EQ(str(r, "t"), "sent") << json::serialize(r);
    auto p = b->wait_push([&](const json::object& f) { return str(f, "t") == "event"; });
    ASSERT_TRUE(p);
    const auto& ev = p->at("ev").as_object();
    EXPECT_EQ(num(ev, "seq"), num(r, "seq"));
    ASSERT_TRUE(ev.contains("reply_to")) << json::serialize(ev);
    EXPECT_EQ(num(ev, "reply_to"), num(s, "seq"));
}

// The heaviest message the rules allow still fits one 64 KiB frame in a
// page, a fetch and a push: the longest body and edit of control characters
// (6 bytes each as JSON), 50 edits, 1,000 reactions from 1,000 users on 25
// emoji of 64 bytes that JSON escapes to 128. The reactions are written into
// the tables im_change maintains (the same rows 1,000 react requests would
// leave; the requests themselves are tested above).
TEST_F(Contract, a_message_with_1000_reactions_and_50_edits_fits_every_frame) {
    auto w = make_world(db(), "heavy", 2);
    auto a = login(port(), w.users[0]);
    auto b = login(port(), w.users[1]);
    const std::string worst(4000, '\x01');
    auto s = send_msg(*a, w.conv, "m1", worst);
    ASSERT_EQ(str(s, "t"), "sent") << json::serialize(s);
    const auto t = num(s, "seq");
    std::int64_t last_edit = 0;
    for (int i = 0; i < 50; ++i) {
        auto e = edit_msg(*a, w.conv, t, "e" + std::to_string(i), worst.substr(0, 3999) + std::to_string(i % 10));
        ASSERT_EQ(str(e, "t"), "edited") << json::serialize(e);
        last_edit = num(e, "seq");
    }
    const std::string popular = std::string(62, '"') + "AA"; // one of the 25, so in the top 20
    auto mine = react(*b, w.conv, t, "rb", popular, true);
    ASSERT_TRUE(mine.at("changed").as_bool());
    pg->scalar("INSERT INTO reaction_state (conv_id, target_seq, user_id, emoji, is_on, seq) "
               "SELECT " + q(w.conv) + ", " + std::to_string(t) + ", 'heavy-u' || u, "
               "repeat('\"', 62) || chr(65 + u % 25) || chr(65 + u % 25), true, " + std::to_string(num(mine, "seq")) +
               " FROM generate_series(1, 999) u");
    pg->scalar("INSERT INTO reaction_counts (conv_id, target_seq, emoji, count) "
               "SELECT conv_id, target_seq, emoji, count(*) FROM reaction_state WHERE conv_id = " + q(w.conv) +
               " AND user_id LIKE 'heavy-u%' GROUP BY 1, 2, 3 "
               "ON CONFLICT (conv_id, target_seq, emoji) DO UPDATE SET count = reaction_counts.count + EXCLUDED.count");
    ASSERT_EQ(pg->scalar("SELECT sum(count) FROM reaction_counts WHERE conv_id = " + q(w.conv)), "1000");
    // ... and the summary im_change keeps beside them (schema/018), as its
    // next reaction would write it.
    pg->scalar("UPDATE msg_changes x SET reactions_top = (SELECT json_agg(json_build_array(t.emoji, t.count) "
               "ORDER BY t.count DESC, t.emoji COLLATE \"C\")::text FROM (SELECT n.emoji, n.count FROM reaction_counts n "
               "WHERE n.conv_id = x.conv_id AND n.target_seq = x.seq AND n.count > 0 "
               "ORDER BY n.count DESC, n.emoji COLLATE \"C\" LIMIT 20) t) "
               "WHERE x.conv_id = " + q(w.conv) + " AND x.seq = " + std::to_string(t));
    auto check = [&](const json::object& ev, const std::string& where) {
        SCOPED_TRACE(where);
        ASSERT_EQ(num(ev, "seq"), t);
        EXPECT_EQ(num(ev.at("edit").as_object(), "seq"), last_edit);
        ASSERT_TRUE(ev.contains("reactions"));
        EXPECT_EQ(ev.at("reactions").as_array().size(), 20u);
        EXPECT_EQ(num(ev.at("reactions").as_array()[0].as_object(), "count"), 40); // 39 + b's on "AA", 40 on the others
    };
    auto f = b->request({{"t", "fetch"}, {"conv", w.conv}, {"seq", t}});
    EXPECT_LE(json::serialize(f).size(), im::max_frame_bytes);
    check(f.at("ev").as_object(), "fetch");
    EXPECT_TRUE(reactions_of(f.at("ev").as_object())[popular].second) << "me";
    auto h = b->request({{"t", "history"}, {"conv", w.conv}, {"before", 0}, {"limit", 200}});
    EXPECT_LE(json::serialize(h).size(), im::max_frame_bytes);
    auto hs = b->request({{"t", "history"}, {"conv", w.conv}, {"before", t + 1}, {"limit", 200}});
    EXPECT_LE(json::serialize(hs).size(), im::max_frame_bytes);
    check(in_page(hs, t), "history");
    auto p = b->request({{"t", "sync"}, {"conv", w.conv}, {"after", t - 1}, {"limit", 200}});
    EXPECT_LE(json::serialize(p).size(), im::max_frame_bytes);
    check(in_page(p, t), "sync");
    // A push: what the fan-out reads and encodes (one frame for all).
    im::FaultRegistry faults(false);
    im::Store store(faults, {});
    pqxx::connection conn(db());
    auto evs = store.push_events(conn, w.conv, t, t);
    ASSERT_EQ(evs.size(), 1u);
    const auto push = im::encode_event_push(evs[0]);
    EXPECT_LE(push.size(), im::max_frame_bytes);
    check(json::parse(push).as_object().at("ev").as_object(), "push");
    std::printf("heavy message: fetch %zu bytes, sync page %zu, push %zu (limit %zu)\n", json::serialize(f).size(),
                json::serialize(p).size(), push.size(), im::max_frame_bytes);
}

} // namespace
