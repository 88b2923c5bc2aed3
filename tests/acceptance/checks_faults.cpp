// lab-faults-off-by-default and 06-*: lost replies, crashes at each fault
// point (the server process really exits and is restarted), an SDK process
// killed with SIGKILL, and PostgreSQL stopped under traffic.
#include "child.hpp"
#include "lab.hpp"

#include <atomic>
#include <filesystem>
#include <thread>

namespace im::lab {

namespace {

// Not an id of acceptance.md: proves the lab's switches are unreachable in a
// default start, so the checks below test a lab build of the same binary.
Verdict faults_off_by_default(Lab& lab) {
    auto a = lab.user("ana"), b = lab.user("ben");
    auto c = lab.conv("c-off", "direct", {a, b});
    Tracked<ServerProcess> plain(lab, lab.db(), std::vector<std::string>{"--quiet"}, unique_name("gw-plain"));
    auto [status, body] = plain->http("POST", "/lab/fault", "api.after_send_commit=crash");
    expect(status == 404, "POST /lab/fault on a default start -> " + std::to_string(status));
    auto ws = connect(plain->port(), a.token);
    auto r = send(*ws, c, uuid4(), "no faults here");
    expect(outcome(r) == "sent", "send after the refused arm -> " + brief(r));
    expect(!plain->wait_exit(200ms), "the default server exited");
    bool refused = false;
    try {
        ServerProcess bad(lab.db(), {"--fault", "api.after_send_commit=crash"}, unique_name("gw-bad"));
    } catch (const std::exception&) {
        refused = true;
    }
    expect(refused, "imserver --fault without --enable-faults started");
    auto [rc, out] = admin(lab.db(), {"--lab-purge-without-tombstones", "purge", c, "--before-seq", "2"});
    expect(rc == 2, "admin --lab-purge-without-tombstones without --enable-faults exited " + std::to_string(rc));
    bool refused_idx = false;
    try {
        ServerProcess bad(lab.db(), {"--lab-no-unique-index"}, unique_name("gw-bad"));
    } catch (const std::exception&) {
        refused_idx = true;
    }
    expect(refused_idx, "imserver --lab-no-unique-index without --enable-faults started");
    return passed("POST /lab/fault 404, " + brief(r) + "; --fault, --lab-no-unique-index and admin "
                  "--lab-purge-without-tombstones refused without --enable-faults");
}

Verdict lost_reply_retry(Lab& lab) {
    auto a = lab.user("ana"), b = lab.user("ben");
    auto c = lab.conv("c-lost", "direct", {a, b});
    auto ws = connect(lab.server().port(), a.token);
    Lab::arm(lab.server(), "api.after_send_commit=drop_reply:1");
    auto cmid = uuid4();
    auto r1 = send(*ws, c, cmid, "are you there", 2s);
    expect(outcome(r1) == "timeout", "first send should get no reply, got " + brief(r1));
    auto stored = lab.sql("SELECT seq FROM events WHERE conv_id = " + quote(c) + " AND client_msg_id = " + quote(cmid));
    expect(!stored.empty(), "the first send did not commit");
    auto r2 = send(*ws, c, cmid, "are you there");
    expect(outcome(r2) == "sent", "resend -> " + brief(r2));
    expect(flag(r2, "dup") && std::to_string(num(r2, "seq")) == stored,
           "resend " + brief(r2) + ", stored seq " + stored);
    auto rows = lab.rows(c, a.user, cmid);
    expect(rows == 1, "rows " + std::to_string(rows));
    return passed("no reply, then resend " + brief(r2) + " (original seq " + stored + "), rows 1");
}

// Arms POINT=crash, sends, sees the process exit 70, restarts it for real,
// resends the same key through a new connection.
Verdict crash_at(Lab& lab, const std::string& point, bool committed) {
    auto a = lab.user("ana"), b = lab.user("ben");
    auto c = lab.conv("c-crash", "direct", {a, b});
    Tracked<ServerProcess> srv(lab, lab.db(), std::vector<std::string>{"--enable-faults", "--quiet"},
                               unique_name("gw-crash"));
    auto ws = connect(srv->port(), a.token);
    Lab::arm(*srv, point + "=crash:1");
    auto cmid = uuid4();
    auto old_pid = srv->pid();
    auto r1 = send(*ws, c, cmid, "crash test");
    expect(outcome(r1) == "closed" || outcome(r1) == "timeout", "send at the crash point -> " + brief(r1));
    auto rc = srv->wait_exit(10s);
    expect(rc && *rc == 70, "server exit status " + (rc ? std::to_string(*rc) : std::string("none (still running)")));
    auto rows_crash = lab.rows(c, a.user, cmid);
    expect(rows_crash == (committed ? 1 : 0), "rows right after the crash: " + std::to_string(rows_crash));
    srv->restart();
    auto ws2 = connect(srv->port(), a.token);
    auto r2 = send(*ws2, c, cmid, "crash test");
    expect(outcome(r2) == "sent", "resend after restart -> " + brief(r2));
    expect(flag(r2, "dup") == committed, "resend " + brief(r2) + ", wanted dup:" + (committed ? "true" : "false"));
    auto rows = lab.rows(c, a.user, cmid);
    expect(rows == 1, "rows after the resend: " + std::to_string(rows));
    expect(num(r2, "seq") == 3, "seq " + std::to_string(num(r2, "seq")) + ", wanted 3 (no seq burnt)");
    return passed("exit 70 (pid " + std::to_string(old_pid) + "), rows after crash " + std::to_string(rows_crash) +
                  ", restarted, resend " + brief(r2) + ", rows 1");
}

Verdict unavailable_retry(Lab& lab) {
    // Its own cluster: stopping it must not disturb the other checks.
    Tracked<TestPostgres> pg(lab);
    auto url = pg->url();
    auto a = make_user(url, "ana"), b = make_user(url, "ben");
    admin_ok(url, {"conv", "create", "c-down", "--kind", "direct", "--members", "ana,ben"});
    Tracked<ServerProcess> srv(lab, url, std::vector<std::string>{"--quiet"}, unique_name("gw-down"));

    const int drafts = 30;
    std::vector<std::string> cmids;
    for (int i = 0; i < drafts; ++i) cmids.push_back(uuid4());
    std::atomic<int> sent{0}, unavailable{0}, timeouts{0}, other{0}, reconnects{0};
    std::atomic<bool> during{false};
    std::atomic<int> unavailable_during{0};
    std::string other_text;
    auto deadline = std::chrono::steady_clock::now() + 60s;
    std::thread writer([&] {
        std::unique_ptr<WsClient> ws;
        for (int i = 0; i < drafts && std::chrono::steady_clock::now() < deadline;) {
            try {
                if (!ws || ws->closed()) {
                    ws.reset();
                    ++reconnects;
                    ws = connect(srv->port(), a.token);
                }
            } catch (const std::exception&) {
                ws.reset();
                std::this_thread::sleep_for(100ms);
                continue;
            }
            auto r = send(*ws, "c-down", cmids[i], "draft " + std::to_string(i), 3s);
            auto o = outcome(r);
            if (o == "sent") {
                ++sent;
                ++i;
                std::this_thread::sleep_for(20ms);
                continue;
            }
            if (o == "UNAVAILABLE") {
                ++unavailable;
                if (during) ++unavailable_during;
            } else if (o == "timeout") ++timeouts;
            else if (o != "closed") {
                ++other;
                other_text = brief(r);
            }
            std::this_thread::sleep_for(100ms); // same key, later
        }
    });
    while (sent < 5 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(10ms);
    during = true;
    pg->stop_immediate();
    std::this_thread::sleep_for(2s);
    during = false;
    pg->start();
    writer.join();
    expect(other == 0, "a terminal error while the database was down: " + other_text);
    expect(sent == drafts, "only " + std::to_string(sent) + "/" + std::to_string(drafts) + " drafts landed");
    expect(unavailable_during > 0, "no UNAVAILABLE while the database was down (timeouts " +
                                       std::to_string(timeouts) + ")");
    int once = 0;
    for (auto& k : cmids) once += pg->scalar("SELECT count(*) FROM events WHERE conv_id = 'c-down' AND "
                                             "client_msg_id = " + quote(k)) == "1";
    auto total = pg->scalar("SELECT count(*) FROM events WHERE conv_id = 'c-down' AND kind = 'msg'");
    expect(once == drafts && total == std::to_string(drafts),
           std::to_string(once) + "/" + std::to_string(drafts) + " drafts exactly once, " + total + " msg rows");
    return passed("UNAVAILABLE x" + std::to_string(unavailable) + " while down (timeouts " + std::to_string(timeouts) +
                  ", reconnects " + std::to_string(reconnects - 1) + "); after restart " + std::to_string(once) +
                  "/" + std::to_string(drafts) + " drafts exactly once, " + total + " rows, no server restart");
}

// One SDK draft: the child sends and is SIGKILLed right after send() returned;
// a fresh child on the same SQLite file resends. Returns the row count.
struct SdkRound {
    std::int64_t rows_before_restart = 0, rows = 0;
    std::string cmid, note;
};

SdkRound sdk_round(Lab& lab, const std::string& bin, const std::string& mode, const std::string& dbfile, const TestUser& u,
                   const std::string& conv, const std::string& body) {
    SdkRound r;
    const std::string url = lab.server().url();
    {
        Child child({bin, mode, dbfile, url, u.token, conv, body});
        auto l = child.until("CMID ", 20s);
        if (!l) throw CheckFailed("SDK child printed no cmid: " + child.transcript() + child.stderr_text());
        child.kill9(); // right after send() returned
        r.cmid = l->substr(5);
    }
    // Let a request that was on the wire settle (it may commit without the client).
    auto settle = std::chrono::steady_clock::now() + (mode == "send-inflight" ? 6s : 1800ms);
    do {
        std::this_thread::sleep_for(100ms);
        r.rows_before_restart = lab.rows(conv, u.user, r.cmid);
    } while (r.rows_before_restart == 0 && std::chrono::steady_clock::now() < settle);
    Child again({bin, "drain", dbfile, url, u.token});
    auto l = again.until("DRAINED", 30s);
    if (!l) throw CheckFailed("restarted SDK child did not drain its outbox: " + again.transcript() +
                              again.stderr_text());
    again.wait(5s);
    r.note = again.transcript();
    r.rows = lab.rows(conv, u.user, r.cmid);
    return r;
}

Verdict sdk_kill_resend(Lab& lab) {
    auto bin = sdk_child_bin();
    expect(!bin.empty() && std::filesystem::exists(bin),
           "the SDK child was not built (ImSdk::ImSdk target absent in this build): cannot run a real SDK process");
    auto a = lab.user("ana"), b = lab.user("ben");
    auto c = lab.conv("c-sdk", "direct", {a, b});
    TempDir dir("imlab-sdk");
    auto dbfile = dir.path() + "/client.db";
    // Round 1: killed right after send() returned.
    auto r1 = sdk_round(lab, bin, "send", dbfile, a, c, "kill me softly");
    expect(r1.rows == 1, "draft 1 (" + r1.cmid + "): rows " + std::to_string(r1.rows));
    // Round 2: killed after the request went on the wire but before the reply
    // was processed (the server holds the reply back 1.5 s after COMMIT).
    Lab::arm(lab.server(), "api.after_send_commit=delay:1500:1");
    auto r2 = sdk_round(lab, bin, "send-inflight", dbfile, a, c, "committed while dead");
    Lab::arm(lab.server(), "off");
    expect(r2.rows_before_restart == 1, "draft 2 (" + r2.cmid + "): the in-flight send did not commit while the "
                                         "client was dead (rows " + std::to_string(r2.rows_before_restart) + ")");
    expect(r2.rows == 1, "draft 2 (" + r2.cmid + "): rows " + std::to_string(r2.rows));
    auto total = lab.sql("SELECT count(*) FROM events WHERE conv_id = " + quote(c) + " AND kind = 'msg'");
    expect(total == "2", "msg rows in the conversation: " + total);
    return passed("draft 1 rows " + std::to_string(r1.rows_before_restart) + " at kill -> 1 after restart; draft 2 rows " +
                  std::to_string(r2.rows_before_restart) + " at kill (committed, reply unseen) -> 1 after restart; " +
                  "2 msg rows");
}

} // namespace

std::vector<Check> fault_checks() {
    return {
        {"lab-faults-off-by-default", faults_off_by_default},
        {"06-lost-reply-retry", lost_reply_retry},
        {"06-crash-before-insert", [](Lab& l) { return crash_at(l, "store.before_insert", false); }},
        {"06-crash-before-commit", [](Lab& l) { return crash_at(l, "store.before_commit", false); }},
        {"06-crash-after-commit", [](Lab& l) { return crash_at(l, "api.after_send_commit", true); }},
        {"06-sdk-kill-resend", sdk_kill_resend},
        {"06-unavailable-retry", unavailable_retry},
    };
}

} // namespace im::lab
