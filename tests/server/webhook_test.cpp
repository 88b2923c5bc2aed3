// Webhooks (server.md "Events to the app's backend (webhooks)"): real
// gateways with --api-listen, a real PostgreSQL, a real receiver
// (webhook_receiver.hpp: a Beast HTTP server that checks signatures with its
// own HMAC) that fails, disappears and comes back, and a gateway killed with
// SIGKILL mid-delivery. Every committed event at least once, per-conversation
// order, valid signatures, nothing that was not committed; failed for good
// after the give-up time, listed and replayed; registration through the
// backend API and the admin CLI.
#include "common.hpp"
#include "webhook_receiver.hpp"

#include <boost/json.hpp>

#include <iostream>
#include <set>

using namespace im::test;

namespace {

const std::string secret = "0123456789abcdef-test-secret";

class Webhooks : public ::testing::Test {
protected:
    static inline TestPostgres* pg = nullptr;
    static inline std::string write_key, admin_key;

    static void SetUpTestSuite() {
        pg = new TestPostgres();
        write_key = admin_ok(pg->url(), {"apikey", "add", "wh-write", "--scope", "write"});
        admin_key = admin_ok(pg->url(), {"apikey", "add", "wh-admin", "--scope", "admin"});
    }
    static void TearDownTestSuite() { delete pg; }
    void TearDown() override {
        // Each test registers its own webhooks; none outlives it.
        pg->scalar("DELETE FROM webhooks");
    }

    static std::vector<std::string> flags(std::vector<std::string> more = {}) {
        std::vector<std::string> f = {"--quiet", "--api-listen", "127.0.0.1:0", "--api-auth-failures", "1000",
                                      "--webhook-poll-ms", "20", "--webhook-refresh-ms", "200",
                                      "--webhook-retry-max-ms", "400"};
        f.insert(f.end(), more.begin(), more.end());
        return f;
    }
    static std::pair<int, json::object> call(const ServerProcess& srv, const std::string& method,
                                             const std::string& target, const json::object& body = {},
                                             const std::string& key = admin_key) {
        auto [st, text] = srv.api(method, target, body.empty() ? std::string() : json::serialize(body), key);
        json::error_code ec;
        auto v = json::parse(text, ec);
        return {st, !ec && v.is_object() ? v.as_object() : json::object{}};
    }
    // Users and a group conversation made through the API; returns the conv.
    static std::string make_conv(const ServerProcess& srv, const std::string& prefix, std::vector<std::string>& users) {
        json::array members;
        for (int i = 0; i < 2; ++i) {
            users.push_back(unique_name(prefix + "u"));
            EXPECT_EQ(call(srv, "POST", "/v1/users", {{"user", users.back()}}, write_key).first, 201);
            members.push_back(json::string(users.back()));
        }
        const std::string conv = unique_name(prefix + "c");
        EXPECT_EQ(call(srv, "POST", "/v1/conversations", {{"conv", conv}, {"kind", "group"}, {"members", members}},
                       write_key).first, 201);
        return conv;
    }
    static std::int64_t post_msg(const ServerProcess& srv, const std::string& conv, const std::string& sender,
                                 const std::string& body) {
        auto [st, o] = call(srv, "POST", "/v1/conversations/" + conv + "/messages",
                            {{"sender", sender}, {"cmid", uuid4()}, {"body", body}}, write_key);
        EXPECT_EQ(st, 200) << json::serialize(o);
        return st == 200 ? o.at("seq").as_int64() : 0;
    }
    static std::string add_hook(const ServerProcess& srv, const std::string& url, json::array kinds = {}) {
        json::object body{{"url", url}, {"secret", secret}};
        if (!kinds.empty()) body["events"] = std::move(kinds);
        auto [st, o] = call(srv, "POST", "/v1/webhooks", body);
        EXPECT_EQ(st, 201) << json::serialize(o);
        return st == 201 ? std::string(o.at("id").as_string()) : std::string();
    }
    // The ids of the committed events of `conv` above `after`, of `kinds` (all when empty).
    static std::set<std::string> committed(const std::string& conv, std::int64_t after, const std::string& kinds = "") {
        std::set<std::string> out;
        std::string list = pg->scalar("SELECT coalesce(string_agg(conv_id || ':' || seq, ',' ORDER BY seq), '') "
                                      "FROM events WHERE conv_id = " + q(conv) + " AND seq > " + std::to_string(after) +
                                      (kinds.empty() ? "" : " AND kind IN (" + kinds + ")"));
        std::stringstream ss(list);
        std::string id;
        while (std::getline(ss, id, ','))
            if (!id.empty()) out.insert(id);
        return out;
    }
    static bool has_all(const WebhookReceiver& r, const std::set<std::string>& want) {
        auto got = r.ids();
        for (const auto& id : want)
            if (!got.count(id)) return false;
        return true;
    }
};

TEST_F(Webhooks, registration_through_the_api_and_the_cli_lists_removes_and_refuses_bad_input) {
    ServerProcess srv(pg->url(), flags({"--webhook-workers", "0"}));
    // Scope: admin only.
    EXPECT_EQ(call(srv, "POST", "/v1/webhooks", {{"url", "http://127.0.0.1:1/x"}}, write_key).first, 403);
    EXPECT_EQ(call(srv, "GET", "/v1/webhooks", {}, write_key).first, 403);
    // Bad input: 400, nothing written.
    EXPECT_EQ(call(srv, "POST", "/v1/webhooks", {{"url", "ftp://x/"}}).first, 400);
    EXPECT_EQ(call(srv, "POST", "/v1/webhooks", {{"url", "http://x/"}, {"events", json::array{"msg", "bogus"}}}).first, 400);
    EXPECT_EQ(call(srv, "POST", "/v1/webhooks", {{"url", "http://x/"}, {"secret", "short"}}).first, 400);
    EXPECT_EQ(call(srv, "POST", "/v1/webhooks", {{"url", "http://x/"}, {"colour", "red"}}).first, 400);
    EXPECT_EQ(pg->scalar("SELECT count(*) FROM webhooks"), "0");

    // No secret given: one is made and answered once.
    auto [st, made] = call(srv, "POST", "/v1/webhooks", {{"url", "http://127.0.0.1:1/a"}, {"events", json::array{"msg"}}});
    ASSERT_EQ(st, 201) << json::serialize(made);
    const std::string id(made.at("id").as_string());
    EXPECT_EQ(made.at("secret").as_string().size(), 64u);
    const std::string id2 = add_hook(srv, "https://example.invalid/b");
    auto [lst, list] = call(srv, "GET", "/v1/webhooks");
    ASSERT_EQ(lst, 200);
    const auto& hooks = list.at("webhooks").as_array();
    ASSERT_EQ(hooks.size(), 2u);
    for (const auto& h : hooks) {
        EXPECT_FALSE(h.as_object().contains("secret")) << "a list never shows a secret";
        EXPECT_EQ(h.as_object().at("backlog").as_int64(), 0);
    }
    EXPECT_EQ(hooks[0].as_object().at("events").as_array().size(), 1u);
    EXPECT_EQ(hooks[1].as_object().at("events").as_array().size(), 6u); // none named: all kinds

    // Deliveries and replay of an unknown webhook or conversation: 404.
    EXPECT_EQ(call(srv, "GET", "/v1/webhooks/wh_nope/deliveries?status=failed").first, 404);
    EXPECT_EQ(call(srv, "POST", "/v1/webhooks/" + id + "/replay", {{"conv", "no-such-conv"}, {"from_seq", 1}}).first, 404);
    auto [dst, del] = call(srv, "GET", "/v1/webhooks/" + id + "/deliveries?status=failed&limit=10");
    EXPECT_EQ(dst, 200);
    EXPECT_TRUE(del.at("deliveries").as_array().empty());

    EXPECT_EQ(call(srv, "DELETE", "/v1/webhooks/" + id).first, 200);
    EXPECT_EQ(call(srv, "DELETE", "/v1/webhooks/" + id).first, 404);

    // The admin CLI: add (prints the id), list (no secrets), remove.
    const std::string cli_id = admin_ok(pg->url(), {"webhook", "add", "http://127.0.0.1:1/c", "--events", "msg,edit",
                                                    "--secret", secret});
    EXPECT_EQ(cli_id.rfind("wh_", 0), 0u) << cli_id;
    const std::string cli_list = admin_ok(pg->url(), {"webhook", "list"});
    EXPECT_NE(cli_list.find(cli_id), std::string::npos);
    EXPECT_NE(cli_list.find("edit,msg"), std::string::npos) << cli_list;
    EXPECT_EQ(cli_list.find(secret), std::string::npos);
    EXPECT_EQ(admin(pg->url(), {"webhook", "add", "gopher://x"}).first, 2);
    admin_ok(pg->url(), {"webhook", "remove", cli_id});
    admin_ok(pg->url(), {"webhook", "remove", id2});
    EXPECT_EQ(admin(pg->url(), {"webhook", "remove", cli_id}).first, 1);
    EXPECT_EQ(pg->scalar("SELECT count(*) FROM webhooks"), "0");

    // In the OpenAPI document.
    auto [ost, doc] = call(srv, "GET", "/v1/openapi.json");
    ASSERT_EQ(ost, 200);
    const auto& paths = doc.at("paths").as_object();
    for (const char* p : {"/v1/webhooks", "/v1/webhooks/{id}", "/v1/webhooks/{id}/deliveries", "/v1/webhooks/{id}/replay"})
        EXPECT_TRUE(paths.contains(p)) << p;
}

TEST_F(Webhooks, every_event_arrives_signed_in_order_while_the_receiver_fails_disappears_and_comes_back) {
    ServerProcess srv(pg->url(), flags());
    WebhookReceiver rx(secret);
    std::vector<std::string> users;
    const std::string a = make_conv(srv, "wha", users);
    const std::string b = make_conv(srv, "whb", users);
    const std::int64_t a0 = std::stoll(pg->scalar("SELECT next_seq - 1 FROM conversations WHERE conv_id = " + q(a)));
    const std::int64_t b0 = std::stoll(pg->scalar("SELECT next_seq - 1 FROM conversations WHERE conv_id = " + q(b)));
    add_hook(srv, rx.url());
    auto send_some = [&](int n, const std::string& tag) {
        for (int i = 0; i < n; ++i) {
            post_msg(srv, a, users[0], tag + " a " + std::to_string(i));
            post_msg(srv, b, users[2], tag + " b " + std::to_string(i));
        }
    };
    send_some(10, "fine");
    wait_until([&] { return has_all(rx, committed(a, a0)) && has_all(rx, committed(b, b0)); }, 20s, "the first events");

    rx.set_mode(WebhookReceiver::Mode::fail); // answers 500
    send_some(10, "failing");
    wait_until([&] { return srv.metric("im_webhook_deliveries_total{outcome=\"http_error\"}") >= 2; }, 20s, "500s");
    rx.down(); // refuses connections
    send_some(10, "down");
    wait_until([&] { return srv.metric("im_webhook_deliveries_total{outcome=\"network_error\"}") >= 2; }, 20s,
               "refused connections");
    // Sends never waited for the receiver: all 60 are committed.
    EXPECT_EQ(committed(a, a0).size() + committed(b, b0).size(), 60u);
    EXPECT_GT(srv.metric("im_webhook_backlog_events{webhook=\"" +
                         pg->scalar("SELECT webhook_id FROM webhooks LIMIT 1") + "\"}"), 0);
    rx.up();
    rx.set_mode(WebhookReceiver::Mode::ok);
    send_some(5, "back");
    wait_until([&] { return has_all(rx, committed(a, a0)) && has_all(rx, committed(b, b0)); }, 30s,
               "every event after the receiver came back");

    EXPECT_EQ(rx.bad_signatures(), 0);
    EXPECT_EQ(rx.order_violation(), "");
    // Nothing delivered that was not committed (nor anything from before the registration).
    std::set<std::string> all = committed(a, a0);
    for (const auto& id : committed(b, b0)) all.insert(id);
    for (const auto& id : rx.ids()) EXPECT_TRUE(all.count(id)) << id << " was delivered but is not a committed event";
    // The events are those of GET .../events (the backend's page view).
    auto [st, page] = call(srv, "GET", "/v1/conversations/" + a + "/events?limit=5", {}, write_key);
    ASSERT_EQ(st, 200);
    for (const auto& e : page.at("events").as_array()) {
        const auto& ev = e.as_object();
        bool found = false;
        for (const auto& acc : rx.accepted())
            if (acc.conv == a && acc.seq == ev.at("seq").as_int64()) {
                EXPECT_EQ(json::serialize(acc.ev), json::serialize(ev));
                found = true;
                break;
            }
        EXPECT_TRUE(found) << json::serialize(ev);
    }
    // The backlog drains to 0.
    wait_until([&] {
        auto [lst, list] = call(srv, "GET", "/v1/webhooks");
        return lst == 200 && list.at("webhooks").as_array().at(0).as_object().at("backlog").as_int64() == 0;
    }, 10s, "an empty backlog");
}

TEST_F(Webhooks, only_the_kinds_asked_for_are_sent_and_a_batch_failing_past_the_give_up_time_is_listed_and_replayed) {
    ServerProcess srv(pg->url(), flags({"--webhook-give-up-ms", "1500"}));
    WebhookReceiver rx(secret);
    std::vector<std::string> users;
    const std::string conv = make_conv(srv, "whg", users);
    const std::string id = add_hook(srv, rx.url(), json::array{"msg"});
    rx.set_mode(WebhookReceiver::Mode::fail);
    const std::int64_t s1 = post_msg(srv, conv, users[0], "one");
    post_msg(srv, conv, users[0], "two");
    // Retried until the give-up time passes, then listed as failed.
    json::array failed;
    wait_until([&] {
        auto [st, o] = call(srv, "GET", "/v1/webhooks/" + id + "/deliveries?status=failed");
        if (st != 200) return false;
        failed = o.at("deliveries").as_array();
        return !failed.empty();
    }, 20s, "a failed delivery");
    const auto& f = failed.at(0).as_object();
    EXPECT_EQ(f.at("conv").as_string(), conv);
    EXPECT_EQ(f.at("from_seq").as_int64(), s1);
    EXPECT_GE(f.at("attempts").as_int64(), 2);
    EXPECT_NE(admin_ok(pg->url(), {"webhook", "failed", id}).find(conv), std::string::npos);
    EXPECT_TRUE(rx.ids().empty());

    // The conversation's later events go on.
    rx.set_mode(WebhookReceiver::Mode::ok);
    const std::int64_t s3 = post_msg(srv, conv, users[1], "three");
    wait_until([&] { return rx.ids().count(conv + ":" + std::to_string(s3)) > 0; }, 20s, "the event after the failure");
    EXPECT_EQ(rx.ids().count(conv + ":" + std::to_string(s1)), 0u);

    // Replay from the first failed seq: they arrive, the failure leaves the list.
    auto [rst, ro] = call(srv, "POST", "/v1/webhooks/" + id + "/replay", {{"conv", conv}, {"from_seq", s1}});
    ASSERT_EQ(rst, 200) << json::serialize(ro);
    wait_until([&] { return rx.ids().count(conv + ":" + std::to_string(s1)) > 0; }, 20s, "the replayed event");
    EXPECT_EQ(rx.ids(), committed(conv, s1 - 1, "'msg'"));
    auto [dst, dl] = call(srv, "GET", "/v1/webhooks/" + id + "/deliveries?status=failed");
    EXPECT_TRUE(dl.at("deliveries").as_array().empty());
    // Only msg events were sent (no join of the conversation).
    for (const auto& acc : rx.accepted()) EXPECT_EQ(acc.kind, "msg");
    EXPECT_EQ(rx.bad_signatures(), 0);
}

TEST_F(Webhooks, a_gateway_killed_mid_delivery_is_taken_over_by_another_with_nothing_lost) {
    const std::vector<std::string> more = {"--webhook-lease-ms", "1500", "--webhook-timeout-ms", "30000"};
    ServerProcess gw1(pg->url(), flags(more), "gw-1");
    ServerProcess gw2(pg->url(), flags({"--webhook-lease-ms", "1500"}), "gw-2");
    WebhookReceiver rx(secret);
    std::vector<std::string> users;
    const std::string conv = make_conv(gw1, "whk", users);
    const std::int64_t c0 = std::stoll(pg->scalar("SELECT next_seq - 1 FROM conversations WHERE conv_id = " + q(conv)));
    add_hook(gw1, rx.url());
    rx.set_mode(WebhookReceiver::Mode::hold); // the receiver takes the request and does not answer
    for (int i = 0; i < 5; ++i) post_msg(gw1, conv, users[0], "held " + std::to_string(i));
    wait_until([&] { return rx.held() >= 1; }, 20s, "a delivery in flight");
    const std::string holder =
        pg->scalar("SELECT lease_owner FROM webhook_cursors WHERE conv_id = " + q(conv) + " AND lease_until > now()");
    ASSERT_FALSE(holder.empty());
    ServerProcess& dying = holder.rfind("gw-1", 0) == 0 ? gw1 : gw2;
    ServerProcess& survivor = &dying == &gw1 ? gw2 : gw1;
    dying.kill(); // SIGKILL mid-delivery: its lease is never released
    for (int i = 0; i < 5; ++i) post_msg(survivor, conv, users[1], "after " + std::to_string(i));
    rx.set_mode(WebhookReceiver::Mode::ok);
    wait_until([&] { return has_all(rx, committed(conv, c0)); }, 30s, "every event, delivered by the survivor");
    // The receiver records a batch before it answers: the survivor counts
    // the delivery when the answer reaches it.
    wait_until([&] { return survivor.metric("im_webhook_deliveries_total{outcome=\"ok\"}") >= 1; }, 20s,
               "the survivor's delivery counted");
    EXPECT_EQ(rx.order_violation(), "");
    EXPECT_EQ(rx.bad_signatures(), 0);
    wait_until([&] {
        return pg->scalar("SELECT done_seq FROM webhook_cursors WHERE conv_id = " + q(conv)) ==
               pg->scalar("SELECT next_seq - 1 FROM conversations WHERE conv_id = " + q(conv));
    }, 10s, "the cursor at the head");
}

// Issue 52, the send path's cost: a worker whose round found a small batch
// waits a little (100 ms, at most --webhook-poll-ms) before the next, so a
// trickle of events goes out in few POSTs (each batch's cursors then move in
// one statement after the 2xx); every event still arrives once, in order.
TEST_F(Webhooks, a_trickle_of_events_goes_out_in_few_batches_in_order) {
    ServerProcess srv(pg->url(), {"--quiet", "--api-listen", "127.0.0.1:0", "--api-auth-failures", "1000",
                                  "--webhook-poll-ms", "200", "--webhook-refresh-ms", "200", "--webhook-workers", "1"});
    WebhookReceiver rx(secret);
    std::vector<std::string> users;
    const std::string a = make_conv(srv, "wtra", users);
    const std::string b = make_conv(srv, "wtrb", users);
    const std::int64_t a0 = std::stoll(pg->scalar("SELECT next_seq - 1 FROM conversations WHERE conv_id = " + q(a)));
    const std::int64_t b0 = std::stoll(pg->scalar("SELECT next_seq - 1 FROM conversations WHERE conv_id = " + q(b)));
    add_hook(srv, rx.url(), json::array{"msg"});
    const int n = 40;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
        post_msg(srv, a, users[0], "trickle a " + std::to_string(i));
        post_msg(srv, b, users[2], "trickle b " + std::to_string(i));
    }
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
    wait_until([&] { return has_all(rx, committed(a, a0)) && has_all(rx, committed(b, b0)); }, 20s, "every event");
    EXPECT_EQ(rx.order_violation(), "");
    EXPECT_EQ(rx.bad_signatures(), 0);
    // One POST per round, a round at most every ~100 ms while the trickle lasts
    // (without the wait: about one POST per event or two).
    const long long bound = took.count() / 90 + 4;
    std::cout << rx.requests() << " POSTs for " << 2 * n << " events over " << took.count() << " ms\n";
    EXPECT_LE(rx.requests(), bound) << 2 * n << " events over " << took.count() << " ms";
    EXPECT_LT(rx.requests(), 2 * n / 3) << took.count() << " ms";
}

// Issue 52, the send path's cost at 64 senders: a claim and its pages are one
// statement, and a claim takes conversations until their events fill
// --webhook-batch (not a fixed 10): a backlog over 30 conversations goes out
// in POSTs of at most the batch size, each of more than 10 conversations
// while the backlog lasts, every event once at least, in order.
TEST_F(Webhooks, a_backlog_over_many_conversations_goes_out_in_full_batches_of_at_most_the_batch_size) {
    constexpr std::size_t batch = 25;
    // This gateway delivers nothing: the backlog waits for the second one.
    ServerProcess srv(pg->url(), flags({"--webhook-workers", "0"}));
    WebhookReceiver rx(secret);
    std::vector<std::string> users, convs;
    std::vector<std::int64_t> heads;
    for (int i = 0; i < 30; ++i) {
        convs.push_back(make_conv(srv, "wbat", users));
        heads.push_back(std::stoll(pg->scalar("SELECT next_seq - 1 FROM conversations WHERE conv_id = " + q(convs.back()))));
    }
    add_hook(srv, rx.url(), json::array{"msg"});
    // Two each: a claim of 25 takes 13 conversations, the 13th with one of
    // its two events (its second goes in a later batch, after the first).
    for (int round = 0; round < 2; ++round)
        for (std::size_t i = 0; i < convs.size(); ++i)
            post_msg(srv, convs[i], users[2 * i], "backlog " + std::to_string(round));
    EXPECT_EQ(rx.requests(), 0);
    ServerProcess deliverer(pg->url(), flags({"--webhook-workers", "1", "--webhook-batch", std::to_string(batch)}));
    wait_until([&] {
        for (std::size_t i = 0; i < convs.size(); ++i)
            if (!has_all(rx, committed(convs[i], heads[i]))) return false;
        return true;
    }, 30s, "every event of the backlog");
    EXPECT_EQ(rx.order_violation(), "");
    EXPECT_EQ(rx.bad_signatures(), 0);
    std::size_t widest = 0, events = 0;
    for (const auto& b : rx.batches()) {
        EXPECT_LE(b.events, batch);
        widest = std::max(widest, b.convs);
        events += b.events;
    }
    std::cout << rx.batches().size() << " POSTs for " << events << " events, at most " << widest
              << " conversations in one\n";
    EXPECT_GT(widest, 10u) << "a claim of at most 10 conversations";
    EXPECT_GE(events, 60u);
}

// Issue 52, the claim's reads: between two sweeps (--webhook-sweep-ms) a
// worker claims only the conversations the notification bus announced as
// moved (primary-key probes of their cursors, not every cursor of the
// webhook). With the next sweep ten minutes away, every event still goes
// out at once, by hinted claims alone.
TEST_F(Webhooks, between_sweeps_the_conversations_the_bus_announced_are_claimed_without_waiting_for_the_sweep) {
    ServerProcess srv(pg->url(), flags({"--webhook-workers", "1", "--webhook-sweep-ms", "600000"}));
    WebhookReceiver rx(secret);
    std::vector<std::string> users;
    const std::string a = make_conv(srv, "whna", users);
    const std::string b = make_conv(srv, "whnb", users);
    const std::int64_t a0 = std::stoll(pg->scalar("SELECT next_seq - 1 FROM conversations WHERE conv_id = " + q(a)));
    const std::int64_t b0 = std::stoll(pg->scalar("SELECT next_seq - 1 FROM conversations WHERE conv_id = " + q(b)));
    add_hook(srv, rx.url(), json::array{"msg"});
    // The webhook's first round is its sweep; after it, none for 10 minutes.
    wait_until([&] { return srv.metric("im_webhook_claims_sweep_total") >= 1; }, 10s, "the first sweep");
    const long long sweeps = srv.metric("im_webhook_claims_sweep_total");
    for (int i = 0; i < 10; ++i) {
        post_msg(srv, a, users[0], "hinted a " + std::to_string(i));
        post_msg(srv, b, users[2], "hinted b " + std::to_string(i));
    }
    wait_until([&] { return has_all(rx, committed(a, a0)) && has_all(rx, committed(b, b0)); }, 10s,
               "every event, before any sweep");
    EXPECT_EQ(srv.metric("im_webhook_claims_sweep_total"), sweeps);
    EXPECT_GE(srv.metric("im_webhook_claims_hinted_total"), 1);
    EXPECT_EQ(rx.order_violation(), "");
    EXPECT_EQ(rx.bad_signatures(), 0);
}

// ... and what no announcement named (here an event written straight into
// the tables, with no bus payload at all, as a commit whose publish was lost
// would be) is found by the next sweep.
TEST_F(Webhooks, an_event_no_bus_payload_announced_is_found_by_the_next_sweep) {
    ServerProcess srv(pg->url(), flags({"--webhook-workers", "1", "--webhook-sweep-ms", "300"}));
    WebhookReceiver rx(secret);
    std::vector<std::string> users;
    const std::string a = make_conv(srv, "whsa", users);
    const std::int64_t a0 = std::stoll(pg->scalar("SELECT next_seq - 1 FROM conversations WHERE conv_id = " + q(a)));
    add_hook(srv, rx.url(), json::array{"msg"});
    wait_until([&] { return srv.metric("im_webhook_claims_sweep_total") >= 1; }, 10s, "the first sweep");
    const std::string seq = pg->scalar(
        "WITH c AS (UPDATE conversations SET next_seq = next_seq + 1, msg_count = msg_count + 1 WHERE conv_id = " +
        q(a) + " RETURNING next_seq - 1 AS seq, epoch, msg_count) "
        "INSERT INTO events (conv_id, seq, kind, sender_user, body, epoch, msg_ordinal, sender_ordinal) "
        "SELECT " + q(a) + ", seq, 'msg', " + q(users[0]) + ", 'unannounced', epoch, msg_count, 1 FROM c RETURNING seq");
    ASSERT_EQ(std::stoll(seq), a0 + 1);
    wait_until([&] { return has_all(rx, committed(a, a0)); }, 10s, "the unannounced event");
    EXPECT_EQ(rx.order_violation(), "");
}

} // namespace
