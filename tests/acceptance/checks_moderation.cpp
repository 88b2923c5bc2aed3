// Issue 52: 14-rate-limited and 14-mute-redact-erase (mute, redaction,
// a user's erase: docs/acceptance.md).
#include "lab.hpp"

#include <map>
#include <thread>

namespace im::lab {

namespace {

// 14-rate-limited: a gateway of its own with --send-rate 2 --send-burst 3;
// eight drafts pipelined, then each limited one resent with its cmid after
// its retry_ms, as the SDK does. `broken`: the same gateway with the lab's
// rule.send_rate armed (the limit not applied): the control fails at
// "rate-limited".
Verdict rate_limited(Lab& lab, bool broken) {
    std::vector<std::string> flags{"--quiet", "--send-rate", "2", "--send-burst", "3"};
    if (broken) flags.insert(flags.end(), {"--enable-faults", "--fault", "rule.send_rate=skip"});
    Tracked<ServerProcess> gw(lab, lab.db(), flags, unique_name("gw-rate"));
    auto ana = lab.user("ana"), ben = lab.user("ben");
    auto conv = lab.conv("rate", "group", {ana, ben});
    auto a = connect(gw->port(), ana.token);
    constexpr int drafts = 8;
    std::vector<std::string> cmids;
    for (int i = 0; i < drafts; ++i) {
        cmids.push_back(uuid4());
        a->send_json({{"t", "send"}, {"rid", "d" + std::to_string(i)}, {"conv", conv}, {"cmid", cmids.back()},
                      {"body", "draft " + std::to_string(i)}});
    }
    std::map<std::string, json::object> replies;
    while (replies.size() < drafts) {
        auto f = a->next(10s);
        expect(f.has_value(), "reply", "a pipelined send got no reply");
        if (f->contains("rid")) replies[str(*f, "rid")] = *f;
    }
    std::vector<int> limited;
    for (int i = 0; i < drafts; ++i) {
        const auto& r = replies["d" + std::to_string(i)];
        if (outcome(r) == "RATE_LIMITED") {
            expect(r.contains("retry_ms") && num(r, "retry_ms") > 0, "retry-ms", "RATE_LIMITED without retry_ms: " + brief(r));
            expect(lab.rows(conv, ana.user, cmids[i]) == 0, "nothing-written", "a limited send was written");
            limited.push_back(i);
        } else {
            expect(outcome(r) == "sent", "reply", "draft " + std::to_string(i) + ": " + brief(r));
        }
    }
    expect(!limited.empty(), "rate-limited", "8 pipelined sends over --send-burst 3 at 2/s: none RATE_LIMITED");
    int resends = 0;
    for (int i : limited) {
        json::object r;
        for (int attempt = 0; attempt < 40; ++attempt) {
            r = send(*a, conv, cmids[i], "draft " + std::to_string(i));
            ++resends;
            if (outcome(r) != "RATE_LIMITED") break;
            std::this_thread::sleep_for(std::chrono::milliseconds(num(r, "retry_ms")));
        }
        expect(outcome(answered(r, "resend")) == "sent", "lands", "resend after retry_ms: " + brief(r));
    }
    for (int i = 0; i < drafts; ++i)
        expect(lab.rows(conv, ana.user, cmids[i]) == 1, "exactly-once",
               "draft " + std::to_string(i) + ": " + std::to_string(lab.rows(conv, ana.user, cmids[i])) + " rows");
    return passed(std::to_string(limited.size()) + " of 8 pipelined drafts RATE_LIMITED with retry_ms, nothing "
                  "written for them; after " + std::to_string(resends) + " resends every draft landed exactly once");
}

json::object api_call(ServerProcess& gw, const std::string& key, const std::string& method, const std::string& target,
                      const std::string& body, int& status) {
    auto [st, text] = gw.api(method, target, body, key);
    status = st;
    json::error_code ec;
    auto v = json::parse(text, ec);
    return !ec && v.is_object() ? v.as_object() : json::object{};
}

// 14-mute-redact-erase: through the backend API of a gateway of its own
// (the shared one has no API listener) and the lab's shared gateway for the
// member's requests. `erase_broken`: that gateway with
// --lab-erase-without-tombstones (the erase keeps no request keys): the
// control fails at "original-expired".
Verdict mute_redact_erase(Lab& lab, bool erase_broken) {
    std::vector<std::string> flags{"--quiet", "--api-listen", "127.0.0.1:0"};
    if (erase_broken) flags.insert(flags.end(), {"--enable-faults", "--lab-erase-without-tombstones"});
    Tracked<ServerProcess> gw(lab, lab.db(), flags, unique_name("gw-mod"));
    const std::string key = admin_ok(lab.db(), {"apikey", "add", unique_name("lab-mod"), "--scope", "admin"});
    auto ana = lab.user("ana"), ben = lab.user("ben");
    auto conv = lab.conv("mod", "group", {ana, ben});
    auto a = connect(lab.server().port(), ana.token);
    std::vector<std::int64_t> seqs;
    for (int i = 0; i < 3; ++i) {
        auto r = answered(send(*a, conv, uuid4(), "m" + std::to_string(i)), "send");
        expect(outcome(r) == "sent", "reply", brief(r));
        seqs.push_back(num(r, "seq"));
    }
    int st = 0;
    auto m = api_call(*gw, key, "PUT", "/v1/conversations/" + conv + "/mutes/" + ana.user, "{}", st);
    expect(st == 200, "reply", "mute: HTTP " + std::to_string(st));
    const auto head = lab.head(conv);
    const std::string muted_cmid = uuid4();
    auto r = answered(send(*a, conv, muted_cmid, "while muted"), "muted send");
    expect(outcome(r) == "MUTED", "muted", "a muted member's send: " + brief(r));
    expect(lab.head(conv) == head && lab.rows(conv, ana.user, muted_cmid) == 0, "muted-nothing-written",
           "a muted send moved the head");
    api_call(*gw, key, "DELETE", "/v1/conversations/" + conv + "/mutes/" + ana.user, "", st);
    expect(st == 200, "reply", "unmute: HTTP " + std::to_string(st));
    r = answered(send(*a, conv, uuid4(), "after the mute"), "send after unmute");
    expect(outcome(r) == "sent", "unmuted", "after the unmute: " + brief(r));
    seqs.push_back(num(r, "seq"));

    auto one = api_call(*gw, key, "POST", "/v1/conversations/" + conv + "/messages/" + std::to_string(seqs[0]) + "/redact",
                        "", st);
    expect(st == 200, "reply", "redact: HTTP " + std::to_string(st));
    const auto recall_seq = one.at("seq").as_int64();
    expect(lab.sql("SELECT kind || '|' || coalesce(sender_user, 'null') || '|' || target_seq FROM events WHERE conv_id = " +
                   quote(conv) + " AND seq = " + std::to_string(recall_seq)) ==
               "recall|null|" + std::to_string(seqs[0]),
           "operator-recall", "the redaction is no recall by the operator");
    auto all = api_call(*gw, key, "POST", "/v1/users/" + ana.user + "/redact",
                        json::serialize(json::object{{"conv", conv}}), st);
    expect(st == 200, "reply", "redact all: HTTP " + std::to_string(st));
    expect(all.at("redacted").as_int64() == static_cast<std::int64_t>(seqs.size()) - 1, "redact-all-count",
           "redacted " + json::serialize(all) + ", wanted " + std::to_string(seqs.size() - 1));
    expect(lab.sql("SELECT count(*) FROM events e WHERE e.conv_id = " + quote(conv) + " AND e.kind = 'msg' AND NOT EXISTS "
                   "(SELECT 1 FROM events x WHERE x.conv_id = e.conv_id AND x.kind = 'recall' AND x.target_seq = e.seq "
                   "AND x.sender_user IS NULL)") == "0",
           "redact-all", "a msg of the user is not recalled by the operator");
    expect(lab.sql("SELECT max(seq) - count(*) FROM events WHERE conv_id = " + quote(conv)) == "0", "gap-free",
           "seqs not gap-free after the redactions");

    // Erase ben, who wrote two msgs (one edited, one with his reaction).
    auto b = connect(lab.server().port(), ben.token);
    std::vector<std::string> ben_cmids;
    std::int64_t ben_first = 0;
    for (int i = 0; i < 2; ++i) {
        ben_cmids.push_back(uuid4());
        r = answered(send(*b, conv, ben_cmids.back(), "ben " + std::to_string(i)), "send");
        expect(outcome(r) == "sent", "reply", brief(r));
        if (!ben_first) ben_first = num(r, "seq");
    }
    r = b->request({{"t", "edit"}, {"conv", conv}, {"cmid", uuid4()}, {"target", ben_first}, {"body", "ben edited"}});
    expect(outcome(r) == "edited", "reply", "edit: " + brief(r));
    r = b->request({{"t", "react"}, {"conv", conv}, {"cmid", uuid4()}, {"target", ben_first}, {"emoji", "x"}, {"on", true}});
    expect(outcome(r) == "reacted", "reply", "react: " + brief(r));
    const std::string ben_rows = lab.sql("SELECT count(*) FROM events WHERE conv_id = " + quote(conv) +
                                         " AND sender_user = " + quote(ben.user));
    auto er = api_call(*gw, key, "DELETE", "/v1/users/" + ben.user, R"({"erase":true})", st);
    expect(st == 200, "reply", "erase: HTTP " + std::to_string(st) + " " + json::serialize(er));
    expect(std::to_string(er.at("events_erased").as_int64()) == ben_rows, "erase-count",
           "erased " + json::serialize(er) + ", wanted " + ben_rows + " events");
    expect(lab.sql("SELECT count(*) FROM events WHERE conv_id = " + quote(conv) + " AND sender_user = " +
                   quote(ben.user) + " AND (NOT erased OR body IS NOT NULL OR emoji IS NOT NULL OR client_msg_id IS NOT NULL)") == "0",
           "bodies-gone", "an event of the erased user still has content");
    expect(lab.sql("SELECT count(*) FROM events e WHERE e.conv_id = " + quote(conv) + " AND e.kind = 'msg' AND "
                   "e.sender_user = " + quote(ben.user) + " AND NOT EXISTS (SELECT 1 FROM events x WHERE x.conv_id = "
                   "e.conv_id AND x.kind = 'recall' AND x.target_seq = e.seq AND x.sender_user IS NULL)") == "0",
           "erase-recalls", "an erased msg has no recall by the operator");
    expect(lab.sql("SELECT count(*) FROM devices WHERE user_id = " + quote(ben.user) + " AND revoked_at IS NULL") == "0",
           "devices-revoked", "a device of the erased user still works");
    expect(lab.sql("SELECT count(*) FROM membership_periods WHERE user_id = " + quote(ben.user) + " AND to_seq IS NULL") ==
               "0",
           "memberships-closed", "the erased user is still a member");
    expect(lab.sql("SELECT max(seq) - count(*) FROM events WHERE conv_id = " + quote(conv)) == "0", "gap-free",
           "seqs not gap-free after the erase");
    // A page shows them erased, without a body.
    auto page = a->request({{"t", "sync"}, {"conv", conv}, {"after", 0}, {"limit", 200}});
    int shown = 0;
    for (const auto& e : page.at("events").as_array()) {
        const auto& ev = e.as_object();
        if (ev.contains("erased")) {
            expect(!ev.contains("body"), "bodies-gone", "an erased event in a page has a body: " + json::serialize(ev));
            if (ev.at("sender").is_string() && ev.at("sender").as_string() == ben.user) ++shown;
        }
    }
    expect(std::to_string(shown) == ben_rows, "erased-in-pages",
           std::to_string(shown) + " events shown erased in a page, wanted " + ben_rows);
    // The late resend of one of ben's keys (his app re-provisioned: a new device).
    const std::string token = admin_ok(lab.db(), {"device", "add", ben.user, unique_name("late")});
    auto late = connect(lab.server().port(), token);
    const auto head_now = lab.head(conv);
    r = answered(send(*late, conv, ben_cmids[0], "ben 0"), "late resend");
    expect(outcome(r) == "ORIGINAL_EXPIRED", "original-expired", "a late resend of an erased key: " + brief(r));
    expect(lab.head(conv) == head_now, "original-expired", "the late resend moved the head");
    return passed("MUTED with nothing written, writes again once unmuted; one redaction and a redaction of all of the "
                  "user's msgs as recall events with sender null; an erase: " + ben_rows + " events emptied and "
                  "shown erased, recalled by the operator, devices revoked, membership closed; seqs gap-free; a late "
                  "resend ORIGINAL_EXPIRED");
}

Verdict mute_redact_erase_ok(Lab& lab) { return mute_redact_erase(lab, false); }

} // namespace

std::vector<Check> moderation_checks() {
    return {
        {"14-rate-limited", [](Lab& lab) { return rate_limited(lab, false); },
         [](Lab& lab) { return rate_limited(lab, true); },
         "its gateway with rule.send_rate=skip: --send-rate not applied", "rate-limited"},
        {"14-mute-redact-erase", mute_redact_erase_ok, breaking("rule.send_mute", mute_redact_erase_ok),
         "gateway rule.send_mute=skip (im_lab_send_send_mute): a muted member's send is appended", "muted",
         {{[](Lab& lab) { return mute_redact_erase(lab, true); },
           "the API's gateway with --lab-erase-without-tombstones: the erase keeps no request keys", "original-expired"}}},
    };
}

} // namespace im::lab
