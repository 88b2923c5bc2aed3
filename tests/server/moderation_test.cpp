// Rate limits and moderation (spec/server.md, "Rate limits and moderation";
// issue 52 items 2-4): a real imserver with --send-rate/--send-burst and the
// backend API, a real PostgreSQL. Sends, edits and reactions over the
// user's bucket answer RATE_LIMITED with retry_ms and write nothing; a resend
// after retry_ms lands.
#include "common.hpp"

#include <boost/json.hpp>

using namespace im::test;

namespace {

// A burst of 5 and 2 a second: small enough to reach at once, slow enough
// that the refill in a test's round trips stays below one token.
const std::vector<std::string> mod_flags = {"--quiet", "--api-listen", "127.0.0.1:0", "--send-rate", "2",
                                            "--send-burst", "5"};

class Moderation : public ::testing::Test {
protected:
    static inline TestPostgres* pg = nullptr;
    static inline ServerProcess* srv = nullptr;
    static inline std::string admin_key;

    static void SetUpTestSuite() {
        pg = new TestPostgres();
        srv = new ServerProcess(pg->url(), mod_flags);
        admin_key = admin_ok(pg->url(), {"apikey", "add", "suite-admin", "--scope", "admin"});
    }
    static void TearDownTestSuite() {
        delete srv;
        delete pg;
    }
    static std::pair<int, json::object> call(const std::string& method, const std::string& target,
                                             const std::string& body = {}) {
        auto [st, text] = srv->api(method, target, body, admin_key);
        json::error_code ec;
        auto v = json::parse(text, ec);
        return {st, !ec && v.is_object() ? v.as_object() : json::object{}};
    }
    static std::string scalar(const std::string& sql) { return pg->scalar(sql); }
};

std::string code_of(const json::object& o) {
    if (str(o, "t") != "error") return "OK:" + std::string(str(o, "t"));
    return str(o, "code");
}

TEST_F(Moderation, sends_over_the_burst_answer_rate_limited_with_retry_ms_and_write_nothing) {
    auto w = make_world(pg->url(), "rl", 2);
    auto c = login(srv->port(), w.users[0]);
    // Pipelined: all seven are read before the first is answered, so the
    // bucket (5) is what decides, not the time between them.
    std::vector<std::string> cmids;
    for (int i = 0; i < 7; ++i) {
        cmids.push_back(uuid4());
        c->send_json({{"t", "send"}, {"rid", "r" + std::to_string(i)}, {"conv", w.conv}, {"cmid", cmids.back()},
                      {"body", "m" + std::to_string(i)}});
    }
    std::map<std::string, json::object> replies;
    while (replies.size() < 7) {
        auto f = c->next(10s);
        ASSERT_TRUE(f) << "no reply";
        if (f->contains("rid")) replies[str(*f, "rid")] = *f;
    }
    int ok = 0, limited = 0;
    std::vector<std::string> limited_cmids;
    for (int i = 0; i < 7; ++i) {
        const auto& r = replies["r" + std::to_string(i)];
        if (str(r, "t") == "sent") ++ok;
        else {
            ASSERT_EQ(str(r, "code"), "RATE_LIMITED") << json::serialize(r);
            ASSERT_TRUE(r.contains("retry_ms")) << json::serialize(r);
            EXPECT_GT(num(r, "retry_ms"), 0);
            EXPECT_LE(num(r, "retry_ms"), 500); // one token at 2 a second
            ++limited;
            limited_cmids.push_back(cmids[i]);
        }
    }
    EXPECT_EQ(ok, 5);
    EXPECT_EQ(limited, 2);
    // Nothing written for the limited ones.
    for (const auto& cm : limited_cmids)
        EXPECT_EQ(count_rows(*pg, "client_msg_id = " + q(cm)), "0") << cm;
    EXPECT_EQ(count_rows(*pg, "conv_id = " + q(w.conv) + " AND kind = 'msg'"), "5");
    EXPECT_GE(srv->metric("im_writes_rate_limited_total"), 2);

    // After retry_ms the resend with the same cmid lands, once.
    for (const auto& cm : limited_cmids) {
        json::object r;
        for (int attempt = 0; attempt < 20; ++attempt) {
            r = send_msg(*c, w.conv, cm, "again");
            if (str(r, "t") == "sent") break;
            ASSERT_EQ(str(r, "code"), "RATE_LIMITED") << json::serialize(r);
            std::this_thread::sleep_for(std::chrono::milliseconds(num(r, "retry_ms")));
        }
        ASSERT_EQ(str(r, "t"), "sent") << json::serialize(r);
        EXPECT_EQ(count_rows(*pg, "client_msg_id = " + q(cm)), "1");
    }
}

TEST_F(Moderation, edits_and_reactions_take_from_the_same_bucket_and_another_user_is_not_limited) {
    auto w = make_world(pg->url(), "rle", 2);
    auto a = login(srv->port(), w.users[0]);
    auto b = login(srv->port(), w.users[1]);
    auto sent = send_msg(*a, w.conv, uuid4(), "target");
    ASSERT_EQ(str(sent, "t"), "sent") << json::serialize(sent);
    const auto target = num(sent, "seq");
    // Four more pipelined writes empty a's bucket (5): edits and reactions.
    for (int i = 0; i < 4; ++i) {
        if (i % 2)
            a->send_json({{"t", "edit"}, {"rid", "e" + std::to_string(i)}, {"conv", w.conv}, {"target", target},
                          {"cmid", uuid4()}, {"body", "edit " + std::to_string(i)}});
        else
            a->send_json({{"t", "react"}, {"rid", "e" + std::to_string(i)}, {"conv", w.conv}, {"target", target},
                          {"cmid", uuid4()}, {"emoji", "x" + std::to_string(i)}, {"on", true}});
    }
    a->send_json({{"t", "edit"}, {"rid", "over-edit"}, {"conv", w.conv}, {"target", target}, {"cmid", uuid4()},
                  {"body", "over"}});
    a->send_json({{"t", "react"}, {"rid", "over-react"}, {"conv", w.conv}, {"target", target}, {"cmid", uuid4()},
                  {"emoji", "over"}, {"on", true}});
    std::map<std::string, json::object> replies;
    while (replies.size() < 6) {
        auto f = a->next(10s);
        ASSERT_TRUE(f) << "no reply";
        if (f->contains("rid")) replies[str(*f, "rid")] = *f;
    }
    for (int i = 0; i < 4; ++i)
        EXPECT_NE(str(replies["e" + std::to_string(i)], "t"), "error") << json::serialize(replies["e" + std::to_string(i)]);
    EXPECT_EQ(code_of(replies["over-edit"]), "RATE_LIMITED");
    EXPECT_TRUE(replies["over-edit"].contains("retry_ms"));
    EXPECT_EQ(code_of(replies["over-react"]), "RATE_LIMITED");
    EXPECT_EQ(count_rows(*pg, "conv_id = " + q(w.conv) + " AND body = 'over'"), "0");
    EXPECT_EQ(scalar("SELECT count(*) FROM events WHERE conv_id = " + q(w.conv) + " AND kind = 'reaction' AND "
                     "emoji = 'over'"), "0");
    // The other member's bucket is their own.
    auto other = send_msg(*b, w.conv, uuid4(), "from b");
    EXPECT_EQ(str(other, "t"), "sent") << json::serialize(other);
}

TEST_F(Moderation, the_backend_apis_sends_are_not_limited) {
    auto w = make_world(pg->url(), "rlapi", 2);
    for (int i = 0; i < 8; ++i) {
        auto [st, o] = call("POST", "/v1/conversations/" + w.conv + "/messages",
                            json::serialize(json::object{{"sender", w.users[0].user}, {"cmid", uuid4()},
                                                         {"body", "api " + std::to_string(i)}}));
        EXPECT_TRUE(st == 200 || st == 201) << st << " " << json::serialize(o);
    }
    EXPECT_EQ(count_rows(*pg, "conv_id = " + q(w.conv) + " AND kind = 'msg'"), "8");
}

} // namespace
