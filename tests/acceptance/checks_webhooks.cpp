// 14-webhook-at-least-once (server.md "Events to the app's backend
// (webhooks)"): two gateways the check starts deliver to a real receiver
// (tests/support/webhook_receiver.hpp) that answers 500 for 30 s, then is
// down (connections refused), then takes a delivery and holds it while the
// gateway delivering it is SIGKILLed; then it answers 200. Every committed
// event arrives at least once, in seq order per conversation, with a valid
// signature, and nothing that was not committed. The lab's shared gateway
// delivers nothing (--webhook-workers 0); the negative control arms
// rule.webhook_retry on the check's two gateways: a failed delivery moves the
// cursor on as if delivered.
#include "lab.hpp"
#include "webhook_receiver.hpp"

#include <set>
#include <sstream>

namespace im::lab {

namespace {

const std::string secret = "lab-webhook-secret-0123456789";

std::set<std::string> committed_ids(Lab& lab, const std::string& conv, std::int64_t after) {
    std::set<std::string> out;
    std::stringstream ss(lab.sql("SELECT coalesce(string_agg(conv_id || ':' || seq, ',' ORDER BY seq), '') FROM events "
                                 "WHERE conv_id = " + quote(conv) + " AND seq > " + std::to_string(after)));
    std::string id;
    while (std::getline(ss, id, ','))
        if (!id.empty()) out.insert(id);
    return out;
}

Verdict webhook_at_least_once(Lab& lab, bool broken) {
    auto ana = lab.user("wha");
    auto ben = lab.user("whb");
    const std::string c1 = lab.conv("whk1", "group", {ana, ben});
    const std::string c2 = lab.conv("whk2", "group", {ana, ben});
    const std::int64_t h1 = lab.head(c1), h2 = lab.head(c2);
    test::WebhookReceiver rx(secret);
    const std::vector<std::string> flags = {"--quiet", "--enable-faults", "--webhook-lease-ms", "2000",
                                            "--webhook-timeout-ms", "120000", "--webhook-retry-max-ms", "1000",
                                            "--webhook-poll-ms", "20", "--webhook-refresh-ms", "200"};
    const std::string name2 = unique_name("gw-wh2"), name3 = unique_name("gw-wh3");
    Tracked<ServerProcess> gw2(lab, lab.db(), flags, name2);
    Tracked<ServerProcess> gw3(lab, lab.db(), flags, name3);
    if (broken) {
        Lab::arm(*gw2, "rule.webhook_retry=skip");
        Lab::arm(*gw3, "rule.webhook_retry=skip");
    }
    const std::string hook = admin_ok(lab.db(), {"webhook", "add", rx.url(), "--secret", secret});
    struct Remove {
        Lab& lab;
        std::string id;
        ~Remove() { admin(lab.db(), {"webhook", "remove", id}); }
    } remove{lab, hook};

    auto a = connect(gw2->port(), ana.token);
    auto b = connect(gw3->port(), ben.token);
    int n = 0;
    auto round = [&](WsClient& x, WsClient& y) {
        ++n;
        answered(send(x, c1, uuid4(), "one " + std::to_string(n)), "send");
        answered(send(y, c2, uuid4(), "two " + std::to_string(n)), "send");
    };

    // 1. 500 for 30 s: a round of sends after each refused delivery.
    rx.set_mode(test::WebhookReceiver::Mode::fail);
    const auto fail_until = std::chrono::steady_clock::now() + 30s;
    while (std::chrono::steady_clock::now() < fail_until) {
        const int seen = rx.requests();
        round(*a, *b);
        if (!wait_until([&] { return rx.requests() > seen; }, 15s))
            throw HarnessError("no delivery attempt within 15 s while the receiver answers 500");
    }
    const int failing_requests = rx.requests();
    // 2. Down: connections refused.
    rx.down();
    const auto refused = [&] {
        return gw2->metric("im_webhook_deliveries_total{outcome=\"network_error\"}") +
               gw3->metric("im_webhook_deliveries_total{outcome=\"network_error\"}");
    };
    // Three rounds, and more while fewer than two deliveries were refused:
    // the deliverer batches what waits (a control that moves a cursor past
    // a refused batch may otherwise find nothing left to attempt).
    for (int i = 0; i < 3; ++i) round(*a, *b);
    const auto down_until = std::chrono::steady_clock::now() + 20s;
    while (refused() < 2 && std::chrono::steady_clock::now() < down_until) {
        const long long seen = refused();
        if (!wait_until([&] { return refused() > seen; }, 3s)) round(*a, *b);
    }
    if (refused() < 2)
        throw HarnessError("no refused delivery while down (network errors " +
                           std::to_string(gw2->metric("im_webhook_deliveries_total{outcome=\"network_error\"}")) + " + " +
                           std::to_string(gw3->metric("im_webhook_deliveries_total{outcome=\"network_error\"}")) +
                           ", http errors " +
                           std::to_string(gw2->metric("im_webhook_deliveries_total{outcome=\"http_error\"}")) + " + " +
                           std::to_string(gw3->metric("im_webhook_deliveries_total{outcome=\"http_error\"}")) +
                           ", receiver requests " + std::to_string(rx.requests()) + ")");
    const long long refusals = refused(); // read now: one of the two is killed below
    // 3. Back, but holding the request: the gateway delivering it is killed.
    rx.set_mode(test::WebhookReceiver::Mode::hold);
    rx.up();
    round(*a, *b);
    if (!wait_until([&] { return rx.held() >= 1; }, 30s)) throw HarnessError("no delivery reached the receiver again");
    const std::string owner = lab.sql("SELECT lease_owner FROM webhook_cursors WHERE webhook_id = " + quote(hook) +
                                      " AND lease_until > now() ORDER BY lease_until DESC LIMIT 1");
    if (owner.rfind(name2 + "/", 0) != 0 && owner.rfind(name3 + "/", 0) != 0)
        throw HarnessError("the held delivery's lease names no gateway of the check: '" + owner + "'");
    const bool kill2 = owner.rfind(name2 + "/", 0) == 0;
    ServerProcess& dying = kill2 ? *gw2 : *gw3;
    ServerProcess& survivor = kill2 ? *gw3 : *gw2;
    dying.kill(); // SIGKILL mid-delivery: its lease is never released
    std::unique_ptr<WsClient> a2, b2;
    try {
        a2 = connect(survivor.port(), ana.token);
        b2 = connect(survivor.port(), ben.token);
    } catch (const std::exception& e) {
        const std::string log = survivor.log();
        throw HarnessError(std::string("the surviving gateway: ") + e.what() + "; its log ends: " +
                           log.substr(log.size() > 1500 ? log.size() - 1500 : 0));
    }
    round(*a2, *b2);
    rx.set_mode(test::WebhookReceiver::Mode::ok);

    // Drained: both cursors at their conversation's head (the survivor took over).
    const bool drained = wait_until([&] {
        return lab.sql("SELECT count(*) FROM webhook_cursors wc JOIN conversations c USING (conv_id) WHERE "
                       "wc.webhook_id = " + quote(hook) + " AND wc.conv_id IN (" + quote(c1) + ", " + quote(c2) +
                       ") AND wc.done_seq = c.next_seq - 1") == "2";
    }, 60s);
    expect(drained, "drained", "the cursors did not reach the heads within 60 s of the receiver's recovery");
    std::set<std::string> want = committed_ids(lab, c1, h1);
    for (const auto& id : committed_ids(lab, c2, h2)) want.insert(id);
    const auto got = rx.ids();
    std::size_t missing = 0;
    std::string first_missing;
    for (const auto& id : want)
        if (!got.count(id) && missing++ == 0) first_missing = id;
    expect(missing == 0, "every-event-delivered",
           std::to_string(missing) + " of " + std::to_string(want.size()) + " committed events never arrived (first: " +
               first_missing + ")");
    for (const auto& id : got) expect(want.count(id) > 0, "only-committed", id + " arrived but is no committed event");
    const std::string order = rx.order_violation();
    expect(order.empty(), "seq-order", order);
    expect(rx.bad_signatures() == 0, "signatures-valid", std::to_string(rx.bad_signatures()) + " bad signatures");
    const std::size_t duplicates = rx.accepted().size() - got.size();
    return passed(std::to_string(want.size()) + " events in 2 conversations, all delivered in order with valid "
                  "signatures after " + std::to_string(failing_requests) + " requests answered 500 for 30 s, " +
                  std::to_string(refusals) + " refused, and the delivering gateway (" + owner +
                  ") SIGKILLed mid-delivery; " + std::to_string(duplicates) + " duplicates (deduped by id)");
}

} // namespace

std::vector<Check> webhook_checks() {
    return {
        {"14-webhook-at-least-once", [](Lab& lab) { return webhook_at_least_once(lab, false); },
         [](Lab& lab) { return webhook_at_least_once(lab, true); },
         "the delivering gateways' rule.webhook_retry=skip: a failed delivery moves the cursor on (at most once)",
         "every-event-delivered"},
    };
}

} // namespace im::lab
