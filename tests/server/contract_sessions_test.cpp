// The contract against a real imserver and a real PostgreSQL (contract.hpp):
// sessions: hello, tokens, frames, limits of a frame; the HTTP endpoints.
#include "contract.hpp"

using namespace im::test;

namespace {

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
