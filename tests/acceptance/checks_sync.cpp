// 07-*: sync paging, cursors, epochs; 08-*: fan-out and former members.
#include "child.hpp"
#include "lab.hpp"

#include <atomic>
#include <filesystem>
#include <thread>

namespace im::lab {

namespace {

std::string join(const std::vector<std::int64_t>& v) {
    std::string s;
    for (auto x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
    return s;
}

Verdict paging_under_writes(Lab& lab) {
    // 4 writers on their own connections and threads: their commits race
    // (and with pipelined sends share transactions), so the reader pages
    // while commits of several transactions land, not one serial stream.
    auto a = lab.user("ana");
    std::vector<TestUser> ws_users{lab.user("ben"), lab.user("cy"), lab.user("dan"), lab.user("eve")};
    std::vector<TestUser> members{a};
    members.insert(members.end(), ws_users.begin(), ws_users.end());
    auto c = lab.conv("c-page", "group", members);
    auto reader = connect(lab.server().port(), a.token);
    const int writers = 4, per_writer = 50, n = writers * per_writer;
    std::atomic<int> finished{0};
    std::atomic<bool> done{false};
    std::mutex werr_mu;
    std::string werr;
    std::vector<std::thread> wthreads;
    for (int k = 0; k < writers; ++k)
        wthreads.emplace_back([&, k] {
            auto writer = connect(lab.server().port(), ws_users[k].token);
            // An UNAVAILABLE reply ("commit outcome unknown", e.g. a COMMIT
            // cut by --db-timeout-ms on a loaded machine) is retryable: the
            // writer resends that message with the same cmid (contract
            // section 8), as the SDK does, and takes the answer of the resend.
            auto settled = [&](json::object r, const std::string& cmid, const std::string& body) {
                for (int tries = 0; outcome(r) == "UNAVAILABLE" && tries < 5; ++tries) r = send(*writer, c, cmid, body, 30s);
                return r;
            };
            for (int i = 0; i < per_writer; ++i) {
                // Two frames pipelined, then both replies: a shared transaction.
                auto id1 = uuid4(), id2 = uuid4();
                auto body1 = "p" + std::to_string(i), body2 = "m" + std::to_string(k) + "-" + std::to_string(i);
                auto rid1 = "pair-" + std::to_string(i);
                writer->send_json({{"t", "send"}, {"conv", c}, {"cmid", id1}, {"body", body1}, {"rid", rid1}});
                auto r2 = send(*writer, c, id2, body2, 30s);
                auto r1 = settled(writer->reply(rid1, 30s), id1, body1);
                r2 = settled(std::move(r2), id2, body2);
                ++i;
                for (const auto* r : {&r1, &r2})
                    if (outcome(*r) != "sent") {
                        std::lock_guard lk(werr_mu);
                        werr = brief(*r);
                        break;
                    }
                if (outcome(r1) != "sent" || outcome(r2) != "sent") break;
            }
            if (++finished == writers) done = true;
        });
    struct Joiner {
        std::vector<std::thread>& t;
        ~Joiner() {
            for (auto& x : t)
                if (x.joinable()) x.join();
        }
    } joiner{wthreads};
    std::vector<std::int64_t> got;
    std::int64_t after = 0, pages = 0, pages_mid_write = 0, head = 0;
    auto deadline = std::chrono::steady_clock::now() + 60s;
    for (;;) {
        bool writer_done = done; // read before the page: a page after this sees every write
        auto p = answered(sync(*reader, c, after, 7), "reader's sync");
        expect(outcome(p) == "page", "page", "sync after " + std::to_string(after) + " -> " + brief(p));
        ++pages;
        head = num(p, "head");
        if (!writer_done) ++pages_mid_write;
        for (const auto& e : p.at("events").as_array()) got.push_back(e.as_object().at("seq").as_int64());
        after = num(p, "next_after"); // stored only after the whole page is applied
        if (writer_done && !flag(p, "has_more")) break;
        expect(std::chrono::steady_clock::now() < deadline, "reader-finished", "reader did not finish in 60 s");
    }
    for (auto& t : wthreads) t.join();
    expect(werr.empty(), "writers-sent", "writer: " + werr);
    const std::int64_t want = n + static_cast<std::int64_t>(members.size()); // joins at 1..5
    expect(head == want, "final-head", "final head " + std::to_string(head) + ", wanted " + std::to_string(want));
    bool exact = static_cast<std::int64_t>(got.size()) == want;
    for (std::size_t i = 0; exact && i < got.size(); ++i) exact = got[i] == static_cast<std::int64_t>(i) + 1;
    expect(exact, "seqs-exact", "seqs not exactly 1.." + std::to_string(want) + " in order: got " + std::to_string(got.size()) +
                      " events");
    expect(pages_mid_write > 1, "paged-during-writes", "the reader never paged while the writer was writing");
    return passed("4 concurrent writers (pipelined pairs); seqs 1.." + std::to_string(want) +
                  " exactly once in order, " + std::to_string(pages) + " pages of <=7 (" +
                  std::to_string(pages_mid_write) + " during writes)");
}

Verdict cursor_ahead(Lab& lab) {
    auto a = lab.user("ana"), b = lab.user("ben");
    auto c = lab.conv("c-ahead", "direct", {a, b});
    auto ws = connect(lab.server().port(), a.token);
    auto ok = answered(sync(*ws, c, 2), "sync after head");
    expect(outcome(ok) == "page" && num(ok, "head") == 2, "page-at-head", "sync after head -> " + brief(ok));
    auto r = answered(sync(*ws, c, 3), "sync after head + 1");
    expect(outcome(r) == "CURSOR_AHEAD", "cursor-ahead", "sync after 3 (head 2) -> " + brief(r));
    return passed("after 2 = head: page; after 3: CURSOR_AHEAD");
}

Verdict epoch_changed(Lab& lab) {
    auto a = lab.user("ana"), b = lab.user("ben");
    auto c = lab.conv("c-epoch", "direct", {a, b});
    auto ws = connect(lab.server().port(), a.token);
    auto wb = connect(lab.server().port(), b.token);
    for (int i = 0; i < 3; ++i)
        expect(outcome(send(*wb, c, uuid4(), "before " + std::to_string(i))) == "sent", "setup-sent", "send");
    auto p1 = answered(sync(*ws, c, 0, 50, 1), "sync with epoch 1");
    expect(outcome(p1) == "page" && num(p1, "epoch") == 1, "epoch-1-page", "sync epoch 1 -> " + brief(p1));

    // The SDK, if built, watches the conversation across the bump.
    std::unique_ptr<Child> watcher;
    std::string sdk_detail = "SDK: not built";
    std::int64_t before_rows = -1;
    TempDir dir("imlab-epoch");
    auto bin = sdk_child_bin();
    if (!bin.empty() && std::filesystem::exists(bin)) {
        watcher = std::make_unique<Child>(
            std::vector<std::string>{bin, "watch", dir.path() + "/client.db", lab.server().url(), a.token, c});
        auto l = watcher->until("SYNCED ", 20s);
        expect(l.has_value(), "sdk-synced", "SDK child never synced: " + watcher->transcript() + watcher->stderr_text());
        before_rows = std::stoll(l->substr(7));
    }

    // History really changes with the new epoch (retention drops seqs 1..3),
    // so a client that only resyncs on top of its stale rows keeps rows the
    // server no longer has, and only a rebuild matches the server.
    admin_ok(lab.db(), {"purge", c, "--before-seq", "4"});
    auto bumped = admin_ok(lab.db(), {"epoch", "bump", c});
    expect(bumped == "2", "epoch-bumped", "epoch bump printed '" + bumped + "'");
    auto r = answered(sync(*ws, c, num(p1, "next_after"), 50, 1), "sync with the old epoch");
    expect(outcome(r) == "EPOCH_CHANGED", "epoch-changed", "sync with epoch 1 after the bump -> " + brief(r));
    auto p2 = answered(sync(*ws, c, 0, 50, 2), "rebuild sync");
    expect(outcome(p2) == "page" && num(p2, "epoch") == 2, "epoch-2-page", "rebuild sync with epoch 2 -> " + brief(p2));

    if (watcher) {
        // New traffic after the bump: the SDK learns of it by push and must
        // notice the epoch, drop the conversation and rebuild it.
        expect(outcome(send(*wb, c, uuid4(), "after the bump")) == "sent", "sent-after-bump", "send after bump");
        auto reset = watcher->until("RESET", 15s);
        expect(reset.has_value(), "sdk-reset", "SDK did not drop the conversation after the epoch bump: " + watcher->transcript() +
                                      watcher->stderr_text());
        // Rebuilt by sync; the new event may come by page or by push. The
        // server's rows now: what survived the purge plus the new event.
        const std::int64_t want = std::stoll(lab.sql("SELECT count(*) FROM events WHERE conv_id = " + quote(c) +
                                                     " AND kind IN ('msg', 'join', 'leave')"));
        std::int64_t rows = -1;
        auto until = std::chrono::steady_clock::now() + 15s;
        while (rows != want && std::chrono::steady_clock::now() < until) {
            auto l = watcher->line(std::chrono::duration_cast<std::chrono::milliseconds>(
                until - std::chrono::steady_clock::now()));
            if (!l) break;
            if (l->rfind("SYNCED ", 0) == 0) rows = std::stoll(l->substr(7));
            else if (l->rfind("APPLIED ", 0) == 0) rows = std::stoll(l->substr(8));
        }
        expect(rows == want, "sdk-rebuilt", "SDK holds " + std::to_string(rows) + " rows, the server " + std::to_string(want) +
                                 " (had " + std::to_string(before_rows) + " before the purge + bump); child said: " +
                                 watcher->transcript());
        sdk_detail = "SDK: " + std::to_string(before_rows) + " rows, purge below 4 + bump, RESET, rebuilt to the "
                     "server's " + std::to_string(want) + " rows";
    } else {
        expect(false, "sdk-built", "EPOCH_CHANGED on the wire ok, but the SDK child was not built: cannot show the SDK rebuild");
    }
    return passed("epoch 1 -> 2, old-epoch sync EPOCH_CHANGED, epoch-2 sync from 0 ok (" +
                  std::to_string(p2.at("events").as_array().size()) + " events); " + sdk_detail);
}

Verdict fanout_event_vs_hint(Lab& lab) {
    auto a = lab.user("ana"), b = lab.user("ben"), c = lab.user("cy");
    auto small = lab.conv("g-small", "group", {a, b, c});
    auto big = lab.conv("g-big", "group", {a, b, c});
    admin_ok(lab.db(), {"conv", "set", big, "--push-full-max", "2"}); // 3 members > 2: hints only
    auto wa = connect(lab.server().port(), a.token);
    auto wb = connect(lab.server().port(), b.token);
    auto wc = connect(lab.server().port(), c.token);
    for (auto* w : {wb.get(), wc.get()}) expect(outcome(w->request({{"t", "sub"}})) == "subscribed", "subscribed", "sub");

    auto s1 = send(*wa, small, uuid4(), "to the small group");
    expect(outcome(s1) == "sent", "sent-small", "send small -> " + brief(s1));
    for (auto* w : {wb.get(), wc.get()}) {
        auto p = awaited_push(*w, [&](const json::object& f) {
            return str(f, "t") == "event" && str(f.at("ev").as_object(), "conv") == small;
        }, 10s, "member");
        expect(p.has_value(), "event-small", "a member got no event push for the small group");
        expect(num(p->at("ev").as_object(), "seq") == num(s1, "seq") &&
                   str(p->at("ev").as_object(), "body") == "to the small group",
               "event-small-content", "event push " + json::serialize(*p));
    }
    auto s2 = send(*wa, big, uuid4(), "to the big group");
    expect(outcome(s2) == "sent", "sent-big", "send big -> " + brief(s2));
    for (auto* w : {wb.get(), wc.get()}) {
        bool event_for_big = false;
        auto p = awaited_push(*w, [&](const json::object& f) {
            if (str(f, "t") == "event" && str(f.at("ev").as_object(), "conv") == big) event_for_big = true;
            return str(f, "t") == "hint" && str(f, "conv") == big;
        }, 10s, "member");
        expect(!event_for_big, "no-event-above-max", "a full event was pushed for the group above push_full_max");
        expect(p.has_value(), "hint-big", "a member got no hint for the big group");
        expect(num(*p, "head") == num(s2, "seq") && !p->contains("ev"), "hint-content", "hint " + json::serialize(*p));
    }
    // Everyone converges by pulling: each member holds every event from its
    // own join (member i joined at seq i+1) up to the head, nothing else.
    std::int64_t member = 0;
    std::string views;
    for (auto* w : {wa.get(), wb.get(), wc.get()}) {
        ++member;
        std::int64_t hs = 0, hb = 0;
        auto ss = sync_all(*w, small, 0, 50, &hs), sb = sync_all(*w, big, 0, 50, &hb);
        std::vector<std::int64_t> want;
        for (std::int64_t q = member; q <= 4; ++q) want.push_back(q);
        expect(ss == want && sb == want && hs == 4 && hb == 4, "converged",
               "member " + std::to_string(member) + " holds " + join(ss) + " / " + join(sb) + ", wanted " + join(want));
        views += (views.empty() ? "" : "; ") + join(sb);
    }
    return passed("3-member group: event seq 4 to both others; push_full_max 2: hint head 4, no event; all 3 "
                  "converge on head 4 (from their joins: " + views + ")");
}

Verdict left_member_history(Lab& lab) {
    auto a = lab.user("ana"), b = lab.user("ben"), c = lab.user("cy");
    auto g = lab.conv("g-leave", "group", {a, b, c}); // joins 1..3
    auto wa = connect(lab.server().port(), a.token);
    auto wc = connect(lab.server().port(), c.token);
    expect(outcome(wc->request({{"t", "sub"}})) == "subscribed", "subscribed", "sub");
    auto m1 = answered(send(*wa, g, uuid4(), "while cy is here"), "send");
    expect(outcome(m1) == "sent" && num(m1, "seq") == 4, "sent-seq-4", "m1 " + brief(m1));
    auto leave = admin_ok(lab.db(), {"member", "remove", g, c.user});
    expect(leave == "5", "leave-seq-5", "leave event at seq " + leave);
    for (int i = 0; i < 3; ++i)
        expect(outcome(send(*wa, g, uuid4(), "after cy left")) == "sent", "sent-after-leave", "send after leave");
    // Pushes for later events never reach the leaver.
    auto late = wc->wait_push([&](const json::object& f) {
        if (str(f, "t") == "event") return num(f.at("ev").as_object(), "seq") > 5;
        return str(f, "t") == "hint" && num(f, "head") > 5;
    }, 1500ms);
    expect(!late, "no-later-push", "the leaver got a push about later traffic: " + (late ? json::serialize(*late) : ""));
    std::int64_t head = 0;
    auto seqs = sync_all(*wc, g, 0, 50, &head);
    // cy joined at seq 3: the period [3, 5] is all cy may read.
    expect(seqs == std::vector<std::int64_t>({3, 4, 5}) && head == 5, "leaver-period",
           "leaver's sync: seqs " + join(seqs) + ", head " + std::to_string(head));
    auto f6 = answered(wc->request({{"t", "fetch"}, {"conv", g}, {"seq", 6}}), "fetch seq 6");
    expect(outcome(f6) == "NOT_FOUND" || outcome(f6) == "NOT_MEMBER", "fetch-later-refused", "fetch seq 6 -> " + brief(f6));
    auto ahead = answered(sync(*wc, g, 6), "sync after 6");
    expect(outcome(ahead) == "CURSOR_AHEAD", "cursor-ahead", "sync after 6 -> " + brief(ahead));
    auto cv = answered(wc->request({{"t", "convs"}}), "convs");
    expect(outcome(cv) == "convs", "convs", "convs -> " + brief(cv));
    std::int64_t convs_head = -1;
    for (const auto& x : cv.at("convs").as_array())
        if (str(x.as_object(), "conv") == g) convs_head = num(x.as_object(), "head");
    expect(convs_head == 5, "convs-head-capped", "convs head for the leaver " + std::to_string(convs_head));
    auto w = answered(send(*wc, g, uuid4(), "can I still write?"), "leaver's send");
    expect(outcome(w) == "NOT_MEMBER", "leaver-not-member", "leaver's send -> " + brief(w));
    auto full = lab.head(g);
    return passed("leaver reads seqs 3..5 (own period, join to leave), head capped 5 (real head " +
                  std::to_string(full) + "), fetch 6 " + outcome(f6) + ", convs head 5, no later pushes, send "
                  "NOT_MEMBER");
}

// 07-paging-under-writes' negative control: the cursor a page hands back is
// the head read after the page (a second statement), so commits landing in
// between, and the rest of a cut page, are skipped. Whether a commit lands
// in that window is a race: up to 3 runs; the first one the check rejects
// is the control's verdict.
Verdict paging_with_cursor_at_head(Lab& lab) {
    auto once = breaking("rule.page_cursor", paging_under_writes);
    Verdict v;
    for (int round = 1; round <= 3; ++round) {
        try {
            v = once(lab);
        } catch (const CheckFailed& e) {
            return failed(e.tag, std::string(e.what()) + " (run " + std::to_string(round) + ")");
        }
    }
    return v;
}

} // namespace

std::vector<Check> sync_checks() {
    return {
        {"07-paging-under-writes", paging_under_writes, paging_with_cursor_at_head,
         "gateway rule.page_cursor=skip: next_after is the head read after the page", "seqs-exact"},
        {"07-cursor-ahead", cursor_ahead, breaking("rule.cursor_ahead", cursor_ahead),
         "gateway rule.cursor_ahead=skip: sync answers a page beyond head", "cursor-ahead"},
        {"07-epoch-changed", epoch_changed, breaking("rule.epoch", epoch_changed),
         "gateway rule.epoch=skip: sync ignores a stale epoch", "epoch-changed"},
        {"08-fanout-event-vs-hint", fanout_event_vs_hint, breaking("rule.push_hint", fanout_event_vs_hint),
         "gateway rule.push_hint=skip: full event pushes whatever push_full_max says", "no-event-above-max"},
        {"08-left-member-history", left_member_history, breaking("rule.membership_periods", left_member_history),
         "gateway rule.membership_periods=skip: sync treats a closed period as open", "leaver-period"},
    };
}

} // namespace im::lab
