// Contract section 13: 13-typing-ephemeral and 13-presence-across-gateways.
// Two gateways on the lab's database: the lab's shared one (faults enabled,
// where the negative controls break a rule) and one the check starts.
// "Not pushed" is judged by order, never by a quiet wait: a frame that must
// come after the one that must not come arrives first.
#include "lab.hpp"

#include <map>

namespace im::lab {

namespace {

json::object typing(WsClient& ws, const std::string& conv, bool on) {
    return ws.request({{"t", "typing"}, {"conv", conv}, {"on", on}});
}

json::object presence(WsClient& ws, const std::vector<std::string>& users) {
    json::array a;
    for (const auto& u : users) a.emplace_back(u);
    return ws.request({{"t", "presence"}, {"users", std::move(a)}});
}

json::object next_of(WsClient& ws, const char* type, std::chrono::milliseconds timeout, const std::string& what) {
    auto f = awaited_push(ws, [&](const json::object& o) { return str(o, "t") == type; }, timeout, what);
    expect(f.has_value(), std::string("push-") + type, std::string("no ") + type + " push to " + what);
    return *f;
}

std::unique_ptr<WsClient> subscribed(unsigned short port, const TestUser& u, const std::string& install = {}) {
    auto ws = connect(port, u.token, install);
    expect(outcome(ws->request({{"t", "sub"}})) == "subscribed", "subscribed", "sub");
    return ws;
}

Verdict typing_ephemeral(Lab& lab) {
    Tracked<ServerProcess> gw2(lab, lab.db(), std::vector<std::string>{"--quiet"}, unique_name("gw-typing"));
    auto ana = lab.user("ana"), ben = lab.user("ben"), cyd = lab.user("cyd");
    auto small = lab.conv("typing", "group", {ana, ben, cyd});
    auto big = lab.conv("typing-big", "group", {ana, ben, cyd});
    admin_ok(lab.db(), {"conv", "set", big, "--push-full-max", "2"}); // 3 members: above it
    const std::string install = unique_name("inst");
    auto a = subscribed(lab.server().port(), ana, install);
    auto a2 = subscribed(gw2->port(), ana, install); // the typist's second connection
    auto b = subscribed(gw2->port(), ben);           // across the bus
    auto c = subscribed(lab.server().port(), cyd);   // on the typist's gateway
    const auto events_before = lab.sql("SELECT count(*) FROM events");
    const auto head_small = lab.head(small), head_big = lab.head(big);

    expect(outcome(answered(typing(*a, small, true), "typing")) == "typing_ok", "typing-ok", "typing answered");
    for (auto* other : {b.get(), c.get()}) {
        auto f = next_of(*other, "typing", 10s, "a member");
        expect(str(f, "conv") == small && str(f, "user") == ana.user && flag(f, "on"), "pushed-to-others",
               "typing push: " + json::serialize(f));
    }
    // cyd types after ana on the same gateway: ana's connections see cyd's first.
    expect(outcome(answered(typing(*c, small, true), "typing")) == "typing_ok", "typing-ok", "typing answered");
    for (auto* self : {a.get(), a2.get()}) {
        auto f = next_of(*self, "typing", 10s, "the typist");
        expect(str(f, "user") == cyd.user, "not-to-sender", "the typist got its own typing: " + json::serialize(f));
    }
    // The large group, then the small one: ben's next typing of ana's must be the small one's.
    expect(outcome(answered(typing(*a, big, true), "typing")) == "typing_ok", "typing-ok", "typing in the large group");
    expect(outcome(answered(typing(*a, small, false), "typing")) == "typing_ok", "typing-ok", "typing answered");
    auto f = awaited_push(*b, [&](const json::object& o) { return str(o, "t") == "typing" && str(o, "user") == ana.user; },
                          10s, "ben");
    expect(f.has_value(), "push-typing", "no typing push to ben");
    expect(str(*f, "conv") == small, "none-in-large-group",
           "typing pushed in a group above push_full_max: " + json::serialize(*f));
    expect(lab.sql("SELECT count(*) FROM events") == events_before, "nothing-stored",
           "events: " + events_before + " before, " + lab.sql("SELECT count(*) FROM events") + " after");
    expect(lab.head(small) == head_small && lab.head(big) == head_big, "head-unchanged", "a typing frame moved a head");
    return passed("typing pushed across two gateways to the others only; none in a group above push_full_max; "
                  "no event stored, heads unchanged");
}

Verdict presence_across_gateways(Lab& lab) {
    Tracked<ServerProcess> gw2(lab, lab.db(), std::vector<std::string>{"--quiet"}, unique_name("gw-presence"));
    auto ana = lab.user("ana"), ben = lab.user("ben"), stranger = lab.user("stranger");
    lab.conv("presence", "direct", {ana, ben});
    auto x = connect(gw2->port(), stranger.token); // online, sharing nothing with ana
    auto a = connect(lab.server().port(), ana.token);
    auto first = answered(presence(*a, {ben.user, stranger.user}), "presence");
    std::map<std::string, json::object> got;
    for (const auto& u : first.at("users").as_array()) got[str(u.as_object(), "user")] = u.as_object();
    expect(!got.count(stranger.user), "stranger-left-out", "a stranger's presence was answered: " + json::serialize(first));
    expect(got.count(ben.user) && !flag(got[ben.user], "online"), "answered-offline",
           "ben, not connected, is not answered offline: " + json::serialize(first));

    const auto t0 = std::chrono::steady_clock::now();
    auto b = connect(gw2->port(), ben.token);
    auto on = next_of(*a, "presence", 10s, "the watcher");
    const auto online_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    expect(str(on, "user") == ben.user && flag(on, "online"), "online-pushed", "presence push: " + json::serialize(on));

    const auto t1 = std::chrono::steady_clock::now();
    gw2->kill(); // SIGKILL: no close reaches anyone
    auto off = awaited_push(*a, [&](const json::object& o) { return str(o, "t") == "presence"; }, 62s, "the watcher");
    const auto offline_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t1).count();
    expect(off.has_value() && str(*off, "user") == ben.user && !flag(*off, "online"), "offline-after-kill",
           off ? "presence push: " + json::serialize(*off) : std::string("no offline push within 60 s of the SIGKILL"));
    auto after = answered(presence(*a, {ben.user}), "presence");
    const auto& users = after.at("users").as_array();
    expect(users.size() == 1 && !flag(users[0].as_object(), "online"), "answered-offline",
           "after the kill: " + json::serialize(after));
    return passed("stranger left out; online pushed across gateways after " + std::to_string(online_ms) +
                  " ms; offline pushed " + std::to_string(offline_ms) +
                  " ms after gateway 2's SIGKILL (default --presence-lease-ms 30000)");
}

} // namespace

std::vector<Check> ephemeral_checks() {
    return {
        {"13-typing-ephemeral", typing_ephemeral, breaking("rule.typing_push_full", typing_ephemeral),
         "gateway rule.typing_push_full=skip: typing forwarded above push_full_max", "none-in-large-group"},
        {"13-presence-across-gateways", presence_across_gateways,
         breaking("rule.presence_strangers", presence_across_gateways),
         "gateway rule.presence_strangers=skip: presence answers strangers", "stranger-left-out"},
    };
}

} // namespace im::lab
