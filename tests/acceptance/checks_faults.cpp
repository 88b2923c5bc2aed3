// lab-faults-off-by-default and 06-*: lost replies, crashes at each fault
// point (the server process really exits and is restarted), an SDK process
// killed with SIGKILL, and PostgreSQL stopped under traffic.
#include "child.hpp"
#include "lab.hpp"

#include <atomic>
#include <filesystem>
#include <functional>
#include <optional>
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
    expect(status == 404, "lab-fault-404", "POST /lab/fault on a default start -> " + std::to_string(status));
    auto ws = connect(plain->port(), a.token);
    auto r = send(*ws, c, uuid4(), "no faults here");
    expect(outcome(r) == "sent", "still-serving", "send after the refused arm -> " + brief(r));
    expect(!plain->wait_exit(200ms), "still-running", "the default server exited");
    // Refused means the documented bad-usage status 2 (docs/operations.md),
    // before listening: a start that serves would run until the timeout (-1).
    const auto head_before = lab.head(c);
    const std::vector<std::string> base{"--db", lab.db(), "--listen", "127.0.0.1:0", "--quiet"};
    auto refused = [&](std::vector<std::string> extra) {
        extra.insert(extra.begin(), base.begin(), base.end());
        return imserver_exit_code(extra, 30s);
    };
    int rc_fault = refused({"--fault", "api.after_send_commit=crash"});
    expect(rc_fault == 2, "fault-refused", "imserver --fault without --enable-faults exited " + std::to_string(rc_fault));
    auto [rc, out] = admin(lab.db(), {"--lab-purge-without-tombstones", "purge", c, "--before-seq", "2"});
    expect(rc == 2, "purge-switch-refused", "admin --lab-purge-without-tombstones without --enable-faults exited " + std::to_string(rc));
    auto [rc_af, out_af] = admin(lab.db(), {"--fault", "store.purge_before_commit=crash", "purge", c, "--before-seq", "2"});
    expect(rc_af == 2, "admin-fault-refused", "admin --fault without --enable-faults exited " + std::to_string(rc_af));
    int rc_idx = refused({"--lab-no-unique-index"});
    expect(rc_idx == 2, "no-index-refused", "imserver --lab-no-unique-index without --enable-faults exited " + std::to_string(rc_idx));
    expect(lab.head(c) == head_before, "head-unchanged", "the refused commands changed the conversation (head " + std::to_string(lab.head(c)) + ")");
    return passed("POST /lab/fault 404, " + brief(r) + "; --fault, --lab-no-unique-index, admin --fault and admin "
                  "--lab-purge-without-tombstones refused with exit 2 without --enable-faults");
}

// fresh_cmid_on_resend (here and in crash_at): the negative control's client
// double, which resends under a new request key, as a client without a
// durable key would.
//
// The server-side controls of the resend checks break the server instead:
// `rule.send_dedup` (the lab's im_lab_send_send_dedup: the request-key
// lookup skipped, a repeated key is judged as a fresh send), on a database
// of their own whose unique index events_idempotency is dropped once the
// gateway runs (a start refuses a database without it). With the index in
// place the skipped lookup only meets the index, and the resend is answered
// UNAVAILABLE for ever: a defect too, but one the check sees at `reply`, not
// at the value (dup-true) this control must prove it sees.
struct NoDedupDb {
    std::string name, url;
};
NoDedupDb no_dedup_database(Lab& lab) {
    NoDedupDb d;
    d.name = unique_name("lab_nodedup");
    for (auto& ch : d.name)
        if (ch == '-') ch = '_';
    d.url = lab.pg().create_database(d.name);
    return d;
}
void drop_idempotency_index(Lab& lab, const NoDedupDb& d) {
    lab.sql("DROP INDEX events_idempotency", d.name);
    auto left = lab.sql("SELECT count(*) FROM pg_indexes WHERE indexname = 'events_idempotency'", d.name);
    if (left != "0") throw HarnessError("events_idempotency still present in " + d.name);
}

Verdict lost_reply_retry_on(Lab& lab, ServerProcess& srv, const std::string& url, const std::string& database,
                            bool fresh_cmid_on_resend) {
    auto a = make_user(url, unique_name("ana")), b = make_user(url, unique_name("ben"));
    auto c = unique_name("c-lost");
    admin_ok(url, {"conv", "create", c, "--kind", "direct", "--members", a.user + "," + b.user});
    auto ws = connect(srv.port(), a.token);
    Lab::arm(srv, "api.after_send_commit=drop_reply:1");
    auto cmid = uuid4();
    auto r1 = send(*ws, c, cmid, "are you there", 2s);
    expect(outcome(r1) == "timeout", "no-reply", "first send should get no reply, got " + brief(r1));
    auto stored = lab.sql("SELECT seq FROM events WHERE conv_id = " + quote(c) + " AND client_msg_id = " + quote(cmid),
                          database);
    expect(!stored.empty(), "committed", "the first send did not commit");
    auto r2 = answered(send(*ws, c, fresh_cmid_on_resend ? uuid4() : cmid, "are you there"), "resend");
    expect(outcome(r2) == "sent", "resend-sent", "resend -> " + brief(r2));
    expect(flag(r2, "dup"), "dup-true", "resend " + brief(r2) + ", stored seq " + stored);
    expect(std::to_string(num(r2, "seq")) == stored, "same-seq", "resend " + brief(r2) + ", stored seq " + stored);
    auto rows = lab.rows(c, a.user, cmid, database);
    expect(rows == 1, "one-row", "rows " + std::to_string(rows));
    return passed("no reply, then resend " + brief(r2) + " (original seq " + stored + "), rows 1");
}

Verdict lost_reply_retry(Lab& lab, bool fresh_cmid_on_resend) {
    return lost_reply_retry_on(lab, lab.server(), lab.db(), "im", fresh_cmid_on_resend);
}

// The server-side control: the duplicate lookup skipped on its own database.
Verdict lost_reply_retry_no_dedup(Lab& lab) {
    auto d = no_dedup_database(lab);
    Tracked<ServerProcess> srv(lab, d.url, std::vector<std::string>{"--enable-faults", "--quiet"},
                               unique_name("gw-nodedup"));
    drop_idempotency_index(lab, d);
    Lab::arm(*srv, "rule.send_dedup=skip");
    return lost_reply_retry_on(lab, *srv, d.url, d.name, false);
}

// Arms POINT=crash, sends, sees the process exit 70, restarts it for real,
// resends the same key through a new connection. The server-side controls:
// `late_crash` arms rule.commit_before_crash with the crash (the crash fires
// after the COMMIT); `no_dedup` runs on a database of its own and, after the
// restart, drops the unique index and arms rule.send_dedup.
Verdict crash_at(Lab& lab, const std::string& point, bool committed, bool fresh_cmid_on_resend,
                 bool late_crash = false, bool no_dedup = false) {
    std::optional<NoDedupDb> own;
    if (no_dedup) own = no_dedup_database(lab);
    const std::string url = own ? own->url : lab.db(), database = own ? own->name : "im";
    // The gateway first: on a database of its own, the start that makes the
    // schema with --enable-faults marks it as the lab's (the lab's send
    // variants are installed only there).
    Tracked<ServerProcess> srv(lab, url, std::vector<std::string>{"--enable-faults", "--quiet"},
                               unique_name("gw-crash"));
    auto a = make_user(url, unique_name("ana")), b = make_user(url, unique_name("ben"));
    auto c = unique_name("c-crash");
    admin_ok(url, {"conv", "create", c, "--kind", "direct", "--members", a.user + "," + b.user});
    auto ws = connect(srv->port(), a.token);
    Lab::arm(*srv, point + "=crash:1");
    if (late_crash) Lab::arm(*srv, "rule.commit_before_crash=skip");
    auto cmid = uuid4();
    auto old_pid = srv->pid();
    auto r1 = send(*ws, c, cmid, "crash test");
    expect(outcome(r1) == "closed" || outcome(r1) == "timeout", "no-reply", "send at the crash point -> " + brief(r1));
    auto rc = srv->wait_exit(10s);
    expect(rc && *rc == 70, "exit-70", "server exit status " + (rc ? std::to_string(*rc) : std::string("none (still running)")));
    auto rows_crash = lab.rows(c, a.user, cmid, database);
    expect(rows_crash == (committed ? 1 : 0), "rows-after-crash", "rows right after the crash: " + std::to_string(rows_crash));
    srv->restart();
    if (own) {
        drop_idempotency_index(lab, *own);
        Lab::arm(*srv, "rule.send_dedup=skip");
    }
    auto ws2 = connect(srv->port(), a.token);
    auto r2 = answered(send(*ws2, c, fresh_cmid_on_resend ? uuid4() : cmid, "crash test"), "resend after restart");
    expect(outcome(r2) == "sent", "resend-sent", "resend after restart -> " + brief(r2));
    expect(flag(r2, "dup") == committed, committed ? "dup-true" : "dup-false", "resend " + brief(r2) + ", wanted dup:" + (committed ? "true" : "false"));
    auto rows = lab.rows(c, a.user, cmid, database);
    expect(rows == 1, "one-row", "rows after the resend: " + std::to_string(rows));
    expect(num(r2, "seq") == 3, "seq-3", "seq " + std::to_string(num(r2, "seq")) + ", wanted 3 (no seq burnt)");
    return passed("exit 70 (pid " + std::to_string(old_pid) + "), rows after crash " + std::to_string(rows_crash) +
                  ", restarted, resend " + brief(r2) + ", rows 1");
}

// give_up: the negative control's client double, which drops a draft on
// UNAVAILABLE instead of resending it later with the same key.
// terminal: the server-side control, a gateway that answers the terminal
// INVALID_ARGUMENT where it must answer UNAVAILABLE (rule.unavailable_terminal).
Verdict unavailable_retry(Lab& lab, bool give_up, bool terminal = false) {
    // Its own cluster: stopping it must not disturb the other checks.
    Tracked<TestPostgres> pg(lab);
    auto url = pg->url();
    auto a = make_user(url, "ana"), b = make_user(url, "ben");
    admin_ok(url, {"conv", "create", "c-down", "--kind", "direct", "--members", "ana,ben"});
    Tracked<ServerProcess> srv(lab, url,
                               terminal ? std::vector<std::string>{"--quiet", "--enable-faults", "--fault",
                                                                   "rule.unavailable_terminal=skip"}
                                        : std::vector<std::string>{"--quiet"},
                               unique_name("gw-down"));

    const int drafts = 30;
    std::vector<std::string> cmids;
    for (int i = 0; i < drafts; ++i) cmids.push_back(uuid4());
    std::atomic<int> sent{0}, unavailable{0}, timeouts{0}, other{0}, reconnects{0};
    std::atomic<bool> during{false}, finished{false};
    std::atomic<int> unavailable_during{0};
    std::string other_text;
    auto deadline = std::chrono::steady_clock::now() + 60s;
    std::thread writer([&] {
        std::unique_ptr<WsClient> ws;
        int i = 0;
        for (; i < drafts && std::chrono::steady_clock::now() < deadline;) {
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
                if (give_up) ++i;
            } else if (o == "timeout") ++timeouts;
            else if (o != "closed") {
                ++other;
                other_text = brief(r);
            }
            std::this_thread::sleep_for(100ms); // same key, later
        }
        finished = i == drafts;
    });
    while (sent < 5 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(10ms);
    during = true;
    pg->stop_immediate();
    std::this_thread::sleep_for(2s);
    during = false;
    pg->start();
    writer.join();
    // The writer went through every draft (sent, or dropped by the control's
    // double on UNAVAILABLE) before its deadline: a server that stopped
    // answering fails here, not at "all-landed".
    expect(finished, "writer-finished", "the writer ran out of time (sent " + std::to_string(sent) + ", timeouts " +
                                            std::to_string(timeouts) + ")");
    expect(other == 0, "no-terminal-error", "a terminal error while the database was down: " + other_text);
    expect(sent == drafts, "all-landed", "only " + std::to_string(sent) + "/" + std::to_string(drafts) + " drafts landed");
    expect(unavailable_during > 0, "unavailable-while-down", "no UNAVAILABLE while the database was down (timeouts " +
                                       std::to_string(timeouts) + ")");
    int once = 0;
    for (auto& k : cmids) once += pg->scalar("SELECT count(*) FROM events WHERE conv_id = 'c-down' AND "
                                             "client_msg_id = " + quote(k)) == "1";
    auto total = pg->scalar("SELECT count(*) FROM events WHERE conv_id = 'c-down' AND kind = 'msg'");
    expect(once == drafts && total == std::to_string(drafts), "each-once",
           std::to_string(once) + "/" + std::to_string(drafts) + " drafts exactly once, " + total + " msg rows");
    return passed("UNAVAILABLE x" + std::to_string(unavailable) + " while down (timeouts " + std::to_string(timeouts) +
                  ", reconnects " + std::to_string(reconnects - 1) + "); after restart " + std::to_string(once) +
                  "/" + std::to_string(drafts) + " drafts exactly once, " + total + " rows, no server restart");
}

// One SDK draft: the child sends and is SIGKILLed right after send()
// returned; a fresh child on the same SQLite file resends.
struct SdkRound {
    std::int64_t rows_at_kill = 0, rows = 0;
    std::string cmid, pending_at_restart, settled;
};

SdkRound sdk_round(Lab& lab, const std::string& bin, const std::string& mode, const std::string& dbfile,
                   const TestUser& u, const std::string& conv, const std::string& body,
                   const std::function<void()>& after_kill, bool lose_store) {
    SdkRound r;
    const std::string url = lab.server().url();
    {
        Child child({bin, mode, dbfile, url, u.token, conv, body});
        auto l = child.until("CMID ", 20s);
        if (!l) throw CheckFailed("sdk-cmid", "SDK child printed no cmid: " + child.transcript() + child.stderr_text());
        child.kill9();
        r.cmid = l->substr(5);
    }
    if (lose_store) // the control: an SDK whose outbox did not survive the kill
        for (const char* ext : {"", "-wal", "-shm", "-journal"}) std::filesystem::remove(dbfile + ext);
    after_kill();
    r.rows_at_kill = lab.rows(conv, u.user, r.cmid);
    Child again({bin, "drain", dbfile, url, u.token});
    // What the dead process left in its durable outbox.
    auto p = again.until("PENDING ", 30s);
    if (!p) throw CheckFailed("sdk-pending-reported", "the restarted SDK child reported no PENDING count: " +
                                                          again.transcript() + again.stderr_text());
    r.pending_at_restart = p->substr(8);
    auto l = again.until("DRAINED", 30s);
    if (!l) throw CheckFailed("sdk-drained", "restarted SDK child did not drain its outbox: " + again.transcript() +
                              again.stderr_text());
    again.wait(5s);
    // The restarted client settled this draft: "STATE CONV CMID SEQ ..."
    const std::string key = "STATE " + conv + " " + r.cmid + " ";
    auto t = again.transcript();
    for (auto at = t.find(key); at != std::string::npos; at = t.find(key, at + 1)) {
        auto end = t.find_first_of(" \n", at + key.size());
        r.settled = t.substr(at + key.size(), end - at - key.size());
    }
    r.rows = lab.rows(conv, u.user, r.cmid);
    return r;
}

// lose_store: the negative control, an SDK whose outbox is not durable (its
// SQLite file is gone after the kill).
Verdict sdk_kill_resend(Lab& lab, bool lose_store) {
    auto bin = sdk_child_bin();
    expect(!bin.empty() && std::filesystem::exists(bin), "sdk-built",
           "the SDK child was not built (ImSdk::ImSdk target absent in this build): cannot run a real SDK process");
    auto a = lab.user("ana"), b = lab.user("ben");
    auto c = lab.conv("c-sdk", "direct", {a, b});
    TempDir dir("imlab-sdk");
    auto dbfile = dir.path() + "/client.db";
    // Round 1: the server refuses every insert (UNAVAILABLE) while the child
    // lives, so the draft cannot be on the server when the child is SIGKILLed
    // right after send() returned: only the SDK's durable outbox can bring it
    // there after the restart.
    Lab::arm(lab.server(), "store.before_insert=unavailable");
    SdkRound r1;
    try {
        r1 = sdk_round(lab, bin, "send", dbfile, a, c, "kill me softly", [&] { Lab::arm(lab.server(), "off"); },
                       lose_store);
    } catch (...) {
        Lab::arm(lab.server(), "off");
        throw;
    }
    expect(r1.rows_at_kill == 0, "d1-not-on-server", "draft 1 (" + r1.cmid + ") was on the server at kill time (rows " +
                                     std::to_string(r1.rows_at_kill) + "): the round proves nothing");
    expect(r1.pending_at_restart == "1", "d1-pending", "draft 1: the restarted SDK found " + r1.pending_at_restart +
                                             " pending (wanted 1: the draft in the durable outbox)");
    expect(r1.rows == 1, "d1-one-row", "draft 1 (" + r1.cmid + "): rows " + std::to_string(r1.rows) + " after the restart");
    // Round 2: killed after the request went on the wire but before anything
    // came back: the server holds the send 1.5 s before its COMMIT, so it
    // commits (and pushes the event, which would settle the draft too) only
    // once the client is dead. The restarted SDK must still hold the draft,
    // resend the same key and settle on the original seq, leaving one row.
    // (Holding only the reply is not enough: the pushed event of one's own
    // send arrives right after the COMMIT and settles the draft before the
    // kill when the machine is quick.)
    Lab::arm(lab.server(), "store.before_commit=delay:1500:1");
    std::string seq2;
    auto r2 = sdk_round(lab, bin, "send-inflight", dbfile, a, c, "committed while dead", [&] {
        // The in-flight send commits without the client (a condition, not a sleep).
        auto until = std::chrono::steady_clock::now() + 30s;
        while (std::chrono::steady_clock::now() < until) {
            seq2 = lab.sql("SELECT seq FROM events WHERE conv_id = " + quote(c) + " AND kind = 'msg' AND body = " +
                           quote("committed while dead"));
            if (!seq2.empty()) break;
            std::this_thread::sleep_for(50ms);
        }
    }, lose_store);
    Lab::arm(lab.server(), "off");
    expect(r2.rows_at_kill == 1, "d2-committed-while-dead", "draft 2 (" + r2.cmid + "): the in-flight send did not commit while the "
                                 "client was dead (rows " + std::to_string(r2.rows_at_kill) + ")");
    expect(r2.pending_at_restart == "1", "d2-pending", "draft 2: the restarted SDK found " + r2.pending_at_restart +
                                             " pending (wanted 1: committed on the server, reply never seen)");
    expect(r2.settled == seq2, "d2-settled-seq", "draft 2: the restarted SDK settled it at seq '" + r2.settled + "', stored seq " + seq2);
    expect(r2.rows == 1, "d2-one-row", "draft 2 (" + r2.cmid + "): rows " + std::to_string(r2.rows));
    auto total = lab.sql("SELECT count(*) FROM events WHERE conv_id = " + quote(c) + " AND kind = 'msg'");
    expect(total == "2", "msg-rows", "msg rows in the conversation: " + total);
    return passed("draft 1: 0 rows at kill (inserts refused), 1 pending at restart -> rows 1; draft 2: committed "
                  "while dead, 1 pending at restart, settled at the stored seq " + seq2 + " -> rows 1; 2 msg rows");
}

} // namespace

std::vector<Check> fault_checks() {
    return {
        {"lab-faults-off-by-default", faults_off_by_default},
        {"06-lost-reply-retry", [](Lab& l) { return lost_reply_retry(l, false); },
         [](Lab& l) { return lost_reply_retry(l, true); }, "client double: the resend has a new cmid", "dup-true",
         {{lost_reply_retry_no_dedup,
           "server: rule.send_dedup (the request-key lookup skipped), events_idempotency dropped on its own database",
           "dup-true"}}},
        {"06-crash-before-insert", [](Lab& l) { return crash_at(l, "store.before_insert", false, false); },
         [](Lab& l) { return crash_at(l, "store.before_insert", false, true); },
         "client double: the resend after the restart has a new cmid", "one-row",
         {{[](Lab& l) { return crash_at(l, "store.before_insert", false, false, true); },
           "server: rule.commit_before_crash (the crash armed before the insert fires after the COMMIT)",
           "rows-after-crash"}}},
        {"06-crash-before-commit", [](Lab& l) { return crash_at(l, "store.before_commit", false, false); },
         [](Lab& l) { return crash_at(l, "store.before_commit", false, true); },
         "client double: the resend after the restart has a new cmid", "one-row",
         {{[](Lab& l) { return crash_at(l, "store.before_commit", false, false, true); },
           "server: rule.commit_before_crash (the crash armed before the COMMIT fires after it)", "rows-after-crash"}}},
        {"06-crash-after-commit", [](Lab& l) { return crash_at(l, "api.after_send_commit", true, false); },
         [](Lab& l) { return crash_at(l, "api.after_send_commit", true, true); },
         "client double: the resend after the restart has a new cmid", "dup-true",
         {{[](Lab& l) { return crash_at(l, "api.after_send_commit", true, false, false, true); },
           "server: after the restart rule.send_dedup (the request-key lookup skipped), events_idempotency dropped "
           "on its own database",
           "dup-true"}}},
        {"06-sdk-kill-resend", [](Lab& l) { return sdk_kill_resend(l, false); },
         [](Lab& l) { return sdk_kill_resend(l, true); }, "the SDK's SQLite file is lost with the killed process",
         "d1-pending"},
        {"06-unavailable-retry", [](Lab& l) { return unavailable_retry(l, false); },
         [](Lab& l) { return unavailable_retry(l, true); }, "client double: a draft answered UNAVAILABLE is dropped",
         "all-landed",
         {{[](Lab& l) { return unavailable_retry(l, false, true); },
           "server: rule.unavailable_terminal (UNAVAILABLE answered as the terminal INVALID_ARGUMENT)",
           "no-terminal-error"}}},
    };
}

} // namespace im::lab
