// lab-crash-*: the fault points beyond send (recall, ack, read, retention
// purge, the notification publish). Each arms POINT=crash, sees the process
// really exit 70, restarts it, repeats the request, and checks the
// invariants over the database: at most one event per request key, seqs
// gap-free from min_seq to head, markers never lost once acknowledged.
// Not ids of spec/acceptance.md: they extend 06-crash-* to the other writes.
//
// Negative controls: the crash comes on the other side of the COMMIT from
// where the check expects it (the other recall fault point; for markers and
// the purge, whose points are all before the commit, the lab kills the
// process itself once the request committed), or the restarted gateway
// loses its notifications (notify.before_publish=unavailable).
#include "lab.hpp"

#include <thread>

namespace im::lab {

namespace {

json::object recall(WsClient& ws, const std::string& conv, std::int64_t target, const std::string& cmid) {
    return ws.request({{"t", "recall"}, {"conv", conv}, {"target", target}, {"cmid", cmid}});
}

// The database-side invariants of one conversation; "" when they hold.
std::string invariants(Lab& lab, const std::string& conv) {
    auto dup_keys = lab.sql("SELECT count(*) FROM (SELECT 1 FROM events WHERE conv_id = " + quote(conv) +
                            " AND client_msg_id IS NOT NULL GROUP BY sender_user, client_msg_id "
                            "HAVING count(*) > 1) d");
    if (dup_keys != "0") return dup_keys + " request keys with more than one event";
    auto gaps = lab.sql("SELECT (SELECT next_seq - min_seq FROM conversations WHERE conv_id = " + quote(conv) +
                        ") - count(*) FROM events WHERE conv_id = " + quote(conv));
    if (gaps != "0") return "seqs not gap-free from min_seq to head (missing " + gaps + ")";
    return {};
}

struct CrashServer {
    Tracked<ServerProcess> srv;
    explicit CrashServer(Lab& lab)
        : srv(lab, lab.db(), std::vector<std::string>{"--enable-faults", "--quiet"}, unique_name("gw-crash2")) {}
    // Sends `frame` with POINT=crash:1 armed; the process must exit 70.
    // after_commit (a negative control): no fault; the request is answered
    // (committed) and then the lab SIGKILLs the process.
    void crash_on(Lab&, WsClient& ws, const std::string& point, const json::object& frame, bool after_commit = false) {
        if (after_commit) {
            answered(ws.request(frame, 10s), point + " (no fault)");
            srv->kill();
        } else {
            Lab::arm(*srv, point + "=crash:1");
            auto r = ws.request(frame, 10s);
            expect(outcome(r) == "closed" || outcome(r) == "timeout", "crashed",
                   point + ": reply " + brief(r) + " instead of a crash");
            auto rc = srv->wait_exit(10s);
            expect(rc && *rc == 70, "exit-70",
                   point + ": exit status " + (rc ? std::to_string(*rc) : std::string("none (running)")));
        }
        srv->restart();
    }
};

// armed: the point that crashes (the check: `point`; its control: the
// recall point on the other side of the COMMIT).
Verdict crash_recall(Lab& lab, const std::string& point, bool committed, const std::string& armed) {
    auto a = lab.user("ana"), b = lab.user("ben");
    auto c = lab.conv("c-crec", "direct", {a, b});
    CrashServer cs(lab);
    auto ws = connect(cs.srv->port(), a.token);
    auto m = send(*ws, c, uuid4(), "to be recalled");
    expect(outcome(m) == "sent", "sent", "send -> " + brief(m));
    auto key = uuid4();
    cs.crash_on(lab, *ws, armed, {{"t", "recall"}, {"conv", c}, {"target", num(m, "seq")}, {"cmid", key}});
    auto rows = lab.rows(c, a.user, key);
    expect(rows == (committed ? 1 : 0), "rows-after-crash", point + ": recall rows right after the crash: " + std::to_string(rows));
    auto ws2 = connect(cs.srv->port(), a.token);
    auto r = answered(recall(*ws2, c, num(m, "seq"), key), "recall again");
    expect(outcome(r) == "recalled" && flag(r, "dup") == committed, committed ? "dup-true" : "dup-false",
           "recall again after the restart -> " + brief(r) + ", wanted dup:" + (committed ? "true" : "false"));
    expect(lab.rows(c, a.user, key) == 1, "one-row", "recall rows after the resend: " + std::to_string(lab.rows(c, a.user, key)));
    auto inv = invariants(lab, c);
    expect(inv.empty(), "invariants", inv);
    return passed("exit 70, recall rows " + std::to_string(rows) + " after the crash, again " + brief(r) +
                  ", 1 recall row, keys unique, seqs gap-free");
}

// ack or read: the marker must be where the last committed request put it.
// after_commit: the negative control (the crash comes after the marker's commit).
Verdict crash_marker(Lab& lab, const std::string& kind, bool after_commit) {
    auto a = lab.user("ana"), b = lab.user("ben");
    auto token2 = admin_ok(lab.db(), {"device", "add", a.user, a.user + "-d2"});
    auto c = lab.conv("c-cmark", "direct", {a, b});
    CrashServer cs(lab);
    auto wb = connect(cs.srv->port(), b.token);
    for (int i = 0; i < 3; ++i)
        expect(outcome(send(*wb, c, uuid4(), "m" + std::to_string(i))) == "sent", "setup-sent", "send");
    auto ws = connect(cs.srv->port(), a.token);
    const char* reply = kind == "ack" ? "acked" : "read_ok";
    const char* field = kind == "ack" ? "delivered" : "read";
    auto first = answered(ws->request({{"t", kind}, {"conv", c}, {"seq", 3}}), kind + " 3");
    expect(outcome(first) == reply && num(first, field) == 3, "marker-3", kind + " 3 -> " + brief(first));
    const std::string table = kind == "ack" ? "delivery_markers" : "read_markers";
    const std::string who = kind == "ack" ? "device_id = " + quote(a.device) : "user_id = " + quote(a.user);
    auto marker = [&] {
        return lab.sql("SELECT " + std::string(field) + " FROM " + table + " WHERE conv_id = " + quote(c) + " AND " + who);
    };
    cs.crash_on(lab, *ws, "store." + kind + "_before_commit", {{"t", kind}, {"conv", c}, {"seq", 5}}, after_commit);
    auto after_crash = marker();
    expect(after_crash == "3", "marker-kept", kind + " marker after the crash: " + after_crash + " (wanted the committed 3)");
    auto ws2 = connect(cs.srv->port(), a.token);
    std::unique_ptr<WsClient> d2;
    if (kind == "read") { // the other device learns of the read marker after the restart
        d2 = connect(cs.srv->port(), token2);
        expect(outcome(d2->request({{"t", "sub"}})) == "subscribed", "subscribed", "sub");
    }
    auto again = answered(ws2->request({{"t", kind}, {"conv", c}, {"seq", 5}}), kind + " 5 again");
    expect(outcome(again) == reply && num(again, field) == 5, "retry-moves", kind + " 5 again -> " + brief(again));
    expect(marker() == "5", "marker-5", kind + " marker after the retry: " + marker());
    if (d2) {
        auto hint = awaited_push(*d2, [&](const json::object& f) { return str(f, "t") == "hint" && f.contains("read"); },
                                  15s, "device 2");
        expect(hint && num(*hint, "read") == 5, "hint-d2", "device 2 got no read hint 5 after the restart");
    }
    auto inv = invariants(lab, c);
    expect(inv.empty(), "invariants", inv);
    return passed("exit 70; marker stayed at the committed 3; retry " + brief(again) + "; marker 5" +
                  (d2 ? "; device 2 hinted read 5" : ""));
}

// after_commit: the negative control; the purge runs to its end (exit 0)
// and its commit stands where the check expects a crash before it.
Verdict crash_purge(Lab& lab, const std::string& point, bool after_commit) {
    auto a = lab.user("ana"), b = lab.user("ben");
    auto c = lab.conv("c-cpurge", "direct", {a, b});
    auto ws = connect(lab.server().port(), a.token);
    auto key = uuid4();
    auto m1 = send(*ws, c, key, "old");
    auto m2 = send(*ws, c, uuid4(), "old 2");
    auto m3 = send(*ws, c, uuid4(), "kept");
    for (const auto* m : {&m1, &m2, &m3}) expect(outcome(*m) == "sent", "setup-sent", "send -> " + brief(*m));
    const auto cut = std::to_string(num(m3, "seq"));
    auto count = [&](const std::string& table) {
        return lab.sql("SELECT count(*) FROM " + table + " WHERE conv_id = " + quote(c));
    };
    const auto events0 = count("events"), tombs0 = count("idem_tombstones");
    auto [rc, out] = after_commit ? admin(lab.db(), {"purge", c, "--before-seq", cut})
                                  : admin(lab.db(), {"--enable-faults", "--fault", point + "=crash:1", "purge", c,
                                                     "--before-seq", cut});
    if (after_commit && rc != 0) throw HarnessError("admin purge (no fault) exited " + std::to_string(rc) + ": " + out);
    if (!after_commit) expect(rc == 70, "exit-70", "admin purge with " + point + "=crash exited " + std::to_string(rc));
    // The batch's transaction died: nothing of it is visible.
    expect(count("events") == events0 && count("idem_tombstones") == tombs0, "unchanged-after-crash",
           "after the crash: events " + count("events") + " (was " + events0 + "), tombstones " +
               count("idem_tombstones") + " (was " + tombs0 + ")");
    auto r0 = answered(send(*ws, c, key, "old"), "resend after the crashed purge");
    expect(outcome(r0) == "sent" && flag(r0, "dup") && num(r0, "seq") == num(m1, "seq"), "original-answers",
           "resend after the crashed purge -> " + brief(r0) + " (the original must still answer)");
    auto purged = admin_ok(lab.db(), {"purge", c, "--before-seq", cut});
    auto r = answered(send(*ws, c, key, "old"), "late resend after the purge");
    expect(outcome(r) == "ORIGINAL_EXPIRED", "original-expired", "late resend after the purge -> " + brief(r));
    expect(lab.rows(c, a.user, key) == 0, "no-new-row", "rows for the purged key");
    auto inv = invariants(lab, c);
    expect(inv.empty(), "invariants", inv);
    return passed("admin exit 70, events " + events0 + " and tombstones " + tombs0 + " unchanged, original answers " +
                  brief(r0) + "; purge again: " + purged + " rows, late resend ORIGINAL_EXPIRED");
}

// The gateway dies between receiving the commit notification and pushing it:
// the event is committed; its subscriber reconnects and converges by sync.
// lose_after_restart: the negative control; the restarted gateway loses its
// notifications (notify.before_publish=unavailable).
// The gateway's notification bus is up (/readyz says so; its LISTEN
// session may trail the ready file): before then, a commit elsewhere never
// reaches its fan-out, so neither the crash nor a push could follow.
bool bus_ready(ServerProcess& srv) {
    const auto until = std::chrono::steady_clock::now() + 20s;
    while (srv.http("GET", "/readyz").first != 200) {
        if (std::chrono::steady_clock::now() > until) return false;
        std::this_thread::sleep_for(20ms);
    }
    return true;
}

Verdict crash_notify(Lab& lab, bool lose_after_restart) {
    auto a = lab.user("ana"), b = lab.user("ben");
    auto c = lab.conv("c-cnote", "direct", {a, b});
    CrashServer cs(lab);
    expect(bus_ready(*cs.srv), "ready", "the gateway's /readyz never answered 200");
    auto wa = connect(cs.srv->port(), a.token);
    expect(outcome(wa->request({{"t", "sub"}})) == "subscribed", "subscribed", "sub");
    std::int64_t cursor = 0;
    auto seqs = sync_all(*wa, c, 0, 50, &cursor);
    Lab::arm(*cs.srv, "notify.before_publish=crash:1");
    auto wb = connect(lab.server().port(), b.token); // writes through the other gateway
    auto s = send(*wb, c, uuid4(), "published by nobody");
    expect(outcome(s) == "sent", "sent", "send -> " + brief(s));
    auto rc = cs.srv->wait_exit(15s);
    expect(rc && *rc == 70, "exit-70", std::string("gateway exit status ") + (rc ? std::to_string(*rc) : "none (running)"));
    expect(wa->wait_closed(10s) != -1 || wa->closed(), "subscriber-closed", "the subscriber's connection outlived the gateway");
    cs.srv->restart();
    expect(bus_ready(*cs.srv), "ready-again", "the restarted gateway's /readyz never answered 200");
    auto wa2 = connect(cs.srv->port(), a.token);
    expect(outcome(wa2->request({{"t", "sub"}})) == "subscribed", "subscribed", "sub after the restart");
    if (lose_after_restart) Lab::arm(*cs.srv, "notify.before_publish=unavailable");
    std::int64_t head = 0;
    auto more = sync_all(*wa2, c, cursor, 50, &head);
    seqs.insert(seqs.end(), more.begin(), more.end());
    bool exact = static_cast<std::int64_t>(seqs.size()) == head && head == lab.head(c);
    for (std::size_t i = 0; exact && i < seqs.size(); ++i) exact = seqs[i] == static_cast<std::int64_t>(i) + 1;
    expect(exact, "converged", "client holds " + std::to_string(seqs.size()) + " events, head " + std::to_string(head) +
                      ", stored head " + std::to_string(lab.head(c)));
    // And the restarted gateway publishes again.
    auto s2 = send(*wb, c, uuid4(), "published again");
    auto ev = awaited_push(*wa2, [&](const json::object& f) {
        return str(f, "t") == "event" && num(f.at("ev").as_object(), "seq") == num(s2, "seq");
    }, 15s, "subscriber");
    expect(ev.has_value(), "pushes-again", "no push from the restarted gateway");
    auto inv = invariants(lab, c);
    expect(inv.empty(), "invariants", inv);
    return passed("gateway exit 70 before publishing seq " + std::to_string(num(s, "seq")) +
                  "; after the restart the client synced 1.." + std::to_string(head) + " exactly once; pushes flow");
}

} // namespace

std::vector<Check> crash_checks() {
    return {
        {"lab-crash-recall-before-commit",
         [](Lab& l) { return crash_recall(l, "store.recall_before_commit", false, "store.recall_before_commit"); },
         [](Lab& l) { return crash_recall(l, "store.recall_before_commit", false, "api.after_recall_commit"); },
         "api.after_recall_commit=crash armed instead: the recall commits before the crash", "rows-after-crash"},
        {"lab-crash-after-recall-commit",
         [](Lab& l) { return crash_recall(l, "api.after_recall_commit", true, "api.after_recall_commit"); },
         [](Lab& l) { return crash_recall(l, "api.after_recall_commit", true, "store.recall_before_commit"); },
         "store.recall_before_commit=crash armed instead: the recall is lost with the crash", "rows-after-crash"},
        {"lab-crash-ack-before-commit", [](Lab& l) { return crash_marker(l, "ack", false); },
         [](Lab& l) { return crash_marker(l, "ack", true); },
         "no fault; the lab SIGKILLs the gateway after the ack committed", "marker-kept"},
        {"lab-crash-read-before-commit", [](Lab& l) { return crash_marker(l, "read", false); },
         [](Lab& l) { return crash_marker(l, "read", true); },
         "no fault; the lab SIGKILLs the gateway after the read committed", "marker-kept"},
        {"lab-crash-purge-after-tombstones",
         [](Lab& l) { return crash_purge(l, "store.purge_after_tombstones", false); },
         [](Lab& l) { return crash_purge(l, "store.purge_after_tombstones", true); },
         "no fault: the purge commits where the check expects a crash before it", "unchanged-after-crash"},
        {"lab-crash-purge-before-commit", [](Lab& l) { return crash_purge(l, "store.purge_before_commit", false); },
         [](Lab& l) { return crash_purge(l, "store.purge_before_commit", true); },
         "no fault: the purge commits where the check expects a crash before it", "unchanged-after-crash"},
        {"lab-crash-notify-before-publish", [](Lab& l) { return crash_notify(l, false); },
         [](Lab& l) { return crash_notify(l, true); },
         "the restarted gateway loses its notifications (notify.before_publish=unavailable)", "pushes-again"},
    };
}

} // namespace im::lab
