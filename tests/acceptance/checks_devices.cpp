// 09-*: markers across devices, installs; 10-*: two gateways on one database.
#include "child.hpp"
#include "lab.hpp"

#include <atomic>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

namespace im::lab {

namespace {

json::object conv_entry(WsClient& ws, const std::string& conv) {
    auto r = answered(ws.request({{"t", "convs"}}), "convs");
    expect(outcome(r) == "convs", "convs", "convs -> " + brief(r));
    for (const auto& x : r.at("convs").as_array())
        if (str(x.as_object(), "conv") == conv) return x.as_object();
    throw CheckFailed("convs-entry", "convs has no entry for " + conv);
}

Verdict read_across_devices(Lab& lab) {
    auto u = lab.user("ana"), v = lab.user("ben");
    auto token2 = admin_ok(lab.db(), {"device", "add", u.user, u.user + "-d2"});
    auto c = lab.conv("c-read", "direct", {u, v});
    auto wv = connect(lab.server().port(), v.token);
    for (int i = 0; i < 3; ++i)
        expect(outcome(send(*wv, c, uuid4(), "unread " + std::to_string(i))) == "sent", "setup-sent", "send");
    auto d1 = connect(lab.server().port(), u.token);
    auto d2 = connect(lab.server().port(), token2);
    for (auto* w : {d1.get(), d2.get()}) expect(outcome(w->request({{"t", "sub"}})) == "subscribed", "subscribed", "sub");
    auto before1 = conv_entry(*d1, c), before2 = conv_entry(*d2, c);
    expect(num(before1, "unread") == 3 && num(before2, "unread") == 3, "unread-3",
           "unread before: d1 " + std::to_string(num(before1, "unread")) + ", d2 " +
               std::to_string(num(before2, "unread")));
    auto r = answered(d1->request({{"t", "read"}, {"conv", c}, {"seq", 5}}), "read on d1");
    expect(outcome(r) == "read_ok" && num(r, "read") == 5, "read-ok", "read on d1 -> " + brief(r));
    auto hint = awaited_push(*d2, [&](const json::object& f) { return str(f, "t") == "hint" && str(f, "conv") == c; }, 10s, "device 2");
    expect(hint.has_value(), "hint-d2", "device 2 got no hint");
    expect(num(*hint, "read") == 5, "hint-read-5", "hint on device 2: " + json::serialize(*hint));
    auto after1 = conv_entry(*d1, c), after2 = conv_entry(*d2, c);
    expect(num(after1, "unread") == 0 && num(after2, "unread") == 0 && num(after1, "read") == 5 &&
               num(after2, "read") == 5,
           "unread-0", "after read: d1 " + json::serialize(after1) + ", d2 " + json::serialize(after2));
    auto back = answered(d2->request({{"t", "read"}, {"conv", c}, {"seq", 3}}), "read below the marker");
    expect(outcome(back) == "read_ok" && num(back, "read") == 5, "read-monotonic", "read below the marker -> " + brief(back));
    return passed("unread 3 on both; d1 read 5 -> d2 hint read 5; convs unread 0, read 5 on both; read 3 keeps 5");
}

Verdict stale_install(Lab& lab) {
    auto u = lab.user("ana"), v = lab.user("ben");
    auto c = lab.conv("c-inst", "direct", {u, v});
    std::string i1 = uuid4(), i2 = uuid4();
    auto old_conn = connect(lab.server().port(), u.token, i1);
    expect(outcome(old_conn->request({{"t", "ack"}, {"conv", c}, {"seq", 1}})) == "acked", "acked-install-1",
           "ack under install 1");
    auto fresh = connect(lab.server().port(), u.token, i2); // a reinstall
    auto r = answered(old_conn->request({{"t", "ack"}, {"conv", c}, {"seq", 2}}), "ack from the old install");
    expect(outcome(r) == "STALE_INSTALL", "stale-install", "ack from the old install -> " + brief(r));
    int code = old_conn->wait_closed(5s);
    expect(code != -1, "old-closed", "the old install's connection stayed open");
    auto again = std::make_unique<WsClient>(lab.server().port());
    auto h = answered(again->hello(u.token, i1), "hello with the old install");
    expect(outcome(h) == "STALE_INSTALL", "hello-stale-install", "hello with the superseded install -> " + brief(h));
    auto ok = answered(fresh->request({{"t", "ack"}, {"conv", c}, {"seq", 2}}), "ack from the new install");
    expect(outcome(ok) == "acked" && num(ok, "delivered") == 2, "new-install-acks", "ack from the new install -> " + brief(ok));
    return passed("old install ack STALE_INSTALL, connection closed (" + std::to_string(code) +
                  "), hello with it STALE_INSTALL, new install acks (delivered 2)");
}

// no_goaway: the negative control, gateway 1 drains without sending goaway.
Verdict goaway_reconnect(Lab& lab, bool no_goaway) {
    const std::string id1 = unique_name("gw-one"), id2 = unique_name("gw-two");
    std::vector<std::string> flags1{"--quiet"};
    if (no_goaway) flags1 = {"--quiet", "--enable-faults", "--fault", "rule.goaway=skip"};
    Tracked<ServerProcess> gw1(lab, lab.db(), flags1, id1);
    Tracked<ServerProcess> gw2(lab, lab.db(), std::vector<std::string>{"--quiet"}, id2);
    const int writers = 3, drafts = 20;
    std::vector<TestUser> users;
    for (int i = 0; i < writers; ++i) users.push_back(lab.user("w" + std::to_string(i)));
    // Besides the raw writers (which move to gateway 2 in this code), a real
    // SDK process with both gateways in its server list must fail over on
    // its own: its goaway handling, not test code, takes it to gateway 2.
    auto sdk_user = lab.user("sdk");
    auto members = users;
    members.push_back(sdk_user);
    auto g = lab.conv("g-drain", "group", members);
    const auto sdk_bin = sdk_child_bin();
    expect(!sdk_bin.empty() && std::filesystem::exists(sdk_bin), "sdk-built",
           "the SDK child was not built (ImSdk::ImSdk target absent in this build): cannot run a real SDK process");
    TempDir dir("imlab-goaway");
    const std::string sdk_db = dir.path() + "/client.db";
    const int sdk_drafts = 40; // one per 100 ms: about half before the SIGTERM, half after
    Child sdk({sdk_bin, "soak", sdk_db, gw1->url() + "," + gw2->url(), sdk_user.token, g, std::to_string(sdk_drafts)});
    std::vector<std::string> sdk_cmids;
    auto sdk_read_cmids = [&](std::size_t want, std::chrono::milliseconds within) {
        const auto until = std::chrono::steady_clock::now() + within;
        while (sdk_cmids.size() < want && std::chrono::steady_clock::now() < until) {
            auto l = sdk.line(std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now()));
            if (!l) break;
            if (l->rfind("CMID ", 0) == 0) sdk_cmids.push_back(l->substr(5, l->find(' ', 5) - 5)); // "CMID <cmid> <body>"
        }
        return sdk_cmids.size() >= want;
    };
    expect(sdk_read_cmids(5, 30s), "sdk-sent-on-gw1", "the SDK child sent fewer than 5 drafts through gateway 1: " + sdk.transcript() +
                                       sdk.stderr_text());
    std::vector<std::vector<std::string>> cmids(writers);
    for (auto& v : cmids)
        for (int i = 0; i < drafts; ++i) v.push_back(uuid4());
    std::atomic<int> progress{0}, goaways{0}, moved{0}, retries{0};
    std::vector<std::string> errors(writers), gateways(writers);
    auto deadline = std::chrono::steady_clock::now() + 60s;
    std::vector<std::thread> threads;
    for (int w = 0; w < writers; ++w) {
        threads.emplace_back([&, w] {
            try {
                auto ws = connect(gw1->port(), users[w].token);
                bool on_gw2 = false, saw_goaway = false;
                for (int i = 0; i < drafts;) {
                    if (std::chrono::steady_clock::now() > deadline) throw CheckFailed("writers-done", "writer ran out of time");
                    auto r = send(*ws, g, cmids[w][i], "draft " + std::to_string(i), 3s);
                    if (!saw_goaway &&
                        ws->wait_push([](const json::object& f) { return str(f, "t") == "goaway"; }, 0ms)) {
                        saw_goaway = true;
                        ++goaways;
                    }
                    if (outcome(r) == "sent") {
                        ++i;
                        ++progress;
                        std::this_thread::sleep_for(10ms);
                        continue;
                    }
                    ++retries;
                    if (!on_gw2 && (saw_goaway || ws->closed())) {
                        ws.reset();
                        auto next = std::make_unique<WsClient>(gw2->port());
                        auto wel = next->hello(users[w].token);
                        expect(outcome(wel) == "welcome", "welcome-gw2", "hello on gateway 2 -> " + brief(wel));
                        gateways[w] = str(wel, "gateway");
                        ws = std::move(next);
                        on_gw2 = true;
                        ++moved;
                    } else if (outcome(r) != "UNAVAILABLE" && outcome(r) != "timeout" && outcome(r) != "closed") {
                        throw CheckFailed("no-terminal-error", "terminal reply " + brief(r));
                    }
                }
                if (!on_gw2) throw CheckFailed("moved-to-gw2", "writer never left gateway 1");
            } catch (const CheckFailed& e) {
                errors[w] = e.tag + ": " + e.what();
            } catch (const std::exception& e) {
                errors[w] = std::string("harness: ") + e.what();
            }
        });
    }
    while (progress < writers * 5 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
    const std::size_t sdk_before = sdk_cmids.size();
    int rc = gw1->terminate(20s);
    for (auto& t : threads) t.join();
    for (auto& e : errors) expect(e.empty(), "writers-done", e);
    // The SDK keeps sending after gateway 1 is gone; then it drains, syncs
    // and prints its rows.
    expect(sdk_read_cmids(sdk_drafts, 60s), "sdk-sent-after-drain", "the SDK child stopped sending after gateway 1 left (" +
                                                std::to_string(sdk_cmids.size()) + "/" + std::to_string(sdk_drafts) +
                                                "): " + sdk.stderr_text());
    { std::ofstream(sdk_db + ".end") << "end\n"; }
    { std::ofstream(sdk_db + ".sync") << "sync\n"; } // the only SDK client: sync once drained
    std::vector<std::string> sdk_rows;
    for (bool done = false; !done;) {
        auto l = sdk.line(60s);
        expect(l.has_value(), "sdk-synced", "the SDK child did not drain and sync after the failover: " + sdk.stderr_text());
        if (l->rfind("ROW ", 0) == 0 && l->find(" msg ") != std::string::npos) sdk_rows.push_back(*l);
        done = *l == "DONE";
    }
    std::string server_order;
    for (const auto& k : sdk_cmids) expect(lab.rows(g, sdk_user.user, k) == 1, "sdk-each-once", "SDK draft " + k + " not stored exactly once");
    auto stored = lab.sql("SELECT string_agg(client_msg_id, ',' ORDER BY seq) FROM events WHERE conv_id = " + quote(g) +
                          " AND sender_user = " + quote(sdk_user.user));
    std::string created;
    for (const auto& k : sdk_cmids) created += (created.empty() ? "" : ",") + k;
    expect(stored == created, "sdk-in-order", "the SDK's drafts were stored out of creation order across the failover");
    expect(rc == 0, "gw1-exit-0", "gateway 1 exit status after SIGTERM " + std::to_string(rc));
    expect(goaways == writers, "goaway-all", "goaway seen by " + std::to_string(goaways) + "/" + std::to_string(writers));
    for (auto& gname : gateways) expect(gname == id2, "moved-to-gw2", "reconnected to '" + gname + "'");
    int exact = 0;
    for (int w = 0; w < writers; ++w)
        for (auto& k : cmids[w]) exact += lab.rows(g, users[w].user, k) == 1;
    auto total = lab.sql("SELECT count(*) FROM events WHERE conv_id = " + quote(g) + " AND kind = 'msg'");
    expect(exact == writers * drafts && total == std::to_string(writers * drafts + sdk_drafts), "each-once",
           std::to_string(exact) + " drafts exactly once, " + total + " msg rows");
    expect(sdk_rows.size() == static_cast<std::size_t>(writers * drafts + sdk_drafts), "sdk-store-equal",
           "the SDK's store has " + std::to_string(sdk_rows.size()) + " messages, the server " + total);
    auto reader = connect(gw2->port(), users[0].token);
    std::int64_t head = 0;
    auto seqs = sync_all(*reader, g, 0, 200, &head);
    bool contiguous = !seqs.empty() && seqs.front() == 1;
    for (std::size_t i = 1; contiguous && i < seqs.size(); ++i) contiguous = seqs[i] == seqs[i - 1] + 1;
    expect(contiguous && head == static_cast<std::int64_t>(seqs.size()), "gw2-sync-gap-free", "gateway 2 sync not 1..head");
    return passed("gw1 drained (exit 0), goaway to " + std::to_string(goaways.load()) + "/" + std::to_string(writers) +
                  " writers, all moved to " + id2 + ", " + std::to_string(retries.load()) + " resends; " +
                  std::to_string(exact) + "/" + std::to_string(writers * drafts) +
                  " drafts exactly once, sync via gw2 1.." + std::to_string(head) + "; SDK child failed over on its own: " +
                  std::to_string(sdk_before) + " drafts before the SIGTERM, " + std::to_string(sdk_drafts) +
                  " in creation order exactly once, its store = the server's " + total + " messages");
}

// no_resync: the negative control, a gateway started with --lab-no-resync.
Verdict notify_loss_resync(Lab& lab, bool no_resync) {
    const std::string id = unique_name("gw-listen");
    std::vector<std::string> flags{"--quiet"};
    if (no_resync) flags = {"--quiet", "--enable-faults", "--lab-no-resync"};
    Tracked<ServerProcess> gw(lab, lab.db(), flags, id);
    auto a = lab.user("ana"), b = lab.user("ben");
    auto c = lab.conv("c-resync", "direct", {a, b});
    auto wa = connect(gw->port(), a.token);
    expect(outcome(wa->request({{"t", "sub"}})) == "subscribed", "subscribed", "sub");
    std::int64_t cursor = 0;
    auto seqs = sync_all(*wa, c, 0, 50, &cursor);
    auto wb = connect(lab.server().port(), b.token); // writes through the other gateway
    auto killed = lab.sql("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = " +
                          quote("imserver-listen-" + id));
    expect(killed == "1", "listen-killed", "LISTEN backends terminated: " + killed);
    for (int i = 0; i < 3; ++i)
        expect(outcome(send(*wb, c, uuid4(), "while deaf " + std::to_string(i))) == "sent", "sent-while-deaf", "send");
    int events_before = 0;
    auto rs = awaited_push(*wa, [&](const json::object& f) {
        if (str(f, "t") == "event") ++events_before;
        return str(f, "t") == "resync";
    }, 15s, "subscriber");
    expect(rs.has_value(), "resync", "no resync push within 15 s after the LISTEN connection was killed");
    std::int64_t head = 0;
    auto more = sync_all(*wa, c, cursor, 50, &head);
    seqs.insert(seqs.end(), more.begin(), more.end());
    bool exact = static_cast<std::int64_t>(seqs.size()) == head;
    for (std::size_t i = 0; exact && i < seqs.size(); ++i) exact = seqs[i] == static_cast<std::int64_t>(i) + 1;
    expect(exact && head == lab.head(c), "converged", "after resync the client holds " + std::to_string(seqs.size()) +
                                             " events, head " + std::to_string(head) + ", stored head " +
                                             std::to_string(lab.head(c)));
    // And the gateway listens again: a new event arrives by push.
    auto s = send(*wb, c, uuid4(), "after the resync");
    auto ev = awaited_push(*wa, [&](const json::object& f) {
        return str(f, "t") == "event" && num(f.at("ev").as_object(), "seq") == num(s, "seq");
    }, 10s, "subscriber");
    expect(ev.has_value(), "pushes-again", "no push after the LISTEN connection came back");
    return passed("LISTEN backend killed, resync pushed (" + std::to_string(events_before) +
                  " events pushed before it), client converged on 1.." + std::to_string(head) +
                  ", pushes flow again (seq " + std::to_string(num(s, "seq")) + ")");
}

} // namespace

std::vector<Check> device_checks() {
    return {
        {"09-read-across-devices", read_across_devices, breaking("rule.read_hint", read_across_devices),
         "gateway rule.read_hint=skip: no read hint to the user's other devices", "hint-d2"},
        {"09-stale-install", stale_install, breaking("rule.stale_install", stale_install),
         "gateway rule.stale_install=skip: a superseded install is served", "stale-install"},
        {"10-goaway-reconnect", [](Lab& l) { return goaway_reconnect(l, false); },
         [](Lab& l) { return goaway_reconnect(l, true); },
         "gateway 1 started with --fault rule.goaway=skip: it closes connections without goaway", "goaway-all"},
        {"10-notify-loss-resync", [](Lab& l) { return notify_loss_resync(l, false); },
         [](Lab& l) { return notify_loss_resync(l, true); }, "imserver --lab-no-resync", "resync"},
    };
}

} // namespace im::lab
