// 11-*: recall rules and idempotency, retention purge with tombstones, and
// the negative control that purges without them.
#include "lab.hpp"

#include <optional>

#include <thread>

namespace im::lab {

namespace {

json::object recall(WsClient& ws, const std::string& conv, std::int64_t target, const std::string& cmid) {
    return ws.request({{"t", "recall"}, {"conv", conv}, {"target", target}, {"cmid", cmid}});
}

Verdict recall_rejections(Lab& lab) {
    auto a = lab.user("ana"), b = lab.user("ben");
    auto c = lab.conv("c-recall", "direct", {a, b});
    auto wa = connect(lab.server().port(), a.token);
    auto wb = connect(lab.server().port(), b.token);
    auto m = answered(send(*wa, c, uuid4(), "oops"), "send");
    expect(outcome(m) == "sent", "sent", "send -> " + brief(m));
    const auto target = num(m, "seq");
    auto r1 = answered(recall(*wb, c, target, uuid4()), "recall by the other member");
    expect(outcome(r1) == "NOT_SENDER", "not-sender", "recall by the other member -> " + brief(r1));
    auto r2 = answered(recall(*wa, c, target, uuid4()), "recall by the sender");
    expect(outcome(r2) == "recalled" && !flag(r2, "dup"), "recalled", "recall by the sender -> " + brief(r2));
    auto r3 = answered(recall(*wa, c, target, uuid4()), "second recall"); // another request, same target
    expect(outcome(r3) == "ALREADY_RECALLED", "already-recalled", "second recall by another request -> " + brief(r3));
    // The window, judged by the database clock.
    admin_ok(lab.db(), {"conv", "set", c, "--recall-window-ms", "300"});
    auto m2 = answered(send(*wa, c, uuid4(), "too late to take back"), "send");
    expect(outcome(m2) == "sent", "sent", "send -> " + brief(m2));
    std::this_thread::sleep_for(800ms);
    auto r4 = answered(recall(*wa, c, num(m2, "seq"), uuid4()), "recall after the window");
    expect(outcome(r4) == "RECALL_WINDOW_EXPIRED", "window-expired", "recall after the 300 ms window -> " + brief(r4));
    auto original = lab.sql("SELECT body FROM events WHERE conv_id = " + quote(c) + " AND seq = " +
                            std::to_string(target));
    expect(original == "oops", "original-untouched", "the recalled original was modified: '" + original + "'");
    auto recalls = lab.sql("SELECT count(*) FROM events WHERE conv_id = " + quote(c) + " AND kind = 'recall'");
    expect(recalls == "1", "one-recall-event", "recall events: " + recalls);
    return passed("NOT_SENDER / ALREADY_RECALLED / RECALL_WINDOW_EXPIRED (window 300 ms, waited 800 ms); 1 recall "
                  "event, original row untouched");
}

// fresh_key_on_resend: the negative control's client double, which resends
// the recall under a new request key (an SDK that lost its outbox entry).
Verdict recall_idempotent_with(Lab& lab, bool fresh_key_on_resend) {
    auto a = lab.user("ana"), b = lab.user("ben");
    auto c = lab.conv("c-recall2", "direct", {a, b});
    auto wa = connect(lab.server().port(), a.token);
    auto m = answered(send(*wa, c, uuid4(), "take it back"), "send");
    expect(outcome(m) == "sent", "sent", "send -> " + brief(m));
    auto key = uuid4();
    auto r1 = answered(recall(*wa, c, num(m, "seq"), key), "recall");
    expect(outcome(r1) == "recalled" && !flag(r1, "dup"), "recalled", "recall -> " + brief(r1));
    auto r2 = answered(recall(*wa, c, num(m, "seq"), fresh_key_on_resend ? uuid4() : key), "same recall again");
    expect(outcome(r2) == "recalled" && flag(r2, "dup") && num(r2, "seq") == num(r1, "seq"), "same-recall-dup",
           "same recall again -> " + brief(r2) + " (first " + brief(r1) + ")");
    auto rows = lab.rows(c, a.user, key);
    expect(rows == 1, "one-row", "recall rows for the key: " + std::to_string(rows));
    return passed("first " + brief(r1) + ", again " + brief(r2) + ", rows 1");
}

struct Purged {
    std::string conv, key, purged_out;
    std::int64_t key_seq = 0, head_before = 0;
    TestUser sender;
};

// Three messages; the first one's key is the late resend. Purges below the third.
Purged purge_setup(Lab& lab, WsClient*& out_ws, std::unique_ptr<WsClient>& holder, bool tombstones) {
    Purged p;
    p.sender = lab.user("ana");
    auto b = lab.user("ben");
    p.conv = lab.conv("c-purge", "direct", {p.sender, b});
    holder = connect(lab.server().port(), p.sender.token);
    out_ws = holder.get();
    p.key = uuid4();
    auto m1 = send(*holder, p.conv, p.key, "old news");
    expect(outcome(m1) == "sent", "setup-sent", "send -> " + brief(m1));
    p.key_seq = num(m1, "seq");
    auto m2 = send(*holder, p.conv, uuid4(), "old news 2");
    expect(outcome(m2) == "sent", "setup-sent", "send -> " + brief(m2));
    auto m3 = send(*holder, p.conv, uuid4(), "kept");
    expect(outcome(m3) == "sent", "setup-sent", "send -> " + brief(m3));
    p.head_before = lab.head(p.conv);
    std::vector<std::string> args;
    if (!tombstones) args = {"--enable-faults", "--lab-purge-without-tombstones"};
    for (auto s : {"purge", p.conv.c_str()}) args.push_back(s);
    args.push_back("--before-seq");
    args.push_back(std::to_string(num(m3, "seq")));
    p.purged_out = admin_ok(lab.db(), args);
    return p;
}

// The late resend after a purge: its reply and what the database holds.
struct LateResend {
    Purged p;
    json::object reply, page, fetched;
    std::string tombstones;
    std::int64_t rows = 0, head_after = 0;
};

LateResend purge_and_resend(Lab& lab, bool tombstones) {
    WsClient* ws = nullptr;
    std::unique_ptr<WsClient> holder;
    LateResend l;
    l.p = purge_setup(lab, ws, holder, tombstones);
    l.tombstones = lab.sql("SELECT count(*) FROM idem_tombstones WHERE conv_id = " + quote(l.p.conv));
    l.reply = send(*ws, l.p.conv, l.p.key, "old news"); // the late resend
    l.rows = lab.rows(l.p.conv, l.p.sender.user, l.p.key);
    l.head_after = lab.head(l.p.conv);
    l.page = sync(*ws, l.p.conv, 0);
    l.fetched = ws->request({{"t", "fetch"}, {"conv", l.p.conv}, {"seq", l.p.key_seq}});
    return l;
}

// The purge without tombstones and its late resend, run once per lab run: by
// the control of 11-retention-purge, then reported by 11-control-no-tombstone
// (which runs it itself only when it runs alone).
std::optional<LateResend> without_tombstones;
const LateResend& late_resend_without_tombstones(Lab& lab) {
    if (!without_tombstones) without_tombstones = purge_and_resend(lab, false);
    return *without_tombstones;
}

Verdict judge_retention(const LateResend& l) {
    answered(l.reply, "late resend");
    expect(outcome(l.reply) == "ORIGINAL_EXPIRED", "original-expired", "late resend of a purged key -> " + brief(l.reply));
    expect(l.rows == 0 && l.head_after == l.p.head_before, "no-new-row",
           "rows for the key " + std::to_string(l.rows) + ", head " + std::to_string(l.head_after) + " (was " +
               std::to_string(l.p.head_before) + ")");
    expect(outcome(l.page) == "page" && flag(l.page, "trimmed"), "trimmed", "sync from 0 after purge -> " + brief(l.page));
    expect(outcome(l.fetched) == "NOT_FOUND", "fetch-not-found", "fetch of a purged seq -> " + brief(l.fetched));
    return passed("purged " + l.p.purged_out + " rows, " + l.tombstones +
                  " tombstones; late resend ORIGINAL_EXPIRED, rows 0, head " + std::to_string(l.p.head_before) +
                  " unchanged; sync trimmed:true (min_seq " + std::to_string(num(l.page, "min_seq")) +
                  "); fetch NOT_FOUND");
}

// tombstones=false: the negative control (admin purge with the lab switch).
Verdict retention_purge_with(Lab& lab, bool tombstones) {
    return judge_retention(tombstones ? purge_and_resend(lab, true) : late_resend_without_tombstones(lab));
}

Verdict control_no_tombstone(Lab& lab) {
    const auto& l = late_resend_without_tombstones(lab);
    expect(outcome(l.reply) == "sent" && l.rows == 1, "new-message",
           "control did not show the defect: late resend -> " + brief(l.reply) + ", rows " + std::to_string(l.rows) +
               ", tombstones " + l.tombstones);
    return passed("purged " + l.p.purged_out + " rows, " + l.tombstones + " tombstones; late resend created a new "
                  "message: " + brief(l.reply) + " (original was seq " + std::to_string(l.p.key_seq) +
                  "; the purge of 11-retention-purge's control)");
}

} // namespace

std::vector<Check> retention_checks() {
    return {
        {"11-recall-rejections", recall_rejections, breaking("rule.recall_window", recall_rejections),
         "gateway rule.recall_window=skip: recall ignores the window", "window-expired"},
        {"11-recall-idempotent", [](Lab& l) { return recall_idempotent_with(l, false); },
         [](Lab& l) { return recall_idempotent_with(l, true); }, "client double: the resent recall has a new cmid",
         "same-recall-dup",
         {{breaking("rule.recall_dedup", [](Lab& l) { return recall_idempotent_with(l, false); }),
           "server: gateway rule.recall_dedup (the recall's request key is never found: a repeat is judged anew)",
           "same-recall-dup"}}},
        {"11-retention-purge", [](Lab& l) { return retention_purge_with(l, true); },
         [](Lab& l) { return retention_purge_with(l, false); }, "admin purge --lab-purge-without-tombstones",
         "original-expired"},
        {"11-control-no-tombstone", control_no_tombstone},
    };
}

} // namespace im::lab
